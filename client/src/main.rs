//! `fl-client`: one federated-learning client, or `--simulate N` of them in one process, sharing
//! gRPC connections (one per [`fl_client::CLIENTS_PER_CONNECTION`] clients).

use anyhow::{Context, bail};
use clap::Parser;
use fl_client::{
    ClientOptions, ClientPrivacy, ClientTls, Connection, LocalData, TrainingSlots,
    assigned_partition, run_client,
};
use fl_common::data::{DataSource, Partition};
use fl_common::privacy::{ClientLimits, ReleaseKind};
use fl_common::secagg::Credentials;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Federated-learning client.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Server URL.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    server: String,
    /// Enrollment token. Prefer the FL_TOKEN environment variable, which does not show in
    /// process listings.
    #[arg(long, env = "FL_TOKEN", hide_env_values = true, default_value = "")]
    token: String,
    /// Local data: mnist:DIR (its training split) or csv:FILE.
    #[arg(long)]
    data: DataSource,
    /// This client's share of the data in a simulation: SCHEME:K:INDEX, with SCHEME one of iid,
    /// shards, dirichlet:ALPHA (e.g. shards:100:7), or SCHEME:K:auto to get the index from the
    /// server (replicas started alike, e.g. with docker compose --scale). Without it the client
    /// uses all of --data.
    #[arg(long)]
    partition: Option<String>,
    /// Seed of the partition; every client of a simulation must use the same one.
    #[arg(long, default_value_t = 0)]
    partition_seed: u64,
    /// Run N clients in this process, with partition indices INDEX, INDEX+1, ..., INDEX+N-1.
    #[arg(long, default_value_t = 1)]
    simulate: usize,
    /// Name for the server's logs (default: client-INDEX).
    #[arg(long)]
    name: Option<String>,
    /// Seed for local shuffling (reproducible experiments only).
    #[arg(long)]
    seed: Option<u64>,
    /// Seconds to keep retrying the first connection and Join. The default covers a default
    /// server's join limiter in its worst case: (20,000 idle clients - a burst of 2,000) / 100
    /// joins a second = 180 s for clients sharing one address.
    #[arg(long, default_value_t = 240.0)]
    connect_timeout: f64,
    /// The local protection this client insists on: it refuses rounds that ask for another.
    /// `follow` applies whatever the round asks.
    #[arg(long, value_enum, default_value_t = Protection::Follow)]
    privacy: Protection,
    /// Largest per-round epsilon this client accepts (it applies the smaller of this and the
    /// round's).
    #[arg(long)]
    epsilon: Option<f64>,
    /// Largest per-round delta this client accepts (ldp-gaussian).
    #[arg(long)]
    delta: Option<f64>,
    /// This client's own clip bound C (L2 for ldp-gaussian, per-example L1 for ldp-laplace).
    #[arg(long)]
    clip_bound: Option<f64>,
    /// PEM certificate of the CA that signed the server's certificate: turns TLS on (use an
    /// https:// --server).
    #[arg(long)]
    ca: Option<PathBuf>,
    /// PEM certificate of this client, for servers that require client certificates.
    #[arg(long, requires_all = ["key", "ca"])]
    cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    /// The name the server's certificate must carry, when not --server's host.
    #[arg(long, requires = "ca")]
    tls_domain: Option<String>,
    /// The federation authority's public key file (`fl authority init`): this client then
    /// takes part only in signed secure-aggregation rounds, checking every peer's certificate
    /// and signature (docs/threat-model.md).
    #[arg(long, requires_all = ["identity", "certificate"])]
    authority: Option<PathBuf>,
    /// This client's identity key file (`fl authority identity`), with --authority.
    #[arg(long, requires = "authority")]
    identity: Option<PathBuf>,
    /// The authority's certificate of --identity (`fl authority sign`), with --authority.
    #[arg(long, requires = "authority")]
    certificate: Option<PathBuf>,
    /// The authority's signed revocation list (`fl authority revoke`): peers it names are
    /// refused.
    #[arg(long, requires = "authority")]
    revocations: Option<PathBuf>,
}

/// `--privacy` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Protection {
    /// Whatever the round asks.
    Follow,
    /// Gaussian local DP only.
    LdpGaussian,
    /// Laplace output perturbation only.
    LdpLaplace,
    /// SignDS only.
    Signds,
}

impl Args {
    /// TLS settings from the certificate files, if TLS is asked for.
    fn tls(&self) -> anyhow::Result<Option<ClientTls>> {
        let Some(ca) = &self.ca else {
            return Ok(None);
        };
        let identity = (self.cert.as_deref()).zip(self.key.as_deref());
        Ok(Some(ClientTls::from_files(
            ca,
            identity,
            self.tls_domain.clone(),
        )?))
    }

    /// The identity this client signs secure rounds with, checked against the authority.
    fn credentials(&self) -> anyhow::Result<Option<Arc<Credentials>>> {
        let (Some(authority), Some(identity), Some(certificate)) =
            (&self.authority, &self.identity, &self.certificate)
        else {
            return Ok(None);
        };
        if self.simulate > 1 {
            bail!("--identity is one client's: run one fl-client per identity, not --simulate");
        }
        let anchor = (authority.as_path(), self.revocations.as_deref());
        let credentials =
            Credentials::from_files(identity, certificate, anchor).map_err(anyhow::Error::msg)?;
        Ok(Some(Arc::new(credentials)))
    }

    /// The client's own requirements, checked.
    fn privacy(&self) -> anyhow::Result<ClientPrivacy> {
        let limits = ClientLimits {
            epsilon: self.epsilon,
            delta: self.delta,
            clip: self.clip_bound,
        };
        limits.check()?;
        let require = match self.privacy {
            Protection::Follow => None,
            Protection::LdpGaussian => Some(ReleaseKind::Gaussian),
            Protection::LdpLaplace => Some(ReleaseKind::Laplace),
            Protection::Signds => Some(ReleaseKind::SignDs),
        };
        Ok(ClientPrivacy { require, limits })
    }
}

/// The options of one client of this process.
fn options(
    args: &Args,
    name: String,
    index: Option<u64>,
    (privacy, credentials): (ClientPrivacy, Option<Arc<Credentials>>),
    tls: Option<ClientTls>,
) -> ClientOptions {
    ClientOptions {
        token: args.token.clone(),
        name,
        seed: args.seed.zip(index).map(|(s, i)| s.wrapping_add(i)),
        connect_timeout: Duration::from_secs_f64(args.connect_timeout),
        privacy,
        credentials,
        tls,
        ..ClientOptions::new(&args.server)
    }
}

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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: logs collected by docker or a file stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    if args.simulate == 0 {
        bail!("--simulate must be at least 1");
    }
    let privacy = args.privacy()?;
    let credentials = args.credentials()?;
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
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (index, indices)) in shares.into_iter().enumerate() {
        let certified = credentials.as_ref().map(|c| c.certificate.name.clone());
        let name = (args.name.clone())
            .or(certified)
            .unwrap_or_else(|| format!("client-{index}"));
        let signing = (privacy, credentials.clone());
        let mut opts = options(&args, name, Some(index as u64), signing, tls.clone());
        opts.training_slots = slots.clone();
        opts.connection = connections
            .get(i / fl_client::CLIENTS_PER_CONNECTION)
            .cloned();
        let local = LocalData {
            data: data.clone(),
            indices,
        };
        tasks.spawn(async move { (index, run_client(opts, local).await) });
    }
    let mut failures = 0;
    while let Some(joined) = tasks.join_next().await {
        match joined? {
            (index, Ok(report)) => tracing::info!(
                index,
                rounds = report.rounds_trained,
                local_releases = report.local_releases,
                local_epsilon = report.local_epsilon,
                reason = %report.shutdown_reason,
                "client finished"
            ),
            (index, Err(e)) => {
                failures += 1;
                let error = fl_common::error_chain(&e);
                tracing::error!(index, %error, "client failed");
            }
        }
    }
    if failures > 0 {
        bail!("{failures} client(s) failed");
    }
    Ok(())
}

/// Each client's (partition index, example indices): the whole data for one client, or the
/// shares of `--partition` (given from an index, or assigned by the server with `:auto`).
async fn shares(
    args: &Args,
    data: &fl_common::data::Dataset,
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
