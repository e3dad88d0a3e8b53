//! The collection of individual uploads: every sampled client sends its dense update or SignDS
//! upload; each is admitted (round, sampling, count) and handed, with its declared local
//! release, to the strategy stack. A sampled client that loses its stream
//! has `reconnect_grace_secs` to come back (with the same identity) and get its task again.

use super::intake::Received;
use super::{RoundWork, Tally};
use crate::edge::clients::{Clients, Next};
use crate::error::ServerError;
use crate::identity::ids::ClientId;
use crate::round::events::{Event, for_log};
use crate::round::rejection::Rejection;
use crate::round::strategy::Upload;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// See the module documentation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlainCollection {
    /// How long a round waits for its results.
    pub round_timeout: Duration,
    /// How long a sampled client that lost its stream may take to come back.
    pub reconnect_grace: Duration,
    /// Whether uploads are updates u_k = w_k - w_t (FedAvg), whose moments V_c and U_s are
    /// recorded; IADMM's are primal iterates.
    pub update_moments: bool,
}

/// The sampled clients still expected, and those away until a time.
struct Waiting {
    /// Sampled clients that have not answered or dropped.
    clients: BTreeSet<ClientId>,
    /// Sampled clients without a stream, and until when they may come back.
    away: BTreeMap<ClientId, Instant>,
}

impl Waiting {
    /// Drops the clients whose grace ended; returns when the next one ends (or `deadline`).
    fn expire(&mut self, round: u64, deadline: Instant) -> Instant {
        let now = Instant::now();
        let clients = &mut self.clients;
        self.away.retain(|client, until| {
            let back_in_time = *until > now;
            if !back_in_time {
                clients.remove(client);
                tracing::warn!(round, client, "sampled client did not come back: dropped");
            }
            back_in_time
        });
        self.away.values().fold(deadline, |t, &u| t.min(u))
    }
}

impl Waiting {
    /// A sampled client lost its stream: it has `grace` to come back, or is dropped at once.
    fn lost(&mut self, round: u64, client: ClientId, grace: Duration) {
        if grace.is_zero() {
            self.clients.remove(&client);
            tracing::warn!(round, client, "sampled client disconnected");
        } else {
            self.away.insert(client, Instant::now() + grace);
            tracing::warn!(round, client, "sampled client lost its stream");
        }
    }
}

impl PlainCollection {
    /// Collects results until every sampled client answered or dropped, or the deadline.
    pub(crate) async fn collect(
        &self,
        clients: &mut Clients,
        mut work: RoundWork<'_>,
    ) -> Result<Tally, ServerError> {
        let round = work.ctx.round;
        let deadline = work.started + self.round_timeout;
        let mut waiting = Waiting {
            clients: work.sampled.clone(),
            away: BTreeMap::new(),
        };
        let mut tally = Tally::new(work.global.len());
        loop {
            let wake = waiting.expire(round, deadline);
            if waiting.clients.is_empty() {
                break;
            }
            let event = match clients.next_before(wake).await? {
                Next::Deadline if Instant::now() >= deadline => {
                    let missing = waiting.clients.len();
                    tracing::warn!(round, missing, "round deadline passed");
                    break;
                }
                // A grace period ended.
                Next::Deadline => continue,
                Next::Stopped => break,
                Next::Event(e) => e,
            };
            self.on_event(clients, &mut work, &mut waiting, &mut tally, event);
        }
        Ok(tally)
    }

    /// Handles one event of the round.
    fn on_event(
        &self,
        clients: &mut Clients,
        work: &mut RoundWork<'_>,
        waiting: &mut Waiting,
        tally: &mut Tally,
        event: Event,
    ) {
        let round = work.ctx.round;
        let event = match Received::read(event, tally) {
            Ok(upload) => return self.on_upload(clients, work, (waiting, tally), upload),
            Err(other) => other,
        };
        match event {
            Event::Failed {
                client,
                round: r,
                reason,
            } => {
                if r == round && waiting.clients.remove(&client) {
                    tracing::warn!(round, client, reason = %for_log(&reason), "client failed its task");
                }
            }
            Event::SecAgg { client, .. } => {
                waiting.clients.remove(&client);
                clients.reject(client, Rejection::NotSecure);
            }
            Event::Disconnected(client) if waiting.clients.contains(&client) => {
                let admitted = clients.is_admitted(client);
                let grace = if admitted {
                    self.reconnect_grace
                } else {
                    Duration::ZERO
                };
                waiting.lost(round, client, grace);
            }
            Event::Connected(client) if waiting.clients.contains(&client) => {
                // A stream opened after the task went out has not seen it: the task again.
                // (The event of the stream that got the task, read late, sends nothing.)
                waiting.away.remove(&client);
                let (strategy, global) = (&*work.strategy, work.global);
                let sent =
                    clients.send_task(client, || strategy.views().client_tensor(client, global));
                if sent > 0 {
                    tally.stage_bytes_down += sent;
                    tracing::info!(round, client, "sampled client is back: task sent again");
                }
            }
            // Uploads were read above; other clients' stream events change nothing here.
            Event::Update { .. } | Event::Sign { .. } | Event::Verified { .. } => {}
            Event::Connected(_) | Event::Disconnected(_) => {}
            // A round of this process's own clients has no group.
            Event::Group { .. } | Event::GroupLost(_) => {}
        }
    }

    /// Admits, checks and absorbs one upload; a refused upload ends its client's stream.
    fn on_upload(
        &self,
        clients: &Clients,
        work: &mut RoundWork<'_>,
        (waiting, tally): (&mut Waiting, &mut Tally),
        upload: Received,
    ) {
        let client = upload.client;
        if !admit(clients, work, &mut waiting.clients, &upload) {
            return;
        }
        let (upload, reported) = match upload.check(1.0) {
            Ok(checked) => checked,
            Err(rejection) => return clients.reject(client, rejection),
        };
        if let Upload::Dense(update) = &upload
            && self.update_moments
            && update.values.len() == work.global.len()
        {
            tally.moments.add(&update.values);
        }
        match work.strategy.absorb(&work.ctx, upload) {
            Ok(()) => tally.count(reported, work.evaluate),
            Err(e) => clients.reject(client, Rejection::Strategy(e)),
        }
    }
}

/// Checks what an upload must satisfy in a round: its round, and that its sender was sampled
/// and has not answered yet. A late or repeated upload is ignored; any other failure refuses and
/// drops the client. Returns whether the upload may go on to its checks.
fn admit(
    clients: &Clients,
    work: &RoundWork<'_>,
    waiting: &mut BTreeSet<ClientId>,
    upload: &Received,
) -> bool {
    let (round, client) = (work.ctx.round, upload.client);
    if !clients.is_admitted(client) {
        tracing::warn!(round, client, "upload from a revoked client ignored");
        waiting.remove(&client);
        return false;
    }
    // Too late for its round (the client was slow or reconnected): not an attack.
    if upload.round < round {
        tracing::info!(round, client, late = upload.round, "late upload ignored");
        return false;
    }
    // Sent twice, e.g. once before and once after a reconnect: the first one counts.
    if upload.round == round && work.sampled.contains(&client) && !waiting.contains(&client) {
        tracing::info!(round, client, "second upload for the round ignored");
        return false;
    }
    let rejection = if upload.round != round {
        waiting.remove(&client);
        Rejection::WrongRound {
            what: "update",
            claimed: upload.round,
            current: round,
        }
    } else if !waiting.remove(&client) {
        Rejection::NotExpected { client, round }
    } else {
        return true;
    };
    clients.reject(client, rejection);
    false
}
