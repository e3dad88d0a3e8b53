//! Every value derived from a seed in a verified upload, each under its own domain string and the
//! upload's binder, with `prio`'s TurboSHAKE128 XOF (draft-irtf-cfrg-vdaf, "XofTurboShake128"),
//! following Prio3's derivations ("Sharding" and "Preparation") with PINE's wraparound joint
//! randomness, derived from the shares of X alone.

use super::circuit::{F, field_bytes};
use super::shape::Binder;
use prio::vdaf::xof::{IntoFieldVec, Xof, XofTurboShake128};

/// What a value is derived for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// The helper's share of the input, from its seed.
    InputShare,
    /// The helper's share of the proof, from its seed.
    ProofShare,
    /// An aggregator's part of the wraparound seed, from its blind and its share of X.
    WraparoundPart,
    /// The wraparound seed (Z's), from both parts.
    WraparoundSeed,
    /// An aggregator's part of the joint-randomness seed, from its blind and its input share.
    JointRandPart,
    /// The joint-randomness seed, from both parts.
    JointRandSeed,
    /// The joint randomness, from its seed.
    JointRand,
    /// The query randomness, from the aggregators' verify key.
    QueryRand,
}

impl Usage {
    /// The domain string.
    fn dst(self) -> &'static [u8] {
        match self {
            Usage::InputShare => b"flp.v1 verified input share",
            Usage::ProofShare => b"flp.v1 verified proof share",
            Usage::WraparoundPart => b"flp.v1 verified wraparound part",
            Usage::WraparoundSeed => b"flp.v1 verified wraparound seed",
            Usage::JointRandPart => b"flp.v1 verified joint rand part",
            Usage::JointRandSeed => b"flp.v1 verified joint rand seed",
            Usage::JointRand => b"flp.v1 verified joint rand",
            Usage::QueryRand => b"flp.v1 verified query rand",
        }
    }
}

/// `len` field elements from `seed`.
pub fn expand(seed: &[u8; 32], usage: Usage, binder: &Binder, len: usize) -> Vec<F> {
    XofTurboShake128::seed_stream(seed, &[usage.dst()], &[binder.as_bytes()]).into_field_vec(len)
}

/// A 32-byte seed from `key` over the binder and `data` (a part from a blind and a share, or a
/// seed from both parts under the zero key).
pub fn seed(key: &[u8; 32], usage: Usage, binder: &Binder, data: &[&[u8]]) -> [u8; 32] {
    let mut xof = XofTurboShake128::init(key, &[usage.dst()]);
    xof.update(binder.as_bytes());
    for part in data {
        xof.update(part);
    }
    *xof.into_seed().as_ref()
}

/// An aggregator's part: XOF(blind, binder || share).
pub fn part(blind: &[u8; 32], usage: Usage, binder: &Binder, share: &[F]) -> [u8; 32] {
    seed(blind, usage, binder, &[&field_bytes(share)])
}

/// The seed of both parts, the leader's first.
pub fn combine(usage: Usage, binder: &Binder, parts: [&[u8; 32]; 2]) -> [u8; 32] {
    seed(&[0; 32], usage, binder, &[parts[0], parts[1]])
}

/// a - b, element by element.
pub fn minus(a: &[F], b: &[F]) -> Vec<F> {
    a.iter().zip(b).map(|(&x, &y)| x - y).collect()
}
