//! `fl authority`: the federation authority's keys, certificates and revocations (see
//! `fl_authority`). The authority's secret key stays with whoever admits clients, never
//! on the server; each client makes its own identity key and sends only its public half to be
//! certified.

use anyhow::{Context, bail};
use fl_authority::files::read_key_file;
use fl_authority::policy::{FederationPolicy, MinDegree, PolicyMode};
use fl_authority::{
    Authority, AuthorityKey, Identity, IdentityCertificate, IdentityKey, RevocationList,
};
use fl_common::durable::write_secret;
use fl_server::output::write_atomic;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// `fl authority` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum AuthorityCommand {
    /// Make the authority's key pair: DIR/authority.key (secret, mode 600; keep it off the
    /// server) and DIR/authority.pub (what clients are configured with).
    Init {
        /// The folder to write to.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Make a client's identity key pair: DIR/identity.key (secret, mode 600) and
    /// DIR/identity.pub (what the authority certifies).
    Identity {
        /// The folder to write to.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Certify that an identity key (its .pub file) belongs to the client NAME.
    Sign {
        /// The authority's secret key file.
        #[arg(long)]
        key: PathBuf,
        /// The client's name.
        #[arg(long)]
        name: String,
        /// The client's identity.pub.
        #[arg(long)]
        identity: PathBuf,
        /// The certificate file to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Add NAME to the signed revocation list (created if missing; its serial goes up by one).
    Revoke {
        /// The authority's secret key file.
        #[arg(long)]
        key: PathBuf,
        /// The client's name.
        #[arg(long)]
        name: String,
        /// The revocation list file.
        #[arg(long)]
        list: PathBuf,
    },
    /// Sign the federation policy every client enforces whatever the server asks
    /// (docs/src/reference/policy.md): the fewest clients, neighbours and threshold of a secure
    /// round, the distributed noise floor, and the epsilon limits of client-side modes.
    Policy(PolicyArgs),
    /// Check a certificate (and that a revocation list, if given, does not revoke it) under the
    /// authority's public key.
    Verify {
        /// The authority's public key file.
        #[arg(long)]
        authority: PathBuf,
        /// The certificate file.
        #[arg(long)]
        cert: PathBuf,
        /// The revocation list file.
        #[arg(long)]
        revocations: Option<PathBuf>,
    },
}

/// `fl authority policy`'s rules.
#[derive(Debug, clap::Args)]
pub struct PolicyArgs {
    /// The authority's secret key file.
    #[arg(long)]
    key: PathBuf,
    /// The federation's id, bound into every secure round's task.
    #[arg(long)]
    federation: String,
    /// The policy's version, 1 for the first: a client that has held a policy of the
    /// federation refuses one with a lower serial, so a new policy takes the next number.
    #[arg(long)]
    serial: u64,
    /// The kinds of round clients take part in, comma-separated, every other refused: plain
    /// (raw updates to a trusted curator: privacy modes none and central), ldp-gaussian,
    /// ldp-laplace, signds, secagg, iadmm, verified (a policy that lists verified and not secagg
    /// makes its clients refuse unverified secure rounds).
    #[arg(long, value_delimiter = ',', required = true)]
    allow: Vec<PolicyMode>,
    /// The fewest admitted clients |U1| of a secure round.
    #[arg(long)]
    min_clients: u64,
    /// The fewest neighbours k of a client, or `complete`.
    #[arg(long)]
    min_degree: String,
    /// The smallest Shamir threshold as a fraction of k (above 2/3).
    #[arg(long, default_value_t = 0.7)]
    min_threshold: f64,
    /// Distributed noise: each client's noise standard deviation is at least this many times
    /// the round's clip bound S (0: no floor).
    #[arg(long, default_value_t = 0.0)]
    min_noise_multiplier: f64,
    /// The largest epsilon of one release (a local mechanism's, or a secure round's charge at
    /// the noise floor).
    #[arg(long)]
    max_release_epsilon: f64,
    /// The largest composed epsilon of one client's releases, secure rounds included, over the
    /// federation's life.
    #[arg(long)]
    max_total_epsilon: f64,
    /// The largest delta of one release; each client composes its total at this delta.
    #[arg(long, default_value_t = 1e-5)]
    max_delta: f64,
    /// The largest absolute value of a received model's parameters.
    #[arg(long, default_value_t = fl_authority::policy::DEFAULT_MAX_MODEL_MAGNITUDE)]
    max_model_magnitude: f64,
    /// The policy file to write.
    #[arg(long)]
    out: PathBuf,
}

impl PolicyArgs {
    /// The policy the flags describe.
    fn policy(&self) -> anyhow::Result<FederationPolicy> {
        let min_degree = match self.min_degree.as_str() {
            "complete" => MinDegree::Complete,
            k => MinDegree::AtLeast(k.parse().with_context(|| {
                format!("--min-degree {k}: a whole number of 2 or more, or \"complete\"")
            })?),
        };
        Ok(FederationPolicy {
            federation: self.federation.clone(),
            serial: self.serial,
            modes: self.allow.iter().copied().collect(),
            min_clients: self.min_clients,
            min_degree,
            min_threshold: self.min_threshold,
            min_noise_multiplier: self.min_noise_multiplier,
            max_release_epsilon: self.max_release_epsilon,
            max_total_epsilon: self.max_total_epsilon,
            max_delta: self.max_delta,
            max_model_magnitude: self.max_model_magnitude,
        })
    }
}

/// What a policy's secure rounds cost each client, to print: refused when even the cheapest
/// round (a one-parameter model at a fine scale) costs more than `max_release_epsilon`, since
/// clients would then refuse every secure round; said plainly when the rounds are not charged.
fn secure_rounds(policy: &FederationPolicy) -> anyhow::Result<String> {
    if !policy.allows(PolicyMode::SecAgg) {
        return Ok(String::new());
    }
    // gamma S = 10^6 levels and d = 1: the sensitivity 2 (gamma S + sqrt(d)) is within 1e-6 of
    // 2 gamma S, the bound every real round's charge is above.
    let levels = 1e6;
    let variance = policy.min_noise_variance(1.0, levels);
    if variance == 0 {
        return Ok(
            "; secure rounds are not charged (min_noise_multiplier = 0): the server may repeat \
             them without limit"
                .into(),
        );
    }
    let neighbours = fl_privacy::Neighbours::ReplaceOne;
    let mut ledger = fl_privacy::LocalLedger::default();
    ledger.record_secure(&fl_privacy::DdgRound {
        clients: 1,
        client_variance: variance,
        l2_sensitivity: neighbours.sensitivity(levels + 1.0),
        neighbours,
        dim: 1,
    });
    let epsilon = ledger.epsilon(policy.max_delta);
    if epsilon > policy.max_release_epsilon {
        bail!(
            "a secure round at min_noise_multiplier = {} costs each client at least epsilon \
             {epsilon:.2} (at delta {}), above max_release_epsilon = {}: clients would refuse \
             every secure round; raise the multiplier or the limit",
            policy.min_noise_multiplier,
            policy.max_delta,
            policy.max_release_epsilon
        );
    }
    Ok(format!(
        "; each secure round costs each client at least epsilon {epsilon:.2} of its {}",
        policy.max_total_epsilon
    ))
}

/// Runs one `fl authority` command; returns what to print.
pub fn run(command: AuthorityCommand) -> anyhow::Result<String> {
    match command {
        AuthorityCommand::Init { dir } => {
            let authority = Authority::generate()?;
            let public = authority.public().to_bytes();
            write_pair(&dir, "authority", &authority.secret(), &public)?;
            Ok(format!("authority key in {}", dir.display()))
        }
        AuthorityCommand::Identity { dir } => {
            let identity = Identity::generate()?;
            write_pair(&dir, "identity", &identity.secret(), &identity.public().0)?;
            Ok(format!("identity key in {}", dir.display()))
        }
        AuthorityCommand::Sign {
            key,
            name,
            identity,
            out,
        } => {
            let authority = Authority::from_secret(&read_key_file(&key, "authority key")?);
            let identity = IdentityKey(read_key_file(&identity, "identity key")?);
            let cert = authority.certify(&name, &identity)?;
            write_atomic(&out, cert.to_toml().as_bytes())
                .with_context(|| format!("writing {}", out.display()))?;
            Ok(format!("{name} certified in {}", out.display()))
        }
        AuthorityCommand::Revoke { key, name, list } => {
            let authority = Authority::from_secret(&read_key_file(&key, "authority key")?);
            let (serial, mut names) = match list.exists() {
                true => {
                    let old = RevocationList::read(&list)?;
                    authority.public().verify_revocations(&old)?;
                    (old.serial + 1, old.names)
                }
                false => (1, BTreeSet::new()),
            };
            names.insert(name.clone());
            let signed = authority.revocations(serial, names)?;
            write_atomic(&list, signed.to_toml().as_bytes())
                .with_context(|| format!("writing {}", list.display()))?;
            Ok(format!("{name} revoked (list serial {serial})"))
        }
        AuthorityCommand::Policy(args) => {
            let authority = Authority::from_secret(&read_key_file(&args.key, "authority key")?);
            let policy = args.policy()?;
            let secure = secure_rounds(&policy)?;
            let signed = authority.sign_policy(policy)?;
            write_atomic(&args.out, signed.to_toml().as_bytes())
                .with_context(|| format!("writing {}", args.out.display()))?;
            let tolerated = signed.policy.tolerated_compromised();
            Ok(format!(
                "federation {:?} policy serial {} signed in {} (both secrets of every honest \
                 client stay hidden from a server holding up to {tolerated} compromised \
                 clients){secure}",
                signed.policy.federation,
                signed.policy.serial,
                args.out.display()
            ))
        }
        AuthorityCommand::Verify {
            authority,
            cert,
            revocations,
        } => {
            let key = AuthorityKey::read(&authority)?;
            let cert = IdentityCertificate::read(&cert)?;
            key.verify(&cert)?;
            if let Some(path) = revocations {
                let list = RevocationList::read(&path)?;
                key.verify_revocations(&list)?;
                if list.revokes(&cert.name) {
                    bail!("{} is revoked (list serial {})", cert.name, list.serial);
                }
            }
            Ok(format!("{} holds a valid certificate", cert.name))
        }
    }
}

/// Writes DIR/NAME.key (the secret, readable by its owner only) and DIR/NAME.pub, refusing to
/// replace an existing key.
fn write_pair(dir: &Path, name: &str, secret: &[u8; 32], public: &[u8; 32]) -> anyhow::Result<()> {
    let (key, publ) = (
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.pub")),
    );
    if key.exists() {
        bail!("{} exists: a key is never replaced", key.display());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    let text = format!("{}\n", hex::encode(secret));
    write_secret(&key, text.as_bytes()).with_context(|| format!("creating {}", key.display()))?;
    write_atomic(&publ, format!("{}\n", hex::encode(public)).as_bytes())
        .with_context(|| format!("writing {}", publ.display()))
}
