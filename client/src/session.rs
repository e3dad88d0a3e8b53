//! A client's life over gRPC: sessions opened until the server shuts training down, and in each
//! session the loop that reads the server's messages into the [`Engine`], runs the round's
//! training and the engine's heavy protocol work in the process's training slots (off the async
//! workers, so that connections keep being served), and sends what the engine says.

use crate::connection::open_session;
use crate::engine::Engine;
use crate::refusal::Refusal;
use crate::state::ClientState;
use crate::trainer::{SgdTrainer, Trainer};
use crate::wire::send_outgoing;
use crate::{ClientError, ClientOptions, ClientReport, LocalData};
use fl_proto::v1::{ClientMessage, RoundTask, ServerMessage, ShutdownKind, server_message};
use fl_proto::{TensorAssembler, server_stage};
use fl_secagg::task::Task;
use std::sync::Arc;
use tokio::sync::mpsc;
use tonic::Streaming;
use tracing::Instrument;

/// Runs one client training with the built-in trainer on `local` until the server shuts the
/// session down.
pub async fn run_client(
    opts: ClientOptions,
    local: LocalData,
) -> Result<ClientReport, ClientError> {
    if local.indices.is_empty() {
        return Err(ClientError::NoData);
    }
    run(opts, SgdTrainer::new(local)).await
}

/// Runs one client training with `trainer` until the server shuts the session down: the
/// library's whole client (protocol, reconnection, privacy) around the caller's training code.
/// `examples/rust/src/main.rs` is a complete program built on it.
pub async fn run(opts: ClientOptions, trainer: impl Trainer) -> Result<ClientReport, ClientError> {
    // Every line the client logs names it (one process may run many, `--simulate N`).
    let span = tracing::info_span!("client", name = %opts.name);
    run_named(opts, Arc::new(trainer)).instrument(span).await
}

/// [`run`], inside the client's span.
async fn run_named(
    opts: ClientOptions,
    trainer: Arc<dyn Trainer>,
) -> Result<ClientReport, ClientError> {
    if let Some(seed) = opts.seed {
        tracing::warn!(seed, "{}", fl_common::rng::SEEDED_WARNING);
    }
    let (policy, cap) = (opts.policy.as_deref(), opts.privacy.max_total_epsilon);
    let state = ClientState::open(opts.state.clone(), policy, cap).map_err(ClientError::State)?;
    let mut engine = Engine::new(trainer, opts.privacy, opts.oracle.clone(), opts.seed)
        .signing_with(opts.credentials.clone())
        .remembering(opts.policy.clone(), state)
        .attacking(opts.attack)
        .reporting_to(&opts.name, opts.round_log.clone());
    let mut held = None;
    loop {
        let (me, outbox, inbound, identity) = open_session(&opts, held.as_ref()).await?;
        held = Some(identity);
        engine.new_session();
        let mut session = Session {
            opts: &opts,
            me,
            outbox,
            engine: &mut engine,
            task: None,
        };
        match session.serve(inbound).await {
            Ok(shutdown_reason) => return Ok(report(&engine, shutdown_reason)),
            // A server stopped to be resumed said so: waiting for it is the plan, not a fault.
            Err(ClientError::ServerResuming(reason)) => {
                tracing::info!(%reason, "the server will be resumed: reconnecting");
            }
            Err(e) if e.is_lost_server() => {
                tracing::warn!(error = %e, "lost the server: reconnecting");
            }
            Err(e) => return Err(e),
        }
    }
}

/// What the client did, once the server shut it down for `shutdown_reason`.
fn report(engine: &Engine, shutdown_reason: String) -> ClientReport {
    ClientReport {
        rounds_trained: engine.rounds_trained,
        shutdown_reason,
        local_releases: engine.state.releases(),
        local_epsilon: engine.state.epsilon(),
        tasks_refused: engine.tasks_refused,
        last_refusal: engine.last_refusal.clone(),
    }
}

/// One open session: who this client is, where its messages go, and the task whose tensor is
/// arriving.
struct Session<'a> {
    opts: &'a ClientOptions,
    me: u64,
    outbox: mpsc::Sender<ClientMessage>,
    engine: &'a mut Engine,
    task: Option<(RoundTask, TensorAssembler)>,
}

impl Session<'_> {
    /// Serves the session until the server shuts it down (returning its reason) or it fails.
    async fn serve(
        &mut self,
        mut inbound: Streaming<ServerMessage>,
    ) -> Result<String, ClientError> {
        loop {
            let Some(message) = inbound.message().await? else {
                return Err(ClientError::SessionLost);
            };
            let body = message
                .body
                .ok_or_else(|| ClientError::Protocol("empty ServerMessage".into()))?;
            if let Some(stage) = server_stage(&body) {
                self.on_stage(stage).await?;
                continue;
            }
            match body {
                server_message::Body::Task(t) => self.on_task(t)?,
                server_message::Body::ModelChunk(chunk) => {
                    let Some((_, assembler)) = self.task.as_mut() else {
                        return Err(ClientError::Protocol(
                            "model chunk without a RoundTask".into(),
                        ));
                    };
                    let protocol = |e: fl_proto::ChunkError| ClientError::Protocol(e.to_string());
                    if let Some(received) = assembler.push(chunk).map_err(protocol)? {
                        self.on_tensor(received).await?;
                    }
                }
                server_message::Body::Shutdown(s) if s.kind() == ShutdownKind::Resuming => {
                    return Err(ClientError::ServerResuming(s.reason));
                }
                server_message::Body::Shutdown(s) => return Ok(s.reason),
                _ => unreachable!("stage messages are read above"),
            }
        }
    }

    /// A round's task: its tensor follows in chunks.
    fn on_task(&mut self, t: RoundTask) -> Result<(), ClientError> {
        if t.num_values > fl_model::MAX_PARAMS as u64 {
            return Err(ClientError::Protocol(format!(
                "task announces a model of {} values, above the limit of {}",
                t.num_values,
                fl_model::MAX_PARAMS
            )));
        }
        let assembler = TensorAssembler::new(t.round, t.num_values, t.num_chunks)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.task = Some((t, assembler));
        Ok(())
    }

    /// The task's tensor is complete: compute the round, then send what the engine says.
    async fn on_tensor(&mut self, received: Vec<f32>) -> Result<(), ClientError> {
        let Some((t, _)) = self.task.take() else {
            return Err(ClientError::Protocol("model without a RoundTask".into()));
        };
        let task = match Task::try_from(&t) {
            Ok(task) => self.engine.task(task, received),
            Err(e) => Err(self.engine.refuse(t.round, unreadable(e))),
        };
        let outgoing = match task {
            // The job goes on in its slot if this session is dropped.
            Ok(work) => {
                let prepared = self.opts.training_slots.run(self.engine.job(self.me, work));
                let prepared = prepared.await?;
                // A simulated slower device answers later (`fl_common::pace`), off the slots.
                let trained = std::time::Duration::from_secs_f64(prepared.seconds);
                let extra = self.opts.pace.extra(trained);
                if !extra.is_zero() {
                    tokio::time::sleep(extra).await;
                }
                self.engine.computed(prepared)
            }
            Err(refusal) => refusal,
        };
        send_outgoing(&self.outbox, outgoing).await
    }

    /// A secure-aggregation stage message: answer it, or leave the round saying why.
    async fn on_stage(
        &mut self,
        stage: Result<(u64, fl_secagg::ServerStage), fl_proto::WireError>,
    ) -> Result<(), ClientError> {
        let (round, stage) = match stage {
            Ok((round, stage)) => (round, Ok(stage)),
            // A stage message that does not read ends the client's secure round, whichever it is.
            Err(e) => (self.engine.secure_round().unwrap_or(0), Err(unreadable(e))),
        };
        let Some(job) = self.engine.stage_job(round, stage) else {
            tracing::debug!(
                round,
                "secure-aggregation message outside the secure round: ignored"
            );
            return Ok(());
        };
        let stepped = self.opts.training_slots.run(job).await?;
        send_outgoing(&self.outbox, self.engine.stepped(stepped)).await
    }
}

/// A server message that did not read, as the reason to refuse its round.
fn unreadable(e: fl_proto::WireError) -> Refusal {
    Refusal::Unreadable(e.to_string())
}
