//! Start-up: checks, the run folder, the pipeline, every endpoint, and the background tasks
//! that keep the edge's state (enrollment file, idle clients), handed to the coordinator.

use crate::config::{self, RunConfig};
use crate::edge::clients;
use crate::edge::registry::Registry;
use crate::edge::shared::Shared;
use crate::edge::transport::Listener;
use crate::edge::{join_gate, session, transport};
use crate::error::ServerError;
use crate::identity::credentials::{Credentials, EnrollmentList};
use crate::operator::endpoint;
use crate::operator::live_page::{self, LivePage};
use crate::operator::telemetry::{self, Telemetry};
use crate::records::checkpoint::Checkpoint;
use crate::records::ledger::Ledger;
use crate::records::output::{RunFolder, Summary};
use crate::records::run_dir;
use crate::round::events;
use crate::run::coordinator::Observer;
use crate::run::{build, coordinator, model_setup};
use fl_datasets::Dataset;
use fl_secagg::PlainInputs;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Events queued from the handlers to the round loop before handlers wait (back-pressure).
const EVENT_QUEUE: usize = 256;
/// How often the enrollment file is read again for revocations.
const ENROLLMENT_POLL: Duration = Duration::from_secs(1);

/// The shortest shared token the server accepts without a warning: 128 bits in hex.
const MIN_TOKEN_LEN: usize = 32;

pub(crate) async fn run_server(
    listener: Listener,
    mut config: RunConfig,
    test: Option<Arc<Dataset>>,
    observer: Option<Observer>,
    oracle: Option<Arc<PlainInputs>>,
    stop: watch::Receiver<bool>,
    checkpoint: Option<Checkpoint>,
) -> Result<Summary, ServerError> {
    if let Some(seed) = config.server.seed {
        tracing::warn!(seed, "{}", fl_common::rng::SEEDED_WARNING);
    }
    warn_on_short_token(&config);
    check_start(&config, checkpoint.as_ref())?;
    if config.server.out.as_os_str().is_empty() {
        config.server.out = run_dir::fresh("run")?;
    }
    let out = config.server.out.clone();
    let existed = out.exists();
    let started = start(listener, config, test, oracle, stop, checkpoint.as_ref()).await;
    let (coordinator, serving, done_tx) = match started {
        Ok(started) => {
            if checkpoint.is_none() {
                run_dir::mark_latest(&out);
            }
            started
        }
        Err(e) => {
            if checkpoint.is_none()
                && let Err(e) = run_dir::discard_unstarted(&out, existed)
            {
                tracing::warn!(dir = %out.display(), error = %e, "cannot remove the unused run folder");
            }
            return Err(e);
        }
    };
    let result = coordinator::Coordinator {
        observer,
        resume: checkpoint,
        ..coordinator
    }
    .run()
    .await;
    let _ = done_tx.send(true);
    transport::drain(serving).await;
    result
}

/// What can be checked of a run before anything is bound or written: the configuration, what
/// only a server needs of it, that a new run's named folder holds no run (an unnamed one gets a
/// new folder), and the starting model (`model.init`). `fl-server` calls it before it announces
/// its address.
pub fn check_start(config: &RunConfig, checkpoint: Option<&Checkpoint>) -> Result<(), ServerError> {
    config.validate()?;
    config.validate_for_server()?;
    // The enrollment files are read now, so that a bad one is refused before the server
    // listens (they are read again when the run starts, and the clients' while it runs).
    let s = &config.server;
    for file in [&s.enrollment, &s.aggregator_enrollment]
        .into_iter()
        .flatten()
    {
        EnrollmentList::read(file).map_err(|e| ServerError::Config(e.into()))?;
    }
    if checkpoint.is_none() && !config.server.out.as_os_str().is_empty() {
        run_dir::check_unused(&config.server.out)?;
    }
    // An external model is its file: read it now (a built-in network's weights are read with
    // its test set, before anything is written).
    if config.model.is_external() {
        model_setup::starting_model(config, None, checkpoint)?;
    }
    Ok(())
}

/// What a started run hands to its round loop: the coordinator (without its observer and
/// checkpoint), the gRPC server's task, and the switch that ends the endpoints.
type Started = (
    coordinator::Coordinator,
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    watch::Sender<bool>,
);

/// Opens the run folder, builds the pipeline and binds every endpoint: what can fail before
/// the first client is awaited.
async fn start(
    listener: Listener,
    config: RunConfig,
    test: Option<Arc<Dataset>>,
    oracle: Option<Arc<PlainInputs>>,
    stop: watch::Receiver<bool>,
    checkpoint: Option<&Checkpoint>,
) -> Result<Started, ServerError> {
    let start = model_setup::starting_model(&config, test, checkpoint)?;
    let folder = open_folder(&config, checkpoint, start.test.as_ref())?;
    let pipeline =
        build::pipeline(
            &config,
            start.model.num_params(),
            oracle,
            |terms| match checkpoint.map(|c| &c.progress) {
                Some(p) => Ledger::reopen(folder.dir(), terms, p.round, p.ledger.as_ref()),
                None => Ledger::create(folder.dir(), terms),
            },
        )?;
    let (shared, events) = shared_state(&config, checkpoint, start.model.num_params())?;
    let telemetry = Arc::new(Telemetry::default());
    let (done_tx, done_rx) = watch::channel(false);
    let page = match &config.server.page_listen {
        Some(_) => {
            let ledger = pipeline.ledger.as_ref();
            let page = LivePage::new(&config, &start.model, ledger, folder.rounds()?)?;
            Some(Arc::new(page))
        }
        None => None,
    };
    let endpoints = (telemetry.clone(), page.clone(), shared.clone());
    spawn_operator_endpoints(&config.server, endpoints, &done_rx).await?;
    let done = transport::signalled(done_rx.clone());
    let serving = transport::spawn_grpc(&config.server, listener, shared.clone(), done)?;
    spawn_edge_upkeep(&config, &shared, done_rx);
    let coordinator = coordinator::Coordinator {
        clients: clients::Clients::new(shared, events, stop),
        rng: fl_common::rng::reproducible(config.server.seed),
        config,
        model: start.model,
        test: start.test,
        pipeline,
        folder,
        observer: None,
        resume: None,
        initial: start.initial,
        telemetry,
        page,
        shortfall: Default::default(),
    };
    Ok((coordinator, serving, done_tx))
}

/// The run folder: a fresh one, or the interrupted run's reopened at its `checkpoint`.
fn open_folder(
    config: &RunConfig,
    checkpoint: Option<&Checkpoint>,
    test: Option<&model_setup::TestSet>,
) -> std::io::Result<RunFolder> {
    let Some(c) = checkpoint else {
        return RunFolder::create(&config.server.out);
    };
    let last = c.progress.last_round.clone().map(|mut line| {
        // The line's evaluation is that of the checkpoint's model (Progress::last_round).
        let eval = test.map(|t| t.evaluate(&c.model));
        line.test_accuracy = eval.as_ref().map(|e| e.accuracy);
        line.test_loss = eval.map(|e| e.loss);
        line
    });
    RunFolder::reopen(&config.server.out, c.progress.round, last.as_ref())
}

/// Serves the metrics and the live page where `s` asks, until `done`.
async fn spawn_operator_endpoints(
    s: &config::ServerSection,
    (telemetry, page, shared): (Arc<Telemetry>, Option<Arc<LivePage>>, Arc<Shared>),
    done: &watch::Receiver<bool>,
) -> Result<(), ServerError> {
    let token = s.operator_token.as_ref().map(|t| t.digest());
    if let Some(addr) = &s.metrics_listen {
        let app = telemetry::router(telemetry, shared.clone());
        let done = transport::signalled(done.clone());
        endpoint::spawn_endpoint("metrics endpoint", addr, app, token, done).await?;
    }
    if let (Some(addr), Some(page)) = (&s.page_listen, page) {
        let app = live_page::router(page, shared);
        let done = transport::signalled(done.clone());
        endpoint::spawn_endpoint("live run page", addr, app, token, done).await?;
    }
    Ok(())
}

/// Warns when a shared token is short enough to be guessed back from its digest.
fn warn_on_short_token(config: &RunConfig) {
    let Some(clear) = config.server.token.as_ref().and_then(|t| t.clear()) else {
        return;
    };
    // The token's unsalted digest is written into the run folder; only a long random token
    // cannot be guessed back from it.
    if clear.len() < MIN_TOKEN_LEN {
        tracing::warn!(
            "the enrollment token is shorter than {MIN_TOKEN_LEN} characters: whoever reads the \
             run folder can guess it from its digest; use a random one (`openssl rand -hex 32`) \
             or `fl enroll`"
        );
    }
}

/// The state the handlers share with the coordinator, and the coordinator's end of the event
/// queue; a resumed run keeps its clients' identities.
pub(crate) fn shared_state(
    config: &RunConfig,
    checkpoint: Option<&Checkpoint>,
    num_params: usize,
) -> Result<(Arc<Shared>, mpsc::Receiver<events::Arrival>), ServerError> {
    let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
    let credentials = Credentials::new(
        config.server.token.as_ref().map(|t| t.digest()),
        config.server.enrollment.as_deref(),
    )
    .map_err(|e| ServerError::Config(e.into()))?;
    let registry = match checkpoint {
        Some(c) => Registry::restore(&c.progress.clients),
        None => Registry::default(),
    };
    let s = &config.server;
    let aggregator_enrollment = (s.aggregator_enrollment.as_deref())
        .map(EnrollmentList::read)
        .transpose()
        .map_err(|e| ServerError::Config(e.into()))?;
    let shared = Arc::new(Shared {
        registry: Mutex::new(registry),
        credentials: Mutex::new(credentials),
        num_params,
        events: events_tx,
        uploads: Arc::new(tokio::sync::Semaphore::new(session::UPLOADS_AT_ONCE)),
        next_partition: Default::default(),
        joins: join_gate::JoinGate::new(s.join_rate, s.join_burst),
        upload_stall: Duration::from_secs_f64(s.upload_stall_secs),
        max_idle: s.max_idle_clients,
        forget_after: Duration::from_secs_f64(s.forget_after_secs),
        groups: Mutex::new(crate::edge::groups::Groups::new(s.aggregators)),
        aggregator_token: s.aggregator_token.as_ref().map(|t| t.digest()),
        aggregator_enrollment,
        coordinates: s.aggregators > 0,
    });
    Ok((shared, events))
}

/// Starts the background tasks that keep the edge's state until `done`: idle clients forgotten,
/// and the enrollment file read again every second.
pub(crate) fn spawn_edge_upkeep(
    config: &RunConfig,
    shared: &Arc<Shared>,
    done: watch::Receiver<bool>,
) {
    tokio::spawn(forget_idle_clients(shared.clone(), done));
    if config.server.enrollment.is_some() {
        tokio::spawn(watch_enrollment(shared.clone()));
    }
}

/// Reads the enrollment file every second: revocations take effect even when nobody joins.
async fn watch_enrollment(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(ENROLLMENT_POLL);
    while !shared.events.is_closed() {
        tick.tick().await;
        shared.enforce_enrollment();
    }
}

/// Forgets, every few seconds until `done`, the clients that have had no stream for
/// `forget_after`.
async fn forget_idle_clients(shared: Arc<Shared>, mut done: watch::Receiver<bool>) {
    let every = (shared.forget_after / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = done.wait_for(|d| *d) => return,
        }
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
