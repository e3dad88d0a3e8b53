//! Key agreement and share encryption (Bonawitz et al. 2017, Sec. 4, "KA" and "AE").
//!
//! Each client makes two X25519 key pairs per round: (c_pk, c_sk) to encrypt its Shamir shares to
//! peers and (s_pk, s_sk) for mask agreement. Every symmetric key is HKDF-SHA256 (RFC 5869) of an
//! X25519 shared secret with a context that binds the protocol, the purpose, the round, the digest
//! of the round's task and model ([`RoundTag`]) and both client ids, so no key is reused across
//! rounds, pairs or purposes, and clients sent different tasks agree on no key.

use crate::task::TaskDigest;
use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::{ChaCha20Poly1305, KeyInit};
use hkdf::Hkdf;
use rand::{CryptoRng, Rng};
use sha2::{Digest, Sha256};
use x25519_dalek::{PublicKey, StaticSecret};

/// HKDF salt: the protocol name and version.
const SALT: &[u8] = b"flp.v1 secure aggregation";

/// An X25519 key pair.
pub struct KeyPair {
    /// The secret scalar (kept so it can be Shamir-shared).
    pub secret: StaticSecret,
    /// Its public key.
    pub public: PublicKey,
}

impl KeyPair {
    /// A fresh key pair from a CSPRNG.
    pub fn generate<R: Rng + CryptoRng>(rng: &mut R) -> Self {
        Self::from_secret(rng.random())
    }

    /// The key pair of a known secret (used when the server reconstructs a dropped client's key).
    pub fn from_secret(bytes: [u8; 32]) -> Self {
        let secret = StaticSecret::from(bytes);
        let public = PublicKey::from(&secret);
        Self { secret, public }
    }
}

/// Why a key agreement fails.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum KeyError {
    /// The peer's public key is a low-order point: the shared secret would be predictable.
    #[error("client {0}'s public key is a low-order point")]
    NonContributory(u64),
    /// The peer's public key is not the canonical encoding of a u-coordinate.
    #[error("client {0}'s public key is not canonical (u must be below 2^255 - 19, top bit 0)")]
    NonCanonical(u64),
}

/// Checks that a public key `client` advertised is a canonical u-coordinate: below
/// p = 2^255 - 19, top bit clear (RFC 7748 Sec. 5). A byte comparison: what a client checks of
/// every neighbour's key it is relayed, the small order being refused by the agreement itself
/// ([`pair_seed`], [`share_cipher`]).
pub fn check_canonical(client: u64, bytes: &[u8; 32]) -> Result<(), KeyError> {
    // p = 2^255 - 19, little-endian: 0xed, then thirty 0xff, then 0x7f.
    let below_p = bytes[31] < 0x7f
        || (bytes[31] == 0x7f && (bytes[1..31].iter().any(|&b| b != 0xff) || bytes[0] < 0xed));
    match below_p {
        true => Ok(()),
        false => Err(KeyError::NonCanonical(client)),
    }
}

/// Checks a public key `client` advertised: a canonical u-coordinate (below p = 2^255 - 19 with the
/// top bit clear, RFC 7748 Sec. 5) that is not of small order. Clamped X25519 scalars are
/// multiples of the cofactor 8, so a Diffie-Hellman with any of them maps exactly the points of
/// order dividing 8 (on the curve or its twist) to the all-zero output.
pub fn check_public(client: u64, bytes: &[u8; 32]) -> Result<(), KeyError> {
    check_canonical(client, bytes)?;
    let probe = StaticSecret::from([0x42; 32]);
    if !probe
        .diffie_hellman(&PublicKey::from(*bytes))
        .was_contributory()
    {
        return Err(KeyError::NonContributory(client));
    }
    Ok(())
}

/// What every key, commitment and signature of a round is bound to: the round and the digest of
/// the task and model its clients received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundTag {
    /// The round.
    pub round: u64,
    /// H(task).
    pub digest: TaskDigest,
}

/// purpose || round (u64) || H(task) || a (u64) || b (u64): the HKDF info and AEAD associated
/// data of a round's keys, big-endian.
fn context(purpose: &[u8], tag: &RoundTag, a: u64, b: u64) -> Vec<u8> {
    let mut info = purpose.to_vec();
    info.extend_from_slice(&tag.round.to_be_bytes());
    info.extend_from_slice(&tag.digest.0);
    for v in [a, b] {
        info.extend_from_slice(&v.to_be_bytes());
    }
    info
}

fn derive(
    secret: &StaticSecret,
    peer: &PublicKey,
    peer_id: u64,
    info: &[u8],
) -> Result<[u8; 32], KeyError> {
    let shared = secret.diffie_hellman(peer);
    if !shared.was_contributory() {
        return Err(KeyError::NonContributory(peer_id));
    }
    let mut okm = [0u8; 32];
    Hkdf::<Sha256>::new(Some(SALT), shared.as_bytes())
        .expand(info, &mut okm)
        .expect("32 bytes is a valid HKDF-SHA256 output length");
    Ok(okm)
}

/// s_{u,v}: the pairwise mask seed of clients u and v in a round, the same from either side:
/// HKDF(X25519(s_sk_u, s_pk_v), "mask" || round || H(task) || min(u,v) || max(u,v)).
pub fn pair_seed(
    tag: &RoundTag,
    me: u64,
    my_secret: &StaticSecret,
    peer: u64,
    peer_public: &PublicKey,
) -> Result<[u8; 32], KeyError> {
    let info = context(b"mask", tag, me.min(peer), me.max(peer));
    derive(my_secret, peer_public, peer, &info)
}

/// The AEAD that carries `from`'s shares to `to` in a round: ChaCha20-Poly1305 keyed by
/// HKDF(X25519(c_sk, c_pk_peer), "share" || round || H(task) || from || to). The direction is in
/// the context, so each key encrypts exactly one message and a zero nonce is safe.
pub fn share_cipher(
    tag: &RoundTag,
    from: u64,
    to: u64,
    my_secret: &StaticSecret,
    peer: u64,
    peer_public: &PublicKey,
) -> Result<ChaCha20Poly1305, KeyError> {
    let key = derive(
        my_secret,
        peer_public,
        peer,
        &context(b"share", tag, from, to),
    )?;
    Ok(ChaCha20Poly1305::new(&key.into()))
}

/// Associated data of a share ciphertext: round, H(task), sender and receiver.
fn share_aad(tag: &RoundTag, from: u64, to: u64) -> Vec<u8> {
    context(b"share-aad", tag, from, to)
}

/// Encrypts `plaintext` from `from` to `to`.
pub fn seal(
    cipher: &ChaCha20Poly1305,
    tag: &RoundTag,
    from: u64,
    to: u64,
    plaintext: &[u8],
) -> Vec<u8> {
    cipher
        .encrypt(
            &[0u8; 12].into(),
            Payload {
                msg: plaintext,
                aad: &share_aad(tag, from, to),
            },
        )
        .expect("in-memory ChaCha20-Poly1305 encryption cannot fail")
}

/// Decrypts and authenticates; `None` for a forged, altered or misaddressed ciphertext.
pub fn open(
    cipher: &ChaCha20Poly1305,
    tag: &RoundTag,
    from: u64,
    to: u64,
    ciphertext: &[u8],
) -> Option<Vec<u8>> {
    cipher
        .decrypt(
            &[0u8; 12].into(),
            Payload {
                msg: ciphertext,
                aad: &share_aad(tag, from, to),
            },
        )
        .ok()
}

/// Which secret a share belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SecretKind {
    /// s_sk_u: revealed only for a client that dropped before sending its masked input.
    MaskKey,
    /// b_u: the self-mask seed, revealed only for a client whose masked input arrived.
    SelfMask,
}

/// A hiding, binding commitment to one share: SHA-256 of the context and the share bytes. The
/// server keeps it from the sharing stage and checks revealed shares against it, so a forged
/// share is caught before it can corrupt the unmasked sum. Shares are uniform field elements
/// (305 bits), so the hash reveals nothing about them.
pub fn share_commitment(
    tag: &RoundTag,
    kind: SecretKind,
    owner: u64,
    holder: u64,
    share: &[u8],
) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(SALT);
    h.update(context(
        match kind {
            SecretKind::MaskKey => b"commit-mask-key",
            SecretKind::SelfMask => b"commit-self-mask",
        },
        tag,
        owner,
        holder,
    ));
    h.update(share);
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn tag(round: u64) -> RoundTag {
        RoundTag {
            round,
            digest: TaskDigest([round as u8; 32]),
        }
    }

    #[test]
    fn both_sides_derive_the_same_pair_seed_and_it_binds_round_task_and_ids() {
        let mut rng = StdRng::seed_from_u64(1);
        let (a, b, c) = (
            KeyPair::generate(&mut rng),
            KeyPair::generate(&mut rng),
            KeyPair::generate(&mut rng),
        );
        let ab = pair_seed(&tag(3), 1, &a.secret, 2, &b.public).unwrap();
        assert_eq!(ab, pair_seed(&tag(3), 2, &b.secret, 1, &a.public).unwrap());
        assert_ne!(ab, pair_seed(&tag(4), 1, &a.secret, 2, &b.public).unwrap());
        assert_ne!(ab, pair_seed(&tag(3), 1, &a.secret, 5, &b.public).unwrap());
        assert_ne!(ab, pair_seed(&tag(3), 1, &a.secret, 3, &c.public).unwrap());
        // Sent a different task, the other side derives another seed: the masks do not cancel.
        let other_task = RoundTag {
            digest: TaskDigest([9; 32]),
            ..tag(3)
        };
        assert_ne!(
            ab,
            pair_seed(&other_task, 2, &b.secret, 1, &a.public).unwrap()
        );
    }

    #[test]
    fn low_order_public_keys_are_refused() {
        let a = KeyPair::generate(&mut StdRng::seed_from_u64(2));
        assert_eq!(
            pair_seed(&tag(1), 1, &a.secret, 9, &PublicKey::from([0u8; 32])),
            Err(KeyError::NonContributory(9))
        );
    }

    #[test]
    fn advertised_keys_must_be_canonical_and_of_large_order() {
        let mut rng = StdRng::seed_from_u64(4);
        let fresh = KeyPair::generate(&mut rng).public.to_bytes();
        assert_eq!(check_public(1, &fresh), Ok(()));
        let mut p_minus = [0xff; 32];
        p_minus[31] = 0x7f;
        // u = 0, 1 and p - 1 (orders 4, 4 and 2 on the curve or twist), and the two points of
        // order 8 (their little-endian encodings, as listed in libsodium).
        let mut small = vec![[0u8; 32], [0u8; 32]];
        small[1][0] = 1;
        let mut minus_one = p_minus;
        minus_one[0] = 0xec;
        small.push(minus_one);
        small.push(hex32(
            "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
        ));
        small.push(hex32(
            "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157",
        ));
        for key in &small {
            assert_eq!(
                check_public(7, key),
                Err(KeyError::NonContributory(7)),
                "{key:?}"
            );
        }
        // u = p, p + 1 and any key with the top bit set are not canonical.
        let mut p = p_minus;
        p[0] = 0xed;
        let mut p_plus = p_minus;
        p_plus[0] = 0xee;
        let mut top = fresh;
        top[31] |= 0x80;
        for key in [p, p_plus, p_minus, top] {
            assert_eq!(
                check_public(7, &key),
                Err(KeyError::NonCanonical(7)),
                "{key:?}"
            );
        }
    }

    fn hex32(s: &str) -> [u8; 32] {
        let bytes: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        bytes.try_into().unwrap()
    }

    #[test]
    fn shares_open_only_for_their_addressee_round_and_bytes() {
        let mut rng = StdRng::seed_from_u64(3);
        let (u, v, w) = (
            KeyPair::generate(&mut rng),
            KeyPair::generate(&mut rng),
            KeyPair::generate(&mut rng),
        );
        let send = share_cipher(&tag(7), 1, 2, &u.secret, 2, &v.public).unwrap();
        let ct = seal(&send, &tag(7), 1, 2, b"share");
        let recv = share_cipher(&tag(7), 1, 2, &v.secret, 1, &u.public).unwrap();
        assert_eq!(open(&recv, &tag(7), 1, 2, &ct).unwrap(), b"share");
        // Wrong round, wrong direction, a third party, or a flipped bit: all refused.
        assert!(open(&recv, &tag(8), 1, 2, &ct).is_none());
        assert!(
            open(
                &share_cipher(&tag(7), 2, 1, &v.secret, 1, &u.public).unwrap(),
                &tag(7),
                2,
                1,
                &ct
            )
            .is_none()
        );
        assert!(
            open(
                &share_cipher(&tag(7), 1, 2, &w.secret, 1, &u.public).unwrap(),
                &tag(7),
                1,
                2,
                &ct
            )
            .is_none()
        );
        let mut forged = ct.clone();
        forged[0] ^= 1;
        assert!(open(&recv, &tag(7), 1, 2, &forged).is_none());
    }
}
