//! The federation authority: an Ed25519 key (RFC 8032, `ed25519-dalek`) held by whoever admits
//! clients to the federation, never by the server. It signs each client's identity key together
//! with the client's name ([`IdentityCertificate`]) and signs the list of revoked names
//! ([`RevocationList`]). A client configured with the authority's public key ([`AuthorityKey`])
//! can check a certificate the server relays: the server can pass certificates on or withhold
//! them, but it cannot mint one, so it cannot put a key of its own in a client's name.
//!
//! Every signed payload starts with its own domain string, then length-prefixed fields
//! (big-endian lengths), so that no payload of one kind reads as another:
//!
//! - certificate: `"flp.v1 identity certificate"`, u16 name length, name (UTF-8), the 32-byte
//!   identity key;
//! - revocations: `"flp.v1 revocations"`, u64 serial, u32 count, then each name as u16 length and
//!   UTF-8 bytes, in sorted order.
//!
//! Why Ed25519 and not a client CA of mutual TLS: the server terminates every TLS connection, so
//! a client never sees another client's TLS certificate; what a client must check is a key that
//! reached it through the server, which needs a signature that travels with the key.
//!
//! The authority also signs the federation's rules ([`policy`]).
//!
//! **Owns** identities, revocations and the signed policy. **Imports** no crate of the
//! workspace: what it signs is bytes and names, so that the code that decides who belongs to a
//! federation can be read alone.

#![deny(missing_docs)]

pub mod files;
pub mod policy;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use std::collections::BTreeSet;

/// Longest client name a certificate may carry, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Domain string of a certificate's signed payload.
const CERTIFICATE_DOMAIN: &[u8] = b"flp.v1 identity certificate";
/// Domain string of a revocation list's signed payload.
const REVOCATIONS_DOMAIN: &[u8] = b"flp.v1 revocations";

/// Why a key, certificate or revocation list is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthorityError {
    /// A name that is empty or longer than [`MAX_NAME_BYTES`].
    #[error("a client name must have 1 to {MAX_NAME_BYTES} bytes (got {0})")]
    Name(usize),
    /// Bytes that are not a public key (not a point of the curve).
    #[error("not an Ed25519 public key")]
    Key,
    /// A signature that the key it is checked with does not verify.
    #[error("the signature of {0} does not verify")]
    Signature(&'static str),
    /// The operating system's random generator failed.
    #[error("the OS random generator failed: {0}")]
    Random(String),
}

/// A secret Ed25519 key: the authority's, or a client's identity key.
fn generate() -> Result<SigningKey, AuthorityError> {
    let mut secret = [0u8; 32];
    getrandom(&mut secret)?;
    Ok(SigningKey::from_bytes(&secret))
}

/// Fills `bytes` from the OS's generator.
fn getrandom(bytes: &mut [u8]) -> Result<(), AuthorityError> {
    use rand::TryRngCore;
    (rand::rngs::OsRng.try_fill_bytes(bytes)).map_err(|e| AuthorityError::Random(e.to_string()))
}

/// A secret Ed25519 key in one of two roles: the federation authority's ([`Authority`]) or a
/// client's identity key ([`Identity`]).
pub struct SecretKey<R> {
    key: SigningKey,
    role: std::marker::PhantomData<R>,
}

/// The role of the federation authority's key.
pub enum AuthorityRole {}
/// The role of a client's identity key.
pub enum IdentityRole {}

/// The federation authority's secret key.
pub type Authority = SecretKey<AuthorityRole>;
/// A client's identity key pair: it signs what the client says to its peers through the server.
pub type Identity = SecretKey<IdentityRole>;

impl<R> SecretKey<R> {
    /// A new key from the OS's generator.
    pub fn generate() -> Result<Self, AuthorityError> {
        generate().map(Self::from_key)
    }

    /// The key whose secret is `secret` (as [`SecretKey::secret`] gave it).
    pub fn from_secret(secret: &[u8; 32]) -> Self {
        Self::from_key(SigningKey::from_bytes(secret))
    }

    /// The secret, for its owner's file (an authority's is never given to the server).
    pub fn secret(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    fn from_key(key: SigningKey) -> Self {
        Self {
            key,
            role: std::marker::PhantomData,
        }
    }
}

impl Authority {
    /// The public key clients are configured with.
    pub fn public(&self) -> AuthorityKey {
        AuthorityKey(self.key.verifying_key())
    }

    /// Certifies that `identity` is the identity key of the client `name`.
    pub fn certify(
        &self,
        name: &str,
        identity: &IdentityKey,
    ) -> Result<IdentityCertificate, AuthorityError> {
        let payload = certificate_payload(name, identity)?;
        Ok(IdentityCertificate {
            name: name.to_owned(),
            identity: *identity,
            signature: self.key.sign(&payload).to_bytes(),
        })
    }

    /// The authority's signature over a domain-separated `payload` (the federation policy's).
    pub(crate) fn sign_payload(&self, payload: &[u8]) -> [u8; 64] {
        self.key.sign(payload).to_bytes()
    }

    /// The signed list of revoked `names`, numbered `serial` (a newer list has a larger one).
    pub fn revocations(
        &self,
        serial: u64,
        names: BTreeSet<String>,
    ) -> Result<RevocationList, AuthorityError> {
        let payload = revocations_payload(serial, &names)?;
        Ok(RevocationList {
            serial,
            names,
            signature: self.key.sign(&payload).to_bytes(),
        })
    }
}

/// The federation authority's public key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthorityKey(VerifyingKey);

impl AuthorityKey {
    /// The key of these 32 bytes, refused when they are not a point of the curve.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<Self, AuthorityError> {
        VerifyingKey::from_bytes(bytes)
            .map(Self)
            .map_err(|_| AuthorityError::Key)
    }

    /// Its 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// Checks that this authority signed `certificate` (strict verification: no malleable
    /// signature, no small-order key).
    pub fn verify(&self, certificate: &IdentityCertificate) -> Result<(), AuthorityError> {
        let payload = certificate_payload(&certificate.name, &certificate.identity)?;
        let signature = Signature::from_bytes(&certificate.signature);
        (self.0.verify_strict(&payload, &signature))
            .map_err(|_| AuthorityError::Signature("the identity certificate"))
    }

    /// Checks that this authority signed `payload` (strict verification), naming `what` when
    /// it did not.
    pub fn verify_payload(
        &self,
        payload: &[u8],
        signature: &[u8; 64],
        what: &'static str,
    ) -> Result<(), AuthorityError> {
        (self
            .0
            .verify_strict(payload, &Signature::from_bytes(signature)))
        .map_err(|_| AuthorityError::Signature(what))
    }

    /// Checks that this authority signed `list`.
    pub fn verify_revocations(&self, list: &RevocationList) -> Result<(), AuthorityError> {
        let payload = revocations_payload(list.serial, &list.names)?;
        let signature = Signature::from_bytes(&list.signature);
        (self.0.verify_strict(&payload, &signature))
            .map_err(|_| AuthorityError::Signature("the revocation list"))
    }
}

impl Identity {
    /// The public identity key, which the authority certifies.
    pub fn public(&self) -> IdentityKey {
        IdentityKey(self.key.verifying_key().to_bytes())
    }

    /// The client's Ed25519 signature over `payload` (a domain-separated payload of the secure
    /// aggregation protocol).
    pub fn sign(&self, payload: &[u8]) -> [u8; 64] {
        self.key.sign(payload).to_bytes()
    }
}

/// A client's public identity key (32 bytes, an Ed25519 public key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdentityKey(pub [u8; 32]);

impl IdentityKey {
    /// Checks the client's `signature` over `payload` (strict verification), naming `what` was
    /// signed when it does not verify.
    pub fn verify(
        &self,
        payload: &[u8],
        signature: &[u8; 64],
        what: &'static str,
    ) -> Result<(), AuthorityError> {
        let key = VerifyingKey::from_bytes(&self.0).map_err(|_| AuthorityError::Key)?;
        (key.verify_strict(payload, &Signature::from_bytes(signature)))
            .map_err(|_| AuthorityError::Signature(what))
    }
}

/// One signature to check in [`verify_all`]: the signer's key, the payload, the signature.
pub type SignedBy<'a> = (IdentityKey, &'a [u8], [u8; 64]);

/// Checks many identity signatures at once; on failure, the index of the first that does not
/// verify on its own (strict verification, as [`IdentityKey::verify`]).
///
/// Ed25519 batch verification (`ed25519_dalek::verify_batch`: one multiscalar product for the
/// whole batch, with coefficients drawn from a transcript of every input) takes about half the
/// time of one strict verification per signature. It accepts every signature strict
/// verification accepts (keys of small order are refused first, as strict verification does).
/// It may also accept, with some probability, a signature whose R its own signer built with a
/// small-order component, which strict verification refuses. Only the holder of the key can
/// make one, and it gains nothing by it in secure aggregation: a signature that some clients
/// accept and others refuse is no more than the server can arrange by forwarding it to some
/// clients and not others.
pub fn verify_all(
    signed: &[SignedBy<'_>],
    what: &'static str,
) -> Result<(), (usize, AuthorityError)> {
    let keys: Option<Vec<VerifyingKey>> = (signed.iter())
        .map(|(k, _, _)| VerifyingKey::from_bytes(&k.0).ok().filter(|k| !k.is_weak()))
        .collect();
    if let Some(keys) = keys {
        let messages: Vec<&[u8]> = signed.iter().map(|(_, m, _)| *m).collect();
        let signatures: Vec<Signature> = signed
            .iter()
            .map(|(_, _, s)| Signature::from_bytes(s))
            .collect();
        if ed25519_dalek::verify_batch(&messages, &signatures, &keys).is_ok() {
            return Ok(());
        }
    }
    for (i, (key, payload, signature)) in signed.iter().enumerate() {
        key.verify(payload, signature, what).map_err(|e| (i, e))?;
    }
    Ok(())
}

/// The authority's statement that `identity` is the identity key of the client `name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdentityCertificate {
    /// The client's name.
    pub name: String,
    /// Its identity key.
    pub identity: IdentityKey,
    /// The authority's Ed25519 signature over the certificate's payload.
    pub signature: [u8; 64],
}

/// The names the authority has revoked, numbered by `serial`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevocationList {
    /// Larger for a newer list.
    pub serial: u64,
    /// The revoked names.
    pub names: BTreeSet<String>,
    /// The authority's Ed25519 signature over the list's payload.
    pub signature: [u8; 64],
}

impl RevocationList {
    /// Whether `name` is revoked.
    pub fn revokes(&self, name: &str) -> bool {
        self.names.contains(name)
    }
}

/// Appends `name` as u16 length and bytes, refusing an empty or too long one.
fn push_name(out: &mut Vec<u8>, name: &str) -> Result<(), AuthorityError> {
    let len = name.len();
    if len == 0 || len > MAX_NAME_BYTES {
        return Err(AuthorityError::Name(len));
    }
    out.extend_from_slice(&(len as u16).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    Ok(())
}

/// The bytes a certificate's signature covers.
fn certificate_payload(name: &str, identity: &IdentityKey) -> Result<Vec<u8>, AuthorityError> {
    let mut out = CERTIFICATE_DOMAIN.to_vec();
    push_name(&mut out, name)?;
    out.extend_from_slice(&identity.0);
    Ok(out)
}

/// The bytes a revocation list's signature covers.
fn revocations_payload(serial: u64, names: &BTreeSet<String>) -> Result<Vec<u8>, AuthorityError> {
    let mut out = REVOCATIONS_DOMAIN.to_vec();
    out.extend_from_slice(&serial.to_be_bytes());
    out.extend_from_slice(&(names.len() as u32).to_be_bytes());
    for name in names {
        push_name(&mut out, name)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate verifies under its authority only, and not once its name, key or signature
    /// is changed.
    #[test]
    fn a_certificate_binds_a_name_to_a_key_under_one_authority() {
        let authority = Authority::generate().unwrap();
        let public = authority.public();
        let alice = Identity::generate().unwrap().public();
        let cert = authority.certify("hospital-1", &alice).unwrap();
        public.verify(&cert).unwrap();
        let renamed = IdentityCertificate {
            name: "hospital-2".into(),
            ..cert.clone()
        };
        assert!(public.verify(&renamed).is_err());
        let swapped = IdentityCertificate {
            identity: Identity::generate().unwrap().public(),
            ..cert.clone()
        };
        assert!(public.verify(&swapped).is_err());
        let mut forged = cert.clone();
        forged.signature[5] ^= 1;
        assert!(public.verify(&forged).is_err());
        // The server's own "authority" cannot mint a certificate clients accept.
        let server = Authority::generate().unwrap();
        let minted = server.certify("hospital-1", &alice).unwrap();
        assert_eq!(
            public.verify(&minted),
            Err(AuthorityError::Signature("the identity certificate"))
        );
        // Keys survive their bytes.
        let again = Authority::from_secret(&authority.secret());
        assert_eq!(again.public(), public);
        assert_eq!(
            AuthorityKey::from_bytes(&public.to_bytes()).unwrap(),
            public
        );
    }

    #[test]
    fn names_are_bounded() {
        let authority = Authority::generate().unwrap();
        let key = Identity::generate().unwrap().public();
        assert_eq!(authority.certify("", &key), Err(AuthorityError::Name(0)));
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        assert!(authority.certify(&long, &key).is_err());
        authority.certify(&long[1..], &key).unwrap();
    }

    /// Certificates and lists read back from their files as written.
    #[test]
    fn files_read_back() {
        let authority = Authority::generate().unwrap();
        let cert =
            (authority.certify("a b \"c\"", &Identity::generate().unwrap().public())).unwrap();
        assert_eq!(
            IdentityCertificate::from_toml(&cert.to_toml()).unwrap(),
            cert
        );
        let list = authority.revocations(1, ["x".to_string()].into()).unwrap();
        assert_eq!(RevocationList::from_toml(&list.to_toml()).unwrap(), list);
        assert!(IdentityCertificate::from_toml("name = \"a\"").is_err());
    }

    /// A revocation list verifies as signed, and not with a name removed or its serial changed.
    #[test]
    fn a_revocation_list_is_signed_whole() {
        let authority = Authority::generate().unwrap();
        let names: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
        let list = authority.revocations(3, names).unwrap();
        authority.public().verify_revocations(&list).unwrap();
        assert!(list.revokes("a") && !list.revokes("c"));
        let mut fewer = list.clone();
        fewer.names.remove("b");
        assert!(authority.public().verify_revocations(&fewer).is_err());
        let older = RevocationList {
            serial: 2,
            ..list.clone()
        };
        assert!(authority.public().verify_revocations(&older).is_err());
    }

    /// A batch verifies when every signature does, and otherwise names the first that does not,
    /// as strict verification would; a weak (small-order) key is refused.
    #[test]
    fn a_batch_names_its_first_bad_signature() {
        let ids: Vec<Identity> = (0..5).map(|_| Identity::generate().unwrap()).collect();
        let payloads: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 40]).collect();
        let mut signed: Vec<SignedBy<'_>> = (ids.iter().zip(&payloads))
            .map(|(id, p)| (id.public(), p.as_slice(), id.sign(p)))
            .collect();
        verify_all(&signed, "test").unwrap();
        verify_all(&[], "test").unwrap();
        signed[3].2[7] ^= 1;
        assert_eq!(verify_all(&signed, "test").unwrap_err().0, 3);
        signed[3].2[7] ^= 1;
        signed[1].1 = &payloads[2];
        assert_eq!(verify_all(&signed, "test").unwrap_err().0, 1);
        signed[1].1 = &payloads[1];
        // The identity point (a small-order key) signs nothing.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        signed[4].0 = IdentityKey(identity);
        assert_eq!(verify_all(&signed, "test").unwrap_err().0, 4);
    }

    /// RFC 8032 section 7.1, TEST 1: the empty message under its secret key, so that the scheme
    /// is Ed25519 itself, byte for byte.
    #[test]
    fn the_signatures_are_rfc_8032_ed25519() {
        let hex = |s: &str| -> Vec<u8> {
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                .collect()
        };
        let secret: [u8; 32] =
            hex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
                .try_into()
                .unwrap();
        let key = SigningKey::from_bytes(&secret);
        assert_eq!(
            key.verifying_key().to_bytes().to_vec(),
            hex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
        );
        let expected = hex(
            "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bac\
             c61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
        );
        assert_eq!(key.sign(b"").to_bytes().to_vec(), expected);
    }
}
