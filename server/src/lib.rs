//! The curator server: admits clients over gRPC, runs the rounds, aggregates them, and writes the
//! run folder.
//!
//! The crate is layered; each folder of `src` is one layer and imports only the layers before it
//! in this list (checked by `server/tests/tidy/`):
//!
//! 1. `identity`: client ids and credentials;
//! 2. `config`: the TOML configuration and the privacy plan it parses into;
//! 3. `error`: [`ServerError`], why a run failed;
//! 4. `records`: the ledger, the checkpoint and the run folder's files;
//! 5. `round`: a round's vocabulary and rules (events, rejections, policies, strategies);
//! 6. `edge`: gRPC, the streams and the registry of clients, the round's port to them;
//! 7. `operator`: the metrics endpoint and the live page;
//! 8. `run`: the privacy plan built into a pipeline, the collection, the round loop, start-up.
//!
//! # Public surface
//!
//! What the binaries (`fl-server`, `fl`), the fuzz target and the tests use, and nothing else:
//!
//! - running a federation: [`serve`], [`resume`], [`check_start`], [`stop_on_signal`],
//!   [`shutdown_signal`], [`Listener`] (with [`InProcessService`] for `fl sim`), [`Observer`],
//!   [`ServerError`]; an aggregator of the aggregator tier: [`aggregate`] with its
//!   [`UpstreamOptions`];
//! - the configuration: [`config`];
//! - the run folder: [`checkpoint`], [`ledger`] (read, replay and verify a ledger),
//!   [`output`] (metrics lines, summary, atomic writes), [`run_dir`], [`model_file`];
//! - credentials: [`credentials`] (tokens, enrollment lists; what `fl enroll` writes);
//! - the live page's default address, [`DEFAULT_PAGE_ADDR`];
//! - the stream framing the fuzz target drives: [`Framer`] and the [`Event`]s it produces.

#![deny(missing_docs)]
#![warn(unreachable_pub)]

pub mod config;
mod edge;
mod error;
mod identity;
mod operator;
mod records;
mod round;
mod run;

pub use edge::framer::Framer;
pub use edge::transport::{InProcessService, Listener};
pub use edge::upstream::UpstreamOptions;
pub use error::ServerError;
pub use identity::credentials;
pub use operator::live_page::DEFAULT_ADDR as DEFAULT_PAGE_ADDR;
pub use records::{checkpoint, ledger, model_file, output, run_dir};
pub use round::events::Event;
pub use run::coordinator::Observer;
pub use run::helper::{HelperFloors, HelperOptions};
pub use run::start::check_start;

use config::RunConfig;
use fl_datasets::Dataset;
use fl_secagg::PlainInputs;
use records::checkpoint::Checkpoint;
use records::output::Summary;
use run::start;
use std::sync::Arc;
use tokio::sync::watch;

/// Serves the federation on `listener` and runs the training `config` describes, evaluating a
/// built-in network on `test` (an external model needs none, see `model.kind` in the configuration reference). Returns the run summary once training ends (all rounds, or `stop` set to true).
/// `oracle` (simulation only) holds the clients' plain secure-aggregation inputs, so that each
/// round's unmasked sum can be checked.
pub async fn serve(
    listener: impl Into<Listener>,
    config: RunConfig,
    test: Option<Arc<Dataset>>,
    observer: Option<Observer>,
    oracle: Option<Arc<PlainInputs>>,
    stop: watch::Receiver<bool>,
) -> Result<Summary, ServerError> {
    start::run_server(listener.into(), config, test, observer, oracle, stop, None).await
}

/// Runs an aggregator (the aggregator tier) on `listener`: it reaches its coordinator as
/// `upstream` says, then serves its clients under `config`'s `[server]` section (the rest of
/// the run comes from the coordinator) until the coordinator says training is over or `stop` is
/// set.
pub async fn aggregate(
    listener: impl Into<Listener>,
    config: RunConfig,
    upstream: UpstreamOptions,
    stop: watch::Receiver<bool>,
) -> Result<(), ServerError> {
    run::aggregator::run_aggregator(listener.into(), config, upstream, stop).await
}

/// Runs the helper of verified rounds on `listener` (TLS as `server` says: its `tls_cert` and
/// `tls_key`) for the leader presenting `options.leader_token`, until `stop` is set.
pub async fn help(
    listener: tokio::net::TcpListener,
    server: &config::ServerSection,
    options: HelperOptions,
    stop: watch::Receiver<bool>,
) -> Result<(), ServerError> {
    run::helper::run_helper(listener, server, options, stop).await
}

/// Resumes the interrupted run whose folder is `dir` from its `checkpoint` (see
/// [`checkpoint`]): the model, counters and strategy state come from the checkpoint, the ledger
/// and `metrics.jsonl` are appended to, and training goes on from the round after the last one
/// any of them recorded, with the checkpoint's configuration.
pub async fn resume(
    listener: impl Into<Listener>,
    (dir, checkpoint): (&std::path::Path, Checkpoint),
    test: Option<Arc<Dataset>>,
    observer: Option<Observer>,
    oracle: Option<Arc<PlainInputs>>,
    stop: watch::Receiver<bool>,
) -> Result<Summary, ServerError> {
    let mut config = checkpoint.progress.config.clone();
    config.server.out = dir.to_owned();
    let listener = listener.into();
    let run = Some(checkpoint);
    start::run_server(listener, config, test, observer, oracle, stop, run).await
}

/// Resolves with the signal's name on SIGINT (Ctrl-C) or SIGTERM (what docker and Kubernetes send
/// to stop a container): what `fl-server` and `fl sim` turn into a stop.
pub async fn shutdown_signal() -> std::io::Result<&'static str> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.map(|()| "SIGINT"),
            _ = term.recv() => Ok("SIGTERM"),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await.map(|()| "SIGINT")
    }
}

/// Sends true on `stop` at the first SIGINT or SIGTERM; resolves with the signal's name.
pub fn stop_on_signal(stop: watch::Sender<bool>) -> tokio::task::JoinHandle<Option<&'static str>> {
    tokio::spawn(async move {
        match shutdown_signal().await {
            Ok(signal) => {
                tracing::warn!(
                    signal,
                    "stopping: the current round ends now, then the run is recorded"
                );
                let _ = stop.send(true);
                Some(signal)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGINT and SIGTERM");
                None
            }
        }
    })
}
