//! `fl sim`: the real server and K real clients in one process, the clients calling the
//! server's gRPC service in-process.

use crate::plot::plot_run;
use anyhow::{Context, bail};
use fl_authority::{Authority, Identity};
use fl_client::{ClientOptions, LocalData, TrainingSlots, run_client};
use fl_datasets::{Dataset, Partition};
use fl_privacy::Budget;
use fl_secagg::{Credentials, PlainInputs, Verifier};
use fl_server::checkpoint::Checkpoint;
use fl_server::config::RunConfig;
use fl_server::credentials::EnrollmentList;
use fl_server::output::{RoundMetrics, StoppedBy, Summary, round_line, write_atomic};
use fl_server::run_dir;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The endpoint the simulated clients name (they call the server in-process).
const IN_PROCESS: &str = "http://in-process.invalid";

/// Options of `fl sim`.
#[derive(Debug, clap::Args)]
pub struct SimArgs {
    /// TOML run configuration (relative paths in it resolve against its folder).
    #[arg(long, required_unless_present = "resume")]
    config: Option<PathBuf>,
    /// Run folder (default: the config's server.out, else a new runs/CONFIG-TIME, which
    /// runs/latest points to).
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
          default_missing_value = fl_server::DEFAULT_PAGE_ADDR)]
    page_listen: Option<String>,
    /// Resume the interrupted run in this folder from its checkpoint, with its configuration
    /// (only --page-listen may be given beside it).
    #[arg(long, value_name = "DIR",
          conflicts_with_all = ["config", "out", "rounds", "seed", "overrides", "overwrite"])]
    resume: Option<PathBuf>,
    /// Start over in a run folder that holds a run: its privacy ledger is kept beside the new
    /// run as `ledger-replaced-TIME.jsonl`, its other records are replaced.
    #[arg(long)]
    overwrite: bool,
}

/// How a simulation ended: its summary, and the signal that interrupted it, if one did.
pub struct Ended {
    /// The run's summary.
    pub summary: Summary,
    /// SIGINT or SIGTERM, when the operator stopped it.
    pub signal: Option<&'static str>,
}

/// The configuration of a new run from `args`, in a folder that holds no run.
fn fresh_config(args: &SimArgs, path: &Path) -> anyhow::Result<RunConfig> {
    let mut config = RunConfig::load_with(path, &args.overrides)?;
    if let Some(out) = &args.out {
        config.server.out = out.clone();
    }
    if let Some(rounds) = args.rounds {
        config.server.rounds = rounds;
    }
    if args.seed.is_some() {
        config.server.seed = args.seed;
    }
    // An unnamed folder is made new once everything else is checked (in `run`).
    if config.server.out.as_os_str().is_empty() {
        return Ok(config);
    }
    let out = &config.server.out;
    if args.overwrite {
        let archive = run_dir::clear_for_overwrite(out)
            .with_context(|| format!("clearing {} for a new run", out.display()))?;
        if let Some(archive) = archive {
            eprintln!(
                "the replaced run's privacy ledger is kept as {}",
                archive.display()
            );
        }
    }
    run_dir::check_unused(out)?;
    Ok(config)
}

/// Runs the simulation (or resumes one) until it ends or a signal stops it.
pub async fn run(args: SimArgs) -> anyhow::Result<Ended> {
    let (mut config, checkpoint) = load_config(&args)?;
    let (train, test, shares) = load_data(&mut config).await?;
    let budget = config.plan()?.ledger().map(|t| t.budget);
    let progress = Progress::new(config.server.rounds, budget);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let signalled = fl_server::stop_on_signal(stop_tx);
    let title = title(&config);
    eprintln!("{title}");
    if config.server.out.as_os_str().is_empty() {
        let stem = args.config.as_deref().and_then(Path::file_stem);
        let name = stem.map_or("sim".into(), |s| s.to_string_lossy());
        config.server.out = run_dir::fresh(&name).context("making a new run folder")?;
    }
    let out = config.server.out.clone();
    // The server removes a folder it could not start in; what fails before it is removed here.
    let existed = out.read_dir().is_ok_and(|mut d| d.next().is_some());
    let prepared = client_tokens(&mut config, shares.len())
        .and_then(|t| Ok((t, sim_credentials(&mut config, shares.len())?)));
    let identities = prepared.inspect_err(|_| {
        if checkpoint.is_none() {
            let _ = run_dir::discard_unstarted(&out, existed);
        }
    })?;
    // Secure aggregation: clients record their plain inputs in-process, so that each round's
    // unmasked sum can be checked (never sent over the network).
    let oracle = (config.privacy.mode == fl_server::config::PrivacyMode::SecAgg)
        .then(|| Arc::new(PlainInputs::default()));
    let helper_key = sim_helper(&mut config, stop.clone()).await?;
    let mut fleet = Fleet::of(&config, oracle.clone(), identities);
    fleet.template.privacy.helper_key = helper_key;
    let observer: fl_server::Observer = {
        let progress = progress.clone();
        Arc::new(move |m| progress.round(m))
    };
    // The clients call the server's service in-process (fl_server::Listener::InProcess).
    let (to_clients, service) = tokio::sync::oneshot::channel();
    let listener = fl_server::Listener::InProcess(to_clients);
    let hooks = (Some(observer), oracle);
    let server = tokio::spawn(async move {
        let test = Some(Arc::new(test));
        match checkpoint {
            // The checkpoint's configuration, with what this process set (the page's address,
            // the loopback listener, the simulated clients' enrollment).
            Some(mut c) => {
                let dir = config.server.out.clone();
                c.progress.config = config;
                let run = (dir.as_path(), c);
                fl_server::resume(listener, run, test, hooks.0, hooks.1, stop).await
            }
            None => fl_server::serve(listener, config, test, hooks.0, hooks.1, stop).await,
        }
    });
    let Ok(service) = service.await else {
        // The server stopped before it served: its error says why.
        server.await??;
        bail!("the server ended before serving");
    };
    let mut clients = fleet.spawn(fl_client::Connection::in_process(service), train, shares);
    let summary = server.await??;
    progress.finish();
    // An interrupted server tells its clients to reconnect; these ones end with this process.
    if summary.stopped_by == StoppedBy::Interrupted {
        clients.abort_all();
    }
    // Clients end on the server's Shutdown; failures were logged as they happened.
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(10), clients.join_next()).await
    {
    }
    plot_run(&out, &title)?;
    let signal = match summary.stopped_by {
        StoppedBy::Interrupted => signalled.await.ok().flatten(),
        _ => None,
    };
    Ok(Ended { summary, signal })
}

/// Under `privacy.mode = "verified"`, the simulation's own helper: a real one on a loopback port
/// (its gRPC as a helper run by another party serves it), in place of any `verified.helper`, its
/// floor of valid uploads `verified.min_clients`, and the token the server presents to it in
/// `RUN/sim-helper-token` (readable by its owner only). Returns its public key, for the clients.
async fn sim_helper(
    config: &mut RunConfig,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Option<[u8; 32]>> {
    if config.privacy.mode != fl_server::config::PrivacyMode::Verified {
        return Ok(None);
    }
    let token = fl_server::credentials::new_token()?;
    let file = config.server.out.join("sim-helper-token");
    std::fs::create_dir_all(&config.server.out)?;
    if file.exists() {
        std::fs::remove_file(&file)?;
    }
    fl_common::durable::write_secret(&file, token.as_bytes())
        .with_context(|| format!("writing {}", file.display()))?;
    let (key, public) = fl_secagg::verified::HelperKey::generate();
    let floors = fl_server::HelperFloors {
        min_clients: config.verified.min_clients,
        min_noise_multiplier: 0.0,
    };
    let options = fl_server::HelperOptions {
        key,
        leader_token: token,
        floors,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    config.verified.helper = format!("http://{}", listener.local_addr()?);
    config.verified.helper_token_file = Some(file);
    let server = fl_server::config::ServerSection::default();
    tokio::spawn(async move { fl_server::help(listener, &server, options, stop).await });
    Ok(Some(public.to_bytes()))
}

/// The run's configuration: a new one from `--config` (with its overrides), or the checkpoint's
/// of the run `--resume` names, with this process's listener and page.
fn load_config(args: &SimArgs) -> anyhow::Result<(RunConfig, Option<Checkpoint>)> {
    let (mut config, checkpoint) = match (&args.resume, &args.config) {
        (Some(dir), _) => {
            let checkpoint = Checkpoint::read(dir)
                .with_context(|| format!("reading the checkpoint in {}", dir.display()))?;
            let mut config = checkpoint.progress.config.clone();
            config.server.out = dir.clone();
            (config, Some(checkpoint))
        }
        (None, Some(path)) => (fresh_config(args, path)?, None),
        (None, None) => bail!("fl sim needs --config FILE or --resume DIR"),
    };
    if args.page_listen.is_some() {
        config.server.page_listen = args.page_listen.clone();
    }
    config.server.listen = "127.0.0.1:0".into();
    anyhow::ensure!(
        !config.model.is_external(),
        "fl sim's clients use the built-in trainer, which cannot train model.kind = \"external\": \
         start fl-server and your own clients (e.g. with the Python package fl_client)"
    );
    Ok((config, checkpoint))
}

/// The training and test sets, and each simulated client's examples, by the configuration's
/// partition; the configuration then validated (IADMM's public I is the partition's total).
async fn load_data(config: &mut RunConfig) -> anyhow::Result<(Dataset, Dataset, Vec<Vec<usize>>)> {
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
    Ok((train, test, shares))
}

/// What the simulation runs, in a line: its first output, and the plot's title.
fn title(config: &RunConfig) -> String {
    let mut title = format!(
        "{} clients, {} per round, {}",
        config.server.clients,
        config.server.clients_per_round,
        String::from(config.data.partition)
    );
    if config.secagg.sim_signed || config.secagg.authority.is_some() {
        title.push_str(", secure rounds signed by an authority made for this simulation");
    }
    title
}

/// The simulated clients' tokens and credentials, one of each per client.
type Identities = (Vec<String>, Vec<Option<Arc<Credentials>>>);

/// The simulated clients: what they share and what each holds.
struct Fleet {
    /// The options every client starts from.
    template: ClientOptions,
    /// Each client's token and credentials.
    identities: Identities,
    /// The run's seed, from which each client's is derived (reproducible runs only).
    seed: Option<u64>,
    /// How fast each client is.
    speeds: fl_common::pace::Speeds,
    /// The seed that draws each client's speed.
    fleet_seed: u64,
    /// How many clients are compromised (the first ones), and their attack.
    attackers: usize,
    attack: fl_client::Attack,
}

impl Fleet {
    /// The clients of `config`, recording their plain secure inputs in `oracle`.
    fn of(config: &RunConfig, oracle: Option<Arc<PlainInputs>>, identities: Identities) -> Self {
        let slots = TrainingSlots::new(std::thread::available_parallelism().map_or(1, usize::from));
        let template = ClientOptions {
            name: String::new(),
            // The server waits this long for all K: clients keep retrying (its join limiter
            // admits them in turn) as long.
            connect_timeout: Duration::from_secs_f64(config.server.join_timeout_secs),
            training_slots: slots,
            oracle,
            ..ClientOptions::new(IN_PROCESS)
        };
        Self {
            template,
            identities,
            seed: config.server.seed,
            speeds: config.server.sim_speeds,
            fleet_seed: config.data.partition_seed,
            attackers: config.server.sim_attackers,
            attack: fl_client::Attack {
                scale: (config.server.sim_attack_scale).unwrap_or(config.clients_at(1) as f64),
            },
        }
    }

    /// Starts one client per share of `train`, each calling the server through `connection`.
    fn spawn(
        self,
        connection: fl_client::Connection,
        train: Dataset,
        shares: Vec<Vec<usize>>,
    ) -> tokio::task::JoinSet<Result<fl_client::ClientReport, fl_client::ClientError>> {
        let (tokens, credentials) = self.identities;
        let train = Arc::new(train);
        let mut clients = tokio::task::JoinSet::new();
        for (index, indices) in shares.into_iter().enumerate() {
            let opts = ClientOptions {
                name: sim_name(index),
                token: tokens[index].clone(),
                seed: self.seed.map(|s| s.wrapping_add(1 + index as u64)),
                connection: Some(connection.clone()),
                credentials: credentials[index].clone(),
                pace: self.speeds.pace(self.fleet_seed, index as u64),
                attack: (index < self.attackers).then_some(self.attack),
                ..self.template.clone()
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
        clients
    }
}

/// The name of simulated client `index`.
fn sim_name(index: usize) -> String {
    format!("sim-{index}")
}

/// The token each of the `count` simulated clients presents: the configuration's shared one, or
/// under DP-FTRL, which needs stable identities, a token of its own, enrolled in
/// `RUN/sim-enrollment.toml` (the file keeps digests; a resumed simulation enrolls new tokens under
/// the same names, which keep the clients' ids).
fn client_tokens(config: &mut RunConfig, count: usize) -> anyhow::Result<Vec<String>> {
    let own = config.server.out.join(SIM_ENROLLMENT);
    let mine = |e: &PathBuf| e.file_name() == Some(SIM_ENROLLMENT.as_ref());
    let needs_own = config.privacy.mode == fl_server::config::PrivacyMode::DpFtrl
        && config.server.enrollment.as_ref().is_none_or(mine);
    if !needs_own {
        let shared = match &config.server.token {
            Some(t) => t
                .clear()
                .context(
                    "fl sim runs the clients itself: give server.token in clear, not as a digest",
                )?
                .to_owned(),
            None => String::new(),
        };
        return Ok(vec![shared; count]);
    }
    let names: Vec<String> = (0..count).map(sim_name).collect();
    let mut list = EnrollmentList::default();
    let tokens = list.enroll_with_new_tokens(&names)?;
    std::fs::create_dir_all(&config.server.out)?;
    write_atomic(&own, list.to_toml().as_bytes())
        .with_context(|| format!("writing {}", own.display()))?;
    config.server.enrollment = Some(own);
    Ok(tokens)
}

/// Under `secagg.sim_signed`, each of the `count` simulated clients' credentials from an
/// authority made for this simulation (its public key in `RUN/sim-authority.pub`, which the
/// server is configured with; the secret is never written); otherwise none. A resumed
/// simulation, whose configuration names that file, gets a new authority in its place.
fn sim_credentials(
    config: &mut RunConfig,
    count: usize,
) -> anyhow::Result<Vec<Option<Arc<Credentials>>>> {
    let mine = (config.secagg.authority.as_ref())
        .is_some_and(|a| a.file_name() == Some(SIM_AUTHORITY.as_ref()));
    if !config.secagg.sim_signed && !mine {
        return Ok(vec![None; count]);
    }
    if config.secagg.authority.is_some() && !mine {
        bail!(
            "secagg.sim_signed makes the simulation's own authority: leave secagg.authority unset \
             (fl sim cannot certify its clients under an authority whose key it does not hold)"
        );
    }
    let authority = Authority::generate()?;
    let public = config.server.out.join(SIM_AUTHORITY);
    std::fs::create_dir_all(&config.server.out)?;
    write_atomic(
        &public,
        format!("{}\n", hex::encode(authority.public().to_bytes())).as_bytes(),
    )
    .with_context(|| format!("writing {}", public.display()))?;
    config.secagg.authority = Some(public);
    config.secagg.sim_signed = false;
    let verifier = Verifier::new(authority.public(), None)?;
    (0..count)
        .map(|i| {
            let identity = Identity::generate()?;
            let certificate = authority.certify(&sim_name(i), &identity.public())?;
            let credentials = Credentials::new(identity, certificate, verifier.clone());
            Ok(Some(Arc::new(credentials?)))
        })
        .collect()
}

/// The authority's public key file `fl sim` writes under `secagg.sim_signed`.
const SIM_AUTHORITY: &str = "sim-authority.pub";

/// The enrollment file `fl sim` writes for its own clients when the mode needs identities.
const SIM_ENROLLMENT: &str = "sim-enrollment.toml";

/// What a person sees of the rounds: a bar with the ETA and the privacy spent on a terminal,
/// one line per round otherwise (a log file, CI).
#[derive(Clone)]
struct Progress {
    bar: Option<ProgressBar>,
    rounds: u64,
    budget: Option<Budget>,
}

impl Progress {
    fn new(rounds: u64, budget: Option<Budget>) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(rounds);
            bar.set_style(
                ProgressStyle::with_template(
                    "{elapsed_precise} [{bar:30}] {pos}/{len} rounds, ETA {eta} | {msg}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar
        });
        Self {
            bar,
            rounds,
            budget,
        }
    }

    /// Shows a published round: each accuracy beside the round it belongs to.
    fn round(&self, m: &RoundMetrics) {
        let line = round_line(m, self.rounds, self.budget.as_ref());
        match &self.bar {
            Some(bar) => {
                bar.set_position(m.round);
                bar.set_message(line);
            }
            None => eprintln!("{line}"),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
