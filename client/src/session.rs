//! A client's life: sessions opened until the server shuts training down, and in each session
//! the loop that receives tasks and models, trains, and answers (plain or protected upload, or
//! the secure-aggregation stages).

use crate::connection::open_session;
use crate::local_round::{self, Upload};
use crate::secure::{SecureRound, Step, secure_start, secure_step};
use crate::task::plan_round;
use crate::upload::{send, send_upload};
use crate::{ClientError, ClientOptions, ClientReport, LocalData};
use fl_common::privacy::LocalLedger;
use fl_proto::TensorAssembler;
use fl_proto::v1::{
    ClientMessage, RoundTask, ServerMessage, TaskFailed, client_message, server_message,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tonic::Streaming;

/// Runs one client until the server shuts the session down.
pub async fn run_client(
    opts: ClientOptions,
    local: LocalData,
) -> Result<ClientReport, ClientError> {
    if local.indices.is_empty() {
        return Err(ClientError::NoData);
    }
    if let Some(seed) = opts.seed {
        tracing::warn!(seed, "{}", fl_common::rng::SEEDED_WARNING);
    }
    let rng = fl_common::rng::reproducible(opts.seed);
    let mut life = Life {
        rng,
        secret_rng: StdRng::from_os_rng(),
        rounds_trained: 0,
        spent: LocalLedger::default(),
        spent_delta: 0.0,
    };
    let mut held = None;
    loop {
        let (me, outbox, inbound, identity) = open_session(&opts, held.as_ref()).await?;
        held = Some(identity);
        match run_session(&opts, &local, me, outbox, inbound, &mut life).await {
            Ok(shutdown_reason) => {
                return Ok(ClientReport {
                    rounds_trained: life.rounds_trained,
                    shutdown_reason,
                    local_releases: life.spent.releases(),
                    local_epsilon: life.spent.epsilon(life.spent_delta),
                });
            }
            Err(e) if e.is_lost_server() => {
                tracing::warn!(error = %e, "lost the server: reconnecting");
            }
            Err(e) => return Err(e),
        }
    }
}

/// What a client keeps across sessions.
struct Life {
    /// Local shuffling (seeded in reproducible experiments).
    rng: StdRng,
    /// Keys, masks, shares, rounding and noise: always from the OS, even in seeded runs.
    secret_rng: StdRng,
    rounds_trained: u64,
    /// What this client's local releases have cost it, at the delta of its releases.
    spent: LocalLedger,
    spent_delta: f64,
}

/// One open session: who this client is, where its messages go, and the round in progress.
struct Session<'a> {
    opts: &'a ClientOptions,
    local: &'a LocalData,
    me: u64,
    outbox: mpsc::Sender<ClientMessage>,
    life: &'a mut Life,
    /// The task whose model is arriving, and its assembler.
    task: Option<(RoundTask, TensorAssembler)>,
    /// The secure-aggregation round this client is in.
    secure: Option<SecureRound>,
}

/// Serves one session until the server shuts it down (returning its reason) or it fails.
async fn run_session(
    opts: &ClientOptions,
    local: &LocalData,
    me: u64,
    outbox: mpsc::Sender<ClientMessage>,
    mut inbound: Streaming<ServerMessage>,
    life: &mut Life,
) -> Result<String, ClientError> {
    let mut session = Session {
        opts,
        local,
        me,
        outbox,
        life,
        task: None,
        secure: None,
    };
    loop {
        let Some(message) = inbound.message().await? else {
            return Err(ClientError::SessionLost);
        };
        match message.body {
            Some(server_message::Body::Task(t)) => session.on_task(t)?,
            Some(server_message::Body::ModelChunk(chunk)) => {
                let Some((_, assembler)) = session.task.as_mut() else {
                    return Err(ClientError::Protocol(
                        "model chunk without a RoundTask".into(),
                    ));
                };
                let protocol = |e: fl_proto::ChunkError| ClientError::Protocol(e.to_string());
                if let Some(global) = assembler.push(chunk).map_err(protocol)? {
                    session.on_model(global).await?;
                }
            }
            Some(
                body @ (server_message::Body::SecaggNeighbours(_)
                | server_message::Body::SecaggShareInbox(_)
                | server_message::Body::SecaggProceed(_)
                | server_message::Body::SecaggSurvivors(_)),
            ) => session.on_stage(body).await?,
            Some(server_message::Body::Shutdown(s)) => return Ok(s.reason),
            None => return Err(ClientError::Protocol("empty ServerMessage".into())),
        }
    }
}

impl Session<'_> {
    /// A round's task: its model follows in chunks.
    fn on_task(&mut self, t: RoundTask) -> Result<(), ClientError> {
        if t.num_values > fl_common::model::MAX_PARAMS as u64 {
            return Err(ClientError::Protocol(format!(
                "task announces a model of {} values, above the limit of {}",
                t.num_values,
                fl_common::model::MAX_PARAMS
            )));
        }
        let assembler = TensorAssembler::new(t.round, t.num_values, t.num_chunks)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.task = Some((t, assembler));
        Ok(())
    }

    /// The task's model is complete: train, then upload, start the secure round, or say why
    /// this client cannot do the task.
    async fn on_model(&mut self, global: Vec<f32>) -> Result<(), ClientError> {
        let Some((t, _)) = self.task.take() else {
            return Err(ClientError::Protocol("model without a RoundTask".into()));
        };
        let round = t.round;
        let reply = match plan_round(&t, self.local, global.len(), &self.opts.privacy) {
            Ok((work, secagg)) => {
                let permit = self.opts.training_slots.clone().acquire_owned().await;
                let (local, seed) = (self.local.clone(), self.life.rng.random());
                let computed = tokio::task::spawn_blocking(move || {
                    let _permit = permit;
                    local_round::compute(&work, &global, &local, seed)
                })
                .await
                .map_err(|e| ClientError::Protocol(format!("training task: {e}")))?;
                self.life.rounds_trained += 1;
                match (computed, secagg) {
                    (Ok(Upload::Plain { values, .. }), Some(sa)) => {
                        let rng = &mut self.life.secret_rng;
                        secure_start(self.me, round, sa, &values, self.opts, rng).map(
                            |(state, keys)| {
                                self.secure = Some(state);
                                Reply::Stage(client_message::Body::SecaggKeys(keys))
                            },
                        )
                    }
                    (computed, _) => computed.map(Reply::Upload),
                }
            }
            Err(reason) => Err(reason),
        };
        match reply {
            Ok(Reply::Upload(upload)) => {
                self.life.record(round, &upload);
                let examples = self.local.indices.len() as u64;
                send_upload(&self.outbox, round, examples, upload).await
            }
            Ok(Reply::Stage(body)) => send(&self.outbox, body).await,
            Err(reason) => fail(&self.outbox, round, reason).await,
        }
    }

    /// A secure-aggregation stage message: answer it, or leave the round saying why.
    async fn on_stage(&mut self, body: server_message::Body) -> Result<(), ClientError> {
        let Some(state) = self.secure.as_mut() else {
            tracing::debug!("secure-aggregation message outside a secure round: ignored");
            return Ok(());
        };
        match secure_step(state, body, &mut self.life.secret_rng) {
            Ok(Step::Ignore) => Ok(()),
            Ok(Step::Send(bodies)) => {
                for b in bodies {
                    send(&self.outbox, b).await?;
                }
                Ok(())
            }
            Ok(Step::Done(body)) => {
                self.secure = None;
                send(&self.outbox, body).await
            }
            Err(reason) => {
                let round = state.round;
                self.secure = None;
                fail(&self.outbox, round, reason).await
            }
        }
    }
}

impl Life {
    /// Adds an upload's local release, if any, to what this client has spent.
    fn record(&mut self, round: u64, upload: &Upload) {
        let Some(release) = upload.release() else {
            return;
        };
        self.spent.record(release);
        self.spent_delta = self.spent_delta.max(release.delta);
        tracing::info!(
            round,
            mechanism = release.kind.name(),
            epsilon = release.epsilon,
            releases = self.spent.releases(),
            composed_epsilon = self.spent.epsilon(self.spent_delta),
            "local privacy spent"
        );
    }
}

/// What a client sends once its local training is done.
enum Reply {
    /// A plain or locally protected upload.
    Upload(Upload),
    /// The first stage message of a secure-aggregation round.
    Stage(client_message::Body),
}

/// Tells the server this client cannot do round `round`'s task, and why.
async fn fail(
    outbox: &mpsc::Sender<ClientMessage>,
    round: u64,
    reason: String,
) -> Result<(), ClientError> {
    tracing::warn!(round, %reason, "cannot do this round's task");
    send(
        outbox,
        client_message::Body::TaskFailed(TaskFailed { round, reason }),
    )
    .await
}
