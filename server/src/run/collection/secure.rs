//! The collection of a secure-aggregation round: carries the stage messages between the clients
//! and `fl_secagg::ServerRound`, with a deadline per stage, (in simulation) drops a
//! chosen fraction of the clients at a chosen stage, and hands the strategy only the survivors'
//! decoded sum.

use super::{Prepared, RoundWork, Tally};
use crate::config::SecureSettings;
use crate::edge::clients::{Clients, Next};
use crate::error::ServerError;
use crate::identity::ids::ClientId;
use crate::records::output::SecAggRoundMetrics;
use crate::round::events::{Event, for_log};
use crate::round::policy::{RoundPlan, secure_extent};
use crate::round::rejection::Rejection;
use crate::round::strategy::{SumInput, Upload};
use fl_secagg::{
    AdvertiseKeys, Calibration, Consistency, Phase, PlainInputs, RoundResult, RoundSetup,
    RoundShape, RoundTag, SecAggError, ServerStage, Stage, StageMessage, Unmasking,
};
use rand::rngs::StdRng;
use rand::seq::IteratorRandom;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// See the module documentation.
pub(crate) struct SecureCollection {
    /// The run's secure-round settings.
    pub settings: SecureSettings,
    /// How long the first stage waits (later stages: `settings.stage_timeout` each).
    pub round_timeout: Duration,
    /// S: the clients' clip bound.
    pub clip: f64,
    /// d.
    pub dim: usize,
    /// Simulation only: the plain inputs, to measure the error of the unmasked sum.
    pub oracle: Option<Arc<PlainInputs>>,
    /// This process's run id, drawn from the OS when the run's pipeline is built (again on
    /// resume): with the federation and the round it names one attempt, which clients take
    /// part in once.
    pub run: u64,
    /// The round's sums are its groups' (a coordinator of aggregators): the code is planned for
    /// the groups' sizes, not the round's.
    pub grouped: bool,
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
    /// Whether this collection's rounds are signed (it checks the clients' certificates).
    pub(crate) fn signed(&self) -> bool {
        self.settings.verifier.is_some()
    }

    /// The round's quantisation and noise: the policy's, when it fixed them with its noise, or
    /// a noiseless code for the round's size ([`Calibration::plan`]).
    pub(crate) fn prepare(&self, plan: &RoundPlan) -> Result<Prepared, ServerError> {
        let (fewest, most) = secure_extent(plan.planned, &plan.sampled, self.grouped);
        let calibration = match plan.calibration {
            Some(c) => c,
            None => Calibration::plan(&RoundShape {
                ring_bits: self.settings.bits,
                clip: self.clip,
                dim: self.dim,
                planned: fewest,
                sampled: most,
                min_survivor_fraction: self.settings.min_survivors,
                calibrate_for: self.settings.min_survivors,
                distributed_noise: None,
                // No noise: nothing is accounted.
                neighbours: Default::default(),
            })
            .map_err(ServerError::Calibration)?,
        };
        if let Some(policy) = &self.settings.policy {
            let q = calibration.quantizer;
            let floor = policy.min_noise_variance(q.clip, q.scale);
            let variance = calibration.ddg.map_or(0, |d| d.client_variance);
            if variance < floor {
                return Err(ServerError::Config(crate::config::ConfigError::Invalid(
                    format!(
                        "federation {:?} policy: each client's noise variance must be at least \
                     {floor} levels (min_noise_multiplier = {}), this round's calibration gives \
                     {variance}: use secagg.noise = \"distributed\" with a larger \
                     privacy.noise_multiplier",
                        policy.federation, policy.min_noise_multiplier
                    ),
                )));
            }
        }
        Ok(Prepared {
            calibration: Some(calibration),
            signed: self.signed(),
            federation: (self.settings.policy.as_ref())
                .map_or_else(String::new, |p| p.federation.clone()),
            run: self.run,
            verified: None,
        })
    }

    /// Runs the stages over the sampled clients (whose tasks are sent) and hands the decoded sum
    /// to the strategy.
    pub(crate) async fn collect(
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
        let Some(digest) = work.task_digest else {
            return Err(ServerError::Internal(
                "a secure round's task has no digest".into(),
            ));
        };
        let tag = RoundTag { round, digest };
        let sampled = (work.sampled, work.started);
        let stages = self
            .run_stages(clients, tag, sampled, &calibration, rng)
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
        tag: RoundTag,
        (sampled, started): (&BTreeSet<ClientId>, Instant),
        calibration: &Calibration,
        rng: &mut StdRng,
    ) -> Result<Stages, ServerError> {
        let cfg = &self.settings;
        let setup = RoundSetup {
            tag,
            ring: calibration.quantizer.ring,
            dim: self.dim,
            graph: cfg.graph(sampled.len()),
            threshold_fraction: cfg.threshold,
            min_survivors: calibration.min_survivors,
            verifier: cfg.verifier.clone(),
        };
        let keys = AdvertiseKeys::new(setup, sampled.iter().copied());
        let mut io = StageIo {
            clients,
            round: tag.round,
            gone: Gone::new(),
            deadline: started + self.round_timeout,
            bytes_up: 0,
            bytes_down: 0,
        };
        let result = self.protocol(&mut io, keys, rng).await?;
        Ok(Stages {
            result,
            bytes_up: io.bytes_up,
            bytes_down: io.bytes_down,
        })
    }

    /// The protocol, phase by phase: each is waited for, closed into its successor, and the
    /// successor's stage messages delivered. A phase that cannot close aborts the round.
    async fn protocol(
        &self,
        io: &mut StageIo<'_>,
        keys: AdvertiseKeys,
        rng: &mut StdRng,
    ) -> Result<Result<RoundResult, SecAggError>, ServerError> {
        macro_rules! closed {
            ($result:expr) => {
                match $result {
                    Ok(next) => next,
                    Err(e) => return Ok(Err(e)),
                }
            };
        }
        let keys = io.wait(keys, self.stage_timeout()).await?;
        let (shares, hoods) = closed!(keys.close());
        let messages = (hoods.into_iter()).map(|(u, h)| (u, ServerStage::Neighbours(h)));
        io.deliver(self.injected(Stage::ShareKeys), messages.collect(), rng);
        let shares = io.wait(shares, self.stage_timeout()).await?;
        let (check, inboxes) = closed!(shares.close());
        let messages = (inboxes.into_iter()).map(|(u, i)| (u, ServerStage::ShareInbox(i)));
        io.deliver(self.injected(Stage::CheckShares), messages.collect(), rng);
        let check = io.wait(check, self.stage_timeout()).await?;
        let (masked, checked) = closed!(check.close());
        for v in checked.excluded {
            io.gone.insert(v);
            io.clients.reject(v, Rejection::Excluded(io.round));
        }
        let messages = (checked.proceed.into_iter()).map(|(u, p)| (u, ServerStage::Proceed(p)));
        io.deliver(self.injected(Stage::MaskedInput), messages.collect(), rng);
        let masked = io.wait(masked, self.stage_timeout()).await?;
        let (unmasking, survivors) = closed!(masked.close());
        let message = ServerStage::Survivors(survivors.clone());
        let messages = survivors.into_iter().map(|u| (u, message.clone()));
        io.deliver(self.injected(Stage::Unmasking), messages.collect(), rng);
        let unmasking = match self.settings.verifier {
            None => unmasking,
            Some(_) => closed!(Self::consistency(io, unmasking, self.stage_timeout(), rng).await?),
        };
        let unmasking = io.wait(unmasking, self.stage_timeout()).await?;
        Ok(unmasking.finish())
    }

    /// A signed round's consistency check: the survivors' signatures over U1 and U3 in, each
    /// signer's neighbours' signatures out; the unmasking then asks only the signers.
    async fn consistency(
        io: &mut StageIo<'_>,
        unmasking: Unmasking,
        timeout: Duration,
        rng: &mut StdRng,
    ) -> Result<Result<Unmasking, SecAggError>, ServerError> {
        let consistency = io.wait(Consistency::new(unmasking), timeout).await?;
        Ok(consistency.close().map(|(unmasking, forwarded)| {
            let messages = (forwarded.into_iter()).map(|(u, s)| (u, ServerStage::Endorsements(s)));
            io.deliver(0.0, messages.collect(), rng);
            unmasking
        }))
    }

    /// How long each stage after the first waits.
    fn stage_timeout(&self) -> Duration {
        self.settings.stage_timeout
    }

    /// The fraction of clients the simulation's dropout injector withholds `stage`'s message
    /// from (0 for every other stage).
    fn injected(&self, stage: Stage) -> f64 {
        let (fraction, at) = self.settings.dropout;
        match fraction > 0.0 && stage == at.withheld() {
            true => fraction,
            false => 0.0,
        }
    }
}

/// The network side of a round's stages: events in, stage messages out, and who has left.
struct StageIo<'a> {
    clients: &'a mut Clients,
    round: u64,
    gone: Gone,
    /// When the phase being waited for closes.
    deadline: Instant,
    bytes_up: u64,
    bytes_down: u64,
}

impl StageIo<'_> {
    /// Feeds `phase` its stage's messages until every expected client answered or left, or the
    /// deadline passed; the next phase then gets `next_timeout`.
    async fn wait<P: Phase>(
        &mut self,
        mut phase: P,
        next_timeout: Duration,
    ) -> Result<P, ServerError> {
        let round = phase.round();
        while phase.pending().iter().any(|c| !self.gone.contains(c)) {
            let event = match self.clients.next_before(self.deadline).await? {
                Next::Deadline => {
                    tracing::warn!(round, stage = %P::STAGE, "stage deadline passed");
                    break;
                }
                Next::Stopped => break,
                Next::Event(e) => e,
            };
            self.on_event(&mut phase, event);
        }
        self.deadline = Instant::now() + next_timeout;
        Ok(phase)
    }

    /// Handles one event while `phase` runs.
    fn on_event<P: Phase>(&mut self, phase: &mut P, event: Event) {
        let round = phase.round();
        match event {
            Event::SecAgg {
                client,
                round: claimed,
                message,
                bytes,
            } => {
                self.bytes_up += bytes;
                self.on_stage_message(phase, client, claimed, message);
            }
            Event::Update { client, .. }
            | Event::Sign { client, .. }
            | Event::Verified { client, .. } => {
                self.gone.insert(client);
                self.clients.reject(client, Rejection::SecureOnly);
            }
            Event::Failed {
                client,
                round: r,
                reason,
            } => {
                if r == round && self.gone.insert(client) {
                    tracing::warn!(round, client, reason = %for_log(&reason), "client failed its task");
                }
            }
            Event::Disconnected(client) => {
                self.gone.insert(client);
            }
            Event::Connected(_) => {}
            // Secure rounds run in one process: no group takes part.
            Event::Group { .. } | Event::GroupLost(_) => {}
        }
    }

    /// Hands one stage message to `phase`; a refused one ends its sender's part in the round.
    fn on_stage_message<P: Phase>(
        &mut self,
        phase: &mut P,
        client: ClientId,
        claimed: u64,
        message: StageMessage,
    ) {
        let round = phase.round();
        if self.gone.contains(&client) {
            return;
        }
        if claimed < round {
            // A slow client's message of an earlier round: too late, not hostile.
            tracing::info!(round, client, late = claimed, "late stage message ignored");
            return;
        }
        if claimed != round {
            self.gone.insert(client);
            let (what, current) = ("stage message", round);
            let rejection = Rejection::WrongRound {
                what,
                claimed,
                current,
            };
            self.clients.reject(client, rejection);
            return;
        }
        let result = phase.receive(client, message);
        if let Err(e) = result {
            self.gone.insert(client);
            self.clients.reject(client, Rejection::SecAgg(e));
        }
    }

    /// Sends each remaining client its message of the next stage, except a `withheld` fraction
    /// of them (the simulation's dropout injector: as if they had dropped).
    fn deliver(&mut self, withheld: f64, messages: Vec<(ClientId, ServerStage)>, rng: &mut StdRng) {
        if withheld > 0.0 {
            let candidates: Vec<ClientId> = (messages.iter().map(|(u, _)| *u))
                .filter(|u| !self.gone.contains(u))
                .collect();
            let count = (withheld * candidates.len() as f64).round() as usize;
            let dropped = candidates.into_iter().choose_multiple(rng, count);
            tracing::info!(dropped = dropped.len(), "dropout injector");
            self.gone.extend(dropped);
        }
        for (u, message) in messages.into_iter().filter(|(u, _)| !self.gone.contains(u)) {
            self.bytes_down += self.clients.send_stage(u, self.round, &message);
        }
    }
}
