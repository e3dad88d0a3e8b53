//! `fl authority`: the federation authority's keys, certificates and revocations (see
//! `fl_authority`). The authority's secret key stays with whoever admits clients, never
//! on the server; each client makes its own identity key and sends only its public half to be
//! certified.

use anyhow::{Context, bail};
use fl_authority::files::read_key_file;
use fl_authority::policy::{FederationPolicy, MinDegree};
use fl_authority::{
    Authority, AuthorityKey, Identity, IdentityCertificate, IdentityKey, RevocationList,
};
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
    /// Client-side modes: the largest epsilon of one release.
    #[arg(long)]
    max_release_epsilon: f64,
    /// Client-side modes: the largest composed epsilon of one client over the federation's
    /// life.
    #[arg(long)]
    max_total_epsilon: f64,
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
            min_clients: self.min_clients,
            min_degree,
            min_threshold: self.min_threshold,
            min_noise_multiplier: self.min_noise_multiplier,
            max_release_epsilon: self.max_release_epsilon,
            max_total_epsilon: self.max_total_epsilon,
            max_model_magnitude: self.max_model_magnitude,
        })
    }
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
            let signed = authority.sign_policy(args.policy()?)?;
            write_atomic(&args.out, signed.to_toml().as_bytes())
                .with_context(|| format!("writing {}", args.out.display()))?;
            let tolerated = signed.policy.tolerated_compromised();
            Ok(format!(
                "federation {:?} policy signed in {} (both secrets of every honest client stay \
                 hidden from a server holding up to {tolerated} compromised clients)",
                signed.policy.federation,
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
    write_secret(&key, &format!("{}\n", hex::encode(secret)))?;
    write_atomic(&publ, format!("{}\n", hex::encode(public)).as_bytes())
        .with_context(|| format!("writing {}", publ.display()))
}

/// Creates `path` with `text`, readable and writable by its owner only.
fn write_secret(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = (options.open(path)).with_context(|| format!("creating {}", path.display()))?;
    file.write_all(text.as_bytes())?;
    Ok(file.sync_all()?)
}
