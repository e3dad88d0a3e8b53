//! The asynchronous loop (FedBuff: Nguyen et al., AISTATS 2022, Alg. 1): at most P clients
//! train at once, each free client is sent the current model, and each time M updates are
//! buffered the server takes a step, which the run records as a round (ledger entry, metrics
//! line, checkpoint). An update s steps stale enters with weight 1/sqrt(1 + s); one past
//! `buffer.max_staleness` is refused, and one for a version its sender was never sent ends the
//! sender's stream.
//!
//! A step's privacy event is spent when its buffer is full, before its release. What is buffered
//! but not released when the process stops (or crashes) is lost, with the training in flight:
//! nothing of it left the server and nothing of it was charged; a resumed run starts from the
//! last step's checkpoint, sends its model to free clients, and ignores uploads of models the
//! old process sent.

use super::{Coordinator, Progressing, RoundCounts};
use crate::edge::clients::Next;
use crate::error::ServerError;
use crate::identity::ids::ClientId;
use crate::records::output::{BufferMetrics, StoppedBy};
use crate::round::buffer::{Admission, Dispatches, staleness_weight};
use crate::round::events::Event;
use crate::round::policy::BufferPolicy;
use crate::round::rejection::Rejection;
use crate::run::build::Steps;
use crate::run::collection::{Received, Tally};
use fl_secagg::task::Task;
use rand::seq::IndexedRandom;
use std::time::{Duration, Instant};

/// How often the loop looks whether the last step's evaluation is done while it waits.
const EVALUATION_POLL: Duration = Duration::from_millis(20);

/// The step being buffered.
struct Step {
    /// R: its round; the model it sends is the one after R - 1 steps.
    round: u64,
    /// Its results.
    tally: Tally,
    /// Its buffer's figures.
    figures: BufferMetrics,
    /// Clients sent the model during it.
    dispatched: usize,
    /// Clients that stopped training without an upload during it.
    lost: usize,
    /// Bytes of tasks sent during it.
    bytes_down: u64,
    /// When it started.
    started: Instant,
}

impl Step {
    /// Round `round`'s empty buffer of M = `size` over `num_params` values.
    fn new(round: u64, size: usize, num_params: usize) -> Self {
        Self {
            round,
            tally: Tally::new(num_params),
            figures: BufferMetrics {
                size,
                ..BufferMetrics::default()
            },
            dispatched: 0,
            lost: 0,
            bytes_down: 0,
            started: Instant::now(),
        }
    }
}

impl Coordinator {
    /// The run's buffer policy (an asynchronous run's).
    fn buffer_policy(&mut self) -> Result<&mut BufferPolicy, ServerError> {
        match &mut self.pipeline.steps {
            Steps::Buffered(policy) => Ok(policy),
            Steps::Rounds(_) => Err(ServerError::Internal("a synchronous run".into())),
        }
    }

    /// Runs the asynchronous server steps from `first_round`; says what stopped them.
    pub(super) async fn buffered(
        &mut self,
        first_round: u64,
        mut run: Progressing<'_>,
    ) -> Result<StoppedBy, ServerError> {
        let policy = self.buffer_policy()?;
        let (size, max_staleness) = (policy.size, policy.max_staleness);
        let mut dispatches = Dispatches::new(first_round, run.resumed, max_staleness);
        let timeout = Duration::from_secs_f64(self.config.server.round_timeout_secs);
        let mut step = Step::new(first_round, size, run.global.len());
        self.open_version(first_round, run.global);
        let mut idle_since = Instant::now();
        while step.round <= self.config.server.rounds {
            self.dispatch(&mut step, &mut dispatches)?;
            let full = step.tally.completed >= size;
            // Nobody left to train and some results buffered: the step goes with what it has.
            let stalled = dispatches.training() == 0 && step.tally.completed > 0;
            if full || stalled {
                if stalled && !full {
                    tracing::warn!(round = step.round, "no client left to fill the buffer");
                }
                if !self.spend_step(step.round)? {
                    tracing::info!(round = step.round, "privacy budget reached: training stops");
                    return Ok(StoppedBy::Budget);
                }
                step = self.step(step, &mut dispatches, &mut run).await?;
                idle_since = Instant::now();
                continue;
            }
            // The last step's line goes out as soon as its evaluation is done.
            if run.evaluations.evaluated() {
                self.publish(run.evaluations).await?;
            }
            let mut wake = (dispatches.next_expiry(timeout)).unwrap_or(idle_since + timeout);
            if run.evaluations.pending.is_some() {
                wake = wake.min(Instant::now() + EVALUATION_POLL);
            }
            match self.clients.next_before(wake).await? {
                Next::Stopped => {
                    tracing::warn!(round = step.round, "interrupted: the buffer is discarded");
                    return Ok(StoppedBy::Interrupted);
                }
                Next::Deadline if Instant::now() < idle_since + timeout => {
                    step.lost += dispatches.expire(Instant::now(), timeout).len();
                }
                Next::Deadline => {
                    let late = dispatches.expire(Instant::now(), timeout);
                    step.lost += late.len();
                    if late.is_empty() && dispatches.training() == 0 {
                        tracing::error!(round = step.round, "no client can train: training ends");
                        return Ok(StoppedBy::Error);
                    }
                }
                Next::Event(event) => {
                    idle_since = Instant::now();
                    self.on_event(&mut step, &mut dispatches, event)?;
                }
            }
        }
        Ok(StoppedBy::Rounds)
    }

    /// Spends the privacy event of the step that buffers `round`; false when the budget does not
    /// allow it.
    fn spend_step(&mut self, round: u64) -> Result<bool, ServerError> {
        let event = self.buffer_policy()?.event();
        self.spend(round, event.as_ref())
    }

    /// Takes the server step of the full buffer `step`: releases, records and publishes it, and
    /// starts the next step, whose model is sent to free clients.
    async fn step(
        &mut self,
        step: Step,
        dispatches: &mut Dispatches,
        run: &mut Progressing<'_>,
    ) -> Result<Step, ServerError> {
        let ctx = self.buffer_policy()?.ctx(step.round);
        let counts = RoundCounts {
            connected: self.clients.connected().len(),
            sampled: step.dispatched,
            dropped: step.lost,
            refused: self.clients.take_refused(),
            bytes_down: step.bytes_down,
            started: step.started,
        };
        let size = step.figures.size;
        let figures = BufferMetrics {
            training: dispatches.training(),
            ..step.figures
        };
        self.publish(run.evaluations).await?;
        self.conclude(&ctx, &step.tally, counts, Some(figures), run)?;
        self.buffer_policy()?.stepped();
        let next = step.round + 1;
        let max_staleness = self.buffer_policy()?.max_staleness;
        dispatches.advance(next);
        self.clients
            .retire_before(next.saturating_sub(max_staleness));
        self.open_version(next, run.global);
        Ok(Step::new(next, size, run.global.len()))
    }

    /// Makes the model `global` the one free clients are sent, as round `round`'s task.
    fn open_version(&mut self, round: u64, global: &[f32]) {
        let ctx = match self.buffer_policy() {
            Ok(policy) => policy.ctx(round),
            Err(_) => return,
        };
        let instructions = self.pipeline.strategy.configure_round(&ctx);
        let task = Task {
            round,
            model: self.model.clone(),
            config: self.config.train.local_config(),
            local: instructions.local,
            secure: None,
            verified: None,
            admm: None,
            evaluate: self.config.eval.federated_at(round),
        };
        self.clients.add_version(&task, global);
    }

    /// Sends the current model to free clients, chosen at random, until P train.
    fn dispatch(
        &mut self,
        step: &mut Step,
        dispatches: &mut Dispatches,
    ) -> Result<(), ServerError> {
        let concurrency = self.buffer_policy()?.concurrency;
        let places = concurrency.saturating_sub(dispatches.training());
        if places == 0 {
            return Ok(());
        }
        let connected = self.clients.connected();
        let policy = self.buffer_policy()?;
        let free: Vec<ClientId> = (connected.into_iter())
            .filter(|&c| dispatches.is_free(c, step.round) && policy.may_contribute(c))
            .collect();
        let chosen: Vec<ClientId> = free
            .choose_multiple(&mut self.rng, places)
            .copied()
            .collect();
        for client in chosen {
            let sent = self.clients.send_version(client, step.round);
            if sent > 0 {
                dispatches.sent(client, step.round, Instant::now());
                step.dispatched += 1;
                step.bytes_down += sent;
            }
        }
        Ok(())
    }

    /// Handles one event while `step` buffers.
    fn on_event(
        &mut self,
        step: &mut Step,
        dispatches: &mut Dispatches,
        event: Event,
    ) -> Result<(), ServerError> {
        let event = match Received::read(event, &mut step.tally) {
            Ok(upload) => return self.on_upload(step, dispatches, upload),
            Err(other) => other,
        };
        match event {
            Event::Failed { client, round, .. } => {
                if dispatches.failed(client, round) {
                    step.lost += 1;
                }
            }
            Event::Disconnected(client) => {
                step.lost += usize::from(dispatches.stopped(client));
            }
            Event::SecAgg { client, .. } => {
                dispatches.stopped(client);
                self.clients.reject(client, Rejection::NotSecure);
            }
            // Uploads were read above.
            Event::Update { .. }
            | Event::Sign { .. }
            | Event::Verified { .. }
            | Event::Connected(_) => {}
            // The asynchronous mode has no aggregator tier.
            Event::Group { .. } | Event::GroupLost(_) => {}
        }
        Ok(())
    }

    /// Admits one upload into the buffer, or refuses it.
    fn on_upload(
        &mut self,
        step: &mut Step,
        dispatches: &mut Dispatches,
        upload: Received,
    ) -> Result<(), ServerError> {
        let (client, claimed) = (upload.client, upload.round);
        let round = step.round;
        if !self.clients.is_admitted(client) {
            tracing::warn!(round, client, "upload from a revoked client ignored");
            dispatches.stopped(client);
            return Ok(());
        }
        let staleness = match dispatches.admit(client, claimed, round) {
            Admission::Buffer { staleness } => staleness,
            Admission::TooStale { staleness } => {
                tracing::info!(
                    round,
                    client,
                    staleness,
                    "update past the maximum staleness refused"
                );
                step.figures.too_stale += 1;
                return Ok(());
            }
            Admission::Ignored(why) => {
                tracing::info!(round, client, claimed, why, "upload ignored");
                return Ok(());
            }
            Admission::Refused(rejection) => {
                dispatches.stopped(client);
                self.clients.reject(client, rejection);
                return Ok(());
            }
        };
        if !self.buffer_policy()?.may_contribute(client) {
            tracing::info!(round, client, "already in this tree: update ignored");
            return Ok(());
        }
        let (upload, reported) = match upload.check(staleness_weight(staleness)) {
            Ok(checked) => checked,
            Err(rejection) => {
                self.clients.reject(client, rejection);
                return Ok(());
            }
        };
        let ctx = self.buffer_policy()?.ctx(round);
        if let Err(e) = self.pipeline.strategy.absorb(&ctx, upload) {
            self.clients.reject(client, Rejection::Strategy(e));
            return Ok(());
        }
        self.buffer_policy()?.contributes(client);
        // The version the client trained on is the task it answers.
        step.tally
            .count(reported, self.config.eval.federated_at(claimed));
        step.figures.count(staleness);
        Ok(())
    }
}
