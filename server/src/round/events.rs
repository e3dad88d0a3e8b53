//! The round's vocabulary: what a client's stream produced, for the round loop, in the domain
//! crates' types. The edge (`crate::edge::framer`) builds these from the wire; the coordinator and the
//! collections read them and know nothing of the wire.

use crate::identity::ids::{ClientId, GroupId};
use fl_privacy::Release;
use fl_secagg::StageMessage;
use fl_secagg::verified::Report;
use tokio::sync::OwnedSemaphorePermit;

/// What a client's stream produced, for the round loop.
#[derive(Debug)]
pub enum Event {
    /// A client's stream is live.
    Connected(ClientId),
    /// A client's stream ended.
    Disconnected(ClientId),
    /// A complete update arrived (framing checked, content not yet).
    Update {
        /// Sender.
        client: ClientId,
        /// Its header.
        header: UploadHeader,
        /// The update's values.
        values: Vec<f32>,
        /// Encoded size of the header and chunks.
        bytes: u64,
    },
    /// A SignDS upload (its indices are checked by the round loop).
    Sign {
        /// Sender.
        client: ClientId,
        /// The round it is for.
        round: u64,
        /// s.
        sign: i64,
        /// J.
        indices: Vec<u64>,
        /// Its declared release.
        release: Declared,
        /// Encoded size.
        bytes: u64,
    },
    /// A secure-aggregation stage message (fields checked, protocol meaning not yet).
    SecAgg {
        /// Sender.
        client: ClientId,
        /// The round it claims.
        round: u64,
        /// The message.
        message: StageMessage,
        /// Encoded size.
        bytes: u64,
    },
    /// A verified upload: the leader's share and the helper's sealed one (framing and field
    /// values checked, the proof not yet).
    Verified {
        /// Sender.
        client: ClientId,
        /// The round it claims.
        round: u64,
        /// The upload.
        report: Box<Report>,
        /// Encoded size of the header and chunks.
        bytes: u64,
    },
    /// The client reports it could not do its task.
    Failed {
        /// Sender.
        client: ClientId,
        /// Round it failed.
        round: u64,
        /// Its reason.
        reason: String,
    },
    /// An aggregator's partial aggregate of a round (the aggregator tier).
    Group {
        /// The aggregator's group.
        group: GroupId,
        /// What it reported.
        report: GroupReport,
    },
    /// An aggregator's stream ended: its clients left the population, and its group's result of
    /// the current round will not come.
    GroupLost(GroupId),
}

/// What an aggregator reports of its group's part of a round (framing checked, content not yet).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupReport {
    /// The round it is for.
    pub round: u64,
    /// sum_k w_k u_k over its results; `None` when it summed none.
    pub sum: Option<Vec<f32>>,
    /// The results summed.
    pub contributors: u64,
    /// sum_k w_k.
    pub weight: f64,
    /// The S it clipped each update to, if any.
    pub clip_bound: Option<f64>,
    /// Its sampled clients that gave no result.
    pub dropped: u64,
    /// Clients it refused during the round.
    pub refused: u64,
    /// Bytes it received from its clients in the round.
    pub bytes_up: u64,
    /// Bytes it sent its clients in the round.
    pub bytes_down: u64,
    /// The training losses its clients reported, summed, and how many reported one.
    pub losses: (f64, u64),
    /// A secure group: clients that shared keys, dropped, and whose masks were removed.
    pub dropouts_recovered: u64,
}

/// A local release as an upload declares it.
#[derive(Debug, Clone, PartialEq)]
pub enum Declared {
    /// None (a plain upload, to a trusted curator).
    Absent,
    /// A release read off the wire, which the strategy stack checks against the round's
    /// mechanism.
    Read(Release),
    /// A release that does not read, and why: the round refuses the upload.
    Unreadable(String),
}

impl Declared {
    /// The release declared, if any; why it does not read as the error.
    pub fn into_release(self) -> Result<Option<Release>, String> {
        match self {
            Declared::Absent => Ok(None),
            Declared::Read(release) => Ok(Some(release)),
            Declared::Unreadable(reason) => Err(reason),
        }
    }
}

/// The header of a dense upload: what may travel with the values depends on who sees them.
#[derive(Debug, Clone, PartialEq)]
pub enum UploadHeader {
    /// No client-side mechanism: the trusted curator gets the example count and the loss.
    Plain {
        /// The round it is for.
        round: u64,
        /// n_k.
        num_examples: u64,
        /// The mean training loss, when the client's trainer reports one.
        train_loss: Option<f32>,
        /// The received model's (loss, accuracy, n) on the client's examples, when the task asked
        /// for federated evaluation; checked to be finite, an accuracy in [0, 1] and n > 0.
        evaluation: Option<(f64, f64, u64)>,
    },
    /// A local mechanism's output: the release's public parameters and nothing else.
    Released {
        /// The round it is for.
        round: u64,
        /// The declared release.
        release: Declared,
    },
}

impl UploadHeader {
    /// The round it is for.
    pub fn round(&self) -> u64 {
        match self {
            Self::Plain { round, .. } | Self::Released { round, .. } => *round,
        }
    }
}

/// An event on its way to the round loop, with the upload place it holds (freed when the round
/// loop takes it; see `crate::edge::session::UPLOADS_AT_ONCE`).
#[derive(Debug)]
pub(crate) struct Arrival {
    /// The event.
    pub event: Event,
    /// The place of the upload it carries.
    _place: Option<OwnedSemaphorePermit>,
}

impl Arrival {
    /// `event`, holding the upload place `place` until the round loop takes it.
    pub(crate) fn holding(event: Event, place: Option<OwnedSemaphorePermit>) -> Self {
        Self {
            event,
            _place: place,
        }
    }
}

impl From<Event> for Arrival {
    fn from(event: Event) -> Self {
        Self::holding(event, None)
    }
}

/// At most the first 256 bytes of a client-supplied string, for logs.
pub(crate) fn for_log(text: &str) -> &str {
    let mut end = text.len().min(256);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logged_strings_are_cut_at_a_character_boundary() {
        let euros = "€".repeat(300);
        assert_eq!(for_log(&euros).len(), 255);
        assert_eq!(for_log("short"), "short");
    }
}
