//! The round loop: waits for K clients, then each round samples m of the connected clients,
//! sends them the global model, collects their updates until all answered or the deadline
//! passed (or, under secure aggregation, runs the stages of [`crate::secure_round`] and gets
//! only the sum), lets the strategy aggregate, evaluates the new model and records the round.

use crate::checkpoint::{Checkpoint, Progress};
use crate::config::{Algorithm, ClipMode, ConfigError, PrivacyMode, RunConfig, SecAggNoise};
use crate::ledger::{Ledger, LedgerEntry};
use crate::local_accounts::LocalAccounts;
use crate::output::{RoundMetrics, RunFolder, StoppedBy, Summary};
use crate::output::{SecAggRoundMetrics, SecAggSummary};
use crate::registry::ClientId;
use crate::secure_round::SecureRoundPlan;
use crate::service::{Event, Shared, UploadHeader, for_log, send_all};
use crate::strategy::{ClientUpdate, RoundPlan, Strategy, SumInput};
use crate::telemetry::Telemetry;
use crate::{Observer, ServerError};
use fl_common::data::Dataset;
use fl_common::model::{ModelSpec, check_model, evaluate};
use fl_common::privacy::Release;
use fl_common::privacy::{
    DdgRound, GaussianRound, PrivacyEvent, Sampling, UpdateMoments, discrete_variance,
};
use fl_common::secagg::{PlainInputs, Quantizer, Ring};
use fl_proto::v1::{
    AdmmTask, LocalPrivacy, LocalRelease, RoundTask, SecAggTask, ServerMessage, Shutdown,
    server_message,
};
use fl_proto::{chunk_count, encode_chunks};
use prost::Message;
use rand::Rng;
use rand::rngs::StdRng;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tonic::Status;
use tracing::Instrument;

/// What an upload says about itself.
struct Claim<'a> {
    /// The round it is for.
    round: u64,
    /// n_k, for plain updates only (the trusted curator's FedAvg weight).
    num_examples: Option<u64>,
    /// Its declared local protection.
    release: Option<&'a LocalRelease>,
}

/// Counters of one round in progress.
#[derive(Debug)]
struct Tally {
    completed: usize,
    /// Plain updates that reported a training loss, and the sum of those losses.
    losses: usize,
    train_loss_sum: f64,
    bytes_up: u64,
    /// Moments of the raw updates, for the paper's V_c and U_s.
    moments: UpdateMoments,
    /// The secure-aggregation figures of the round.
    secagg: Option<SecAggRoundMetrics>,
    /// Bytes of secure-aggregation stage messages sent (beyond the task and model).
    stage_bytes_down: u64,
}

/// A round's task as sent to every sampled client, kept for clients that reconnect.
struct RoundTasks {
    /// The task without its tensor sizes.
    template: RoundTask,
    /// The task and model chunks for a client that gets the global model.
    common: Vec<ServerMessage>,
    /// The stream generation each sampled client was sent the task on.
    sent_on: BTreeMap<ClientId, u64>,
}

/// The messages of a task carrying `tensor`: the RoundTask, then the tensor's chunks.
fn task_messages(template: &RoundTask, tensor: &[f32]) -> Vec<ServerMessage> {
    let round = template.round;
    let task = RoundTask {
        num_values: tensor.len() as u64,
        num_chunks: chunk_count(tensor.len()),
        ..template.clone()
    };
    std::iter::once(server_message::Body::Task(task))
        .chain(encode_chunks(round, tensor).map(server_message::Body::ModelChunk))
        .map(|body| ServerMessage { body: Some(body) })
        .collect()
}

/// Largest per-client discrete Gaussian standard deviation, in levels (2^30): keeps the exact
/// sampler's integer arithmetic in range.
const MAX_DISCRETE_SIGMA: f64 = 1_073_741_824.0;

/// A secure-aggregation round as planned before its tasks go out.
pub(crate) struct SecurePlan {
    /// What the clients are told.
    task: SecAggTask,
    /// The fixed-point code.
    quantizer: Quantizer,
    /// Fewest survivors per stage (the distributed noise is calibrated for this many).
    min_survivors: usize,
    /// The distributed noise's accounting event, if any.
    ddg: Option<DdgRound>,
}

/// Owns all round state; the gRPC handlers only feed it [`Event`]s.
pub struct RoundLoop {
    /// Shared with the gRPC handlers.
    pub shared: Arc<Shared>,
    /// Events from the handlers.
    pub events: mpsc::Receiver<Event>,
    /// The validated configuration.
    pub config: RunConfig,
    /// The model architecture.
    pub spec: ModelSpec,
    /// Test set for the per-round evaluation.
    pub test: Arc<Dataset>,
    /// The aggregation rule.
    pub strategy: Box<dyn Strategy>,
    /// CSPRNG for sampling and initialisation.
    pub rng: StdRng,
    /// Where outputs go.
    pub folder: RunFolder,
    /// Called after every round.
    pub observer: Option<Observer>,
    /// Becomes true when the operator asks to stop.
    pub stop: watch::Receiver<bool>,
    /// Simulation only: the clients' plain secure-aggregation inputs, to check the sums.
    pub oracle: Option<Arc<PlainInputs>>,
    /// The privacy ledger of a private run.
    pub ledger: Option<Ledger>,
    /// The client-side mechanism and each client's local ledger, when clients protect uploads.
    pub local: Option<LocalAccounts>,
    /// Where an interrupted run resumes: its checkpoint and the first round to run.
    pub resume: Option<(Checkpoint, u64)>,
    /// The Prometheus metrics.
    pub telemetry: Arc<Telemetry>,
}

impl RoundLoop {
    /// Runs the whole training; writes the model and summary at the end, whatever ended it.
    pub async fn run(mut self) -> Result<Summary, ServerError> {
        let (mut global, first_round, before) = match self.resume.take() {
            Some((checkpoint, first)) => {
                self.strategy
                    .restore(checkpoint.strategy_state())
                    .map_err(ServerError::Internal)?;
                if let Some(accounts) = &mut self.local {
                    accounts.restore(checkpoint.progress.local_ledgers.clone());
                }
                tracing::info!(
                    checkpoint = checkpoint.progress.round,
                    next = first,
                    "resuming from the checkpoint"
                );
                (checkpoint.model, first, Some(checkpoint.progress))
            }
            None => {
                let init = self.spec.init(&mut self.rng);
                // Round 0: a crash before the first round ends can still be resumed.
                self.checkpoint(0, (0, 0, 0, 0), 0.0, &init, None)?;
                (init, 1, None)
            }
        };
        let join_timeout = Duration::from_secs_f64(self.config.server.join_timeout_secs);
        if first_round <= self.config.server.rounds {
            self.wait_for_clients(join_timeout).await?;
        } else {
            // Killed during or after its last round: only the summary is left, but clients that
            // come back get their Shutdown instead of retrying until their timeout.
            let grace = join_timeout.min(Duration::from_secs(10));
            if let Err(e) = self.wait_for_clients(grace).await {
                tracing::info!(error = %e, "no more clients came back");
            }
        }
        let started = Instant::now();
        let earlier_seconds = before.as_ref().map_or(0.0, |p| p.wall_seconds);
        let mut rounds_completed = before.as_ref().map_or(0, |p| p.rounds_completed);
        let mut client_updates = before.as_ref().map_or(0, |p| p.client_updates);
        let (mut bytes_up, mut bytes_down) = before
            .as_ref()
            .map_or((0, 0), |p| (p.bytes_up, p.bytes_down));
        let mut stopped_by = StoppedBy::Rounds;
        let mut last_eval = None;
        let mut secagg_totals =
            (self.config.privacy.mode == PrivacyMode::SecAgg).then(SecAggSummary::default);
        for round in first_round..=self.config.server.rounds {
            if *self.stop.borrow() {
                stopped_by = StoppedBy::Error;
                break;
            }
            let t0 = Instant::now();
            // A client revoked since the last check is neither sampled nor sent the model.
            self.shared.enforce_enrollment();
            let connected = self.shared.registry().connected();
            if connected.is_empty() {
                tracing::error!(round, "no client is connected: training ends");
                stopped_by = StoppedBy::Error;
                break;
            }
            let m = self.config.clients_at(round);
            let central = self.round_event(round, m, connected.len());
            let sampled = self.sample(&connected, m, central.as_ref());
            let secure = match self.config.privacy.mode {
                PrivacyMode::SecAgg => Some(self.plan_secure(round, m, sampled.len())?),
                _ => None,
            };
            let event: Option<PrivacyEvent> = central
                .map(PrivacyEvent::from)
                .or_else(|| secure.as_ref().and_then(|s| s.ddg.map(PrivacyEvent::from)));
            if let (Some(ledger), Some(event)) = (&mut self.ledger, &event)
                && !ledger.take_unreleased(round, event)
            {
                if !ledger.allows(event) {
                    tracing::info!(round, "privacy budget reached: training stops");
                    stopped_by = StoppedBy::Budget;
                    break;
                }
                // Spent before anything of the round leaves the server.
                ledger.spend(&LedgerEntry {
                    round,
                    event: *event,
                    clip_mode: self.config.privacy.clip,
                    clip_bound_leaks: self.config.privacy.clip == ClipMode::Median,
                    sampling_seeded: self.config.server.seed.is_some(),
                    accountant: ledger.accountant_name().into(),
                })?;
            }
            // Under Poisson sampling the divisor is the public expectation q K = m_t, never the
            // private number of participants.
            let expected_clients = match central.map(|e| e.sampling) {
                Some(Sampling::Poisson) => m as f64,
                _ => sampled.len().max(1) as f64,
            };
            let plan = RoundPlan {
                total_examples: self.config.admm.total_examples.unwrap_or(0),
                expected_clients,
                noise_multiplier: event.is_some().then(|| {
                    self.config
                        .privacy
                        .noise_multiplier
                        .at(round, self.config.server.rounds)
                }),
            };
            let task = secure.as_ref().map(|s| s.task);
            let (down, mut tasks) = self.start_round(round, &global, &sampled, &plan, task);
            // A span per round's collection: what the loop logs while collecting names the round.
            let span = tracing::info_span!("round", round);
            let tally = match secure {
                None => {
                    self.collect(round, &sampled, t0, &mut tasks, &global)
                        .instrument(span)
                        .await?
                }
                Some(secure) => {
                    self.collect_sum(round, &sampled, t0, secure)
                        .instrument(span)
                        .await?
                }
            };
            // Under central DP the noised sum over the expected count is released however many
            // answered: an exact count deciding the release is not accounted (under Poisson
            // sampling the count itself is private). Elsewhere, too few results skip the round.
            let enough = self.config.privacy.mode == PrivacyMode::Central
                || tally.completed >= self.config.server.min_clients;
            let outcome = self.strategy.finish_round(round, &global);
            let max_abs = self.config.robust.max_parameter_abs as f32;
            let skipped = match outcome.model {
                Some(next) if enough => match check_model(&next, max_abs) {
                    Ok(()) => {
                        global = next;
                        rounds_completed += 1;
                        None
                    }
                    Err(fault) => Some(format!("{fault}: the aggregate is not released")),
                },
                _ => Some(format!(
                    "too few results: {} of at least {}",
                    tally.completed, self.config.server.min_clients
                )),
            };
            if let Some(reason) = &skipped {
                tracing::warn!(round, %reason, "round skipped, model unchanged");
            }
            let (epsilon, delta) = match &self.ledger {
                Some(l) => {
                    let (e, d) = l.spent();
                    (Some(e), Some(d))
                }
                None => (None, None),
            };
            let (v_c, u_s) = tally.moments.v_c_and_u_s().unzip();
            let eval = {
                let (spec, params, test) = (self.spec.clone(), global.clone(), self.test.clone());
                tokio::task::spawn_blocking(move || evaluate(&spec, &params, &test))
                    .await
                    .map_err(|e| ServerError::Internal(e.to_string()))?
            };
            client_updates += tally.completed as u64;
            bytes_up += tally.bytes_up;
            let down = down + tally.stage_bytes_down;
            bytes_down += down;
            if let (Some(totals), Some(m)) = (&mut secagg_totals, &tally.secagg) {
                totals.add(m);
            }
            let metrics = RoundMetrics {
                secagg: tally.secagg.clone(),
                round,
                sampled: sampled.len(),
                completed: tally.completed,
                dropped: sampled.len() - tally.completed,
                applied: skipped.is_none(),
                skipped,
                clip_bound: outcome.clip_bound,
                noise_std: outcome.noise_std,
                rho: outcome.rho,
                local_epsilon: self.local.as_ref().map(LocalAccounts::max_epsilon),
                epsilon,
                delta,
                test_accuracy: eval.accuracy,
                test_loss: eval.loss,
                train_loss: (tally.losses > 0).then(|| tally.train_loss_sum / tally.losses as f64),
                v_c,
                u_s,
                bytes_up: tally.bytes_up,
                bytes_down: down,
                seconds: t0.elapsed().as_secs_f64(),
            };
            // Nothing derived from the round's noise leaves the server before its checkpoint is
            // durable: a crash before it re-runs the round under its ledger entry, unseen.
            let totals = (rounds_completed, client_updates, bytes_up, bytes_down);
            let seconds = earlier_seconds + started.elapsed().as_secs_f64();
            self.checkpoint(round, totals, seconds, &global, Some(&metrics))?;
            self.folder.append_round(&metrics)?;
            self.telemetry.observe(&metrics);
            tracing::info!(
                round,
                accuracy = format_args!("{:.4}", eval.accuracy),
                loss = format_args!("{:.4}", eval.loss),
                completed = tally.completed,
                dropped = metrics.dropped,
                "round done"
            );
            if let Some(observer) = &self.observer {
                observer(&metrics);
            }
            last_eval = Some(eval);
        }
        self.shutdown_clients(self.config.server.rounds);
        let eval = match last_eval {
            Some(e) => e,
            None => evaluate(&self.spec, &global, &self.test),
        };
        self.folder.write_model(&self.spec, &global)?;
        let privacy = &self.config.privacy;
        let (epsilon, delta) = self.ledger.as_ref().map(Ledger::spent).unzip();
        let summary = Summary {
            rounds_completed,
            test_accuracy: eval.accuracy,
            test_loss: eval.loss,
            epsilon,
            delta,
            accountant: self
                .ledger
                .as_ref()
                .map(|l| l.accountant_name().to_string()),
            sampling: match &self.ledger {
                Some(_) if self.config.round_event(1).is_some() => privacy.sampling.to_string(),
                _ => Sampling::Fixed.to_string(),
            },
            clip_mode: self.ledger.as_ref().map(|_| privacy.clip.to_string()),
            clip_bound_leaks: self.ledger.is_some() && privacy.clip == ClipMode::Median,
            sampling_seeded: self.ledger.is_some() && self.config.server.seed.is_some(),
            stopped_by,
            client_updates,
            bytes_up,
            bytes_down,
            wall_seconds: earlier_seconds + started.elapsed().as_secs_f64(),
            model: self.spec.to_string(),
            config: serde_json::to_value(&self.config)
                .map_err(|e| ServerError::Internal(e.to_string()))?,
            secagg: secagg_totals,
            local_privacy: self.local.as_ref().map(LocalAccounts::summary),
        };
        if let Some(accounts) = &self.local {
            self.folder.write_local_privacy(&accounts.per_client())?;
        }
        self.folder.write_summary(&summary)?;
        Ok(summary)
    }

    /// Writes the checkpoint of the end of `round`: `totals` are (rounds completed, client
    /// updates, bytes up, bytes down), `metrics` the round's line.
    fn checkpoint(
        &self,
        round: u64,
        totals: (u64, u64, u64, u64),
        wall_seconds: f64,
        global: &[f32],
        metrics: Option<&RoundMetrics>,
    ) -> std::io::Result<()> {
        let (rounds_completed, client_updates, bytes_up, bytes_down) = totals;
        let progress = Progress {
            round,
            rounds_completed,
            client_updates,
            bytes_up,
            bytes_down,
            wall_seconds,
            config: self.config.clone(),
            strategy: serde_json::Value::Null,
            clients: self.shared.registry().identities(),
            local_ledgers: self
                .local
                .as_ref()
                .map(|a| a.ledgers().clone())
                .unwrap_or_default(),
            last_round: metrics.cloned(),
        };
        Checkpoint::new(progress, global, self.strategy.state()).write(self.folder.dir())
    }

    /// Waits until K clients have live streams, for at most `patience`.
    async fn wait_for_clients(&mut self, patience: Duration) -> Result<(), ServerError> {
        let expected = self.config.server.clients;
        let deadline = Instant::now() + patience;
        tracing::info!(expected, "waiting for clients");
        loop {
            let connected = self.shared.registry().connected().len();
            if connected >= expected {
                tracing::info!(connected, "all expected clients connected");
                return Ok(());
            }
            let event = tokio::select! {
                e = tokio::time::timeout_at(deadline.into(), self.events.recv()) => e,
                _ = self.stop.changed() => return Err(ServerError::Interrupted),
            };
            match event {
                Err(_) => {
                    return Err(ServerError::NotEnoughClients {
                        connected,
                        expected,
                    });
                }
                Ok(None) => return Err(ServerError::Internal("event channel closed".into())),
                // Only connections matter before the first round; stray uploads are refused
                // when rounds start checking them, so drop them here.
                Ok(Some(Event::Update { client, .. } | Event::Sign { client, .. })) => {
                    self.reject(client, Status::failed_precondition("no round is running"))
                }
                Ok(Some(_)) => {}
            }
        }
    }

    /// The accountant's view of the round, or `None` in a non-private run. Fixed-size sampling
    /// draws m of the connected clients, so its rate is taken as m / min(K, connected): when
    /// fewer than K are connected the real rate is higher than m/K, and this errs towards a
    /// larger epsilon.
    fn round_event(&self, round: u64, m: usize, connected: usize) -> Option<GaussianRound> {
        let mut event = self.config.round_event(round)?;
        if event.sampling == Sampling::Fixed {
            let population = self.config.server.clients.min(connected).max(m).max(1);
            event.q = m as f64 / population as f64;
        }
        Some(event)
    }

    /// Z_t: Poisson sampling includes each connected client independently with probability q_t;
    /// otherwise m_t clients are drawn uniformly without replacement. Both from the CSPRNG.
    fn sample(
        &mut self,
        connected: &[ClientId],
        m: usize,
        event: Option<&GaussianRound>,
    ) -> BTreeSet<ClientId> {
        if let Some(GaussianRound {
            q,
            sampling: Sampling::Poisson,
            ..
        }) = event
        {
            return connected
                .iter()
                .copied()
                .filter(|_| self.rng.random_bool(*q))
                .collect();
        }
        if m > connected.len() {
            tracing::warn!(
                connected = connected.len(),
                m,
                "fewer clients connected than m"
            );
        }
        let m = m.min(connected.len());
        rand::seq::index::sample(&mut self.rng, connected.len(), m)
            .into_iter()
            .map(|i| connected[i])
            .collect()
    }

    /// Sends each sampled client its task and the global model (or, for IADMM, its own anchor
    /// and point); returns the bytes sent and the round's tasks, for clients that come back.
    fn start_round(
        &mut self,
        round: u64,
        global: &[f32],
        sampled: &BTreeSet<ClientId>,
        plan: &RoundPlan,
        secagg: Option<SecAggTask>,
    ) -> (u64, RoundTasks) {
        let local = self.strategy.configure_round(round, plan);
        let template = RoundTask {
            round,
            model: Some((&self.spec).into()),
            config: Some(local.into()),
            num_values: 0,
            num_chunks: 0,
            secagg,
            local_privacy: self
                .local
                .as_ref()
                .map(|a| LocalPrivacy::from(a.mechanism())),
            admm: self.strategy.admm_round().map(|a| AdmmTask {
                rho: a.rho,
                total_examples: a.total_examples,
            }),
        };
        let mut tasks = RoundTasks {
            common: task_messages(&template, global),
            template,
            sent_on: BTreeMap::new(),
        };
        let mut sent = 0;
        for &id in sampled {
            sent += self.send_task(id, &mut tasks, global);
        }
        tracing::debug!(round, sampled = sampled.len(), "tasks sent");
        (sent, tasks)
    }

    /// Sends one client its task of the round on its live stream, unless that stream already
    /// got it; returns the bytes sent.
    fn send_task(&self, id: ClientId, tasks: &mut RoundTasks, global: &[f32]) -> u64 {
        let Some((generation, outbox)) = self.shared.registry().stream(id) else {
            return 0;
        };
        if tasks.sent_on.insert(id, generation) == Some(generation) {
            return 0;
        }
        let batch = match self.strategy.client_tensor(id, global) {
            Some(own) => task_messages(&tasks.template, &own),
            None => tasks.common.clone(),
        };
        let sent = batch.iter().map(|m| m.encoded_len() as u64).sum();
        send_all(outbox, batch);
        sent
    }

    /// Collects results until every sampled client answered or dropped, or the deadline. A
    /// sampled client that loses its stream has `reconnect_grace_secs` to come back (with the
    /// same identity) and get its task again.
    async fn collect(
        &mut self,
        round: u64,
        sampled: &BTreeSet<ClientId>,
        t0: Instant,
        tasks: &mut RoundTasks,
        global: &[f32],
    ) -> Result<Tally, ServerError> {
        let num_params = global.len();
        let deadline = t0 + Duration::from_secs_f64(self.config.server.round_timeout_secs);
        let grace = Duration::from_secs_f64(self.config.server.reconnect_grace_secs);
        let mut waiting = sampled.clone();
        // Sampled clients without a stream, and until when they may come back.
        let mut away: BTreeMap<ClientId, Instant> = BTreeMap::new();
        // IADMM uploads are primal iterates z_p, not updates: V_c and U_s do not apply.
        let updates_are_deltas = self.config.train.algorithm == Algorithm::FedAvg;
        let mut tally = Tally {
            completed: 0,
            losses: 0,
            train_loss_sum: 0.0,
            bytes_up: 0,
            moments: UpdateMoments::new(num_params),
            secagg: None,
            stage_bytes_down: 0,
        };
        loop {
            let now = Instant::now();
            away.retain(|client, until| {
                let back_in_time = *until > now;
                if !back_in_time {
                    waiting.remove(client);
                    tracing::warn!(round, client, "sampled client did not come back: dropped");
                }
                back_in_time
            });
            if waiting.is_empty() {
                break;
            }
            let wake = away.values().fold(deadline, |t, &u| t.min(u));
            let event = tokio::select! {
                e = tokio::time::timeout_at(wake.into(), self.events.recv()) => e,
                _ = self.stop.changed() => break,
            };
            let event = match event {
                Err(_) if Instant::now() >= deadline => {
                    tracing::warn!(round, missing = waiting.len(), "round deadline passed");
                    break;
                }
                // A grace period ended.
                Err(_) => continue,
                Ok(None) => return Err(ServerError::Internal("event channel closed".into())),
                Ok(Some(e)) => e,
            };
            match event {
                Event::Update {
                    client,
                    header,
                    values,
                    bytes,
                } => {
                    tally.bytes_up += bytes;
                    // Under a local mechanism only the release travels: every upload weighs 1.
                    let (num_examples, loss, claimed) = match &header {
                        UploadHeader::Plain(h) => (Some(h.num_examples), Some(h.train_loss), None),
                        UploadHeader::Released(h) => (None, None, h.release.as_ref()),
                    };
                    let claim = Claim {
                        round: header.round(),
                        num_examples,
                        release: claimed,
                    };
                    let Some(release) = self.admit(round, client, sampled, &mut waiting, claim)
                    else {
                        continue;
                    };
                    let update = ClientUpdate {
                        client,
                        num_examples: num_examples.unwrap_or(1),
                        values,
                    };
                    let finite = update.values.iter().all(|v| v.is_finite());
                    if updates_are_deltas && finite && update.values.len() == num_params {
                        tally.moments.add(&update.values);
                    }
                    match self.strategy.absorb(round, update) {
                        Ok(()) => {
                            tally.completed += 1;
                            if let Some(loss) = loss {
                                tally.losses += 1;
                                tally.train_loss_sum += f64::from(loss);
                            }
                            self.record_release(client, release);
                        }
                        Err(e) => self.reject(client, Status::invalid_argument(e.to_string())),
                    }
                }
                Event::Sign {
                    client,
                    upload,
                    bytes,
                } => {
                    tally.bytes_up += bytes;
                    let claim = Claim {
                        round: upload.round,
                        num_examples: None,
                        release: upload.release.as_ref(),
                    };
                    let Some(release) = self.admit(round, client, sampled, &mut waiting, claim)
                    else {
                        continue;
                    };
                    let sign = i64::from(upload.sign);
                    match self.strategy.absorb_sign(round, sign, &upload.indices) {
                        Ok(()) => {
                            tally.completed += 1;
                            self.record_release(client, release);
                        }
                        Err(e) => self.reject(client, Status::invalid_argument(e.to_string())),
                    }
                }
                Event::Failed {
                    client,
                    round: r,
                    reason,
                } => {
                    if r == round && waiting.remove(&client) {
                        tracing::warn!(round, client, reason = %for_log(&reason), "client failed its task");
                    }
                }
                Event::SecAgg { client, .. } => {
                    waiting.remove(&client);
                    self.reject(
                        client,
                        Status::failed_precondition(
                            "this round does not use secure aggregation: send a plain update",
                        ),
                    );
                }
                Event::Disconnected(client) if waiting.contains(&client) => {
                    if grace.is_zero() || !self.shared.registry().is_admitted(client) {
                        waiting.remove(&client);
                        tracing::warn!(round, client, "sampled client disconnected");
                    } else {
                        away.insert(client, Instant::now() + grace);
                        tracing::warn!(round, client, "sampled client lost its stream");
                    }
                }
                Event::Connected(client) if waiting.contains(&client) => {
                    // A stream opened after the task went out has not seen it: the task again.
                    // (The event of the stream that got the task, read late, sends nothing.)
                    away.remove(&client);
                    let sent = self.send_task(client, tasks, global);
                    if sent > 0 {
                        tally.stage_bytes_down += sent;
                        tracing::info!(round, client, "sampled client is back: task sent again");
                    }
                }
                Event::Connected(_) | Event::Disconnected(_) => {}
            }
        }
        Ok(tally)
    }

    /// Fixes a secure-aggregation round's quantisation and noise: n_min = max(3, ceil(f m_t))
    /// survivors, gamma for the sampled count, and, for distributed noise, each client's
    /// discrete variance sigma_i^2 = ceil((z Delta_2)^2 / n_min) so that any n_min survivors
    /// carry noise of standard deviation at least z Delta_2 (Kairouz et al. 2021). As for central
    /// noise under fixed-size sampling, z is relative to one update's bound Delta_2 and the
    /// accountant sees the replace-one sensitivity 2 Delta_2.
    fn plan_secure(&self, round: u64, m: usize, sampled: usize) -> Result<SecurePlan, ServerError> {
        let cfg = &self.config.secagg;
        let dim = self.spec.num_params();
        let min_survivors = ((cfg.min_survivors * m as f64).ceil() as usize).max(3);
        let n_max = sampled.max(min_survivors);
        let distributed = cfg.noise == SecAggNoise::Distributed;
        let z = self
            .config
            .privacy
            .noise_multiplier
            .at(round, self.config.server.rounds);
        let headroom = if distributed {
            z * (n_max as f64 / min_survivors as f64).sqrt()
        } else {
            0.0
        };
        let ring = Ring::new(cfg.bits).map_err(|e| ServerError::Config(ConfigError::Invalid(e)))?;
        let quantizer = Quantizer::plan(ring, self.config.privacy.clip_bound, n_max, dim, headroom)
            .map_err(|e| ServerError::Config(ConfigError::Invalid(e.to_string())))?;
        let delta2 = quantizer.l2_sensitivity(dim);
        let sigma_i = z * delta2 / (min_survivors as f64).sqrt();
        if distributed && sigma_i > MAX_DISCRETE_SIGMA {
            return Err(ServerError::Config(ConfigError::Invalid(format!(
                "distributed noise of {sigma_i:.3e} levels per client is beyond the exact \
                 sampler's range ({MAX_DISCRETE_SIGMA:.0e}); lower privacy.noise_multiplier"
            ))));
        }
        // Replace-one neighbours (the participants, hence the noise terms, are the same on both
        // sides): the sum moves by at most 2 Delta_2.
        let ddg = distributed.then(|| DdgRound {
            clients: min_survivors as u64,
            client_variance: discrete_variance(sigma_i),
            l2_sensitivity: 2.0 * delta2,
            dim: dim as u64,
        });
        Ok(SecurePlan {
            task: SecAggTask {
                ring_bits: cfg.bits,
                clip_bound: quantizer.clip,
                scale: quantizer.scale,
                noise_variance: ddg.map_or(0, |d| d.client_variance),
            },
            quantizer,
            min_survivors,
            ddg,
        })
    }

    /// Runs a secure-aggregation round and hands its sum to the strategy.
    async fn collect_sum(
        &mut self,
        round: u64,
        sampled: &BTreeSet<ClientId>,
        t0: Instant,
        secure: SecurePlan,
    ) -> Result<Tally, ServerError> {
        let dim = self.spec.num_params();
        let quantizer = secure.quantizer;
        let noise_std = secure
            .ddg
            .map(|d| (d.client_variance as f64).sqrt() / quantizer.scale);
        let plan = SecureRoundPlan {
            quantizer,
            min_survivors: secure.min_survivors,
            oracle: self.oracle.clone(),
        };
        let secure_tally = self.collect_secure(round, sampled, t0, plan).await?;
        let mut completed = 0;
        if let Some((sum, contributors)) = secure_tally.sum {
            let input = SumInput {
                sum,
                contributors,
                clip_bound: quantizer.clip,
                sensitivity: quantizer.decoded_sensitivity(dim),
                noise_std: noise_std.map(|s| s * (contributors as f64).sqrt()),
            };
            match self.strategy.absorb_sum(round, input) {
                Ok(()) => completed = contributors,
                Err(e) => tracing::error!(round, error = %e, "the strategy refused the secure sum"),
            }
        }
        Ok(Tally {
            completed,
            losses: 0,
            train_loss_sum: 0.0,
            bytes_up: secure_tally.bytes_up,
            moments: UpdateMoments::new(0),
            secagg: Some(secure_tally.metrics),
            stage_bytes_down: secure_tally.bytes_down,
        })
    }

    /// Checks what every upload must satisfy: its round, that its sender was sampled and has not
    /// answered yet, its example count, and its local protection. Returns the release to record
    /// once the upload is absorbed (`Some(None)` when the round has no local mechanism); on
    /// failure the client is refused and dropped and `None` returned.
    fn admit(
        &mut self,
        round: u64,
        client: ClientId,
        sampled: &BTreeSet<ClientId>,
        waiting: &mut BTreeSet<ClientId>,
        claim: Claim<'_>,
    ) -> Option<Option<Release>> {
        if !self.shared.registry().is_admitted(client) {
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
        if claim.round == round && sampled.contains(&client) && !waiting.contains(&client) {
            tracing::info!(round, client, "second upload for the round ignored");
            return None;
        }
        if claim.round != round {
            waiting.remove(&client);
            self.reject(
                client,
                Status::invalid_argument(format!(
                    "update for round {}, but the current round is {round}",
                    claim.round
                )),
            );
            return None;
        }
        if !waiting.remove(&client) {
            self.reject(
                client,
                Status::failed_precondition(format!(
                    "client {client} was not sampled in round {round} or already submitted"
                )),
            );
            return None;
        }
        if claim.num_examples == Some(0) {
            self.reject(
                client,
                Status::invalid_argument("update claims 0 examples: it must be at least 1"),
            );
            return None;
        }
        let release = match (&self.local, claim.release) {
            (None, None) => Ok(None),
            (None, Some(_)) => {
                Err("this round uses no local mechanism: send the update without a release".into())
            }
            (Some(accounts), release) => accounts.admit(release).map(Some),
        };
        match release {
            Ok(release) => Some(release),
            Err(reason) => {
                self.reject(client, Status::invalid_argument(reason));
                None
            }
        }
    }

    /// Adds an absorbed upload's release to its client's local ledger.
    fn record_release(&mut self, client: ClientId, release: Option<Release>) {
        if let (Some(accounts), Some(release)) = (&mut self.local, release) {
            accounts.record(client, &release);
        }
    }

    /// Ends a misbehaving client's stream with `status`; the round goes on without it.
    pub(crate) fn reject(&self, client: ClientId, status: Status) {
        tracing::warn!(client, error = %status.message(), "update refused; client dropped");
        if let Some(outbox) = self.shared.registry().disconnect(client) {
            tokio::spawn(async move {
                let _ = outbox.send(Err(status)).await;
            });
        }
    }

    /// Tells every connected client that training is over and releases their streams.
    fn shutdown_clients(&self, round: u64) {
        let mut registry = self.shared.registry();
        for id in registry.connected() {
            if let Some(outbox) = registry.outbox(id) {
                let reason = "training finished".to_string();
                send_all(
                    outbox,
                    vec![ServerMessage {
                        body: Some(server_message::Body::Shutdown(Shutdown { round, reason })),
                    }],
                );
            }
        }
        registry.disconnect_all();
    }
}
