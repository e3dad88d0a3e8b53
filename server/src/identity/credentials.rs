//! Who may join: anyone, the holders of one enrollment token shared by all clients, or the clients
//! an enrollment file names, each with its own token or TLS client certificate, which the operator
//! can revoke while the server runs.
//!
//! The server never keeps a token in clear where it could be written out: the configuration, the
//! checkpoint and `summary.json` hold SHA-256 digests ([`Digest`], written `sha256:HEX`), and a
//! presented token is hashed and compared with them in constant time. Certificates are named by
//! the SHA-256 fingerprint of their DER encoding (what `openssl x509 -outform der | sha256sum`
//! prints).
//!
//! The enrollment file (TOML, `server.enrollment`):
//!
//! ```toml
//! [[client]]
//! name = "hospital-1"
//! token = "sha256:5e88...b3"         # digest of the client's own token
//!
//! [[client]]
//! name = "hospital-2"
//! certificate = "sha256:9f86...08"   # fingerprint of its client certificate
//! revoked = true                     # refused from now on
//! ```
//!
//! An enrolled client's name is its identity: it gets the same client id each time it joins, also
//! after the server resumes from a checkpoint. The file is read again when a client joins, when a
//! round starts and every second; a client revoked (or removed) loses its stream at once and can
//! neither join again, be sampled, nor receive the model. While the file cannot be read or parsed,
//! the last good list stays in force for connected clients and new joins are refused.

pub use super::secret::{Digest, Token, new_token};

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// One client of the enrollment file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Enrolled {
    /// Its identity (and name in logs).
    pub name: String,
    /// Digest of its own token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<Digest>,
    /// Fingerprint of its TLS client certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<Digest>,
    /// Refused from now on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub revoked: bool,
}

/// The enrollment file's contents.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnrollmentList {
    /// The clients, in the file's order.
    #[serde(default, rename = "client")]
    pub clients: Vec<Enrolled>,
}

/// Why an enrollment list, or a change to it, is refused.
#[derive(Debug, thiserror::Error)]
pub enum EnrollmentError {
    /// The file cannot be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file (named) holds a list that is refused.
    #[error("{}: {problem}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: Box<EnrollmentError>,
    },
    /// Not the TOML of an enrollment list: the parser's message on one line (its quoted
    /// excerpt of the file left out).
    #[error("{}", .0.message().trim_end())]
    Toml(#[from] toml::de::Error),
    /// A client with an empty name.
    #[error("a client has an empty name")]
    EmptyName,
    /// A name enrolled twice.
    #[error("client {0:?} is enrolled twice")]
    Twice(String),
    /// A client with neither credential.
    #[error("client {0:?} has neither a token nor a certificate")]
    NoCredential(String),
    /// A token or certificate of two clients (the second named).
    #[error("client {0:?} shares a credential with another client")]
    SharedCredential(String),
    /// No client of that name to revoke.
    #[error("no client {0:?} is enrolled")]
    NotEnrolled(String),
}

impl EnrollmentError {
    /// This refusal of the list in the file `path`.
    fn in_file(self, path: &Path) -> Self {
        Self::Invalid {
            path: path.to_path_buf(),
            problem: Box::new(self),
        }
    }
}

impl EnrollmentList {
    /// Parses and checks a file's text: names are unique and not empty, every client has a token
    /// or a certificate, and no credential belongs to two clients.
    pub fn parse(text: &str) -> Result<Self, EnrollmentError> {
        let list: Self = toml::from_str(text)?;
        let mut names = BTreeSet::new();
        let mut credentials = BTreeSet::new();
        for c in &list.clients {
            let name = || c.name.clone();
            if c.name.trim().is_empty() {
                return Err(EnrollmentError::EmptyName);
            }
            if !names.insert(c.name.as_str()) {
                return Err(EnrollmentError::Twice(name()));
            }
            if c.token.is_none() && c.certificate.is_none() {
                return Err(EnrollmentError::NoCredential(name()));
            }
            for d in c.token.iter().chain(&c.certificate) {
                if !credentials.insert(d.0) {
                    return Err(EnrollmentError::SharedCredential(name()));
                }
            }
        }
        Ok(list)
    }

    /// Reads and checks `path`.
    pub fn read(path: &Path) -> Result<Self, EnrollmentError> {
        Self::read_text(path).map(|(_, list)| list)
    }

    /// The text of `path` and the list it holds, checked.
    fn read_text(path: &Path) -> Result<(String, Self), EnrollmentError> {
        let text = std::fs::read_to_string(path).map_err(|source| EnrollmentError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let list = Self::parse(&text).map_err(|e| e.in_file(path))?;
        Ok((text, list))
    }

    /// The TOML text of the list.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("an enrollment list always serialises")
    }

    /// Adds a client, or gives an enrolled one new credentials and lifts its revocation.
    pub fn enroll(
        &mut self,
        name: &str,
        token: Option<Digest>,
        certificate: Option<Digest>,
    ) -> Result<(), EnrollmentError> {
        let entry = Enrolled {
            name: name.to_owned(),
            token,
            certificate,
            revoked: false,
        };
        let mut next = self.clone();
        match next.clients.iter_mut().find(|c| c.name == name) {
            Some(c) => *c = entry,
            None => next.clients.push(entry),
        }
        *self = Self::parse(&next.to_toml())?;
        Ok(())
    }

    /// Enrolls each of `names` with a new token ([`new_token`]); returns the tokens, in the
    /// order of `names` (a simulation's own clients, which it starts with them).
    pub fn enroll_with_new_tokens(&mut self, names: &[String]) -> std::io::Result<Vec<String>> {
        let mut tokens = Vec::with_capacity(names.len());
        for name in names {
            let token = new_token()?;
            let digest = Some(Digest::of(token.as_bytes()));
            self.clients.retain(|c| c.name != *name);
            self.clients.push(Enrolled {
                name: name.clone(),
                token: digest,
                certificate: None,
                revoked: false,
            });
            tokens.push(token);
        }
        *self = Self::parse(&self.to_toml()).map_err(std::io::Error::other)?;
        Ok(tokens)
    }

    /// Revokes an enrolled client.
    pub fn revoke(&mut self, name: &str) -> Result<(), EnrollmentError> {
        let c = (self.clients.iter_mut().find(|c| c.name == name))
            .ok_or_else(|| EnrollmentError::NotEnrolled(name.into()))?;
        c.revoked = true;
        Ok(())
    }

    /// The client a token or a certificate fingerprint belongs to, comparing every entry in
    /// constant time.
    fn find(&self, token: &Digest, certificate: Option<&Digest>) -> Option<&Enrolled> {
        let mut found = None;
        for c in &self.clients {
            let by_token = c.token.is_some_and(|t| t.matches(token));
            let by_cert =
                matches!((c.certificate, certificate), (Some(a), Some(b)) if a.matches(b));
            if (by_token | by_cert) && found.is_none() {
                found = Some(c);
            }
        }
        found
    }
}

/// What a Join is admitted as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// No identity: a new client id at every Join.
    Anonymous,
    /// An enrolled client, by name.
    Enrolled(String),
}

/// Why a Join was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The token (or certificate) is not one the server admits.
    #[error(
        "enrollment token refused: the client must present the server's token, or its own from \
         `fl enroll`, in FL_TOKEN (or --token), in the shell that starts it"
    )]
    Unknown,
    /// The client was revoked.
    #[error("client {0} is revoked")]
    Revoked(String),
    /// The enrollment file cannot be read: nobody new is admitted until it can.
    #[error("the server cannot read its enrollment list: retry later")]
    Unreadable,
}

/// The enrollment file as last read.
#[derive(Debug)]
struct EnrollmentFile {
    path: PathBuf,
    /// The text last read, to notice changes.
    text: String,
    /// The last good list.
    list: EnrollmentList,
    /// Why the file cannot be used now, if it cannot.
    broken: Option<EnrollmentError>,
}

/// The server's admission rule.
#[derive(Debug)]
pub struct Credentials {
    shared: Option<Digest>,
    enrollment: Option<EnrollmentFile>,
}

impl Credentials {
    /// Admits holders of `shared` (anyone when `None`), or, with an enrollment file at `path`,
    /// only the clients it names. Fails when the file cannot be read or checked.
    pub fn new(shared: Option<Digest>, path: Option<&Path>) -> Result<Self, EnrollmentError> {
        let enrollment = match path {
            Some(path) => {
                let (text, list) = EnrollmentList::read_text(path)?;
                tracing::info!(
                    path = %path.display(),
                    clients = list.clients.len(),
                    revoked = list.clients.iter().filter(|c| c.revoked).count(),
                    "enrollment list read"
                );
                Some(EnrollmentFile {
                    path: path.to_owned(),
                    text,
                    list,
                    broken: None,
                })
            }
            None => None,
        };
        Ok(Self { shared, enrollment })
    }

    /// Reads the enrollment file again; returns whether the list in force changed.
    pub fn refresh(&mut self) -> bool {
        let Some(file) = &mut self.enrollment else {
            return false;
        };
        let text = match std::fs::read_to_string(&file.path) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(path = %file.path.display(), error = %e, "enrollment list unreadable");
                file.broken = Some(EnrollmentError::Read {
                    path: file.path.clone(),
                    source: e,
                });
                return false;
            }
        };
        if text == file.text {
            return false;
        }
        match EnrollmentList::parse(&text) {
            Ok(list) => {
                let changed = list != file.list;
                tracing::info!(
                    clients = list.clients.len(),
                    revoked = list.clients.iter().filter(|c| c.revoked).count(),
                    "enrollment list read again"
                );
                (file.text, file.list, file.broken) = (text, list, None);
                changed
            }
            Err(e) => {
                tracing::error!(
                    path = %file.path.display(),
                    error = %e,
                    "enrollment list invalid: the last good list stays in force, joins are refused"
                );
                file.broken = Some(e.in_file(&file.path));
                file.text = text;
                false
            }
        }
    }

    /// Decides on a Join presenting `token` over a connection whose client certificate (DER) is
    /// `certificate`.
    pub fn admit(&self, token: &str, certificate: Option<&[u8]>) -> Result<Admission, Refusal> {
        let presented = Digest::of(token.as_bytes());
        match &self.enrollment {
            Some(file) => {
                if file.broken.is_some() {
                    return Err(Refusal::Unreadable);
                }
                let fingerprint = certificate.map(Digest::of);
                match file.list.find(&presented, fingerprint.as_ref()) {
                    Some(c) if c.revoked => Err(Refusal::Revoked(c.name.clone())),
                    Some(c) => Ok(Admission::Enrolled(c.name.clone())),
                    None => Err(Refusal::Unknown),
                }
            }
            None => match &self.shared {
                Some(digest) if !digest.matches(&presented) => Err(Refusal::Unknown),
                _ => Ok(Admission::Anonymous),
            },
        }
    }

    /// Whether `name` is enrolled and not revoked in the list in force.
    pub fn is_active(&self, name: &str) -> bool {
        self.enrollment
            .as_ref()
            .is_some_and(|f| f.list.clients.iter().any(|c| c.name == name && !c.revoked))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary folder, removed on drop.
    struct TempDir(PathBuf);

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Writes `text` to a fresh `clients.toml`.
    fn file(text: &str) -> (TempDir, PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "fl-credentials-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("clients.toml");
        std::fs::write(&path, text).unwrap();
        (TempDir(dir), path)
    }

    fn entry(name: &str, token: &str, revoked: bool) -> String {
        format!(
            "[[client]]\nname = \"{name}\"\ntoken = \"{}\"\nrevoked = {revoked}\n",
            Digest::of(token.as_bytes())
        )
    }

    #[test]
    fn digests_round_trip_and_reject_malformed_text() {
        let d = Digest::of(b"abc");
        // SHA-256("abc") from FIPS 180-2, appendix B.1.
        assert_eq!(
            d.to_string(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        assert!("ba7816bf".parse::<Digest>().is_err());
        assert!("sha256:ba78".parse::<Digest>().is_err());
        assert!(
            format!("sha256:{}", "zz".repeat(32))
                .parse::<Digest>()
                .is_err()
        );
    }

    #[test]
    fn tokens_are_written_out_as_digests_only() {
        #[derive(Serialize, Deserialize)]
        struct S {
            token: Token,
        }
        let s: S = toml::from_str("token = \"hunter2\"").unwrap();
        assert_eq!(s.token.clear(), Some("hunter2"));
        let written = toml::to_string(&s).unwrap();
        assert!(!written.contains("hunter2"), "{written}");
        let back: S = toml::from_str(&written).unwrap();
        assert_eq!(back.token, s.token);
        assert_eq!(back.token.clear(), None);
        assert!(toml::from_str::<S>("token = \"\"").is_err());
    }

    #[test]
    fn the_shared_token_admits_its_holders_only() {
        let open = Credentials::new(None, None).unwrap();
        assert_eq!(open.admit("", None), Ok(Admission::Anonymous));
        let shared = Credentials::new(Some(Digest::of(b"s3cret")), None).unwrap();
        assert_eq!(shared.admit("s3cret", None), Ok(Admission::Anonymous));
        for wrong in ["", "s3cre", "s3cret "] {
            assert_eq!(shared.admit(wrong, None), Err(Refusal::Unknown));
        }
    }

    #[test]
    fn enrolled_clients_are_admitted_by_token_or_certificate_until_revoked() {
        let cert = b"DER of a client certificate";
        let text = format!(
            "{}{}[[client]]\nname = \"c\"\ncertificate = \"{}\"\n",
            entry("a", "ta", false),
            entry("b", "tb", true),
            Digest::of(cert)
        );
        let (_guard, path) = file(&text);
        let mut creds = Credentials::new(None, Some(&path)).unwrap();
        assert_eq!(creds.admit("ta", None), Ok(Admission::Enrolled("a".into())));
        assert_eq!(creds.admit("tb", None), Err(Refusal::Revoked("b".into())));
        assert_eq!(
            creds.admit("", Some(cert)),
            Ok(Admission::Enrolled("c".into()))
        );
        assert_eq!(creds.admit("", Some(b"another")), Err(Refusal::Unknown));
        assert_eq!(creds.admit("tc", None), Err(Refusal::Unknown));
        assert!(creds.is_active("a") && !creds.is_active("b") && !creds.is_active("z"));

        // Revoke a while the server runs.
        assert!(!creds.refresh(), "nothing changed yet");
        std::fs::write(&path, text.replace("revoked = false", "revoked = true")).unwrap();
        assert!(creds.refresh());
        assert_eq!(creds.admit("ta", None), Err(Refusal::Revoked("a".into())));
        assert!(!creds.is_active("a"));

        // A broken edit: the last list stays for live clients, nobody new joins.
        std::fs::write(&path, "[[client]]\nname = ").unwrap();
        assert!(!creds.refresh());
        assert_eq!(creds.admit("", Some(cert)), Err(Refusal::Unreadable));
        assert!(creds.is_active("c"));
        std::fs::write(&path, &text).unwrap();
        assert!(creds.refresh());
        assert_eq!(creds.admit("ta", None), Ok(Admission::Enrolled("a".into())));
    }

    #[test]
    fn enrollment_lists_are_checked() {
        let ok = entry("a", "ta", false);
        assert!(EnrollmentList::parse(&ok).is_ok());
        let twice = format!("{ok}{}", entry("a", "tb", false));
        let refused = |text: &str| EnrollmentList::parse(text).unwrap_err();
        assert!(matches!(refused(&twice), EnrollmentError::Twice(n) if n == "a"));
        let shared = format!("{ok}{}", entry("b", "ta", false));
        assert!(matches!(refused(&shared), EnrollmentError::SharedCredential(n) if n == "b"));
        let bare = "[[client]]\nname = \"a\"\n";
        assert!(matches!(refused(bare), EnrollmentError::NoCredential(_)));
        let empty = entry(" ", "ta", false);
        assert!(matches!(refused(&empty), EnrollmentError::EmptyName));
        let unknown = refused("[[client]]\nname = \"a\"\ncolour = 1\n");
        assert!(matches!(unknown, EnrollmentError::Toml(_)));
        let (_guard, path) = file(&twice);
        assert!(Credentials::new(None, Some(&path)).is_err());
    }

    #[test]
    fn enroll_and_revoke_edit_the_list() {
        let mut list = EnrollmentList::default();
        list.enroll("a", Some(Digest::of(b"ta")), None).unwrap();
        list.enroll("b", None, Some(Digest::of(b"cert"))).unwrap();
        assert!(
            list.enroll("c", Some(Digest::of(b"ta")), None).is_err(),
            "a token is one client's"
        );
        list.revoke("a").unwrap();
        assert!(list.revoke("z").is_err());
        let back = EnrollmentList::parse(&list.to_toml()).unwrap();
        assert_eq!(back, list);
        assert!(back.clients[0].revoked && !back.clients[1].revoked);
        list.enroll("a", Some(Digest::of(b"ta2")), None).unwrap();
        assert!(
            !list.clients[0].revoked,
            "enrolling again lifts the revocation"
        );
    }
}
