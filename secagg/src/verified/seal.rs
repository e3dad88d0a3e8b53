//! The helper's part of an upload, sealed by the client to the helper's public key with RFC 9180
//! HPKE (base mode, DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, ChaCha20-Poly1305; the `hpke`
//! crate), with the upload's binder as associated data: the leader, which relays it, cannot read
//! it, and cannot move it to another round or client.

use super::shape::Binder;
use hpke::aead::ChaCha20Poly1305;
use hpke::kdf::HkdfSha256;
use hpke::kem::X25519HkdfSha256;
use hpke::{Deserializable, Kem, OpModeR, OpModeS, Serializable};

/// HPKE's info string.
const INFO: &[u8] = b"flp.v1 verified helper share";

/// Why a sealed part cannot be opened, or a key read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Not 32 bytes, or not a key.
    #[error("not an X25519 key")]
    Key,
    /// The ciphertext does not open under this key and binder.
    #[error("the helper's part does not open: sealed to another key, round or client, or altered")]
    Open,
}

/// The helper's private key.
pub struct HelperKey(<X25519HkdfSha256 as Kem>::PrivateKey);

impl std::fmt::Debug for HelperKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HelperKey(..)")
    }
}

/// The helper's public key, as clients get it from the federation's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperPublicKey(<X25519HkdfSha256 as Kem>::PublicKey);

impl HelperKey {
    /// A fresh key from the OS's randomness, with its public key.
    pub fn generate() -> (Self, HelperPublicKey) {
        let (secret, public) = X25519HkdfSha256::gen_keypair();
        (Self(secret), HelperPublicKey(public))
    }

    /// The key from its 32 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SealError> {
        Deserializable::from_bytes(bytes)
            .map(Self)
            .map_err(|_| SealError::Key)
    }

    /// Its 32 bytes, for the helper's key file.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes().into()
    }

    /// The public key.
    pub fn public(&self) -> HelperPublicKey {
        HelperPublicKey(X25519HkdfSha256::sk_to_pk(&self.0))
    }

    /// The plaintext of `sealed`, if it was sealed to this key under `binder`.
    pub fn open(&self, binder: &Binder, sealed: &Sealed) -> Result<Vec<u8>, SealError> {
        let encapped =
            Deserializable::from_bytes(&sealed.encapped_key).map_err(|_| SealError::Open)?;
        hpke::single_shot_open::<ChaCha20Poly1305, HkdfSha256, X25519HkdfSha256>(
            &OpModeR::Base,
            &self.0,
            &encapped,
            INFO,
            &sealed.ciphertext,
            binder.as_bytes(),
        )
        .map_err(|_| SealError::Open)
    }
}

impl HelperPublicKey {
    /// The key from its 32 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SealError> {
        Deserializable::from_bytes(bytes)
            .map(Self)
            .map_err(|_| SealError::Key)
    }

    /// Its 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes().into()
    }

    /// `plaintext` sealed to this key under `binder`, with an ephemeral key from the OS; refused
    /// for a key whose shared secret would be all zeros (a low-order point).
    pub fn seal(&self, binder: &Binder, plaintext: &[u8]) -> Result<Sealed, SealError> {
        let (encapped, ciphertext) = hpke::single_shot_seal::<
            ChaCha20Poly1305,
            HkdfSha256,
            X25519HkdfSha256,
        >(
            &OpModeS::Base, &self.0, INFO, plaintext, binder.as_bytes()
        )
        .map_err(|_| SealError::Key)?;
        Ok(Sealed {
            encapped_key: encapped.to_bytes().to_vec(),
            ciphertext,
        })
    }
}

/// An HPKE ciphertext: the encapsulated key and the sealed bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// enc, 32 bytes.
    pub encapped_key: Vec<u8>,
    /// The ciphertext with its tag.
    pub ciphertext: Vec<u8>,
}
