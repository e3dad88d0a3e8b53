//! The collection of a secure-aggregation round: carries the stage messages between the clients
//! and `fl_common::secagg::ServerRound`, with a deadline per stage, (in simulation) drops a
//! chosen fraction of the clients at a chosen stage, and hands the strategy only the survivors'
//! decoded sum.

use super::{Prepared, RoundWork, Tally};
use crate::ServerError;
use crate::clients::{Clients, Next};
use crate::config::{ConfigError, SecAggSection};
use crate::output::SecAggRoundMetrics;
use crate::registry::ClientId;
use crate::rejection::Rejection;
use crate::service::{Event, SecAggMessage, for_log};
use crate::strategy::{SumInput, Upload};
use crate::wire::{self, Outgoing};
use fl_common::privacy::PrivacyEvent;
use fl_common::secagg::{
    Calibration, PlainInputs, RoundResult, RoundShape, SecAggError, ServerRound, Stage,
};
use fl_proto::ring_elements;
use rand::rngs::StdRng;
use rand::seq::IteratorRandom;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// See the module documentation.
pub struct SecureCollection {
    /// `[secagg]`.
    pub settings: SecAggSection,
    /// How long the first stage waits (later stages: `stage_timeout_secs` each).
    pub round_timeout: Duration,
    /// S: the clients' clip bound.
    pub clip: f64,
    /// d.
    pub dim: usize,
    /// Whether the clients add distributed discrete Gaussian noise.
    pub distributed_noise: bool,
    /// Simulation only: the plain inputs, to measure the error of the unmasked sum.
    pub oracle: Option<Arc<PlainInputs>>,
}

/// Clients gone from a round: disconnected, failed, refused, or dropped by the injector.
type Gone = BTreeSet<ClientId>;

/// What the stages yield.
struct Stages {
    /// The unmasked sum, unless the round aborted.
    result: Result<RoundResult, SecAggError>,
    /// Bytes received.
    bytes_up: u64,
    /// Bytes of stage messages sent.
    bytes_down: u64,
}

impl SecureCollection {
    /// Fixes the round's quantisation and noise ([`Calibration::plan`]).
    pub fn prepare(&self, planned: usize, sampled: usize, z: f64) -> Result<Prepared, ServerError> {
        let calibration = Calibration::plan(&RoundShape {
            ring_bits: self.settings.bits,
            clip: self.clip,
            dim: self.dim,
            planned,
            sampled,
            min_survivor_fraction: self.settings.min_survivors,
            distributed_noise: self.distributed_noise.then_some(z),
        })
        .map_err(|e| ServerError::Config(ConfigError::Invalid(e.to_string())))?;
        Ok(Prepared {
            event: calibration.ddg.map(PrivacyEvent::from),
            calibration: Some(calibration),
        })
    }

    /// Runs the stages over the sampled clients (whose tasks are sent) and hands the decoded sum
    /// to the strategy.
    pub async fn collect(
        &self,
        clients: &mut Clients,
        work: RoundWork<'_>,
        prepared: Prepared,
        rng: &mut StdRng,
    ) -> Result<Tally, ServerError> {
        let Some(calibration) = prepared.calibration else {
            return Err(ServerError::Internal(
                "a secure round was not prepared".into(),
            ));
        };
        let round = work.ctx.round;
        let sampled = (work.sampled, work.started);
        let stages = self
            .run_stages(clients, round, sampled, &calibration, rng)
            .await?;
        let mut tally = Tally::new(0);
        tally.bytes_up = stages.bytes_up;
        tally.stage_bytes_down = stages.bytes_down;
        let mut metrics = SecAggRoundMetrics::default();
        match stages.result {
            Ok(result) => {
                metrics.survivors = result.survivors.len();
                metrics.dropouts_recovered = result.dropouts_recovered;
                metrics.max_abs_error = self.oracle_error(round, &calibration, &result);
                let contributors = result.survivors.len();
                let q = calibration.quantizer;
                let input = SumInput {
                    sum: q.decode(&result.sum),
                    contributors,
                    clip_bound: q.clip,
                    sensitivity: q.decoded_sensitivity(self.dim),
                    noise_std: calibration.noise_std(contributors),
                };
                match work.strategy.absorb(&work.ctx, Upload::Sum(input)) {
                    Ok(()) => tally.completed = contributors,
                    Err(e) => {
                        tracing::error!(round, error = %e, "the strategy refused the secure sum")
                    }
                }
            }
            Err(e) => {
                tracing::warn!(round, error = %e, "secure aggregation round aborted; model unchanged");
                metrics.aborted = Some(e.to_string());
            }
        }
        tally.secagg = Some(metrics);
        Ok(tally)
    }

    /// Simulation only: the largest error of the unmasked sum, in ring units.
    fn oracle_error(&self, round: u64, c: &Calibration, result: &RoundResult) -> Option<u64> {
        let ring = c.quantizer.ring;
        let plain = self
            .oracle
            .as_ref()?
            .sum(round, ring, &result.survivors, self.dim)?;
        let errors = plain.iter().zip(&result.sum);
        Some(
            errors
                .map(|(&p, &s)| ring.to_signed(ring.sub(s, p)).unsigned_abs())
                .max()
                .unwrap_or(0),
        )
    }

    /// Runs the stages (keys, shares, check, masked input, unmasking) of `round` over the
    /// sampled clients, from the round's start.
    async fn run_stages(
        &self,
        clients: &mut Clients,
        round: u64,
        (sampled, started): (&BTreeSet<ClientId>, Instant),
        calibration: &Calibration,
        rng: &mut StdRng,
    ) -> Result<Stages, ServerError> {
        let cfg = &self.settings;
        let mut server = ServerRound::new(
            round,
            calibration.quantizer.ring,
            self.dim,
            cfg.graph(sampled.len()),
            cfg.threshold,
            calibration.min_survivors,
            sampled.iter().copied(),
        );
        let (mut bytes_up, mut bytes_down) = (0, 0);
        let mut gone = Gone::new();
        let mut deadline = started + self.round_timeout;
        let result = loop {
            let stage = server.stage();
            let ring = calibration.quantizer.ring;
            bytes_up += wait_stage(clients, &mut server, &mut gone, deadline, ring).await?;
            deadline = Instant::now() + Duration::from_secs_f64(cfg.stage_timeout_secs);
            let messages = match close_stage(clients, &mut server, stage, &mut gone, rng) {
                Closed::Finished(result) => break result,
                Closed::Next(Err(e)) => break Err(e),
                Closed::Next(Ok(m)) => m,
            };
            // The injector's clients never see the next stage's message, as if they had dropped.
            if cfg.sim_dropout > 0.0 && server.stage() == cfg.sim_dropout_stage.withheld() {
                let candidates = messages
                    .iter()
                    .map(|(u, _)| *u)
                    .filter(|u| !gone.contains(u));
                let candidates: Vec<ClientId> = candidates.collect();
                let count = (cfg.sim_dropout * candidates.len() as f64).round() as usize;
                let dropped = candidates.into_iter().choose_multiple(rng, count);
                tracing::info!(round, stage = %server.stage(), dropped = dropped.len(), "dropout injector");
                gone.extend(dropped);
            }
            for (u, body) in messages.into_iter().filter(|(u, _)| !gone.contains(u)) {
                bytes_down += clients.send(u, vec![body]);
            }
        };
        Ok(Stages {
            result,
            bytes_up,
            bytes_down,
        })
    }
}

/// What closing a stage gave.
enum Closed {
    /// The next stage's message to each participant.
    Next(Result<Vec<(ClientId, Outgoing)>, SecAggError>),
    /// The round's unmasked sum (or why it aborted).
    Finished(Result<RoundResult, SecAggError>),
}

/// Closes `stage` and builds the next stage's messages.
fn close_stage(
    clients: &Clients,
    server: &mut ServerRound,
    stage: Stage,
    gone: &mut Gone,
    rng: &mut StdRng,
) -> Closed {
    let round = server.round();
    let next = match stage {
        Stage::AdvertiseKeys => server.close_keys(rng).map(|hoods| {
            let to = |(u, hood)| (u, wire::neighbours(round, &hood));
            hoods.into_iter().map(to).collect()
        }),
        Stage::ShareKeys => server.close_shares().map(|inboxes| {
            let to = |(u, inbox): (ClientId, Vec<_>)| (u, wire::share_inbox(round, &inbox));
            inboxes.into_iter().map(to).collect()
        }),
        Stage::CheckShares => server.close_checks().map(|proceed| {
            for &v in server.excluded() {
                gone.insert(v);
                clients.reject(v, Rejection::Excluded(round));
            }
            let to = |(u, p)| (u, wire::proceed(round, p));
            proceed.into_iter().map(to).collect()
        }),
        Stage::MaskedInput => server.close_masked().map(|survivors| {
            let message = wire::survivors(round, &survivors);
            survivors
                .into_iter()
                .map(|u| (u, message.clone()))
                .collect()
        }),
        Stage::Unmasking | Stage::Done => return Closed::Finished(server.finish()),
    };
    Closed::Next(next)
}

/// Feeds one stage's messages to `server` until every expected client answered or left, or the
/// deadline passed; returns the bytes received.
async fn wait_stage(
    clients: &mut Clients,
    server: &mut ServerRound,
    gone: &mut Gone,
    deadline: Instant,
    ring: fl_common::secagg::Ring,
) -> Result<u64, ServerError> {
    let round = server.round();
    let mut bytes_up = 0;
    while server.pending().iter().any(|c| !gone.contains(c)) {
        let event = match clients.next_before(deadline).await? {
            Next::Deadline => {
                tracing::warn!(round, stage = %server.stage(), "stage deadline passed");
                break;
            }
            Next::Stopped => break,
            Next::Event(e) => e,
        };
        match event {
            Event::SecAgg {
                client,
                round: r,
                message,
                bytes,
            } => {
                bytes_up += bytes;
                on_stage_message(clients, server, gone, ring, (client, r, message));
            }
            Event::Update { client, .. } | Event::Sign { client, .. } => {
                gone.insert(client);
                clients.reject(client, Rejection::SecureOnly);
            }
            Event::Failed {
                client,
                round: r,
                reason,
            } => {
                if r == round && gone.insert(client) {
                    tracing::warn!(round, client, reason = %for_log(&reason), "client failed its task");
                }
            }
            Event::Disconnected(client) => {
                gone.insert(client);
            }
            Event::Connected(_) => {}
        }
    }
    Ok(bytes_up)
}

/// Hands one stage message to `server`; a refused one ends its sender's part in the round.
fn on_stage_message(
    clients: &Clients,
    server: &mut ServerRound,
    gone: &mut Gone,
    ring: fl_common::secagg::Ring,
    (client, claimed, message): (ClientId, u64, SecAggMessage),
) {
    let round = server.round();
    if gone.contains(&client) {
        return;
    }
    if claimed < round {
        // A slow client's message of an earlier round: too late, not hostile.
        tracing::info!(round, client, late = claimed, "late stage message ignored");
        return;
    }
    if claimed != round {
        gone.insert(client);
        let current = round;
        let what = "stage message";
        clients.reject(
            client,
            Rejection::WrongRound {
                what,
                claimed,
                current,
            },
        );
        return;
    }
    let result = match message {
        SecAggMessage::Keys(keys) => server.receive_keys(client, keys),
        SecAggMessage::Shares(shares) => server.receive_shares(client, shares),
        SecAggMessage::Check(refused) => server.receive_check(client, refused),
        SecAggMessage::Masked(words) => match ring_elements(ring, &words) {
            Ok(y) => server.receive_masked(client, &y),
            Err(e) => Err(SecAggError::BadMaskedInput {
                from: client,
                problem: e.to_string(),
            }),
        },
        SecAggMessage::Reveal(reveals) => server.receive_reveal(client, reveals),
    };
    if let Err(e) = result {
        gone.insert(client);
        clients.reject(client, Rejection::SecAgg(e));
    }
}
