//! The authority's files: keys in hex, certificates, revocation lists and policies in TOML,
//! each read with an error that names the file and what is wrong with it.

use crate::policy::{
    DEFAULT_MAX_MODEL_MAGNITUDE, FederationPolicy, MinDegree, PolicyError, PolicyMode, SignedPolicy,
};
use crate::{AuthorityError, AuthorityKey, IdentityCertificate, IdentityKey, RevocationList};
use std::collections::BTreeSet;

/// Why an authority's file (a key, certificate, revocation list or policy) is refused: the file
/// named, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file cannot be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file does not hold what it should.
    #[error("{}: {problem}", path.display())]
    Invalid {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        problem: FormatError,
    },
}

/// Why an authority file's text is refused.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// Not the TOML of its kind of file.
    #[error(transparent)]
    Toml(#[from] toml::de::Error),
    /// A field (named) that is not hex.
    #[error("{what}: {source}")]
    Hex {
        /// The field.
        what: &'static str,
        /// The cause.
        source: hex::FromHexError,
    },
    /// A field (named) of the wrong length.
    #[error("{what}: {len} bytes, not {expected}")]
    Length {
        /// The field.
        what: &'static str,
        /// Its bytes.
        len: usize,
        /// The bytes it must have.
        expected: usize,
    },
    /// A policy's min_degree that is neither a number nor "complete".
    #[error("min_degree = {0} (a number, or \"complete\")")]
    MinDegree(String),
    /// A key that is not one, or a signature that does not verify.
    #[error(transparent)]
    Authority(#[from] AuthorityError),
    /// A policy whose rules cannot protect anyone.
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

/// A certificate or revocation list as a file (TOML, keys and signatures in hex), what the
/// authority hands out and clients and servers read.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CertificateFile {
    name: String,
    identity: String,
    signature: String,
}

/// A revocation list as a file.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RevocationsFile {
    serial: u64,
    names: BTreeSet<String>,
    signature: String,
}

/// `N` bytes from hex, naming `what` when they are not.
pub(crate) fn from_hex<const N: usize>(
    text: &str,
    what: &'static str,
) -> Result<[u8; N], FormatError> {
    let bytes = hex::decode(text.trim()).map_err(|source| FormatError::Hex { what, source })?;
    let len = bytes.len();
    (bytes.try_into()).map_err(|_| FormatError::Length {
        what,
        len,
        expected: N,
    })
}

/// A 32-byte key or secret in hex, as the key files hold it.
pub fn key_from_hex(text: &str, what: &'static str) -> Result<[u8; 32], FormatError> {
    from_hex(text, what)
}

impl IdentityCertificate {
    /// The certificate's file.
    pub fn to_toml(&self) -> String {
        let file = CertificateFile {
            name: self.name.clone(),
            identity: hex::encode(self.identity.0),
            signature: hex::encode(self.signature),
        };
        toml::to_string(&file).expect("a certificate always serialises")
    }

    /// Reads a certificate's file (its signature is checked by [`AuthorityKey::verify`]).
    pub fn from_toml(text: &str) -> Result<Self, FormatError> {
        let file: CertificateFile = toml::from_str(text)?;
        Ok(Self {
            name: file.name,
            identity: IdentityKey(from_hex(&file.identity, "identity")?),
            signature: from_hex(&file.signature, "signature")?,
        })
    }
}

impl RevocationList {
    /// The list's file.
    pub fn to_toml(&self) -> String {
        let file = RevocationsFile {
            serial: self.serial,
            names: self.names.clone(),
            signature: hex::encode(self.signature),
        };
        toml::to_string(&file).expect("a revocation list always serialises")
    }

    /// Reads a list's file (its signature is checked by [`AuthorityKey::verify_revocations`]).
    pub fn from_toml(text: &str) -> Result<Self, FormatError> {
        let file: RevocationsFile = toml::from_str(text)?;
        Ok(Self {
            serial: file.serial,
            names: file.names,
            signature: from_hex(&file.signature, "signature")?,
        })
    }
}

/// The file at `path` read by `parse`; either failure names the file.
pub(crate) fn read_parsed<T>(
    path: &std::path::Path,
    parse: impl FnOnce(&str) -> Result<T, FormatError>,
) -> Result<T, FileError> {
    let path_buf = || path.to_path_buf();
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
        path: path_buf(),
        source,
    })?;
    parse(&text).map_err(|problem| FileError::Invalid {
        path: path_buf(),
        problem,
    })
}

/// A 32-byte key from its hex file (`fl authority init` and `identity` write them), naming
/// `what` and the file when it is not one.
pub fn read_key_file(path: &std::path::Path, what: &'static str) -> Result<[u8; 32], FileError> {
    read_parsed(path, |text| key_from_hex(text, what))
}

impl AuthorityKey {
    /// The authority's public key from its hex file (`fl authority init` writes it).
    pub fn read(path: &std::path::Path) -> Result<Self, FileError> {
        read_parsed(path, |text| {
            let key = key_from_hex(text, "the authority's public key")?;
            Ok(Self::from_bytes(&key)?)
        })
    }
}

impl IdentityCertificate {
    /// A certificate's file (not yet verified).
    pub fn read(path: &std::path::Path) -> Result<Self, FileError> {
        read_parsed(path, Self::from_toml)
    }
}

impl RevocationList {
    /// A revocation list's file (not yet verified).
    pub fn read(path: &std::path::Path) -> Result<Self, FileError> {
        read_parsed(path, Self::from_toml)
    }
}

/// The policy's file (TOML): the rules, then the signature in hex.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    federation: String,
    serial: u64,
    /// The allowed modes' names.
    modes: Vec<String>,
    min_clients: u64,
    /// A number, or "complete".
    min_degree: toml::Value,
    min_threshold: f64,
    min_noise_multiplier: f64,
    max_release_epsilon: f64,
    max_total_epsilon: f64,
    max_delta: f64,
    #[serde(default = "default_magnitude")]
    max_model_magnitude: f64,
    signature: String,
}

fn default_magnitude() -> f64 {
    DEFAULT_MAX_MODEL_MAGNITUDE
}

impl SignedPolicy {
    /// The policy's file.
    pub fn to_toml(&self) -> String {
        let p = &self.policy;
        let min_degree = match p.min_degree {
            MinDegree::Complete => toml::Value::String("complete".into()),
            MinDegree::AtLeast(k) => toml::Value::Integer(k as i64),
        };
        let file = PolicyFile {
            federation: p.federation.clone(),
            serial: p.serial,
            modes: p.modes.iter().map(|m| m.name().to_string()).collect(),
            min_clients: p.min_clients,
            min_degree,
            min_threshold: p.min_threshold,
            min_noise_multiplier: p.min_noise_multiplier,
            max_release_epsilon: p.max_release_epsilon,
            max_total_epsilon: p.max_total_epsilon,
            max_delta: p.max_delta,
            max_model_magnitude: p.max_model_magnitude,
            signature: hex::encode(self.signature),
        };
        toml::to_string(&file).expect("a policy always serialises")
    }

    /// Reads a policy's file (its signature is checked by [`SignedPolicy::verified`]).
    pub fn from_toml(text: &str) -> Result<Self, FormatError> {
        let file: PolicyFile = toml::from_str(text)?;
        let min_degree = match &file.min_degree {
            toml::Value::String(s) if s == "complete" => MinDegree::Complete,
            toml::Value::Integer(k) if *k >= 0 => MinDegree::AtLeast(*k as u64),
            other => return Err(FormatError::MinDegree(other.to_string())),
        };
        let signature = from_hex(&file.signature, "signature")?;
        let modes = (file.modes.iter().map(|m| m.parse()))
            .collect::<Result<BTreeSet<PolicyMode>, PolicyError>>()?;
        Ok(Self {
            policy: FederationPolicy {
                federation: file.federation,
                serial: file.serial,
                modes,
                min_clients: file.min_clients,
                min_degree,
                min_threshold: file.min_threshold,
                min_noise_multiplier: file.min_noise_multiplier,
                max_release_epsilon: file.max_release_epsilon,
                max_total_epsilon: file.max_total_epsilon,
                max_delta: file.max_delta,
                max_model_magnitude: file.max_model_magnitude,
            },
            signature,
        })
    }

    /// The verified policy in the file `path`, signed by the authority whose public key is in
    /// the file `authority`; every failure names its file.
    pub fn read_verified(
        path: &std::path::Path,
        authority: &std::path::Path,
    ) -> Result<FederationPolicy, FileError> {
        let key = AuthorityKey::read(authority)?;
        read_parsed(path, |text| Ok(Self::from_toml(text)?.verified(&key)?))
    }
}
