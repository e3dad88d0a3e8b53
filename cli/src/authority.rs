//! `fl authority`: the federation authority's keys, certificates and revocations (see
//! `fl_common::authority`). The authority's secret key stays with whoever admits clients, never
//! on the server; each client makes its own identity key and sends only its public half to be
//! certified.

use anyhow::{Context, bail};
use fl_common::authority::{
    Authority, AuthorityKey, Identity, IdentityCertificate, IdentityKey, RevocationList,
    read_key_file,
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
            let authority = Authority::from_secret(&read_key(&key, "authority key")?);
            let identity = IdentityKey(read_key(&identity, "identity key")?);
            let cert = authority.certify(&name, &identity)?;
            write_atomic(&out, cert.to_toml().as_bytes())
                .with_context(|| format!("writing {}", out.display()))?;
            Ok(format!("{name} certified in {}", out.display()))
        }
        AuthorityCommand::Revoke { key, name, list } => {
            let authority = Authority::from_secret(&read_key(&key, "authority key")?);
            let (serial, mut names) = match list.exists() {
                true => {
                    let old = read_revocations(&list)?;
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
        AuthorityCommand::Verify {
            authority,
            cert,
            revocations,
        } => {
            let key = AuthorityKey::from_bytes(&read_key(&authority, "authority public key")?)?;
            let cert = IdentityCertificate::read(&cert).map_err(anyhow::Error::msg)?;
            key.verify(&cert)?;
            if let Some(path) = revocations {
                let list = read_revocations(&path)?;
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

/// A 32-byte key from its hex file.
fn read_key(path: &Path, what: &str) -> anyhow::Result<[u8; 32]> {
    read_key_file(path, what).map_err(anyhow::Error::msg)
}

/// A revocation list's file (not yet verified).
fn read_revocations(path: &Path) -> anyhow::Result<RevocationList> {
    RevocationList::read(path).map_err(anyhow::Error::msg)
}
