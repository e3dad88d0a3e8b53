//! The curator server: admits clients over gRPC, runs the rounds, aggregates with a
//! [`strategy::Strategy`], and writes the run folder.
//!
//! The gRPC handlers ([`service`]) only move bytes and check framing; all round state lives in
//! the round loop ([`rounds`]), which the handlers feed with events (the shape of xaynet's
//! coordinator).

#![deny(missing_docs)]

mod accept;
pub mod checkpoint;
pub mod config;
pub mod credentials;
pub mod ledger;
pub mod local_accounts;
pub mod output;
pub mod registry;
pub mod rounds;
pub mod secure_round;
pub mod service;
pub mod strategy;
pub mod telemetry;

use checkpoint::Checkpoint;
use config::{
    Aggregator, Algorithm, ClipMode, ConfigError, PrivacyMode, RobustSection, RunConfig,
    SecAggNoise,
};
use credentials::Credentials;
use fl_common::data::Dataset;
use fl_common::model::LocalConfig;
use fl_common::privacy::LocalMechanism;
use fl_common::secagg::PlainInputs;
use fl_proto::v1::federation_server::FederationServer;
use ledger::Ledger;
use local_accounts::LocalAccounts;
use output::{RoundMetrics, RunFolder, Summary};
use rand::SeedableRng;
use rand::rngs::StdRng;
use registry::Registry;
use service::{FederationService, Shared};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use strategy::{
    ClipRule, DpFedAvg, FedAvg, Iadmm, NormBound, QuantileClip, ResidualBalancing, SecureSum,
    SignDsAvg, Strategy, SumNoise, TrimmedMean,
};
use telemetry::Telemetry;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

/// Largest gRPC message accepted or sent ([`fl_proto::MAX_MESSAGE_BYTES`]).
pub const MAX_MESSAGE_BYTES: usize = fl_proto::MAX_MESSAGE_BYTES;
/// Events queued from the handlers to the round loop before handlers wait (back-pressure).
const EVENT_QUEUE: usize = 256;
/// Interval of HTTP/2 pings on idle connections: clients that are not sampled for many rounds keep
/// a live stream through NATs and proxies, and dead peers are noticed.
const KEEPALIVE: Duration = Duration::from_secs(30);
/// How long a keep-alive ping may go unanswered before the connection is closed.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// How often the enrollment file is read again for revocations.
const ENROLLMENT_POLL: Duration = Duration::from_secs(1);
/// How long connections get to close after training ends.
const DRAIN: Duration = Duration::from_secs(5);

/// Called with each round's metrics (e.g. to drive a progress bar).
pub type Observer = Arc<dyn Fn(&RoundMetrics) + Send + Sync>;

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The run folder could not be written.
    #[error("writing the run folder: {0}")]
    Io(#[from] std::io::Error),
    /// Fewer than K clients connected in time.
    #[error("only {connected} of {expected} expected clients connected before the join timeout")]
    NotEnoughClients {
        /// Clients connected.
        connected: usize,
        /// K.
        expected: usize,
    },
    /// The operator stopped the server before the first round.
    #[error("interrupted before training started")]
    Interrupted,
    /// The gRPC transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A bug or a lost background task.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Serves the federation on `listener` and runs the training `config` describes, evaluating on
/// `test`. Returns the run summary once training ends (all rounds, or `stop` set to true).
/// `oracle` (simulation only) holds the clients' plain secure-aggregation inputs, so that each
/// round's unmasked sum can be checked.
pub async fn serve(
    listener: TcpListener,
    config: RunConfig,
    test: Arc<Dataset>,
    observer: Option<Observer>,
    oracle: Option<Arc<PlainInputs>>,
    stop: watch::Receiver<bool>,
) -> Result<Summary, ServerError> {
    run_server(listener, config, test, observer, oracle, stop, None).await
}

/// Resumes the interrupted run whose folder is `dir` from its `checkpoint` (see
/// [`checkpoint`]): the model, counters and strategy state come from the checkpoint, the ledger
/// and `metrics.jsonl` are appended to, and training goes on from the round after the last one
/// any of them recorded, with the checkpoint's configuration.
pub async fn resume(
    listener: TcpListener,
    dir: &std::path::Path,
    checkpoint: Checkpoint,
    test: Arc<Dataset>,
    stop: watch::Receiver<bool>,
) -> Result<Summary, ServerError> {
    let mut config = checkpoint.progress.config.clone();
    config.server.out = dir.to_owned();
    run_server(listener, config, test, None, None, stop, Some(checkpoint)).await
}

/// The shortest shared token the server accepts without a warning: 128 bits in hex.
const MIN_TOKEN_LEN: usize = 32;

/// A transport builder with TLS (and client certificates) when the configuration asks for it.
fn server_builder(s: &config::ServerSection) -> Result<Server, ServerError> {
    let (Some(cert), Some(key)) = (&s.tls_cert, &s.tls_key) else {
        let loopback = s
            .listen
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|a| a.ip().is_loopback());
        if !loopback {
            tracing::warn!("TLS is off: updates and models travel in clear text");
        }
        return Ok(Server::builder());
    };
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| {
            ServerError::Config(ConfigError::Invalid(format!(
                "reading {}: {e}",
                p.display()
            )))
        })
    };
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(read(cert)?, read(key)?));
    if let Some(ca) = &s.tls_client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read(ca)?));
    }
    Ok(Server::builder().tls_config(tls)?)
}

async fn run_server(
    listener: TcpListener,
    config: RunConfig,
    test: Arc<Dataset>,
    observer: Option<Observer>,
    oracle: Option<Arc<PlainInputs>>,
    stop: watch::Receiver<bool>,
    checkpoint: Option<Checkpoint>,
) -> Result<Summary, ServerError> {
    config.validate()?;
    config.validate_for_server()?;
    if let Some(clear) = config.server.token.as_ref().and_then(|t| t.clear()) {
        // The token's unsalted digest is written into the run folder; only a long random token
        // cannot be guessed back from it.
        if clear.len() < MIN_TOKEN_LEN {
            tracing::warn!(
                "the enrollment token is shorter than {MIN_TOKEN_LEN} characters: whoever reads \
                 the run folder can guess it from its digest; use a random one (`openssl rand \
                 -hex 32`) or `fl enroll`"
            );
        }
    }
    let spec = config.model.spec(test.num_features(), test.num_classes())?;
    let dim = spec.num_params();
    let local_mechanism = config.local_mechanism(dim)?;
    let rng = match config.server.seed {
        Some(seed) => {
            tracing::warn!(
                seed,
                "seeded run: sampling and initialisation are reproducible; NOT for production privacy"
            );
            StdRng::seed_from_u64(seed)
        }
        None => StdRng::from_os_rng(),
    };
    let checkpointed = checkpoint.as_ref().map(|c| c.progress.round);
    let folder = match &checkpoint {
        Some(c) => {
            let last = c.progress.last_round.as_ref();
            RunFolder::reopen(&config.server.out, c.progress.round, last)?
        }
        None => RunFolder::create(&config.server.out)?,
    };
    let accountant = config.accountant();
    let open_ledger = |budget| match checkpointed {
        Some(round) => Ledger::reopen(folder.dir(), budget, accountant, round),
        None => Ledger::create(folder.dir(), budget, accountant),
    };
    let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
    let credentials = Credentials::new(
        config.server.token.as_ref().map(|t| t.digest()),
        config.server.enrollment.as_deref(),
    )
    .map_err(|e| ServerError::Config(ConfigError::Invalid(e)))?;
    let registry = match &checkpoint {
        Some(c) => Registry::restore(&c.progress.clients),
        None => Registry::default(),
    };
    let shared = Arc::new(Shared {
        registry: Mutex::new(registry),
        credentials: Mutex::new(credentials),
        num_params: spec.num_params(),
        events: events_tx,
        next_partition: Default::default(),
        joins: service::JoinGate::new(config.server.join_rate, config.server.join_burst),
        upload_stall: Duration::from_secs_f64(config.server.upload_stall_secs),
        max_idle: config.server.max_idle_clients,
        forget_after: Duration::from_secs_f64(config.server.forget_after_secs),
    });
    let sweeper = tokio::spawn(forget_idle_clients(shared.clone()));
    if config.server.enrollment.is_some() {
        let shared = shared.clone();
        tokio::spawn(async move {
            // Revocations take effect within a second even when nobody joins.
            let mut tick = tokio::time::interval(ENROLLMENT_POLL);
            while !shared.events.is_closed() {
                tick.tick().await;
                shared.enforce_enrollment();
            }
        });
    }
    let service = FederationServer::new(FederationService::new(shared.clone()))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let telemetry = Arc::new(Telemetry::default());
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let (metrics_done_tx, metrics_done) = tokio::sync::oneshot::channel::<()>();
    if let Some(addr) = &config.server.metrics_listen {
        let listener = TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        tracing::info!(address = %bound, "Prometheus metrics at /metrics");
        if !bound.ip().is_loopback() {
            tracing::warn!(
                address = %bound,
                "the metrics endpoint is reachable beyond this host: its counts (clients \
                 connected, dropped, updates) are curator-side figures the privacy guarantee does \
                 not cover"
            );
        }
        let done = async {
            let _ = metrics_done.await;
        };
        let (t, sh) = (telemetry.clone(), shared.clone());
        tokio::spawn(async move {
            if let Err(e) = telemetry::serve_metrics(listener, t, sh, done).await {
                tracing::warn!(error = %e, "metrics endpoint failed");
            }
        });
    }
    let handshake = Duration::from_secs_f64(config.server.handshake_timeout_secs);
    let transport = tokio::spawn(
        server_builder(&config.server)?
            .http2_keepalive_interval(Some(KEEPALIVE))
            .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
            // A span per RPC: every line logged while handling it names the method.
            .trace_fn(|request| tracing::info_span!("rpc", method = %request.uri().path()))
            .add_service(service)
            .serve_with_incoming_shutdown(accept::guarded(listener, handshake), async {
                let _ = done_rx.await;
            }),
    );
    let local_config = config.train.local_config();
    let (strategy, ledger) = match config.privacy.mode {
        _ if config.train.algorithm == Algorithm::Iadmm => {
            let a = &config.admm;
            let balancing = a.balance.then_some(ResidualBalancing {
                mu: a.balance_mu,
                tau: a.balance_tau,
            });
            let iadmm = Iadmm::new(dim, a.rho, balancing, local_config);
            (Box::new(iadmm) as Box<dyn Strategy>, None)
        }
        // Config validation keeps the norm bound to mode "none"; local releases may be
        // trimmed (post-processing).
        PrivacyMode::None | PrivacyMode::LdpGaussian | PrivacyMode::LdpLaplace => {
            (plain_fedavg(&config.robust, dim, local_config), None)
        }
        PrivacyMode::SignDs => {
            let Some(LocalMechanism::SignDs { k, h, epsilon }) = local_mechanism else {
                unreachable!("signds runs have a SignDS mechanism");
            };
            tracing::info!(
                d = dim,
                k,
                h,
                epsilon,
                "SignDS: each upload is a sign and h indices"
            );
            let lr = config.signds.global_learning_rate as f32;
            let avg = SignDsAvg::new(dim, h, lr, local_config);
            (Box::new(avg) as Box<dyn Strategy>, None)
        }
        PrivacyMode::Central => {
            let p = &config.privacy;
            let rule = match p.clip {
                ClipMode::Fixed => ClipRule::Fixed(p.clip_bound),
                ClipMode::Median => {
                    tracing::warn!(
                        "clip = median: S is the median of the clients' update norms, which is \
                         NOT private; the reported epsilon does not cover it"
                    );
                    ClipRule::Median
                }
                ClipMode::Quantile => ClipRule::Quantile(QuantileClip {
                    bound: p.clip_bound,
                    target: p.target_quantile,
                    learning_rate: p.clip_learning_rate,
                    count_noise: p.count_noise(config.clients_at(1) as f64),
                }),
            };
            // Noise always comes from a generator seeded by the OS, even in seeded runs.
            let noise_rng = StdRng::from_os_rng();
            let dp = DpFedAvg::new(
                spec.num_params(),
                config.train.local_config(),
                rule,
                noise_rng,
            );
            let ledger = open_ledger(p.budget())?;
            (Box::new(dp) as Box<dyn Strategy>, Some(ledger))
        }
        PrivacyMode::SecAgg => {
            let noise = match config.secagg.noise {
                SecAggNoise::None => SumNoise::None,
                SecAggNoise::Central => SumNoise::Central,
                SecAggNoise::Distributed => SumNoise::Distributed,
            };
            let ledger = match noise {
                SumNoise::None => None,
                _ => Some(open_ledger(config.privacy.budget())?),
            };
            let sum = SecureSum::new(config.train.local_config(), noise, StdRng::from_os_rng());
            (Box::new(sum) as Box<dyn Strategy>, ledger)
        }
    };
    let config_delta = config.local.delta;
    let resume = checkpoint.map(|c| {
        let next = c.progress.round + 1;
        (c, next)
    });
    let result = rounds::RoundLoop {
        shared,
        events,
        config,
        spec,
        test,
        strategy,
        rng,
        folder,
        observer,
        stop,
        oracle,
        ledger,
        local: local_mechanism.map(|m| LocalAccounts::new(m, config_delta)),
        resume,
        telemetry,
    }
    .run()
    .await;
    sweeper.abort();
    let _ = done_tx.send(());
    let _ = metrics_done_tx.send(());
    match tokio::time::timeout(DRAIN, transport).await {
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "transport ended with an error"),
        Err(_) => tracing::warn!("connections still open after the drain period; closing"),
        _ => {}
    }
    result
}

/// Forgets, every few seconds, the clients that have had no stream for `forget_after`.
async fn forget_idle_clients(shared: Arc<Shared>) {
    let every = (shared.forget_after / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let Some(cutoff) = std::time::Instant::now().checked_sub(shared.forget_after) else {
            continue;
        };
        let forgotten = shared.registry().forget_idle(cutoff);
        if forgotten > 0 {
            tracing::info!(forgotten, "forgot clients without a session");
            release_freed_memory();
        }
    }
}

/// Hands memory freed back to the OS: glibc's allocator otherwise keeps it, and after a join
/// flood the server would stay at its high-water mark.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only returns free heap pages to the OS.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// FedAvg over updates the server sees (non-private, or local releases) as `[robust]` asks: the
/// weighted or the trimmed mean, behind the update-norm bound if there is one.
fn plain_fedavg(robust: &RobustSection, dim: usize, local: LocalConfig) -> Box<dyn Strategy> {
    fn bounded<S: Strategy + 'static>(inner: S, robust: &RobustSection) -> Box<dyn Strategy> {
        match robust.max_update_norm {
            Some(bound) => Box::new(NormBound::new(inner, bound, robust.norm_action)),
            None => Box::new(inner),
        }
    }
    match robust.aggregator {
        Aggregator::Mean => bounded(FedAvg::new(dim, local), robust),
        Aggregator::TrimmedMean => {
            bounded(TrimmedMean::new(dim, robust.trim_fraction, local), robust)
        }
    }
}
