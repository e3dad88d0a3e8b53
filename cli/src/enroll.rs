//! `fl enroll` and `fl revoke`: edit the server's enrollment file (see
//! `fl_server::credentials`). The server reads the file again within a second, so a revocation
//! takes effect while it runs. A token is printed once and never stored: the file keeps its
//! SHA-256 digest.

use anyhow::Context;
use fl_server::credentials::{Digest, EnrollmentList, new_token};
use fl_server::output::write_atomic;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use std::path::{Path, PathBuf};

/// `fl enroll` arguments.
#[derive(Debug, clap::Args)]
pub struct EnrollArgs {
    /// The client's name: its identity on the server.
    pub name: String,
    /// The enrollment file (created if missing).
    #[arg(long)]
    pub file: PathBuf,
    /// Identify the client by this PEM client certificate (mutual TLS) instead of a new token.
    #[arg(long)]
    pub certificate: Option<PathBuf>,
}

/// `fl revoke` arguments.
#[derive(Debug, clap::Args)]
pub struct RevokeArgs {
    /// The client's name.
    pub name: String,
    /// The enrollment file.
    #[arg(long)]
    pub file: PathBuf,
}

/// Enrolls a client (or gives it new credentials); returns the new token, if one was made.
pub fn enroll(args: &EnrollArgs) -> anyhow::Result<Option<String>> {
    let mut list = read_or_empty(&args.file)?;
    let (token, digest, fingerprint) = match &args.certificate {
        Some(pem) => {
            let cert = CertificateDer::from_pem_file(pem)
                .with_context(|| format!("reading a PEM certificate from {}", pem.display()))?;
            (None, None, Some(Digest::of(cert.as_ref())))
        }
        None => {
            let token = new_token().context("the OS random generator failed")?;
            let digest = Digest::of(token.as_bytes());
            (Some(token), Some(digest), None)
        }
    };
    list.enroll(&args.name, digest, fingerprint)?;
    write_atomic(&args.file, list.to_toml().as_bytes())
        .with_context(|| format!("writing {}", args.file.display()))?;
    Ok(token)
}

/// Revokes a client.
pub fn revoke(args: &RevokeArgs) -> anyhow::Result<()> {
    let mut list = EnrollmentList::read(&args.file)?;
    list.revoke(&args.name)?;
    write_atomic(&args.file, list.to_toml().as_bytes())
        .with_context(|| format!("writing {}", args.file.display()))
}

fn read_or_empty(path: &Path) -> anyhow::Result<EnrollmentList> {
    if path.exists() {
        Ok(EnrollmentList::read(path)?)
    } else {
        Ok(EnrollmentList::default())
    }
}
