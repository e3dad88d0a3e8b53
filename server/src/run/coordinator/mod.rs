//! The coordinator: waits for K clients, then each round samples m_t of the connected clients,
//! passes the budget gate, sends the task, lets the run's [`Collection`] gather results into the
//! strategy stack, releases the aggregate if the release rule and the model check allow, and
//! checkpoints the round. The released model's test evaluation (a built-in network's) runs while
//! the next round's clients train; the round's metrics line is published when it is done. It never branches on the privacy
//! mode: `crate::run::build` decided the pipeline.

use crate::config::RunConfig;
use crate::edge::clients::Clients;
use crate::error::ServerError;
use crate::identity::ids::ClientId;
use crate::operator::live_page::LivePage;
use crate::operator::telemetry::Telemetry;
use crate::records::checkpoint::{Checkpoint, Progress};
use crate::records::output::{
    BufferMetrics, RoundMetrics, RunFolder, SecAggSummary, StoppedBy, Summary,
};
use crate::round::policy::Shortfall;
use crate::round::strategy::{RoundContext, RoundOutcome};
use crate::run::build::{Pipeline, Steps};
use crate::run::collection::{RoundWork, Tally};
use crate::run::model_setup::TestSet;
use fl_model::{Evaluation, Model, check_model};
use fl_privacy::{PrivacyEvent, Sampling};
use fl_secagg::Calibration;
use fl_secagg::task::{SecureTask, Task, TaskDigest};
use rand::rngs::StdRng;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

mod buffered;
mod join;
mod report;

/// Called with each round's metrics (e.g. to drive a progress bar).
pub type Observer = Arc<dyn Fn(&RoundMetrics) + Send + Sync>;

/// Owns all round state; the gRPC handlers only feed it events through [`Clients`].
pub(crate) struct Coordinator {
    /// Events in, messages out.
    pub clients: Clients,
    /// The validated configuration.
    pub config: RunConfig,
    /// The model.
    pub model: Model,
    /// The per-round test evaluation (a built-in network's; none for an external model).
    pub test: Option<TestSet>,
    /// What the privacy mode and algorithm decided.
    pub pipeline: Pipeline,
    /// CSPRNG for sampling and initialisation.
    pub rng: StdRng,
    /// Where outputs go.
    pub folder: RunFolder,
    /// Called after every round.
    pub observer: Option<Observer>,
    /// The checkpoint an interrupted run resumes from.
    pub resume: Option<Checkpoint>,
    /// Given starting weights (`model.init`), for a run that does not resume.
    pub initial: Option<Vec<f32>>,
    /// The Prometheus metrics.
    pub telemetry: Arc<Telemetry>,
    /// The live run page, when it is served.
    pub page: Option<Arc<LivePage>>,
    /// What the log last said of rounds drawing fewer than m clients.
    pub shortfall: Shortfall,
}

/// What became of a round's aggregate.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Release {
    /// It replaced the global model.
    Released,
    /// The global model stays, for this reason (the metrics line's `skipped`).
    Withheld(String),
}

/// The run's totals, carried across rounds and checkpoints.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunTotals {
    /// Rounds whose aggregate updated the model.
    pub rounds_completed: u64,
    /// Uploads absorbed.
    pub client_updates: u64,
    /// Bytes received.
    pub bytes_up: u64,
    /// Bytes sent.
    pub bytes_down: u64,
    /// Wall-clock seconds before this process took over (a resumed run).
    pub earlier_seconds: f64,
    /// The secure rounds' figures, for a secure collection.
    pub secagg: Option<SecAggSummary>,
}

impl RunTotals {
    /// Totals where `progress` left them.
    fn resumed(progress: &Progress) -> Self {
        Self {
            rounds_completed: progress.rounds_completed,
            client_updates: progress.client_updates,
            bytes_up: progress.bytes_up,
            bytes_down: progress.bytes_down,
            earlier_seconds: progress.wall_seconds,
            secagg: None,
        }
    }

    /// Adds one round's figures.
    fn add(&mut self, tally: &Tally, bytes_down: u64, applied: bool) {
        self.rounds_completed += u64::from(applied);
        self.client_updates += tally.completed as u64;
        self.bytes_up += tally.bytes_up;
        self.bytes_down += bytes_down;
        if let (Some(totals), Some(m)) = (&mut self.secagg, &tally.secagg) {
            totals.add(m);
        }
    }
}

/// What every server step works on, carried from step to step.
struct Progressing<'a> {
    /// w_t.
    global: &'a mut Vec<f32>,
    /// The run's totals.
    totals: &'a mut RunTotals,
    /// When this process started training.
    started: Instant,
    /// Whether this process resumed an interrupted run.
    resumed: bool,
    /// The test evaluations of released models.
    evaluations: &'a mut Evaluations,
}

/// How a round ended.
enum RoundEnd {
    /// It ran and is checkpointed; its evaluation may still be running.
    Ran,
    /// Training stops before it.
    Stop(StoppedBy),
}

/// A checkpointed round whose metrics line waits for the test evaluation of its model.
struct PendingRound {
    /// The line, but for `test_accuracy` and `test_loss`.
    metrics: RoundMetrics,
    /// The evaluation, on the blocking pool, if the server evaluates the model.
    evaluation: Option<tokio::task::JoinHandle<Evaluation>>,
}

/// The test evaluations of released models: at most one runs (overlapping the next round's
/// training), and the last one done.
#[derive(Default)]
struct Evaluations {
    pending: Option<PendingRound>,
    last: Option<Evaluation>,
}

impl Evaluations {
    /// Whether a round waits to be published and its evaluation is done.
    fn evaluated(&self) -> bool {
        (self.pending.as_ref())
            .is_some_and(|p| p.evaluation.as_ref().is_none_or(|e| e.is_finished()))
    }
}

/// A round's own figures beyond its tally.
struct RoundCounts {
    /// Clients with a live stream when it was planned.
    connected: usize,
    /// |Z_t| (asynchronous: the clients sent the model during the step).
    sampled: usize,
    /// Clients that gave no result (asynchronous: those that stopped training without one).
    dropped: usize,
    /// Clients refused during it.
    refused: usize,
    /// Bytes sent in the round.
    bytes_down: u64,
    /// When the round started.
    started: Instant,
}

/// A round as fixed before its tasks go out.
struct Planned {
    ctx: RoundContext,
    connected: usize,
    sampled: BTreeSet<ClientId>,
    prepared: crate::run::collection::Prepared,
}

impl Coordinator {
    /// Runs the whole training; writes the model and summary at the end, whatever ended it.
    pub(crate) async fn run(mut self) -> Result<Summary, ServerError> {
        let resumed = self.resume.is_some();
        let (mut global, first_round, mut totals) = self.start()?;
        self.await_clients(first_round).await?;
        let started = Instant::now();
        let mut evaluations = Evaluations::default();
        let run = Progressing {
            global: &mut global,
            totals: &mut totals,
            started,
            resumed,
            evaluations: &mut evaluations,
        };
        let stopped_by = match self.pipeline.steps {
            Steps::Rounds(_) => self.rounds(first_round, run).await?,
            Steps::Buffered(_) => self.buffered(first_round, run).await?,
        };
        self.publish(&mut evaluations).await?;
        let resuming = stopped_by == StoppedBy::Interrupted;
        self.clients
            .shutdown_all(self.config.server.rounds, resuming);
        let released = self.pipeline.strategy.views().average.unwrap_or(&global);
        let eval = (evaluations.last).or_else(|| self.test.as_ref().map(|t| t.evaluate(released)));
        self.folder.write_model(&self.model, released)?;
        let seconds = totals.earlier_seconds + started.elapsed().as_secs_f64();
        let summary = self.summary(&totals, eval.as_ref(), stopped_by, seconds)?;
        if let Some(accounts) = self.pipeline.strategy.views().local_accounts {
            self.folder.write_local_privacy(&accounts.per_client())?;
        }
        self.folder.write_summary(&summary)?;
        if let Some(page) = &self.page {
            page.finish(stopped_by);
        }
        Ok(summary)
    }

    /// The model, first round and totals to start from: the checkpoint's, or a fresh model
    /// (checkpointed as round 0, so that a crash before the first round ends can resume).
    fn start(&mut self) -> Result<(Vec<f32>, u64, RunTotals), ServerError> {
        let secagg = self.pipeline.collection.secure_summary();
        let Some(checkpoint) = self.resume.take() else {
            let init = match (self.initial.take(), self.model.network()) {
                (Some(given), _) => given,
                (None, Some(spec)) => spec.init(&mut self.rng),
                (None, None) => {
                    return Err(ServerError::Internal(
                        "an external model without weights".into(),
                    ));
                }
            };
            let totals = RunTotals {
                secagg,
                ..RunTotals::default()
            };
            self.checkpoint(0, &totals, &init, None)?;
            return Ok((init, 1, totals));
        };
        let strategy = &mut self.pipeline.strategy;
        strategy
            .restore(checkpoint.strategy_state())
            .map_err(ServerError::Restore)?;
        let next = checkpoint.progress.round + 1;
        tracing::info!(checkpoint = next - 1, next, "resuming from the checkpoint");
        let totals = RunTotals {
            secagg,
            ..RunTotals::resumed(&checkpoint.progress)
        };
        Ok((checkpoint.model, next, totals))
    }

    /// Runs the synchronous rounds from `first_round`; says what stopped them.
    async fn rounds(
        &mut self,
        first_round: u64,
        run: Progressing<'_>,
    ) -> Result<StoppedBy, ServerError> {
        let mut run = run;
        for round in first_round..=self.config.server.rounds {
            let end = self.round(round, &mut run).await?;
            if let RoundEnd::Stop(reason) = end {
                return Ok(reason);
            }
        }
        Ok(StoppedBy::Rounds)
    }

    /// Runs round `round` from `global`; the previous round's metrics are published once this
    /// round's tasks are out.
    async fn round(
        &mut self,
        round: u64,
        run: &mut Progressing<'_>,
    ) -> Result<RoundEnd, ServerError> {
        let t0 = Instant::now();
        let planned = match self.plan(round)? {
            Ok(planned) => planned,
            Err(stop) => return Ok(RoundEnd::Stop(stop)),
        };
        let ctx = planned.ctx;
        let (down, task_digest) = self.start_round(&ctx, run.global, &planned);
        self.publish(run.evaluations).await?;
        let work = RoundWork {
            ctx,
            sampled: &planned.sampled,
            started: t0,
            strategy: &mut *self.pipeline.strategy,
            global: run.global,
            evaluate: self.config.eval.federated_at(round),
            task_digest,
        };
        // A span per round's collection: what is logged while collecting names the round.
        let calibration = planned.prepared.calibration;
        let tally = (self.pipeline.collection)
            .collect(&mut self.clients, work, planned.prepared, &mut self.rng)
            .instrument(tracing::info_span!("round", round))
            .await?;
        // A round the operator cut short releases nothing and is not counted against T: the
        // checkpoint stays at the round before, and a resumed run runs it again under its
        // ledger entry (`Ledger::take_unreleased`).
        if self.clients.stop_requested() {
            tracing::warn!(
                round,
                "interrupted: the round is discarded and runs again on resume"
            );
            return Ok(RoundEnd::Stop(StoppedBy::Interrupted));
        }
        self.settle(round, calibration.as_ref(), &tally)?;
        let counts = RoundCounts {
            connected: planned.connected,
            sampled: planned.sampled.len(),
            dropped: planned.sampled.len().saturating_sub(tally.completed),
            refused: self.clients.take_refused(),
            bytes_down: down,
            started: t0,
        };
        self.conclude(&ctx, &tally, counts, None, run)?;
        Ok(RoundEnd::Ran)
    }

    /// Ends a server step whose results `tally` counts: the strategy's aggregate, released if
    /// the release rule and the model check allow, the metrics line (with the `buffer` figures
    /// of an asynchronous step), the checkpoint, and the test evaluation started; the line is
    /// published once the evaluation is done.
    fn conclude(
        &mut self,
        ctx: &RoundContext,
        tally: &Tally,
        counts: RoundCounts,
        buffer: Option<BufferMetrics>,
        run: &mut Progressing<'_>,
    ) -> Result<(), ServerError> {
        let global = &mut *run.global;
        let outcome = self.pipeline.strategy.finish_round(ctx, global);
        let release = self.release(&outcome, tally.completed, global);
        let released = matches!(release, Release::Released);
        self.pipeline.strategy.released(released);
        let down = counts.bytes_down + tally.stage_bytes_down;
        run.totals.add(tally, down, released);
        let skipped = match release {
            Release::Released => None,
            Release::Withheld(reason) => Some(reason),
        };
        let counts = RoundCounts {
            bytes_down: down,
            ..counts
        };
        let mut metrics = self.metrics(ctx, counts, tally, (&outcome, skipped));
        metrics.buffer = buffer;
        // The evaluation releases nothing before it is published, so it may start before the
        // checkpoint (and overlap its fsync).
        let evaluation = self.test.clone().map(|test| {
            let params = self
                .pipeline
                .strategy
                .views()
                .average
                .unwrap_or(global)
                .to_vec();
            tokio::task::spawn_blocking(move || test.evaluate(&params))
        });
        let mut checkpointed = run.totals.clone();
        checkpointed.earlier_seconds += run.started.elapsed().as_secs_f64();
        self.checkpoint(ctx.round, &checkpointed, global, Some(&metrics))?;
        run.evaluations.pending = Some(PendingRound {
            metrics,
            evaluation,
        });
        Ok(())
    }

    /// Samples the round, lets the collection prepare it and passes the budget gate; or says
    /// why training stops.
    fn plan(&mut self, round: u64) -> Result<Result<Planned, StoppedBy>, ServerError> {
        if self.clients.stop_requested() {
            return Ok(Err(StoppedBy::Interrupted));
        }
        let connected = self.clients.connected();
        if connected.is_empty() {
            tracing::error!(round, "no client is connected: training ends");
            return Ok(Err(StoppedBy::Error));
        }
        let policy = self.pipeline.steps.rounds()?;
        let plan = policy.plan(round, &connected, &mut self.rng)?;
        if policy.sampling() == Sampling::Fixed {
            (self.shortfall).observe(round, plan.sampled.len(), plan.planned);
        }
        let prepared = self.pipeline.collection.prepare(&plan)?;
        if !self.spend(round, plan.event.as_ref())? {
            tracing::info!(round, "privacy budget reached: training stops");
            return Ok(Err(StoppedBy::Budget));
        }
        let (ctx, sampled) = (plan.ctx, plan.sampled);
        Ok(Ok(Planned {
            ctx,
            connected: connected.len(),
            sampled,
            prepared,
        }))
    }

    /// Records the round's privacy event in the ledger before anything of the round leaves the
    /// server; false when the budget does not allow it. A round re-run after a crash reuses its
    /// entry.
    fn spend(&mut self, round: u64, event: Option<&PrivacyEvent>) -> Result<bool, ServerError> {
        let (Some(ledger), Some(event)) = (&mut self.pipeline.ledger, event) else {
            return Ok(true);
        };
        if ledger.take_unreleased(round, event) {
            return Ok(true);
        }
        Ok(ledger.spend_within_budget(round, event)?)
    }

    /// Records the policy's correction of the round's up-front charge once its secure sum's
    /// survivors are known (before anything of the round is released).
    fn settle(
        &mut self,
        round: u64,
        calibration: Option<&Calibration>,
        tally: &Tally,
    ) -> Result<(), ServerError> {
        let survivors = (tally.secagg.as_ref()).filter(|s| s.aborted.is_none());
        let settlement = calibration
            .zip(survivors)
            .zip(self.pipeline.steps.rounds().ok())
            .and_then(|((c, s), policy)| policy.settle(c, s.survivors));
        if let (Some(ledger), Some(event)) = (&mut self.pipeline.ledger, settlement) {
            ledger.spend(round, &event)?;
        }
        Ok(())
    }

    /// Whether the round's aggregate, the model `outcome` proposes from `results` results,
    /// replaces `global`; otherwise why not.
    fn release(&self, outcome: &RoundOutcome, results: usize, global: &mut Vec<f32>) -> Release {
        let max_abs = self.config.robust.max_parameter_abs as f32;
        // Not logged here: a reason may name a value of the noised aggregate, and nothing of
        // the round leaves the server before its checkpoint (`publish` logs it).
        let reason = match &outcome.model {
            Some(_) if !self.pipeline.release.allows(results) => format!(
                "too few results: {results} of at least {}",
                self.config.server.min_clients
            ),
            Some(next) => match check_model(next, max_abs) {
                Ok(()) => {
                    *global = next.clone();
                    return Release::Released;
                }
                Err(fault) => format!("{fault}: the aggregate is not released"),
            },
            None => (outcome.withheld.clone())
                .unwrap_or_else(|| format!("no results to aggregate ({results} absorbed)")),
        };
        Release::Withheld(reason)
    }

    /// Sends each sampled client the round's task and the global model (or what the strategy
    /// sends it instead); returns the bytes sent and, for a secure round, H(task).
    fn start_round(
        &mut self,
        ctx: &RoundContext,
        global: &[f32],
        planned: &Planned,
    ) -> (u64, Option<TaskDigest>) {
        let instructions = self.pipeline.strategy.configure_round(ctx);
        let task = Task {
            round: ctx.round,
            model: self.model.clone(),
            config: self.config.train.local_config(),
            local: instructions.local,
            secure: (planned.prepared.calibration).map(|c| SecureTask {
                quantizer: c.quantizer,
                noise_variance: c.ddg.map_or(0, |d| d.client_variance),
                signed: planned.prepared.signed,
                federation: planned.prepared.federation.clone(),
                run: planned.prepared.run,
                min_survivors: c.min_survivors as u64,
            }),
            verified: planned.prepared.verified.clone(),
            admm: instructions.admm,
            evaluate: self.config.eval.federated_at(ctx.round),
        };
        self.clients.start_round(&task, global);
        let strategy = &*self.pipeline.strategy;
        let sent: u64 = (planned.sampled.iter())
            .map(|&id| (self.clients).send_task(id, || strategy.views().client_tensor(id, global)))
            .sum();
        let collection = &mut self.pipeline.collection;
        let part = (&planned.sampled, global);
        let sent = sent + collection.dispatch(&self.clients, part, &planned.prepared);
        tracing::debug!(
            round = ctx.round,
            sampled = planned.sampled.len(),
            "tasks sent"
        );
        // A secure round's clients are sent w_t itself (no strategy sends them more).
        (sent, task.secure_digest(global))
    }

    /// Publishes the pending round, if any, once its evaluation is done: its metrics line, the
    /// Prometheus metrics, the log line and the observer. Its checkpoint is already durable (a
    /// crash before the line is written rewrites it on resume, evaluating the checkpoint's model
    /// again).
    async fn publish(&mut self, evaluations: &mut Evaluations) -> Result<(), ServerError> {
        let Some(PendingRound {
            mut metrics,
            evaluation,
        }) = evaluations.pending.take()
        else {
            return Ok(());
        };
        if let Some(evaluation) = evaluation {
            let eval = (evaluation.await).map_err(|e| ServerError::Internal(e.to_string()))?;
            (metrics.test_accuracy, metrics.test_loss) = (Some(eval.accuracy), Some(eval.loss));
            evaluations.last = Some(eval);
        }
        self.folder.append_round(&metrics)?;
        self.telemetry.observe(&metrics);
        if let Some(page) = &self.page {
            page.publish(&metrics, self.pipeline.ledger.as_ref());
        }
        if let Some(reason) = &metrics.skipped {
            tracing::warn!(round = metrics.round, %reason, "round skipped, model unchanged");
        }
        let budget = self.pipeline.ledger.as_ref().map(|l| &l.terms().budget);
        tracing::info!(
            round = metrics.round,
            of = self.config.server.rounds,
            accuracy = metrics.test_accuracy.map(|a| format!("{a:.4}")),
            loss = metrics.test_loss.map(|l| format!("{l:.4}")),
            federated_accuracy = (metrics.federated_eval).map(|f| format!("{:.4}", f.accuracy)),
            spent = crate::records::output::spent_text(&metrics, budget),
            completed = metrics.completed,
            dropped = metrics.dropped,
            seconds = format!("{:.1}", metrics.seconds),
            "round done"
        );
        if let Some(observer) = &self.observer {
            observer(&metrics);
        }
        Ok(())
    }

    /// Writes the checkpoint of the end of `round` with its metrics line (but for its evaluation).
    /// Nothing derived from the round's noise leaves the server before this is durable, so a crash
    /// before it re-runs the round under its ledger entry, unseen.
    fn checkpoint(
        &self,
        round: u64,
        totals: &RunTotals,
        global: &[f32],
        metrics: Option<&RoundMetrics>,
    ) -> std::io::Result<()> {
        let progress = Progress {
            round,
            rounds_completed: totals.rounds_completed,
            client_updates: totals.client_updates,
            bytes_up: totals.bytes_up,
            bytes_down: totals.bytes_down,
            wall_seconds: totals.earlier_seconds,
            config: self.config.clone(),
            // The strategy's scalars and local ledgers: `Checkpoint::new` fills them in.
            strategy: serde_json::Value::Null,
            clients: self.clients.identities(),
            local_ledgers: Default::default(),
            last_round: metrics.cloned(),
            ledger: self.pipeline.ledger.as_ref().map(|l| l.head().clone()),
        };
        let state = self.pipeline.strategy.state();
        Checkpoint::new(progress, global, state).write(self.folder.dir())
    }
}
