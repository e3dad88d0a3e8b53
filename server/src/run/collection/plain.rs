//! The collection of individual uploads: every sampled client sends its dense update or SignDS
//! upload; each is admitted (round, sampling, count) and handed, with its declared local
//! release, to the strategy stack. A sampled client that loses its stream
//! has `reconnect_grace_secs` to come back (with the same identity) and get its task again.

use super::{RoundWork, Tally};
use crate::edge::clients::{Clients, Next};
use crate::error::ServerError;
use crate::identity::ids::ClientId;
use crate::round::events::{Declared, Event, UploadHeader, for_log};
use crate::round::rejection::Rejection;
use crate::round::strategy::{ClientUpdate, SignUpload, Upload};
use fl_common::model::CheckedUpdate;
use fl_common::privacy::Release;
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

/// What an upload says about itself.
struct Claim {
    /// The round it is for.
    round: u64,
    /// n_k, for plain updates only (the trusted curator's FedAvg weight).
    num_examples: Option<u64>,
    /// Its declared local protection.
    release: Declared,
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
        match event {
            Event::Update {
                client,
                header,
                values,
                bytes,
            } => {
                tally.bytes_up += bytes;
                self.on_update(clients, work, (waiting, tally), client, header, values);
            }
            Event::Sign {
                client,
                round: claimed,
                sign,
                indices,
                release,
                bytes,
            } => {
                tally.bytes_up += bytes;
                let claim = Claim {
                    round: claimed,
                    num_examples: None,
                    release,
                };
                on_sign(
                    clients,
                    work,
                    (waiting, tally),
                    (client, claim),
                    (sign, indices),
                );
            }
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
                let sent = clients.send_task(client, || strategy.client_tensor(client, global));
                if sent > 0 {
                    tally.stage_bytes_down += sent;
                    tracing::info!(round, client, "sampled client is back: task sent again");
                }
            }
            Event::Connected(_) | Event::Disconnected(_) => {}
        }
    }

    /// Admits and absorbs one dense update.
    fn on_update(
        &self,
        clients: &Clients,
        work: &mut RoundWork<'_>,
        (waiting, tally): (&mut Waiting, &mut Tally),
        client: ClientId,
        header: UploadHeader,
        values: Vec<f32>,
    ) {
        // Under a local mechanism only the release travels: every upload weighs 1.
        let (claim, loss, evaluation) = match header {
            UploadHeader::Plain {
                round,
                num_examples,
                train_loss,
                evaluation,
            } => {
                let release = None;
                let num_examples = Some(num_examples);
                let claim = Claim {
                    round,
                    num_examples,
                    release,
                };
                (claim, train_loss, evaluation)
            }
            UploadHeader::Released { round, release } => {
                let num_examples = None;
                let claim = Claim {
                    round,
                    num_examples,
                    release,
                };
                (claim, None, None)
            }
        };
        let num_examples = claim.num_examples;
        let Some(release) = admit(clients, work, &mut waiting.clients, client, claim) else {
            return;
        };
        // Checked once, here: every later pass takes the check and the norm from the type.
        let values = match CheckedUpdate::new(values) {
            Ok(values) => values,
            Err(e) => return clients.reject(client, Rejection::Strategy(e.into())),
        };
        if self.update_moments && values.len() == work.global.len() {
            tally.moments.add(&values);
        }
        let update = ClientUpdate {
            client,
            num_examples: num_examples.unwrap_or(1),
            values,
            release,
            staleness_weight: 1.0,
        };
        if absorb(clients, work, client, update.into()) {
            tally.completed += 1;
            if let Some(loss) = loss.filter(|l| l.is_finite()) {
                tally.losses += 1;
                tally.train_loss_sum += f64::from(loss);
            }
            // Only a round that asked for them counts the figures.
            if let Some((loss, accuracy, n)) = evaluation.filter(|_| work.evaluate) {
                (tally.federated_eval.get_or_insert_default()).add(loss, accuracy, n);
            }
        }
    }
}

/// Admits and absorbs one SignDS upload (s, J).
fn on_sign(
    clients: &Clients,
    work: &mut RoundWork<'_>,
    (waiting, tally): (&mut Waiting, &mut Tally),
    (client, claim): (ClientId, Claim),
    (sign, indices): (i64, Vec<u64>),
) {
    let Some(release) = admit(clients, work, &mut waiting.clients, client, claim) else {
        return;
    };
    let upload = SignUpload {
        client,
        release,
        sign,
        indices,
    };
    if absorb(clients, work, client, Upload::Sign(upload)) {
        tally.completed += 1;
    }
}

/// Hands an admitted upload to the strategy stack; a refused upload ends its client's stream.
/// Returns whether it counted.
fn absorb(clients: &Clients, work: &mut RoundWork<'_>, client: ClientId, upload: Upload) -> bool {
    match work.strategy.absorb(&work.ctx, upload) {
        Ok(()) => true,
        Err(e) => {
            clients.reject(client, Rejection::Strategy(e));
            false
        }
    }
}

/// Checks what every upload must satisfy: its round, that its sender was sampled and has not
/// answered yet, its example count; and reads its declared local release (which the strategy
/// stack checks). On failure the client is refused and dropped and `None` returned.
fn admit(
    clients: &Clients,
    work: &RoundWork<'_>,
    waiting: &mut BTreeSet<ClientId>,
    client: ClientId,
    claim: Claim,
) -> Option<Option<Release>> {
    let round = work.ctx.round;
    if !clients.is_admitted(client) {
        tracing::warn!(round, client, "upload from a revoked client ignored");
        waiting.remove(&client);
        return None;
    }
    // Too late for its round (the client was slow or reconnected): not an attack.
    if claim.round < round {
        tracing::info!(round, client, late = claim.round, "late upload ignored");
        return None;
    }
    // Sent twice, e.g. once before and once after a reconnect: the first one counts.
    if claim.round == round && work.sampled.contains(&client) && !waiting.contains(&client) {
        tracing::info!(round, client, "second upload for the round ignored");
        return None;
    }
    let rejection = if claim.round != round {
        waiting.remove(&client);
        Some(Rejection::WrongRound {
            what: "update",
            claimed: claim.round,
            current: round,
        })
    } else if !waiting.remove(&client) {
        Some(Rejection::NotExpected { client, round })
    } else if claim.num_examples == Some(0) {
        Some(Rejection::NoExamples)
    } else {
        None
    };
    if let Some(rejection) = rejection {
        clients.reject(client, rejection);
        return None;
    }
    (claim.release.transpose())
        .map_err(|reason| clients.reject(client, Rejection::Release(reason)))
        .ok()
}
