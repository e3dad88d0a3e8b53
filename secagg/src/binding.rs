//! What makes a round hold against a server that deviates from the protocol (Bonawitz et al.
//! 2017, Sec. 6, the malicious-server variant): every client's keys are signed with an identity
//! key that the federation authority certified ([`fl_authority`]), over the round and the
//! digest of the task and model the client received; and before any share is revealed, the
//! survivors sign the set of clients admitted (U1) and the set of survivors (U3) they were told,
//! so that a client reveals only once t of its neighbours saw the same sets.
//!
//! Signed payloads (big-endian integers; docs/src/reference/protocol.md, "Signed payloads"):
//! - keys: `"flp.v1 secagg keys"`, round u64, H(task) (32 bytes), client id u64, c_pk, s_pk;
//! - survivors: `"flp.v1 secagg survivors"`, round u64, H(task), H(U1) (32 bytes), u32 count,
//!   then each survivor's id u64 in increasing order.

use super::SecAggError;
use super::keys::RoundTag;
use super::messages::{AdvertisedKeys, Member, Signed};
use fl_authority::files::{FileError, read_key_file};
use fl_authority::{AuthorityError, AuthorityKey, Identity, IdentityCertificate};
use fl_authority::{IdentityKey, RevocationList, SignedBy, verify_all};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// Why a certificate is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CertificateError {
    /// Its signature does not verify under the authority's key.
    #[error(transparent)]
    Authority(#[from] AuthorityError),
    /// The authority revoked its name.
    #[error("the authority revoked {name:?} (revocation list {serial})")]
    Revoked {
        /// The name.
        name: String,
        /// The revocation list's serial number.
        serial: u64,
    },
    /// It certifies another identity key than the one it comes with.
    #[error("the certificate of {0:?} is for another identity key")]
    OtherKey(String),
}

/// Why a verifier or a client's credentials cannot be built from their files.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// A file cannot be read or does not hold what it should.
    #[error(transparent)]
    File(#[from] FileError),
    /// The revocation list is not the authority's.
    #[error("the revocation list: {0}")]
    Revocations(#[from] AuthorityError),
    /// The certificate is refused.
    #[error(transparent)]
    Certificate(#[from] CertificateError),
}

/// Domain string of a signed key advertisement.
const KEYS_DOMAIN: &[u8] = b"flp.v1 secagg keys";
/// Domain string of a signed survivor set.
const SURVIVORS_DOMAIN: &[u8] = b"flp.v1 secagg survivors";
/// Domain string of the digest of the admitted clients and their keys (the key transcript).
const MEMBERS_DOMAIN: &[u8] = b"flp.v1 secagg transcript";
/// Domain string of the digest of one key advertisement.
const ADVERT_DOMAIN: &[u8] = b"flp.v1 secagg advert";

impl AdvertisedKeys {
    /// H(advert): SHA-256 of `"flp.v1 secagg advert"`, the client id u64, c_pk, s_pk, then u8 1
    /// and the 64-byte signature when signed, or u8 0.
    pub fn digest(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(ADVERT_DOMAIN);
        h.update(self.client.to_be_bytes());
        h.update(self.cipher_public);
        h.update(self.mask_public);
        match &self.signed {
            Some(s) => {
                h.update([1]);
                h.update(s.signature);
            }
            None => h.update([0]),
        }
        h.finalize().into()
    }
}

/// The bytes a key advertisement's signature covers.
pub fn keys_payload(tag: &RoundTag, keys: &AdvertisedKeys) -> Vec<u8> {
    let mut out = KEYS_DOMAIN.to_vec();
    out.extend_from_slice(&tag.round.to_be_bytes());
    out.extend_from_slice(&tag.digest.0);
    out.extend_from_slice(&keys.client.to_be_bytes());
    out.extend_from_slice(&keys.cipher_public);
    out.extend_from_slice(&keys.mask_public);
    out
}

/// H(U1), the attempt's key transcript: SHA-256 of `"flp.v1 secagg transcript"`, round, H(task),
/// u32 count, then each member's id u64, name (u16 length and UTF-8 bytes; length 0 for a
/// client without a certificate) and H(advert) (32 bytes), in increasing order of id. Every
/// honest member's keys are fresh in each attempt, so no two attempts share it.
pub fn members_digest(tag: &RoundTag, members: &[Member]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(MEMBERS_DOMAIN);
    h.update(tag.round.to_be_bytes());
    h.update(tag.digest.0);
    h.update((members.len() as u32).to_be_bytes());
    for m in members {
        h.update(m.id.to_be_bytes());
        let name = m.name.as_deref().unwrap_or("");
        h.update((name.len() as u16).to_be_bytes());
        h.update(name.as_bytes());
        h.update(m.keys);
    }
    h.finalize().into()
}

/// The bytes a survivor's signature covers: the round, H(task), H(U1) and U3 (sorted).
pub fn survivors_payload(tag: &RoundTag, members: &[u8; 32], survivors: &[u64]) -> Vec<u8> {
    let mut out = SURVIVORS_DOMAIN.to_vec();
    out.extend_from_slice(&tag.round.to_be_bytes());
    out.extend_from_slice(&tag.digest.0);
    out.extend_from_slice(members);
    out.extend_from_slice(&(survivors.len() as u32).to_be_bytes());
    for id in survivors {
        out.extend_from_slice(&id.to_be_bytes());
    }
    out
}

/// What the server and every client check of what a client says through the server: a
/// certificate from the federation authority, for a name the authority has not revoked, and
/// signatures by the certified key.
///
/// Certificates come back every round (the keys they certify do not change), so the ones that
/// verified are remembered whole (name, key and signature: a known signature on another name or
/// key is verified afresh and fails): a certificate is verified once per process, its revocation
/// checked every time. Only certificates that verified are kept, so the memory is bounded by the
/// number of certified clients seen.
#[derive(Debug, Clone)]
pub struct Verifier {
    authority: AuthorityKey,
    revoked: Option<RevocationList>,
    verified: Arc<Mutex<HashSet<IdentityCertificate>>>,
}

/// Two verifiers are equal when they check against the same authority and revocations.
impl PartialEq for Verifier {
    fn eq(&self, other: &Self) -> bool {
        (self.authority, &self.revoked) == (other.authority, &other.revoked)
    }
}

impl Verifier {
    /// Checks with `authority`'s key and, when given, its list of `revoked` names (refused when
    /// the authority did not sign it).
    pub fn new(
        authority: AuthorityKey,
        revoked: Option<RevocationList>,
    ) -> Result<Self, AuthorityError> {
        if let Some(list) = &revoked {
            authority.verify_revocations(list)?;
        }
        Ok(Self {
            authority,
            revoked,
            verified: Arc::default(),
        })
    }

    /// The verifier of the authority whose public key is in the file `authority` (as `fl
    /// authority init` writes it), with the revocation list in the file `revocations`.
    pub fn from_files(
        authority: &std::path::Path,
        revocations: Option<&std::path::Path>,
    ) -> Result<Self, IdentityError> {
        let key = AuthorityKey::read(authority)?;
        let list = revocations.map(RevocationList::read).transpose()?;
        Ok(Self::new(key, list)?)
    }

    /// A certificate the authority signed, for a name it has not revoked.
    pub fn check_certificate(
        &self,
        certificate: &IdentityCertificate,
    ) -> Result<(), CertificateError> {
        let known = (self.verified.lock()).is_ok_and(|set| set.contains(certificate));
        if !known {
            self.authority.verify(certificate)?;
            if let Ok(mut set) = self.verified.lock() {
                set.insert(certificate.clone());
            }
        }
        match &self.revoked {
            Some(list) if list.revokes(&certificate.name) => Err(CertificateError::Revoked {
                name: certificate.name.clone(),
                serial: list.serial,
            }),
            Some(_) | None => Ok(()),
        }
    }

    /// [`Verifier::check_keys`] for every advertisement of `keys` at once: each certificate, then
    /// every signature in one batch ([`verify_all`]); the first failure names its client.
    pub fn check_all_keys<'a>(
        &self,
        tag: &RoundTag,
        keys: &'a [AdvertisedKeys],
    ) -> Result<Vec<&'a IdentityCertificate>, SecAggError> {
        let mut certificates = Vec::with_capacity(keys.len());
        for k in keys {
            let bad = |reason: String| SecAggError::Unauthenticated {
                client: k.client,
                reason,
            };
            let signed =
                (k.signed.as_ref()).ok_or_else(|| bad("its keys are not signed".into()))?;
            (self.check_certificate(&signed.certificate)).map_err(|e| bad(e.to_string()))?;
            certificates.push(&signed.certificate);
        }
        let payloads: Vec<Vec<u8>> = keys.iter().map(|k| keys_payload(tag, k)).collect();
        let signed: Vec<SignedBy<'_>> = (keys.iter().zip(&payloads))
            .filter_map(|(k, p)| {
                k.signed
                    .as_ref()
                    .map(|s| (s.certificate.identity, p.as_slice(), s.signature))
            })
            .collect();
        let what = "the key advertisement (keys, round or task differ from what was signed)";
        verify_all(&signed, what).map_err(|(i, e)| SecAggError::Unauthenticated {
            client: keys[i].client,
            reason: e.to_string(),
        })?;
        Ok(certificates)
    }

    /// A key advertisement signed for this round and task by a certified, unrevoked identity;
    /// returns its certificate.
    pub fn check_keys<'a>(
        &self,
        tag: &RoundTag,
        keys: &'a AdvertisedKeys,
    ) -> Result<&'a IdentityCertificate, SecAggError> {
        let mut checked = self.check_all_keys(tag, std::slice::from_ref(keys))?;
        Ok(checked.remove(0))
    }
}

/// Checks `signer`'s signature over a survivor set's `payload`.
pub fn check_survivors(
    signer: u64,
    identity: &IdentityKey,
    payload: &[u8],
    signature: &[u8; 64],
) -> Result<(), SecAggError> {
    (identity.verify(payload, signature, "the survivor set")).map_err(|e| {
        SecAggError::Unauthenticated {
            client: signer,
            reason: e.to_string(),
        }
    })
}

/// [`check_survivors`] for many signatures over one survivor set at once ([`verify_all`]);
/// `signers[i]` made `signed[i]`.
pub fn check_all_survivors(signers: &[u64], signed: &[SignedBy<'_>]) -> Result<(), SecAggError> {
    verify_all(signed, "the survivor set").map_err(|(i, e)| SecAggError::Unauthenticated {
        client: signers[i],
        reason: e.to_string(),
    })
}

/// A client's side of the trust anchor: its identity key, the authority's certificate of it,
/// and the checks it makes of its peers.
pub struct Credentials {
    /// The client's identity key.
    pub identity: Identity,
    /// The authority's certificate of it.
    pub certificate: IdentityCertificate,
    /// The authority's key and revocations, to check the peers.
    pub verifier: Verifier,
}

/// Names the certificate, never the secret key.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("name", &self.certificate.name)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// Refuses an identity that its own certificate does not name, or a certificate the
    /// authority did not sign or has revoked: a client never starts with credentials its peers
    /// would refuse.
    pub fn new(
        identity: Identity,
        certificate: IdentityCertificate,
        verifier: Verifier,
    ) -> Result<Self, CertificateError> {
        if certificate.identity != identity.public() {
            return Err(CertificateError::OtherKey(certificate.name));
        }
        verifier.check_certificate(&certificate)?;
        Ok(Self {
            identity,
            certificate,
            verifier,
        })
    }

    /// The credentials of the identity key in the file `identity` (as `fl authority identity`
    /// writes it) with its certificate in the file `certificate`, checked against the
    /// authority whose public key is in the file `authority` and its revocation list, if any.
    pub fn from_files(
        identity: &std::path::Path,
        certificate: &std::path::Path,
        (authority, revocations): (&std::path::Path, Option<&std::path::Path>),
    ) -> Result<Self, IdentityError> {
        let verifier = Verifier::from_files(authority, revocations)?;
        let secret = read_key_file(identity, "the identity key")?;
        let certificate = IdentityCertificate::read(certificate)?;
        Ok(Self::new(
            Identity::from_secret(&secret),
            certificate,
            verifier,
        )?)
    }

    /// Signs this client's advertisement `keys` for the round.
    pub fn sign_keys(&self, tag: &RoundTag, keys: &mut AdvertisedKeys) {
        keys.signed = None;
        keys.signed = Some(Box::new(Signed {
            certificate: self.certificate.clone(),
            signature: self.identity.sign(&keys_payload(tag, keys)),
        }));
    }
}
