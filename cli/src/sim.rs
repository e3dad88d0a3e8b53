//! `fl sim`: the real server and K real clients in one process, the clients calling the
//! server's gRPC service in-process.

use crate::plot::plot_run;
use anyhow::{Context, bail};
use fl_client::{ClientOptions, LocalData, TrainingSlots, run_client};
use fl_common::data::Partition;
use fl_common::secagg::PlainInputs;
use fl_server::config::RunConfig;
use fl_server::output::Summary;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The endpoint the simulated clients name (they call the server in-process).
const IN_PROCESS: &str = "http://in-process.invalid";

/// Options of `fl sim`.
#[derive(Debug, clap::Args)]
pub struct SimArgs {
    /// TOML run configuration.
    #[arg(long)]
    config: PathBuf,
    /// Run folder (default: the config's server.out).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Override the number of rounds.
    #[arg(long)]
    rounds: Option<u64>,
    /// Seed for sampling, initialisation and local shuffling (reproducible experiments only).
    #[arg(long)]
    seed: Option<u64>,
    /// Override a configuration key: `--set section.key=VALUE` (repeatable), e.g.
    /// `--set local.epsilon=2`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Serve the live run page at this address (without one: 127.0.0.1:8080); its URL is
    /// logged.
    #[arg(long, value_name = "ADDR", num_args = 0..=1,
          default_missing_value = fl_server::live_page::DEFAULT_ADDR)]
    page_listen: Option<String>,
}

/// Runs the simulation; returns the summary.
pub async fn run(args: SimArgs) -> anyhow::Result<Summary> {
    let mut config = RunConfig::load_with(&args.config, &args.overrides)?;
    if let Some(out) = args.out {
        config.server.out = out;
    }
    if let Some(rounds) = args.rounds {
        config.server.rounds = rounds;
    }
    if args.seed.is_some() {
        config.server.seed = args.seed;
    }
    if args.page_listen.is_some() {
        config.server.page_listen = args.page_listen;
    }
    config.server.listen = "127.0.0.1:0".into();
    anyhow::ensure!(
        !config.model.is_external(),
        "fl sim's clients use the built-in trainer, which cannot train model.kind = \"external\": \
         start fl-server and your own clients (e.g. with the Python package fl_client)"
    );

    let source = config.data.source.clone();
    let (train, test) = tokio::task::spawn_blocking(move || {
        anyhow::Ok((source.load_train()?, source.load_test()?))
    })
    .await?
    .with_context(|| format!("loading {}", config.data.source))?;
    let partition = Partition {
        scheme: config.data.partition,
        clients: config.server.clients,
        seed: config.data.partition_seed,
    };
    let shares = partition.assign(train.labels())?;
    // IADMM's I is public; in a simulation the partition is known.
    if config.train.algorithm == fl_server::config::Algorithm::Iadmm
        && config.admm.total_examples.is_none()
    {
        config.admm.total_examples = Some(shares.iter().map(|s| s.len() as u64).sum());
    }
    config.validate()?;
    if let Some(empty) = shares.iter().position(Vec::is_empty) {
        bail!(
            "client {empty} of the {} partition gets no examples",
            String::from(partition.scheme)
        );
    }

    // The clients call the server's service in-process (fl_server::Listener::InProcess).
    let (to_clients, service) = tokio::sync::oneshot::channel();
    let progress = progress_bar(config.server.rounds);
    let observer: fl_server::Observer = {
        let progress = progress.clone();
        Arc::new(move |m| {
            progress.set_position(m.round);
            if let Some(accuracy) = m.test_accuracy {
                progress.set_message(format!("accuracy {accuracy:.4}"));
            }
        })
    };
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let out = config.server.out.clone();
    let title = format!(
        "{} clients, {} per round, {}",
        config.server.clients,
        config.server.clients_per_round,
        String::from(config.data.partition)
    );
    let token = match &config.server.token {
        Some(t) => t
            .clear()
            .context("fl sim runs the clients itself: give server.token in clear, not as a digest")?
            .to_owned(),
        None => String::new(),
    };
    let seed = config.server.seed;
    let join_timeout_secs = config.server.join_timeout_secs;
    // Secure aggregation: clients record their plain inputs in-process, so that each round's
    // unmasked sum can be checked (never sent over the network).
    let oracle = (config.privacy.mode == fl_server::config::PrivacyMode::SecAgg)
        .then(|| Arc::new(PlainInputs::default()));
    let server = tokio::spawn(fl_server::serve(
        fl_server::Listener::InProcess(to_clients),
        config,
        Some(Arc::new(test)),
        Some(observer),
        oracle.clone(),
        stop,
    ));

    let train = Arc::new(train);
    let join_timeout = Duration::from_secs_f64(join_timeout_secs);
    let slots = TrainingSlots::new(std::thread::available_parallelism().map_or(1, usize::from));
    let template = ClientOptions {
        token,
        name: String::new(),
        // The server waits this long for all K: clients keep retrying (its join limiter admits
        // them in turn) as long.
        connect_timeout: join_timeout,
        training_slots: slots,
        oracle: oracle.clone(),
        ..ClientOptions::new(IN_PROCESS)
    };
    let Ok(service) = service.await else {
        // The server stopped before it served: its error says why.
        server.await??;
        bail!("the server ended before serving");
    };
    let connection = fl_client::Connection::in_process(service);
    let mut clients = tokio::task::JoinSet::new();
    for (index, indices) in shares.into_iter().enumerate() {
        let opts = ClientOptions {
            name: format!("sim-{index}"),
            seed: seed.map(|s| s.wrapping_add(1 + index as u64)),
            connection: Some(connection.clone()),
            ..template.clone()
        };
        let local = LocalData {
            data: train.clone(),
            indices,
        };
        clients.spawn(async move {
            let result = run_client(opts, local).await;
            if let Err(e) = &result {
                tracing::warn!(client = index, error = %e, "simulated client stopped");
            }
            result
        });
    }
    let summary = server.await??;
    progress.finish_and_clear();
    // Clients end on the server's Shutdown; failures were logged as they happened.
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(10), clients.join_next()).await
    {
    }
    plot_run(&out, &title)?;
    Ok(summary)
}

fn progress_bar(rounds: u64) -> ProgressBar {
    let bar = ProgressBar::new(rounds);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] round {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}
