//! The federated-learning client: joins the server, keeps one Session stream open, and for each
//! round it is sampled into, receives the global model w_t, trains locally (E epochs of SGD with
//! batch size B) and uploads its update u = w_local - w_t.

#![deny(missing_docs)]

use fl_common::data::Dataset;
mod local_round;

use fl_common::model::{LocalConfig, ModelSpec};
use fl_common::privacy::{
    ClientLimits, LocalLedger, LocalMechanism, MAX_VARIANCE, ReleaseKind,
    add_discrete_gaussian_noise,
};
use fl_common::secagg::{
    AdvertisedKeys, ClientRound, Neighbourhood, PlainInputs, Proceed, Quantizer, Ring, SealedShares,
};
use fl_proto::v1::federation_client::FederationClient;
use fl_proto::v1::{
    ClientMessage, Hello, JoinRequest, LocalRelease, MaskedInputHeader, PartitionRequest,
    ReleaseHeader, RevealedShare, RoundTask, SealedShare, SecAggCheck, SecAggKeys, SecAggReveal,
    SecAggShares, SecAggTask, ServerMessage, SignDsUpload, TaskFailed, UpdateHeader,
    client_message, server_message,
};
use fl_proto::{TensorAssembler, chunk_count, encode_chunks, encode_word_chunks, ring_words};
use local_round::{AdmmStep, Upload, Work};
use rand::Rng;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::Streaming;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Largest gRPC message accepted or sent ([`fl_proto::MAX_MESSAGE_BYTES`]).
const MAX_MESSAGE_BYTES: usize = fl_proto::MAX_MESSAGE_BYTES;

/// Interval of HTTP/2 pings while waiting to be sampled (keeps NAT mappings alive).
const KEEPALIVE: Duration = Duration::from_secs(30);

/// Why a client stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Could not reach the server.
    #[error("connecting to {endpoint}: {source}")]
    Connect {
        /// The server address.
        endpoint: String,
        /// The cause.
        source: tonic::transport::Error,
    },
    /// The server answered with an error status (e.g. refused token, refused update).
    #[error("server said: {}: {}", .0.code(), .0.message())]
    Status(#[from] tonic::Status),
    /// The server broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// This client has no examples.
    #[error("this client has no training examples")]
    NoData,
    /// The session ended without a Shutdown (the server went away).
    #[error("the server closed the session without Shutdown")]
    SessionLost,
}

impl ClientError {
    /// Whether the server went away (crashed, restarted, lost the connection) rather than
    /// refused this client: the client then joins again.
    pub fn is_lost_server(&self) -> bool {
        match self {
            Self::SessionLost => true,
            Self::Status(s) => matches!(
                s.code(),
                Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal
            ),
            _ => false,
        }
    }
}

/// The examples a client trains on: a shared dataset and the indices that are this client's.
#[derive(Debug, Clone)]
pub struct LocalData {
    /// The dataset (shared between simulated clients).
    pub data: Arc<Dataset>,
    /// This client's examples.
    pub indices: Vec<usize>,
}

/// How a client reaches and identifies itself to the server.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Server URL, e.g. `http://127.0.0.1:50051`.
    pub endpoint: String,
    /// Enrollment token.
    pub token: String,
    /// Name for the server's logs.
    pub name: String,
    /// Seed for local shuffling (reproducible experiments only).
    pub seed: Option<u64>,
    /// How long to keep retrying the first connection (the server may still be starting).
    pub connect_timeout: Duration,
    /// Limits how many clients of this process train at once (one per core is best).
    pub training_slots: Arc<Semaphore>,
    /// Simulation only: where to record plain secure-aggregation inputs (never sent).
    pub oracle: Option<Arc<PlainInputs>>,
    /// The protection this client insists on, whatever the server asks.
    pub privacy: ClientPrivacy,
    /// TLS settings (with an `https://` endpoint).
    pub tls: Option<ClientTls>,
    /// A connection shared with other clients of this process (see [`shared_connections`]);
    /// `None`: this client opens its own.
    pub connection: Option<Channel>,
}

/// Simulated clients per shared connection: each holds one long-lived Session stream, and a
/// server accepts 200 concurrent HTTP/2 streams per connection by default (hyper's limit).
pub const CLIENTS_PER_CONNECTION: usize = 100;

/// Lazily connected channels for `clients` clients of one process, [`CLIENTS_PER_CONNECTION`]
/// to a connection (HTTP/2 streams multiplexed on it): 10,000 simulated clients then need 100
/// sockets instead of 10,000, within the usual open-file limits. A channel reconnects by itself
/// when its connection is lost.
pub fn shared_connections(
    opts: &ClientOptions,
    clients: usize,
) -> Result<Vec<Channel>, ClientError> {
    let ep = endpoint(opts)?;
    Ok((0..clients.div_ceil(CLIENTS_PER_CONNECTION))
        .map(|_| ep.connect_lazy())
        .collect())
}

/// The endpoint of `opts.endpoint` with keep-alive and TLS settings.
fn endpoint(opts: &ClientOptions) -> Result<Endpoint, ClientError> {
    let connect_error = |source| ClientError::Connect {
        endpoint: opts.endpoint.clone(),
        source,
    };
    let mut ep = Endpoint::from_shared(opts.endpoint.clone())
        .map_err(connect_error)?
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_while_idle(true);
    if let Some(tls) = &opts.tls {
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca));
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &tls.domain {
            config = config.domain_name(domain.clone());
        }
        ep = ep.tls_config(config).map_err(connect_error)?;
    }
    Ok(ep)
}

/// How a client checks the server and proves itself over TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM certificate of the CA that signed the server's certificate.
    pub ca: Vec<u8>,
    /// PEM certificate and key of this client, for servers that require client certificates.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name the server's certificate must carry, when not the endpoint's host.
    pub domain: Option<String>,
}

/// A client's own privacy requirements.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClientPrivacy {
    /// The only local mechanism it uploads with (`None`: whatever the round asks).
    pub require: Option<ReleaseKind>,
    /// Limits that tighten the round's mechanism.
    pub limits: ClientLimits,
}

/// What a client did before the server shut the session down.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientReport {
    /// Rounds this client trained in.
    pub rounds_trained: u64,
    /// The server's reason for ending.
    pub shutdown_reason: String,
    /// Local releases made (uploads protected by a local mechanism).
    pub local_releases: u64,
    /// Their composed epsilon (at the releases' delta; 0 when there were none).
    pub local_epsilon: f64,
}

/// The gRPC client of `opts.endpoint`, connected, retrying with jittered back-off until
/// `opts.connect_timeout` passes: the server may still be starting (or restarting), or a burst of
/// clients may overflow its accept queue (the kernel then resets connections it had half-opened,
/// seen as transport errors or cancellations). `then` runs on the connected client and is retried
/// with it on transient errors; a refusal (bad token, invalid request) is final.
async fn with_server<T, F, Fut>(opts: &ClientOptions, mut then: F) -> Result<T, ClientError>
where
    F: FnMut(FederationClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let deadline = tokio::time::Instant::now() + opts.connect_timeout;
    let connect_error = |source| ClientError::Connect {
        endpoint: opts.endpoint.clone(),
        source,
    };
    let ep = endpoint(opts)?;
    let mut failures = 0u32;
    loop {
        let attempt = async {
            let channel = match &opts.connection {
                Some(shared) => shared.clone(),
                None => ep.connect().await.map_err(connect_error)?,
            };
            let grpc = FederationClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
            then(grpc).await
        };
        match attempt.await {
            Ok(done) => return Ok(done),
            Err(e) if is_transient(&e) && tokio::time::Instant::now() < deadline => {
                failures += 1;
                tokio::time::sleep(retry_pause(failures)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// What a client holds of its identity between sessions: the id and session key of its last
/// Join, which reopen a Session without joining again.
#[derive(Clone)]
struct Held {
    client_id: String,
    session_key: Vec<u8>,
}

/// A session: this client's id, its outgoing queue, the server's stream, and what reopens it.
type Opened = (
    u64,
    mpsc::Sender<ClientMessage>,
    Streaming<ServerMessage>,
    Held,
);

/// Opens the Session stream: first, when it holds an identity, with it (a reconnect keeps the
/// client's id and its place in a running round); when the server no longer knows it (it
/// restarted), by joining again. See [`with_server`] for the retries.
async fn open_session(opts: &ClientOptions, held: Option<&Held>) -> Result<Opened, ClientError> {
    with_server(opts, |mut grpc| async move {
        if let Some(held) = held {
            match hello(&mut grpc, held.clone()).await {
                Err(ClientError::Status(s)) if s.code() == Code::Unauthenticated => {
                    tracing::info!("the server does not know this session any more: joining again");
                }
                other => return other,
            }
        }
        let request = JoinRequest {
            token: opts.token.clone(),
            name: opts.name.clone(),
        };
        let joined = grpc.join(request).await?.into_inner();
        let held = Held {
            client_id: joined.client_id,
            session_key: joined.session_key,
        };
        hello(&mut grpc, held).await
    })
    .await
}

/// Opens a Session with Hello for the identity `held`.
async fn hello(grpc: &mut FederationClient<Channel>, held: Held) -> Result<Opened, ClientError> {
    let id: u64 = held.client_id.parse().map_err(|_| {
        ClientError::Protocol(format!(
            "server issued a non-numeric id {:?}",
            held.client_id
        ))
    })?;
    let (outbox, rx) = mpsc::channel(8);
    let body = client_message::Body::Hello(Hello {
        client_id: held.client_id.clone(),
        session_key: held.session_key.clone(),
    });
    send(&outbox, body).await?;
    let inbound = grpc.session(ReceiverStream::new(rx)).await?.into_inner();
    tracing::debug!(client = id, "session open");
    Ok((id, outbox, inbound, held))
}

/// Asks the server for `count` demo partition indices (for `--partition SCHEME:K:auto`);
/// returns the first.
pub async fn assigned_partition(opts: &ClientOptions, count: u64) -> Result<u64, ClientError> {
    with_server(opts, |mut grpc| async move {
        let request = PartitionRequest {
            token: opts.token.clone(),
            count,
        };
        Ok(grpc.assign_partition(request).await?.into_inner().first)
    })
    .await
}

/// Whether a failed connect or Join may succeed if tried again (including a join refused for
/// its rate).
/// The pause before retry number `failures`: jittered exponential back-off, uniform in
/// [c/4, c] with c = min(5 s, 100 ms x 2^failures), so that thousands of clients refused together by the
/// server's join limiter or its accept queue spread their retries instead of returning in step.
fn retry_pause(failures: u32) -> Duration {
    let ceiling = (100u64 << failures.min(6)).min(5_000);
    Duration::from_millis(rand::rng().random_range(ceiling / 4..=ceiling))
}

fn is_transient(e: &ClientError) -> bool {
    match e {
        ClientError::Connect { .. } => true,
        ClientError::Status(s) => {
            matches!(
                s.code(),
                Code::Unavailable | Code::Unknown | Code::Cancelled | Code::ResourceExhausted
            )
        }
        _ => false,
    }
}

/// Runs one client until the server shuts the session down.
pub async fn run_client(
    opts: ClientOptions,
    local: LocalData,
) -> Result<ClientReport, ClientError> {
    if local.indices.is_empty() {
        return Err(ClientError::NoData);
    }
    let rng = match opts.seed {
        Some(seed) => {
            tracing::warn!(
                seed,
                "seeded client: reproducible experiments only, not for privacy"
            );
            StdRng::seed_from_u64(seed)
        }
        None => StdRng::from_os_rng(),
    };
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

/// Serves one session until the server shuts it down (returning its reason) or it fails.
async fn run_session(
    opts: &ClientOptions,
    local: &LocalData,
    me: u64,
    outbox: mpsc::Sender<ClientMessage>,
    mut inbound: Streaming<ServerMessage>,
    life: &mut Life,
) -> Result<String, ClientError> {
    let mut task: Option<(RoundTask, TensorAssembler)> = None;
    let mut secure: Option<SecureRound> = None;
    loop {
        let Some(message) = inbound.message().await? else {
            return Err(ClientError::SessionLost);
        };
        match message.body {
            Some(server_message::Body::Task(t)) => {
                if t.num_values > fl_common::model::MAX_PARAMS as u64 {
                    return Err(ClientError::Protocol(format!(
                        "task announces a model of {} values, above the limit of {}",
                        t.num_values,
                        fl_common::model::MAX_PARAMS
                    )));
                }
                let assembler = TensorAssembler::new(t.round, t.num_values, t.num_chunks)
                    .map_err(|e| ClientError::Protocol(e.to_string()))?;
                task = Some((t, assembler));
            }
            Some(server_message::Body::ModelChunk(chunk)) => {
                let Some((_, assembler)) = task.as_mut() else {
                    return Err(ClientError::Protocol(
                        "model chunk without a RoundTask".into(),
                    ));
                };
                let Some(global) = assembler
                    .push(chunk)
                    .map_err(|e| ClientError::Protocol(e.to_string()))?
                else {
                    continue;
                };
                let (t, _) = task.take().expect("checked above");
                let round = t.round;
                let reply = match plan_round(&t, local, global.len(), &opts.privacy) {
                    Ok((work, secagg)) => {
                        let permit = opts.training_slots.clone().acquire_owned().await;
                        let (local, seed) = (local.clone(), life.rng.random());
                        let computed = tokio::task::spawn_blocking(move || {
                            let _permit = permit;
                            local_round::compute(&work, &global, &local, seed)
                        })
                        .await
                        .map_err(|e| ClientError::Protocol(format!("training task: {e}")))?;
                        life.rounds_trained += 1;
                        match (computed, secagg) {
                            (Ok(Upload::Plain { values, .. }), Some(sa)) => {
                                secure_start(me, round, sa, &values, opts, &mut life.secret_rng)
                                    .map(|(state, keys)| {
                                        secure = Some(state);
                                        Reply::Stage(client_message::Body::SecaggKeys(keys))
                                    })
                            }
                            (computed, _) => computed.map(Reply::Upload),
                        }
                    }
                    Err(reason) => Err(reason),
                };
                match reply {
                    Ok(Reply::Upload(upload)) => {
                        if let Some(release) = upload.release() {
                            life.spent.record(release);
                            life.spent_delta = life.spent_delta.max(release.delta);
                            tracing::info!(
                                round,
                                mechanism = release.kind.name(),
                                epsilon = release.epsilon,
                                releases = life.spent.releases(),
                                composed_epsilon = life.spent.epsilon(life.spent_delta),
                                "local privacy life.spent"
                            );
                        }
                        send_upload(&outbox, round, local.indices.len() as u64, upload).await?
                    }
                    Ok(Reply::Stage(body)) => send(&outbox, body).await?,
                    Err(reason) => fail(&outbox, round, reason).await?,
                }
            }
            Some(
                body @ (server_message::Body::SecaggNeighbours(_)
                | server_message::Body::SecaggShareInbox(_)
                | server_message::Body::SecaggProceed(_)
                | server_message::Body::SecaggSurvivors(_)),
            ) => {
                let Some(state) = secure.as_mut() else {
                    tracing::debug!("secure-aggregation message outside a secure round: ignored");
                    continue;
                };
                match secure_step(state, body, &mut life.secret_rng) {
                    Ok(Step::Ignore) => {}
                    Ok(Step::Send(bodies)) => {
                        for b in bodies {
                            send(&outbox, b).await?;
                        }
                    }
                    Ok(Step::Done(body)) => {
                        send(&outbox, body).await?;
                        secure = None;
                    }
                    Err(reason) => {
                        let round = state.round;
                        secure = None;
                        fail(&outbox, round, reason).await?;
                    }
                }
            }
            Some(server_message::Body::Shutdown(s)) => return Ok(s.reason),
            None => return Err(ClientError::Protocol("empty ServerMessage".into())),
        }
    }
}

/// What a client sends once its local training is done.
enum Reply {
    /// A plain or locally protected upload.
    Upload(Upload),
    /// The first stage message of a secure-aggregation round.
    Stage(client_message::Body),
}

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

/// A secure-aggregation round in progress: the protocol state and the quantised input x_u.
struct SecureRound {
    round: u64,
    ring: Ring,
    protocol: ClientRound,
    input: Vec<u64>,
}

/// What a stage message asks the client to do.
enum Step {
    /// A message of another round: nothing.
    Ignore,
    /// Send these and wait for the next stage.
    Send(Vec<client_message::Body>),
    /// Send this; the round is over for this client.
    Done(client_message::Body),
}

/// Quantises the update as the task says (clip to S, scale by gamma, stochastic rounding, then
/// the distributed discrete Gaussian noise if any) and starts the protocol: returns its state and
/// the public keys to advertise.
fn secure_start(
    me: u64,
    round: u64,
    task: SecAggTask,
    update: &[f32],
    opts: &ClientOptions,
    rng: &mut StdRng,
) -> Result<(SecureRound, SecAggKeys), String> {
    let ring = Ring::new(task.ring_bits)?;
    if !(task.clip_bound > 0.0
        && task.clip_bound.is_finite()
        && task.scale >= 1.0 / task.clip_bound
        && task.scale.is_finite())
    {
        return Err(format!(
            "unusable quantisation S = {}, gamma = {}",
            task.clip_bound, task.scale
        ));
    }
    if task.noise_variance > MAX_VARIANCE {
        return Err(format!(
            "noise variance {} is beyond the sampler's range",
            task.noise_variance
        ));
    }
    let quantizer = Quantizer {
        ring,
        clip: task.clip_bound,
        scale: task.scale,
    };
    let mut codes = quantizer.encode(update, rng);
    if task.noise_variance > 0 {
        add_discrete_gaussian_noise(&mut codes, task.noise_variance, rng);
    }
    let input = quantizer.to_ring(&codes);
    if let Some(oracle) = &opts.oracle {
        oracle.record(round, me, input.clone());
    }
    let protocol = ClientRound::new(round, me, ring, rng);
    let keys = protocol.advertise();
    let advert = SecAggKeys {
        round,
        cipher_public: keys.cipher_public.to_vec(),
        mask_public: keys.mask_public.to_vec(),
    };
    Ok((
        SecureRound {
            round,
            ring,
            protocol,
            input,
        },
        advert,
    ))
}

/// Answers one stage message of the server.
fn secure_step(
    state: &mut SecureRound,
    body: server_message::Body,
    rng: &mut StdRng,
) -> Result<Step, String> {
    let round = state.round;
    let text = |e: &dyn std::fmt::Display| e.to_string();
    match body {
        server_message::Body::SecaggNeighbours(n) if n.round == round => {
            let neighbours = n
                .neighbours
                .iter()
                .map(AdvertisedKeys::try_from)
                .collect::<Result<_, _>>()
                .map_err(|e| text(&e))?;
            let hood = Neighbourhood {
                threshold: n.threshold as usize,
                neighbours,
            };
            let sealed = state.protocol.share_keys(hood, rng).map_err(|e| text(&e))?;
            Ok(Step::Send(vec![client_message::Body::SecaggShares(
                SecAggShares {
                    round,
                    shares: sealed.iter().map(SealedShare::from).collect(),
                },
            )]))
        }
        server_message::Body::SecaggShareInbox(inbox) if inbox.round == round => {
            let shares: Vec<SealedShares> = inbox
                .shares
                .iter()
                .map(SealedShares::try_from)
                .collect::<Result<_, _>>()
                .map_err(|e| text(&e))?;
            // A neighbour whose shares do not open is, to this client, dropped: it says so.
            let refused = state.protocol.check_shares(&shares).map_err(|e| text(&e))?;
            if !refused.is_empty() {
                tracing::warn!(
                    round,
                    ?refused,
                    "neighbours' shares do not open: treated as dropped"
                );
            }
            Ok(Step::Send(vec![client_message::Body::SecaggCheck(
                SecAggCheck { round, refused },
            )]))
        }
        server_message::Body::SecaggProceed(p) if p.round == round => {
            let proceed = Proceed {
                excluded: p.excluded,
                unpaired: p.unpaired,
            };
            let y = state
                .protocol
                .masked_input(&proceed, &state.input)
                .map_err(|e| text(&e))?;
            let words = ring_words(state.ring, &y);
            let header = client_message::Body::MaskedInputHeader(MaskedInputHeader {
                round,
                num_words: words.len() as u64,
                num_chunks: chunk_count(words.len()),
            });
            let mut bodies = vec![header];
            bodies.extend(
                encode_word_chunks(round, words.len(), |i| words[i])
                    .map(client_message::Body::UpdateChunk),
            );
            Ok(Step::Send(bodies))
        }
        server_message::Body::SecaggSurvivors(s) if s.round == round => {
            let reveals = state.protocol.unmask(&s.survivors).map_err(|e| text(&e))?;
            Ok(Step::Done(client_message::Body::SecaggReveal(
                SecAggReveal {
                    round,
                    shares: reveals.iter().map(RevealedShare::from).collect(),
                },
            )))
        }
        _ => Ok(Step::Ignore),
    }
}

/// Checks that a task fits this client's data; returns the model and training settings.
fn check_model(
    task: &RoundTask,
    local: &LocalData,
    num_values: usize,
) -> Result<(ModelSpec, LocalConfig), String> {
    let spec = ModelSpec::try_from(task.model.as_ref().ok_or("task without a model spec")?)
        .map_err(|e| e.to_string())?;
    let config = LocalConfig::from(task.config.ok_or("task without a local config")?);
    if spec.num_params() != num_values {
        return Err(format!(
            "model {spec} has {} parameters but {num_values} were sent",
            spec.num_params()
        ));
    }
    if spec.inputs() != local.data.num_features() {
        return Err(format!(
            "model takes {} features, local data has {}",
            spec.inputs(),
            local.data.num_features()
        ));
    }
    if local
        .indices
        .iter()
        .any(|&i| local.data.labels()[i] as usize >= spec.classes())
    {
        return Err(format!(
            "local data has labels beyond the model's {} classes",
            spec.classes()
        ));
    }
    if config.epochs == 0
        || config.batch_size == 0
        || !config.learning_rate.is_finite()
        || config.learning_rate <= 0.0
    {
        return Err(format!("unusable local config {config:?}"));
    }
    Ok((spec, config))
}

/// Checks a task against this client's data and its own privacy requirements, and decides how
/// to do the round: the local work, and the secure-aggregation task that follows it, if any. The
/// client never uploads with less protection than it requires: its limits only tighten the
/// round's mechanism, and a round of another kind is refused.
fn plan_round(
    task: &RoundTask,
    local: &LocalData,
    num_values: usize,
    own: &ClientPrivacy,
) -> Result<(Work, Option<SecAggTask>), String> {
    let factor = if task.admm.is_some() { 2 } else { 1 };
    if !num_values.is_multiple_of(factor) {
        return Err(format!("an IADMM task cannot carry {num_values} values"));
    }
    let (spec, config) = check_model(task, local, num_values / factor)?;
    let mechanism = task
        .local_privacy
        .as_ref()
        .map(LocalMechanism::try_from)
        .transpose()
        .map_err(|e| e.to_string())?;
    let asked = mechanism.map_or("none", |m| m.name());
    if let Some(required) = own.require
        && required.name() != asked
    {
        return Err(format!(
            "this client uploads only with {}; the round asks for {asked}",
            required.name()
        ));
    }
    if task.secagg.is_some() && (mechanism.is_some() || task.admm.is_some()) {
        return Err("secure aggregation with local privacy or IADMM is not supported".into());
    }
    let mechanism = mechanism.map(|m| m.tightened(&own.limits));
    if let Some(m) = &mechanism {
        m.check(spec.num_params()).map_err(|e| e.to_string())?;
    }
    let admm = match task.admm {
        None => None,
        Some(a) if a.rho > 0.0 && a.rho.is_finite() && a.total_examples > 0 => Some(AdmmStep {
            rho: a.rho,
            total_examples: a.total_examples,
        }),
        Some(a) => {
            return Err(format!(
                "unusable IADMM step rho = {}, I = {}",
                a.rho, a.total_examples
            ));
        }
    };
    let work = Work {
        spec,
        config,
        mechanism,
        admm,
    };
    Ok((work, task.secagg))
}

async fn send(
    outbox: &mpsc::Sender<ClientMessage>,
    body: client_message::Body,
) -> Result<(), ClientError> {
    outbox
        .send(ClientMessage { body: Some(body) })
        .await
        .map_err(|_| ClientError::SessionLost)
}

/// Sends an upload: a dense tensor as a header and its chunks, or a SignDS release. Only a
/// plain upload (no local mechanism; the curator is trusted) carries the example count and loss.
async fn send_upload(
    outbox: &mpsc::Sender<ClientMessage>,
    round: u64,
    num_examples: u64,
    upload: Upload,
) -> Result<(), ClientError> {
    let (header, values) = match upload {
        Upload::Plain { values, loss } => {
            let header = client_message::Body::UpdateHeader(UpdateHeader {
                round,
                num_examples,
                num_values: values.len() as u64,
                num_chunks: chunk_count(values.len()),
                train_loss: loss,
            });
            (header, values)
        }
        Upload::Released { values, release } => {
            let header = client_message::Body::ReleaseHeader(ReleaseHeader {
                round,
                num_values: values.len() as u64,
                num_chunks: chunk_count(values.len()),
                release: Some(LocalRelease::from(&release)),
            });
            (header, values)
        }
        Upload::Sign {
            sign,
            indices,
            release,
        } => {
            let upload = SignDsUpload {
                round,
                sign: i32::from(sign),
                indices: indices.into_iter().map(u64::from).collect(),
                release: Some(LocalRelease::from(&release)),
            };
            return send(outbox, client_message::Body::SigndsUpload(upload)).await;
        }
    };
    send(outbox, header).await?;
    for chunk in encode_chunks(round, &values) {
        send(outbox, client_message::Body::UpdateChunk(chunk)).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fl_common::data::Dataset;
    use fl_common::privacy::Release;
    use fl_proto::v1::{GaussianLdp, LaplaceLdp, LocalPrivacy, local_privacy};

    fn local() -> LocalData {
        let features = ndarray::Array2::from_shape_fn((6, 3), |(i, j)| (i + j) as f32);
        let data = Dataset::new(features, vec![0, 1, 0, 1, 0, 1], 2).unwrap();
        LocalData {
            data: Arc::new(data),
            indices: (0..6).collect(),
        }
    }

    fn task(mechanism: Option<local_privacy::Mechanism>) -> RoundTask {
        let spec = ModelSpec::logistic(3, 2).unwrap();
        RoundTask {
            round: 1,
            model: Some((&spec).into()),
            config: Some(
                LocalConfig {
                    epochs: 1,
                    batch_size: 2,
                    learning_rate: 0.1,
                }
                .into(),
            ),
            num_values: 8,
            num_chunks: 1,
            secagg: None,
            local_privacy: mechanism.map(|m| LocalPrivacy { mechanism: Some(m) }),
            admm: None,
        }
    }

    fn gaussian(epsilon: f64) -> Option<local_privacy::Mechanism> {
        Some(local_privacy::Mechanism::Gaussian(GaussianLdp {
            epsilon,
            delta: 1e-5,
            clip_bound: 1.0,
        }))
    }

    #[test]
    fn a_client_refuses_rounds_below_its_requirements_and_tightens_the_rest() {
        let follow = ClientPrivacy::default();
        let err = plan_round(&task(gaussian(0.0)), &local(), 8, &follow).err();
        assert!(err.unwrap().contains("local epsilon = 0"));
        let laplace_only = ClientPrivacy {
            require: Some(ReleaseKind::Laplace),
            ..ClientPrivacy::default()
        };
        let err = plan_round(&task(gaussian(2.0)), &local(), 8, &laplace_only).err();
        assert!(err.unwrap().contains("uploads only with ldp-laplace"));
        let err = plan_round(&task(None), &local(), 8, &laplace_only).err();
        assert!(err.unwrap().contains("the round asks for none"));
        let strict = ClientPrivacy {
            require: Some(ReleaseKind::Laplace),
            limits: ClientLimits {
                epsilon: Some(0.5),
                ..ClientLimits::default()
            },
        };
        let laplace = Some(local_privacy::Mechanism::Laplace(LaplaceLdp {
            epsilon: 2.0,
            clip_bound: 1.0,
        }));
        let (work, secagg) = plan_round(&task(laplace), &local(), 8, &strict).unwrap();
        assert!(secagg.is_none());
        assert_eq!(
            work.mechanism,
            Some(LocalMechanism::Laplace {
                epsilon: 0.5,
                clip: 1.0
            })
        );
        // The upload carries the tightened loss, which the round admits.
        let upload = local_round::compute(&work, &[0.0; 8], &local(), 1).unwrap();
        let release: &Release = upload.release().unwrap();
        assert_eq!(release.epsilon, 0.5);
        let round = LocalMechanism::Laplace {
            epsilon: 2.0,
            clip: 1.0,
        };
        round.admits(release).unwrap();
    }
}
