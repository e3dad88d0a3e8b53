//! `fl-client`'s flags (clap): where the server is, which data and share this process trains
//! on, the protection it insists on, TLS, and the identity it signs secure rounds with; and the
//! checks that turn them into a client's options.

use anyhow::bail;
use clap::Parser;
use fl_authority::policy::{FederationPolicy, SignedPolicy};
use fl_client::{ClientOptions, ClientPrivacy, ClientTls};
use fl_datasets::DataSource;
use fl_privacy::{ClientLimits, LocalKind};
use fl_secagg::Credentials;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Federated-learning client.
#[derive(Debug, Parser)]
#[command(version, about)]
pub(crate) struct Args {
    /// Server URL.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub(crate) server: String,
    /// Enrollment token. Prefer the FL_TOKEN environment variable, which does not show in
    /// process listings.
    #[arg(long, env = "FL_TOKEN", hide_env_values = true, default_value = "")]
    pub(crate) token: String,
    /// Local data: mnist:DIR (its training split) or csv:FILE.
    #[arg(long)]
    pub(crate) data: DataSource,
    /// This client's share of the data in a simulation: SCHEME:K:INDEX, with SCHEME one of iid,
    /// shards, dirichlet:ALPHA (e.g. shards:100:7), or SCHEME:K:auto to get the index from the
    /// server (replicas started alike, e.g. with docker compose --scale). Without it the client
    /// uses all of --data.
    #[arg(long)]
    pub(crate) partition: Option<String>,
    /// Seed of the partition; every client of a simulation must use the same one.
    #[arg(long, default_value_t = 0)]
    pub(crate) partition_seed: u64,
    /// Run N clients in this process, with partition indices INDEX, INDEX+1, ..., INDEX+N-1.
    #[arg(long, default_value_t = 1)]
    pub(crate) simulate: usize,
    /// Simulation only: how fast each client is, drawn per partition index from the partition
    /// seed (the same fleet as `fl sim`'s `server.sim_speeds`): `uniform`,
    /// `lognormal:MEDIAN_SECS:SIGMA` (each client waits a delay of its own after training) or
    /// `slow:FRACTION:FACTOR` (that share of the clients FACTOR times slower).
    #[arg(long, default_value = "uniform")]
    pub(crate) speeds: fl_common::pace::Speeds,
    /// Name for the server's logs and the state file (default: the certificate's name, or
    /// client-INDEX); with --simulate N, each client is NAME-INDEX.
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Seed for local shuffling (reproducible experiments only).
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Seconds to keep retrying the first connection and Join. The default covers a default
    /// server's join limiter in its worst case: (20,000 idle clients - a burst of 2,000) / 100
    /// joins a second = 180 s for clients sharing one address.
    #[arg(long, default_value_t = 240.0)]
    pub(crate) connect_timeout: f64,
    /// The local protection this client insists on: it refuses rounds that ask for another.
    /// `follow` applies whatever the round asks.
    #[arg(long, default_value = "follow", value_parser = requirement())]
    pub(crate) privacy: Requirement,
    /// Largest per-round epsilon this client accepts (it applies the smaller of this and the
    /// round's).
    #[arg(long)]
    pub(crate) epsilon: Option<f64>,
    /// Largest per-round delta this client accepts (ldp-gaussian).
    #[arg(long)]
    pub(crate) delta: Option<f64>,
    /// This client's own clip bound: S (L2) for ldp-gaussian, R (per-example L1) for ldp-laplace.
    #[arg(long)]
    pub(crate) clip_bound: Option<f64>,
    /// PEM certificate of the CA that signed the server's certificate: turns TLS on (use an
    /// https:// --server).
    #[arg(long)]
    pub(crate) ca: Option<PathBuf>,
    /// PEM certificate of this client, for servers that require client certificates.
    #[arg(long, requires_all = ["key", "ca"])]
    pub(crate) cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, requires = "cert")]
    pub(crate) key: Option<PathBuf>,
    /// The name the server's certificate must carry, when not --server's host.
    #[arg(long, requires = "ca")]
    pub(crate) tls_domain: Option<String>,
    /// The federation authority's public key file (`fl authority init`): this client then
    /// takes part only in signed secure-aggregation rounds, checking every peer's certificate
    /// and signature (docs/src/explanation/threat-model.md).
    #[arg(long, requires_all = ["identity", "certificate"])]
    pub(crate) authority: Option<PathBuf>,
    /// This client's identity key file (`fl authority identity`), with --authority.
    #[arg(long, requires = "authority")]
    pub(crate) identity: Option<PathBuf>,
    /// The authority's certificate of --identity (`fl authority sign`), with --authority.
    #[arg(long, requires = "authority")]
    pub(crate) certificate: Option<PathBuf>,
    /// The authority's signed revocation list (`fl authority revoke`): peers it names are
    /// refused.
    #[arg(long, requires = "authority")]
    pub(crate) revocations: Option<PathBuf>,
    /// The federation policy the authority signed (`fl authority policy`), with --authority:
    /// the client takes part only in the kinds of round it lists and refuses any task outside
    /// it (fewest clients, neighbours and threshold of a secure round, distributed noise floor,
    /// epsilon and delta per release, epsilon in total, secure rounds included), whatever the
    /// server asks. Checked before the first connection; an older serial than one this client
    /// has held is refused.
    #[arg(long, requires = "authority")]
    pub(crate) policy: Option<PathBuf>,
    /// The largest composed epsilon of all this client's releases, over restarts (with
    /// --policy, the smaller of this and the policy's, and its secure rounds count too); a
    /// release past it is refused.
    #[arg(long)]
    pub(crate) max_total_epsilon: Option<f64>,
    /// The helper's public key (64 hex digits, as `fl-server --role helper` prints it) that this
    /// client seals the helper's share of a verified upload to: the second aggregator it trusts
    /// not to collude with the server. Without it, verified rounds are refused.
    #[arg(long, value_parser = fl_client::helper_key)]
    pub(crate) helper_key: Option<[u8; 32]>,
    /// Where each client of this process remembers, across restarts, the local privacy it
    /// spent and the secure rounds it took part in (one file per federation and client name),
    /// when it has a --policy or --max-total-epsilon.
    #[arg(long, default_value = "fl-client-state")]
    pub(crate) state_dir: PathBuf,
}

/// `--privacy`: the one local mechanism this client insists on, or none (`follow`).
pub(crate) type Requirement = Option<LocalKind>;

/// `--privacy`'s parser: `follow`, or a mechanism's name, from [`LocalKind::ALL`].
fn requirement() -> impl clap::builder::TypedValueParser<Value = Requirement> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let follow = PossibleValue::new("follow").help("Whatever the round asks");
    let kinds = (LocalKind::ALL.iter()).map(|k| {
        PossibleValue::new(k.name()).help(format!("This mechanism only. {}", k.description()))
    });
    PossibleValuesParser::new(std::iter::once(follow).chain(kinds))
        .map(|name: String| name.parse().ok())
}

impl Args {
    /// TLS settings from the certificate files, if TLS is asked for.
    pub(crate) fn tls(&self) -> anyhow::Result<Option<ClientTls>> {
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
    pub(crate) fn credentials(&self) -> anyhow::Result<Option<Arc<Credentials>>> {
        let (Some(authority), Some(identity), Some(certificate)) =
            (&self.authority, &self.identity, &self.certificate)
        else {
            return Ok(None);
        };
        if self.simulate > 1 {
            bail!("--identity is one client's: run one fl-client per identity, not --simulate");
        }
        let anchor = (authority.as_path(), self.revocations.as_deref());
        let credentials = Credentials::from_files(identity, certificate, anchor)?;
        Ok(Some(Arc::new(credentials)))
    }

    /// The client's own requirements, checked.
    pub(crate) fn privacy(&self) -> anyhow::Result<ClientPrivacy> {
        let limits = ClientLimits {
            epsilon: self.epsilon,
            delta: self.delta,
            clip: self.clip_bound,
        };
        let privacy = ClientPrivacy {
            require: self.privacy,
            limits,
            max_total_epsilon: self.max_total_epsilon,
            helper_key: self.helper_key,
        };
        privacy.check().map_err(anyhow::Error::msg)?;
        Ok(privacy)
    }

    /// The federation policy, verified under the authority, if given.
    pub(crate) fn policy(&self) -> anyhow::Result<Option<Arc<FederationPolicy>>> {
        let (Some(policy), Some(authority)) = (&self.policy, &self.authority) else {
            return Ok(None);
        };
        let policy = SignedPolicy::read_verified(policy, authority)?;
        Ok(Some(Arc::new(policy)))
    }

    /// The state file of the client `name` under `policy`, when it has something to remember
    /// across restarts (a policy or a total cap).
    pub(crate) fn state_file(
        &self,
        name: &str,
        policy: Option<&FederationPolicy>,
    ) -> Option<PathBuf> {
        if policy.is_none() && self.max_total_epsilon.is_none() {
            return None;
        }
        Some(fl_client::state_file(&self.state_dir, policy, name))
    }
}

/// The options of one client of this process.
pub(crate) fn options(
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

#[cfg(test)]
mod tests {
    /// docs/src/reference/fl-client.md is what clap makes of the flags.
    #[test]
    fn the_command_line_reference_is_current() {
        let page = clap_markdown::help_markdown::<super::Args>();
        let test = "cargo test -p fl-client --bin fl-client the_command_line_reference_is_current";
        let page_file = "docs/src/reference/fl-client.md";
        fl_common::generated_docs::assert_fresh(env!("CARGO_MANIFEST_DIR"), page_file, &page, test);
    }
}
