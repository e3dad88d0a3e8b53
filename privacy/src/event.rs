//! The ledger's events: one round of any mechanism the accountants know. Each kind answers for
//! itself ([`LedgerEvent`], implemented beside its mechanism); [`PrivacyEvent`], the closed enum
//! the ledger stores, is written by one `privacy_events!` invocation that lists the kinds, so
//! no dispatch `match` is edited by hand when a kind is added.

use super::ddg::{DdgRound, DdgSettlement};
use super::ledger_event::LedgerEvent;
use super::sampled_gaussian::GaussianRound;
use super::stream::{BandedRound, TreeRound};
use super::unsampled_gaussian::UnsampledGaussian;
use serde::{Deserialize, Serialize};

/// Writes [`PrivacyEvent`] from its kinds: the enum (tagged by `mechanism` on disk, each
/// variant's name in kebab case), its dispatch to [`LedgerEvent`], and a `From` per kind.
macro_rules! privacy_events {
    ($($(#[$doc:meta])* $variant:ident($kind:ty),)*) => {
        /// One round of any mechanism the accountant knows. On disk (the ledger's lines) it is
        /// tagged by `mechanism`; [`read_event`] also reads the untagged lines of earlier
        /// ledgers.
        #[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
        #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
        #[serde(tag = "mechanism", rename_all = "kebab-case")]
        pub enum PrivacyEvent {
            $($(#[$doc])* $variant($kind),)*
        }

        impl PrivacyEvent {
            /// The event's own answers.
            fn kind(&self) -> &dyn LedgerEvent {
                match self {
                    $(Self::$variant(event) => event,)*
                }
            }
        }

        $(impl From<$kind> for PrivacyEvent {
            fn from(event: $kind) -> Self {
                Self::$variant(event)
            }
        })*
    };
}

privacy_events! {
    /// Central Gaussian noise on the sum of a sampled round.
    SampledGaussian(GaussianRound),
    /// Distributed discrete Gaussian noise under secure aggregation (no sampling amplification).
    DistributedDiscreteGaussian(DdgRound),
    /// A round of DP-FTRL's tree aggregation (zero-out neighbours, no sampling).
    TreeAggregation(TreeRound),
    /// The correction of a distributed-noise round once its survivors are known (never
    /// positive).
    DdgSettlement(DdgSettlement),
    /// Central Gaussian noise on the sum of a round whose participants are public (no sampling
    /// amplification).
    UnsampledGaussian(UnsampledGaussian),
    /// A step of banded matrix-factorization DP-FTRL (zero-out neighbours, no sampling).
    BandedMatrix(BandedRound),
}

/// Each kind's own answers.
impl LedgerEvent for PrivacyEvent {
    fn rdp_curve(&self, orders: &[f64]) -> Vec<f64> {
        self.kind().rdp_curve(orders)
    }

    fn as_gaussian(&self) -> Option<Option<GaussianRound>> {
        self.kind().as_gaussian()
    }

    fn reruns_after_crash(&self) -> bool {
        self.kind().reruns_after_crash()
    }
}

/// The ledger lines written before events were tagged: the kinds of that time, told apart by
/// their fields, in the order they were tried then.
#[derive(Deserialize)]
#[serde(untagged)]
enum UntaggedEvent {
    SampledGaussian(GaussianRound),
    DistributedDiscreteGaussian(DdgRound),
    TreeAggregation(TreeRound),
    DdgSettlement(DdgSettlement),
    UnsampledGaussian(UnsampledGaussian),
}

/// A stored event: tagged, or an earlier ledger's untagged line.
#[derive(Deserialize)]
#[serde(untagged)]
enum StoredEvent {
    Tagged(PrivacyEvent),
    Untagged(UntaggedEvent),
}

/// Reads a stored event, tagged or untagged (for `#[serde(deserialize_with)]`).
pub fn read_event<'de, D: serde::Deserializer<'de>>(d: D) -> Result<PrivacyEvent, D::Error> {
    Ok(match StoredEvent::deserialize(d)? {
        StoredEvent::Tagged(event) => event,
        StoredEvent::Untagged(old) => match old {
            UntaggedEvent::SampledGaussian(g) => g.into(),
            UntaggedEvent::DistributedDiscreteGaussian(d) => d.into(),
            UntaggedEvent::TreeAggregation(t) => t.into(),
            UntaggedEvent::DdgSettlement(s) => s.into(),
            UntaggedEvent::UnsampledGaussian(g) => g.into(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Neighbours, Sampling};

    fn read(line: &str) -> PrivacyEvent {
        read_event(&mut serde_json::Deserializer::from_str(line)).unwrap()
    }

    /// Every kind is written tagged and reads back as itself; the untagged lines of earlier
    /// ledgers read as the kind they were written as, a tree round (which has an unsampled
    /// round's two fields and one more) as a tree round.
    #[test]
    fn stored_events_read_back_as_their_kind() {
        let unsampled = UnsampledGaussian {
            noise_multiplier: 1.36,
            neighbours: Neighbours::ZeroOut,
        };
        let banded = BandedRound {
            noise_multiplier: 2.0,
            step: 5,
            bands: 4,
            min_separation: 4,
            max_participations: Some(13),
            neighbours: Neighbours::ZeroOut,
        };
        let events: [PrivacyEvent; 4] = [
            GaussianRound::new(0.25, 1.2, Sampling::Poisson)
                .unwrap()
                .into(),
            TreeRound::zero_out(1.5, 6).into(),
            unsampled.into(),
            banded.into(),
        ];
        for event in events {
            let line = serde_json::to_string(&event).unwrap();
            assert!(line.starts_with(r#"{"mechanism":"#), "{line}");
            assert_eq!(read(&line), event, "{line}");
        }
        let untagged = [
            (
                r#"{"q":0.25,"noise_multiplier":1.2,"sampling":"poisson"}"#,
                events[0],
            ),
            (
                r#"{"noise_multiplier":1.5,"tree_step":6,"neighbours":"zero-out"}"#,
                events[1],
            ),
            (
                r#"{"noise_multiplier":1.36,"neighbours":"zero-out"}"#,
                events[2],
            ),
        ];
        for (line, event) in untagged {
            assert_eq!(read(line), event, "{line}");
        }
    }
}
