//! `fl-client`: one federated-learning client, or `--simulate N` of them in one process, sharing
//! gRPC connections (one per [`fl_client::CLIENTS_PER_CONNECTION`] clients).

mod args;

use anyhow::{Context, bail};
use args::{Args, options};
use clap::Parser;
use fl_client::{
    ClientPrivacy, ClientTls, Connection, LocalData, TrainingSlots, assigned_partition, run_client,
};
use fl_datasets::Partition;
use std::sync::Arc;

fn main() -> std::process::ExitCode {
    // Before the runtime starts its threads (fl_common::allocator).
    fl_common::allocator::tune();
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", fl_common::error_chain(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn run() -> anyhow::Result<()> {
    fl_client::init_logging("info");
    let args = Args::parse();
    if args.simulate == 0 {
        bail!("--simulate must be at least 1");
    }
    let privacy = args.privacy()?;
    let credentials = args.credentials()?;
    let policy = args.policy()?;
    let tls = args.tls()?;
    let source = args.data.clone();
    let data = Arc::new(
        tokio::task::spawn_blocking(move || source.load_train())
            .await?
            .with_context(|| format!("loading {}", args.data))?,
    );
    let shares = shares(&args, &data, privacy, &tls).await?;
    let connections = connections(&args, shares.len(), privacy, &tls)?;
    if !connections.is_empty() {
        let (clients, shared) = (shares.len(), connections.len());
        tracing::info!(server = %args.server, clients, connections = shared, "connecting");
    }
    let slots = TrainingSlots::new(std::thread::available_parallelism().map_or(1, usize::from));
    // Many clients in one process: one line per round for them all.
    let round_log = (args.simulate > 1).then(fl_client::RoundLog::new);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (index, indices)) in shares.into_iter().enumerate() {
        let certified = credentials.as_ref().map(|c| c.certificate.name.clone());
        let name = match (&args.name, certified) {
            // Each simulated client its own name, and so its own state file.
            (Some(name), _) if args.simulate > 1 => format!("{name}-{index}"),
            (Some(name), _) => name.clone(),
            (None, Some(certified)) => certified,
            (None, None) => format!("client-{index}"),
        };
        let signing = (privacy, credentials.clone());
        let mut opts = options(&args, name, Some(index as u64), signing, tls.clone());
        opts.training_slots = slots.clone();
        opts.state = args.state_file(&opts.name, policy.as_deref());
        opts.policy = policy.clone();
        opts.pace = args.speeds.pace(args.partition_seed, index as u64);
        opts.round_log = round_log.clone();
        opts.connection = connections
            .get(i / fl_client::CLIENTS_PER_CONNECTION)
            .cloned();
        let local = LocalData {
            data: data.clone(),
            indices,
        };
        tasks.spawn(async move { (index, run_client(opts, local).await) });
    }
    outcomes(tasks, round_log).await
}

/// Waits for the clients of this process and says how each ended (for `--simulate N`, with a
/// `round_log`, in one line for all that finished); an error names those that failed or refused
/// every task.
async fn outcomes(
    mut tasks: tokio::task::JoinSet<(
        usize,
        Result<fl_client::ClientReport, fl_client::ClientError>,
    )>,
    round_log: Option<fl_client::RoundLog>,
) -> anyhow::Result<()> {
    let mut failures = Vec::new();
    let mut finished = Finished::default();
    while let Some(joined) = tasks.join_next().await {
        match joined? {
            (index, Ok(report)) if report.rounds_trained == 0 && report.tasks_refused > 0 => {
                let reason = report.last_refusal.unwrap_or_default();
                tracing::error!(index, %reason, "client refused every task");
                failures.push(format!("client {index} refused every task: {reason}"));
            }
            (index, Ok(report)) if round_log.is_none() => tracing::info!(
                index,
                rounds = report.rounds_trained,
                local_releases = report.local_releases,
                local_epsilon = report.local_epsilon,
                reason = %report.shutdown_reason,
                "client finished"
            ),
            (_, Ok(report)) => finished.add(&report),
            (index, Err(e)) => {
                let error = fl_common::error_chain(&e);
                tracing::error!(index, %error, "client failed");
                failures.push(format!("client {index}: {error}"));
            }
        }
    }
    if let Some(log) = round_log {
        log.finish();
        finished.say();
    }
    match failures.as_slice() {
        [] => Ok(()),
        [one] => bail!("{one}"),
        [first, ..] => bail!("{} clients failed; the first: {first}", failures.len()),
    }
}

/// Each client's (partition index, example indices): the whole data for one client, or the
/// shares of `--partition` (given from an index, or assigned by the server with `:auto`).
async fn shares(
    args: &Args,
    data: &fl_datasets::Dataset,
    privacy: ClientPrivacy,
    tls: &Option<ClientTls>,
) -> anyhow::Result<Vec<(usize, Vec<usize>)>> {
    let shares = match &args.partition {
        None if args.simulate > 1 => {
            bail!("--simulate needs --partition to give each client its share")
        }
        None => vec![(0, (0..data.len()).collect())],
        Some(spec) => {
            let indices: Vec<usize>;
            let partition = match spec.strip_suffix(":auto") {
                // The server hands out the indices: replicas started alike get their own shares.
                Some(scheme_k) => {
                    let (partition, _) =
                        Partition::parse_with_index(&format!("{scheme_k}:0"), args.partition_seed)?;
                    let opts =
                        options(args, "partition".into(), None, (privacy, None), tls.clone());
                    let first = assigned_partition(&opts, args.simulate as u64).await?;
                    let k = partition.clients as u64;
                    indices = (0..args.simulate as u64)
                        .map(|i| ((first + i) % k) as usize)
                        .collect();
                    tracing::info!(first = first % k, k, "partition assigned by the server");
                    partition
                }
                None => {
                    let (partition, first) =
                        Partition::parse_with_index(spec, args.partition_seed)?;
                    if first + args.simulate > partition.clients {
                        bail!(
                            "--simulate {} from index {first} runs past K = {}",
                            args.simulate,
                            partition.clients
                        );
                    }
                    indices = (first..first + args.simulate).collect();
                    partition
                }
            };
            let mut all = partition.assign(data.labels())?;
            indices
                .into_iter()
                .map(|i| (i, std::mem::take(&mut all[i])))
                .collect()
        }
    };
    Ok(shares)
}

/// The connections simulated clients share, CLIENTS_PER_CONNECTION to each (none for one
/// client), with the open-file limit raised to hold them.
fn connections(
    args: &Args,
    clients: usize,
    privacy: ClientPrivacy,
    tls: &Option<ClientTls>,
) -> anyhow::Result<Vec<Connection>> {
    let connections = match clients {
        1 => Vec::new(),
        n => {
            let first = options(args, String::new(), None, (privacy, None), tls.clone());
            fl_client::shared_connections(&first, n)?
        }
    };
    let wanted = 2 * connections.len().max(1) as u64 + 256;
    if let Ok(got) = rlimit::increase_nofile_limit(wanted)
        && got < wanted
    {
        tracing::warn!(
            got,
            wanted,
            "open-file limit too low for --simulate; raise `ulimit -n`"
        );
    }
    Ok(connections)
}

/// What the clients of a `--simulate` process that finished did, said on one line at the end.
#[derive(Default)]
struct Finished {
    clients: usize,
    /// Rounds trained, summed over the clients.
    rounds: u64,
    local_releases: u64,
    /// The largest composed local epsilon of any one client.
    max_local_epsilon: f64,
    /// Why they finished, each reason once.
    reasons: std::collections::BTreeSet<String>,
}

impl Finished {
    /// One more client finished with `report`.
    fn add(&mut self, report: &fl_client::ClientReport) {
        self.clients += 1;
        self.rounds += report.rounds_trained;
        self.local_releases += report.local_releases;
        self.max_local_epsilon = self.max_local_epsilon.max(report.local_epsilon);
        self.reasons.insert(report.shutdown_reason.clone());
    }

    /// The line that says it, if any client finished.
    fn say(&self) {
        if self.clients > 0 {
            let reasons: Vec<&str> = self.reasons.iter().map(String::as_str).collect();
            tracing::info!(
                clients = self.clients,
                rounds_trained = self.rounds,
                local_releases = self.local_releases,
                max_local_epsilon = self.max_local_epsilon,
                reason = %reasons.join("; "),
                "clients finished"
            );
        }
    }
}
