//! `fl-server`: the curator as a standalone process.

use anyhow::Context;
use clap::Parser;
use fl_datasets::DataSource;
use fl_server::checkpoint::Checkpoint;
use fl_server::config::{ModelKind, RunConfig, ServerSection};
use fl_server::credentials::Token;
use fl_server::output::StoppedBy;
use fl_server::{ServerError, UpstreamOptions, run_dir};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

/// Federated-learning curator server. Flags override the config file.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// TOML run configuration (docs/src/reference/config.md).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on, e.g. 0.0.0.0:50051 (port 0 picks a free one).
    #[arg(long)]
    listen: Option<String>,
    /// K: clients to wait for before the first round.
    #[arg(long)]
    clients: Option<usize>,
    /// m: clients sampled per round (a constant; schedules go in the config file).
    #[arg(long)]
    clients_per_round: Option<u32>,
    /// Fewest results for a round to update the model.
    #[arg(long)]
    min_clients: Option<usize>,
    /// T: rounds.
    #[arg(long)]
    rounds: Option<u64>,
    /// E: local epochs.
    #[arg(long)]
    epochs: Option<u32>,
    /// B: local batch size.
    #[arg(long)]
    batch_size: Option<u32>,
    /// eta: local learning rate.
    #[arg(long)]
    lr: Option<f32>,
    /// Model: mlp, logistic, fedavg-cnn or lenet5 (a `cnn` of your own layers needs a config).
    #[arg(long)]
    model: Option<ModelKind>,
    /// Hidden widths of the MLP, comma-separated.
    #[arg(long, value_delimiter = ',')]
    hidden: Option<Vec<usize>>,
    /// Test data: mnist:DIR or csv:FILE.
    #[arg(long)]
    data: Option<DataSource>,
    /// Run folder.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Seconds a round waits for results.
    #[arg(long)]
    round_timeout: Option<f64>,
    /// PEM certificate of the server: turns TLS on (with --tls-key).
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// PEM CA certificate: only clients with a certificate it signed may connect (mutual TLS).
    #[arg(long)]
    tls_client_ca: Option<PathBuf>,
    /// Address of the Prometheus endpoint (GET /metrics), e.g. 0.0.0.0:9100.
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Serve the live run page at this address (without one: 127.0.0.1:8080; beyond loopback
    /// it needs --operator-token).
    #[arg(long, value_name = "ADDR", num_args = 0..=1,
          default_missing_value = fl_server::DEFAULT_PAGE_ADDR)]
    page_listen: Option<String>,
    /// Token the live run page and the metrics endpoint require (HTTP Basic password or Bearer
    /// token). Prefer the FL_OPERATOR_TOKEN environment variable.
    #[arg(long, env = "FL_OPERATOR_TOKEN", hide_env_values = true)]
    operator_token: Option<String>,
    /// Seed (reproducible experiments only; not for production privacy).
    #[arg(long)]
    seed: Option<u64>,
    /// Enrollment token clients must present (default: the config's, else none). Prefer the
    /// FL_TOKEN environment variable, which does not show in process listings.
    #[arg(
        long,
        env = "FL_TOKEN",
        hide_env_values = true,
        conflicts_with = "enrollment"
    )]
    token: Option<String>,
    /// Enrollment file naming each client with its own token or certificate; edit it (or use
    /// `fl enroll` / `fl revoke`) while the server runs to admit or revoke clients.
    #[arg(long, value_name = "FILE")]
    enrollment: Option<PathBuf>,
    /// Override a key of the --config file: `--set section.key=VALUE` (repeatable), e.g.
    /// `--set privacy.mode=ldp-gaussian`.
    #[arg(long = "set", value_name = "KEY=VALUE", requires = "config")]
    overrides: Vec<String>,
    /// Resume the interrupted run in this folder from its checkpoint, with its configuration
    /// (only --listen, --metrics-listen, --page-listen and --operator-token may change).
    #[arg(long, value_name = "DIR", conflicts_with = "config")]
    resume: Option<PathBuf>,
    /// With --config: when the run folder already holds a checkpoint (a server restarted or
    /// rescheduled, e.g. by Kubernetes), resume that run as --resume would, listening where the
    /// configuration says; otherwise start the configured run.
    #[arg(long, requires = "config")]
    resume_existing: bool,
    /// Start over in a run folder that holds a run: its privacy ledger is kept beside the new
    /// run as `ledger-replaced-TIME.jsonl`, its other records are replaced.
    #[arg(long, conflicts_with_all = ["resume", "resume_existing"])]
    overwrite: bool,
    /// `server` runs the federation (serving its clients itself, or coordinating
    /// `--aggregators`); `aggregator` serves clients for the coordinator at --upstream.
    #[arg(long, value_enum, default_value_t = Role::Server)]
    role: Role,
    /// The aggregator tier, on the coordinator: how many aggregators to coordinate (the
    /// population is their clients).
    #[arg(long)]
    aggregators: Option<usize>,
    /// The token aggregators present to the coordinator (on both). Prefer the
    /// FL_AGGREGATOR_TOKEN environment variable.
    #[arg(long, env = "FL_AGGREGATOR_TOKEN", hide_env_values = true)]
    aggregator_token: Option<String>,
    /// A coordinator's enrollment file of aggregators (`fl enroll --file FILE NAME`):
    /// each presents its own token, for its own name only.
    #[arg(long, value_name = "FILE")]
    aggregator_enrollment: Option<PathBuf>,
    /// An aggregator's coordinator, e.g. http://coordinator:50051.
    #[arg(long, value_name = "URL", required_if_eq("role", "aggregator"))]
    upstream: Option<String>,
    /// PEM CA certificate that signed the coordinator's (an https:// --upstream).
    #[arg(long, value_name = "FILE")]
    upstream_ca: Option<PathBuf>,
    /// An aggregator's name, the same across its restarts (default: $HOSTNAME, which is the
    /// container's or the pod's name).
    #[arg(long)]
    name: Option<String>,
    /// A helper's private key file (64 hex digits; made if missing). It prints its public key.
    #[arg(long, value_name = "FILE", required_if_eq("role", "helper"))]
    helper_key: Option<PathBuf>,
    /// The token a helper's leader presents. Prefer the FL_LEADER_TOKEN environment variable.
    #[arg(long, env = "FL_LEADER_TOKEN", hide_env_values = true)]
    leader_token: Option<String>,
    /// A helper's floors: the fewest valid uploads it sums, and its least noise multiplier.
    #[arg(long, value_name = "N:Z", default_value = "2:0")]
    helper_floors: fl_server::HelperFloors,
}

/// What an `fl-server` process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Role {
    /// The federation's server (a coordinator when it has aggregators).
    Server,
    /// An aggregator of the aggregator tier.
    Aggregator,
    /// The helper of verified rounds: the second aggregator, run by another party.
    Helper,
}

impl Args {
    fn resolve(self) -> anyhow::Result<RunConfig> {
        let endpoints = self.operator_endpoints();
        let mut c = match &self.config {
            Some(path) => RunConfig::load_with(path, &self.overrides)?,
            None => RunConfig::default(),
        };
        let s = &mut c.server;
        macro_rules! set {
            ($($flag:expr => $field:expr),* $(,)?) => { $(if let Some(v) = $flag { $field = v; })* };
        }
        set! {
            self.listen => s.listen,
            self.clients => s.clients,
            self.min_clients => s.min_clients,
            self.rounds => s.rounds,
            self.round_timeout => s.round_timeout_secs,
            self.out => s.out,
            self.epochs => c.train.epochs,
            self.batch_size => c.train.batch_size,
            self.lr => c.train.learning_rate,
            self.model => c.model.kind,
            self.hidden => c.model.hidden,
            self.data => c.data.source,
        }
        if let Some(m) = self.clients_per_round {
            c.server.clients_per_round = f64::from(m).into();
        }
        if self.seed.is_some() {
            c.server.seed = self.seed;
        }
        endpoints.apply(&mut c.server);
        if self.tls_cert.is_some() {
            c.server.tls_cert = self.tls_cert;
            c.server.tls_key = self.tls_key;
        }
        if self.tls_client_ca.is_some() {
            c.server.tls_client_ca = self.tls_client_ca;
        }
        if let Some(token) = &self.token {
            c.server.token = Some(Token::new(token));
        }
        if self.enrollment.is_some() {
            c.server.enrollment = self.enrollment;
        }
        if let Some(n) = self.aggregators {
            c.server.aggregators = n;
        }
        if let Some(token) = &self.aggregator_token {
            c.server.aggregator_token = Some(Token::new(token));
        }
        if self.aggregator_enrollment.is_some() {
            c.server.aggregator_enrollment = self.aggregator_enrollment.clone();
        }
        c.validate()?;
        Ok(c)
    }

    /// An aggregator's way to its coordinator.
    fn upstream(&self) -> anyhow::Result<UpstreamOptions> {
        let url = (self.upstream.clone()).context("an aggregator needs --upstream")?;
        let token = self.aggregator_token.clone().unwrap_or_default();
        let name = self.name.clone();
        Ok(UpstreamOptions::read(
            url,
            (name, token),
            self.upstream_ca.as_deref(),
        )?)
    }
}

/// Where the operator's endpoints listen and the token they require: what flags may change, also
/// for a resumed run.
#[derive(Debug)]
struct OperatorEndpoints {
    metrics_listen: Option<String>,
    page_listen: Option<String>,
    operator_token: Option<Token>,
}

impl OperatorEndpoints {
    /// Sets in `s` what was given.
    fn apply(self, s: &mut ServerSection) {
        if self.metrics_listen.is_some() {
            s.metrics_listen = self.metrics_listen;
        }
        if self.page_listen.is_some() {
            s.page_listen = self.page_listen;
        }
        if self.operator_token.is_some() {
            s.operator_token = self.operator_token;
        }
    }
}

impl Args {
    /// The flags given that a resumed run does not honour (it keeps its own configuration),
    /// by name; the tokens, which may come from the environment, are not among them.
    fn unhonoured_on_resume(&self) -> Vec<&'static str> {
        let given = [
            ("--clients", self.clients.is_some()),
            ("--clients-per-round", self.clients_per_round.is_some()),
            ("--min-clients", self.min_clients.is_some()),
            ("--rounds", self.rounds.is_some()),
            ("--epochs", self.epochs.is_some()),
            ("--batch-size", self.batch_size.is_some()),
            ("--lr", self.lr.is_some()),
            ("--model", self.model.is_some()),
            ("--hidden", self.hidden.is_some()),
            ("--data", self.data.is_some()),
            ("--out", self.out.is_some()),
            ("--round-timeout", self.round_timeout.is_some()),
            ("--tls-cert", self.tls_cert.is_some()),
            ("--tls-key", self.tls_key.is_some()),
            ("--tls-client-ca", self.tls_client_ca.is_some()),
            ("--seed", self.seed.is_some()),
            ("--enrollment", self.enrollment.is_some()),
            ("--aggregators", self.aggregators.is_some()),
            (
                "--aggregator-enrollment",
                self.aggregator_enrollment.is_some(),
            ),
            ("--set", !self.overrides.is_empty()),
        ];
        given
            .into_iter()
            .filter(|(_, g)| *g)
            .map(|(f, _)| f)
            .collect()
    }

    fn operator_endpoints(&self) -> OperatorEndpoints {
        OperatorEndpoints {
            metrics_listen: self.metrics_listen.clone(),
            page_listen: self.page_listen.clone(),
            operator_token: self.operator_token.as_deref().map(Token::new),
        }
    }
}

/// The run to serve: a fresh one from the configuration, or an interrupted one (its folder and
/// checkpoint) with its own configuration, of which only where it and its operator endpoints
/// listen, and the operator token, may change.
type Start = (Option<(PathBuf, Checkpoint)>, RunConfig);

/// What `args` ask to serve (--resume, --resume-existing with a checkpoint, or a fresh run).
fn start(args: Args) -> anyhow::Result<Start> {
    let unhonoured = args.unhonoured_on_resume();
    let refuse_unhonoured = |dir: &Path| match unhonoured.as_slice() {
        [] => Ok(()),
        flags => Err(anyhow::anyhow!(
            "resuming {} continues the run with its own configuration: {} would be ignored \
             (only --listen, --metrics-listen, --page-listen and --operator-token may change); \
             leave them out, or start a new run",
            dir.display(),
            flags.join(", ")
        )),
    };
    let (listen, endpoints, dir) = match &args.resume {
        Some(dir) => {
            refuse_unhonoured(dir)?;
            (args.listen.clone(), args.operator_endpoints(), dir.clone())
        }
        None => {
            let (resume_existing, overwrite) = (args.resume_existing, args.overwrite);
            let fresh = args.resolve()?;
            let out = fresh.server.out.clone();
            // An unnamed folder is made new once the run is checked (`run_dir::fresh` in `run`).
            if out.as_os_str().is_empty() {
                return Ok((None, fresh));
            }
            if overwrite {
                // Clears the folder for the new run; its ledger is kept and logged.
                (run_dir::replace(&out))
                    .with_context(|| format!("clearing {} for a new run", out.display()))?;
            }
            if !(resume_existing && Checkpoint::exists(&out)) {
                return Ok((None, fresh));
            }
            refuse_changed(&fresh, &out)?;
            tracing::info!(run = %out.display(), "the run folder holds a checkpoint: resuming it");
            // The configuration's endpoints and token, or the flags' (already in `fresh`).
            let s = fresh.server;
            let endpoints = OperatorEndpoints {
                metrics_listen: s.metrics_listen,
                page_listen: s.page_listen,
                operator_token: s.operator_token,
            };
            (Some(s.listen), endpoints, out)
        }
    };
    if let Some(ended) = run_dir::finished(&dir)? {
        anyhow::bail!(
            "the run in {} has finished ({ended}): there is nothing to resume; start a new run \
             in another folder",
            dir.display()
        );
    }
    let mut checkpoint = Checkpoint::read(&dir)
        .with_context(|| format!("reading the checkpoint in {}", dir.display()))?;
    let c = &mut checkpoint.progress.config;
    if let Some(listen) = listen {
        c.server.listen = listen;
    }
    endpoints.apply(&mut c.server);
    c.validate()?;
    let config = c.clone();
    Ok((Some((dir, checkpoint)), config))
}

/// The settings a resumed run may take from its new start: where it and its operator endpoints
/// listen, and the tokens (the run's own digests are kept when they match).
const MAY_CHANGE_ON_RESUME: [&str; 6] = [
    "server.listen",
    "server.metrics_listen",
    "server.page_listen",
    "server.operator_token",
    "server.token",
    "server.aggregator_token",
];

/// Refuses to resume the run in `dir` under `--resume-existing` when `fresh` (the configuration
/// and flags given) differs from the run's own in a setting the resumed run would ignore,
/// naming each: the same command that started a run resumes it, a changed one is not silently
/// dropped.
fn refuse_changed(fresh: &RunConfig, dir: &Path) -> anyhow::Result<()> {
    let own = Checkpoint::read(dir)
        .with_context(|| format!("reading the checkpoint in {}", dir.display()))?
        .progress
        .config;
    let (a, b) = (serde_json::to_value(fresh)?, serde_json::to_value(&own)?);
    let mut changed = Vec::new();
    differing(&a, &b, String::new(), &mut changed);
    changed.retain(|key| !MAY_CHANGE_ON_RESUME.contains(&key.as_str()));
    if changed.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "{} holds a run whose configuration differs from the one given in {}: a resumed run \
         keeps its own, so the change would be ignored; start a new run (another server.out), \
         or give the run's own settings",
        dir.display(),
        changed.join(", ")
    )
}

/// The dotted keys where `a` and `b` differ, into `out`.
fn differing(a: &serde_json::Value, b: &serde_json::Value, at: String, out: &mut Vec<String>) {
    use serde_json::Value::Object;
    match (a, b) {
        (Object(x), Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let null = serde_json::Value::Null;
                let key = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                differing(
                    x.get(k).unwrap_or(&null),
                    y.get(k).unwrap_or(&null),
                    key,
                    out,
                );
            }
        }
        (x, y) if x != y => out.push(at),
        _ => {}
    }
}

fn main() -> ExitCode {
    // Before the runtime starts its threads (fl_common::allocator).
    fl_common::allocator::tune();
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", fl_common::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// Logs on stderr, filtered by `RUST_LOG` (default `info`).
fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: logs collected by docker or a file stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Runs the helper of verified rounds until a signal stops it.
async fn helper(args: Args) -> anyhow::Result<ExitCode> {
    let key = (args.helper_key.as_deref()).context("a helper needs --helper-key")?;
    let token = args.leader_token.clone().unwrap_or_default();
    let options = fl_server::HelperOptions::read(key, token, args.helper_floors)?;
    let config = args.resolve()?;
    let listener = tokio::net::TcpListener::bind(&config.server.listen).await?;
    let (at, public) = (listener.local_addr()?, options.public_hex());
    println!("listening on {at}\nhelper public key {public}");
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    fl_server::stop_on_signal(stop_tx);
    fl_server::help(listener, &config.server, options, stop).await?;
    Ok(ExitCode::SUCCESS)
}

/// Runs an aggregator until its coordinator ends training or a signal stops it.
async fn aggregator(args: Args) -> anyhow::Result<ExitCode> {
    let upstream = args.upstream()?;
    let mut config = args.resolve()?;
    // The rest of the run is the coordinator's; an aggregator coordinates none.
    config.server.aggregators = 0;
    let listener = (tokio::net::TcpListener::bind(&config.server.listen).await)
        .with_context(|| format!("the gRPC server cannot listen on {}", config.server.listen))?;
    println!("listening on {}", listener.local_addr()?);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let signalled = fl_server::stop_on_signal(stop_tx);
    let served = fl_server::aggregate(listener, config, upstream, stop).await;
    if signalled.is_finished() {
        let signal = signalled.await.ok().flatten().unwrap_or("a signal");
        println!("interrupted by {signal}; its clients reconnect when it is back");
        return Ok(signal_code(signal));
    }
    served?;
    println!("done: the coordinator ended training");
    Ok(ExitCode::SUCCESS)
}

#[tokio::main]
async fn run() -> anyhow::Result<ExitCode> {
    init_logging();
    let args = Args::parse();
    match args.role {
        Role::Aggregator => return aggregator(args).await,
        Role::Helper => return helper(args).await,
        Role::Server => {}
    }
    let name = (args.config.as_deref())
        .and_then(|c| c.file_stem())
        .map_or("fl-server".into(), |s| s.to_string_lossy().into_owned());
    let (resume, mut config) = start(args)?;
    fl_server::check_start(&config, resume.as_ref().map(|(_, c)| c))?;
    // The server evaluates a built-in network on the test set; it cannot run an external model.
    let test = match config.model.is_external() {
        true => None,
        false => {
            let source = config.data.source.clone();
            let test = tokio::task::spawn_blocking(move || source.load_test())
                .await?
                .with_context(|| format!("loading test data from {}", config.data.source))?;
            Some(Arc::new(test))
        }
    };
    let listener = (tokio::net::TcpListener::bind(&config.server.listen).await)
        .with_context(|| format!("the gRPC server cannot listen on {}", config.server.listen))?;
    // Only now, with the test data read and the address bound, is an unnamed run's folder made
    // (a start-up that fails after this removes it: `run_dir::discard_unstarted`).
    if config.server.out.as_os_str().is_empty() {
        config.server.out = run_dir::fresh(&name).context("making a new run folder")?;
    }
    // The bound address on stdout, for scripts and tests that asked for port 0.
    println!("listening on {}", listener.local_addr()?);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let signalled = fl_server::stop_on_signal(stop_tx);
    let (out, served) = match resume {
        Some((dir, checkpoint)) => {
            let run = (dir.as_path(), checkpoint);
            let served = fl_server::resume(listener, run, test, None, None, stop).await;
            (dir, served)
        }
        None => {
            let out = config.server.out.clone();
            let served = fl_server::serve(listener, config, test, None, None, stop).await;
            (out, served)
        }
    };
    let signal = async { signalled.await.ok().flatten().unwrap_or("a signal") };
    let summary = match served {
        // Stopped while waiting for its clients: the checkpoint (round 0, or the resumed
        // run's) is where a resume starts.
        Err(ServerError::Interrupted) => {
            let signal = signal.await;
            println!(
                "interrupted by {signal} before a round, run folder {}",
                out.display()
            );
            return Ok(interrupted(signal, &out));
        }
        served => served?,
    };
    let accuracy =
        (summary.test_accuracy).map_or("none (external model)".into(), |a| format!("{a:.4}"));
    if summary.stopped_by == StoppedBy::Interrupted {
        let signal = signal.await;
        println!(
            "interrupted by {signal} after {} rounds, test accuracy {accuracy}, run folder {}",
            summary.rounds_completed,
            out.display()
        );
        return Ok(interrupted(signal, &out));
    }
    println!(
        "done: {} rounds, test accuracy {accuracy}, run folder {}",
        summary.rounds_completed,
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Prints how to resume the run in `out`, stopped by `signal`; its exit code: 128 + the
/// signal's number, as a shell reports a command a signal ended (143 for SIGTERM, else 130).
fn interrupted(signal: &str, out: &Path) -> ExitCode {
    println!("resume with: fl-server --resume {}", out.display());
    signal_code(signal)
}

/// The exit code of a process `signal` stopped: 128 + the signal's number, as a shell reports a
/// command a signal ended (143 for SIGTERM, else 130).
fn signal_code(signal: &str) -> ExitCode {
    ExitCode::from(if signal == "SIGTERM" { 143 } else { 130 })
}

#[cfg(test)]
mod tests {
    /// docs/src/reference/fl-server.md is what clap makes of the flags.
    #[test]
    fn the_command_line_reference_is_current() {
        let page = clap_markdown::help_markdown::<super::Args>();
        let test = "cargo test -p fl-server --bin fl-server the_command_line_reference_is_current";
        let page_file = "docs/src/reference/fl-server.md";
        fl_common::generated_docs::assert_fresh(env!("CARGO_MANIFEST_DIR"), page_file, &page, test);
    }
}
