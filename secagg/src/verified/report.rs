//! The client's side of a verified upload (Prio3's sharding for two aggregators, with PINE's
//! wraparound joint randomness): its update clipped and encoded as field integers, split into an
//! explicit share for the leader and a seed for the helper, with a proof of the norm bound split
//! the same way.
//!
//! 1. The helper's shares of the input and the proof are expanded from a random seed; the leader's
//!    are the input and the proof minus them.
//! 2. Z's seed is XOF(0, part_0 || part_1), each part XOF(blind_j, binder || share j of X): the
//!    client cannot choose X after seeing Z, and each aggregator recomputes its own part.
//! 3. The FLP's joint randomness comes the same way from both parts over the whole input shares.
//! 4. Each aggregator gets its blind and the other's two parts; the helper's seed, blind and the
//!    leader's parts travel sealed to the helper ([`super::seal`]).

use super::circuit::{F, NormCircuit};
use super::derive::{Usage, combine, expand, minus, part};
use super::encode::{EncodeError, fixed_point, to_field};
use super::seal::{HelperPublicKey, SealError, Sealed};
use super::shape::{Binder, Shape, ShapeError};
use prio::field::FieldElement;
use prio::flp::Flp;
use rand::RngCore;

/// An aggregator's two parts, as recomputed from its share or as the client sent them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts {
    /// Its part of Z's seed.
    pub wraparound: [u8; 32],
    /// Its part of the joint-randomness seed.
    pub joint_rand: [u8; 32],
}

impl Parts {
    /// An aggregator's parts from its blind and its input share (X first).
    pub(super) fn of(blind: &[u8; 32], binder: &Binder, input: &[F], dim: usize) -> Self {
        Self {
            wraparound: part(blind, Usage::WraparoundPart, binder, &input[..dim]),
            joint_rand: part(blind, Usage::JointRandPart, binder, input),
        }
    }
}

/// What the leader receives in the clear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderShare {
    /// Its share of the input (X, then the circuit's bits and S_k).
    pub input: Vec<F>,
    /// Its share of the proof.
    pub proof: Vec<F>,
    /// Its blind.
    pub blind: [u8; 32],
    /// The helper's parts.
    pub helper_parts: Parts,
}

/// What the helper receives, sealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperShare {
    /// The seed of its input and proof shares.
    pub seed: [u8; 32],
    /// Its blind.
    pub blind: [u8; 32],
    /// The leader's parts.
    pub leader_parts: Parts,
}

/// Bytes of a [`HelperShare`]: seed, blind, the two parts.
const HELPER_SHARE_BYTES: usize = 4 * 32;

impl HelperShare {
    /// seed || blind || wraparound part || joint-rand part.
    pub fn to_bytes(&self) -> Vec<u8> {
        let parts = [self.seed, self.blind, self.leader_parts.wraparound];
        let mut out = parts.concat();
        out.extend_from_slice(&self.leader_parts.joint_rand);
        out
    }

    /// The share from its bytes, if they have the length.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != HELPER_SHARE_BYTES {
            return None;
        }
        let at =
            |i: usize| -> [u8; 32] { bytes[32 * i..32 * (i + 1)].try_into().unwrap_or([0; 32]) };
        Some(Self {
            seed: at(0),
            blind: at(1),
            leader_parts: Parts {
                wraparound: at(2),
                joint_rand: at(3),
            },
        })
    }
}

/// One client's verified upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The leader's share, in the clear.
    pub leader: LeaderShare,
    /// The helper's share, sealed to it.
    pub helper: Sealed,
}

/// Why a client cannot make its upload.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShardError {
    /// The round's shape does not give a circuit.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// The update does not encode (its length, or the wraparound check's rare honest failure).
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The proof system refused the input.
    #[error("the proof: {0}")]
    Prove(String),
    /// The helper's key is not usable.
    #[error("the helper's key: {0}")]
    Seal(#[from] SealError),
}

/// 32 bytes from the OS-seeded CSPRNG.
fn random_seed() -> [u8; 32] {
    let mut seed = [0u8; 32];
    rand::rng().fill_bytes(&mut seed);
    seed
}

/// `update` clipped to the shape's S, encoded, proved and split for the two aggregators of the
/// round `binder` names.
pub fn shard(
    shape: &Shape,
    binder: &Binder,
    helper_key: &HelperPublicKey,
    update: &[f32],
) -> Result<Report, ShardError> {
    if update.len() != shape.dim {
        let (got, want) = (update.len(), shape.dim);
        return Err(EncodeError::Length { got, want }.into());
    }
    let (x, _) = fixed_point(update, shape.clip, shape.frac_bits);
    split(shape, binder, helper_key, &x, &NormCircuit::encode)
}

/// A compromised client's upload (simulations and tests of the defence): `update` scaled and
/// not clipped, encoded honestly when within the bound and else by
/// [`NormCircuit::encode_claiming_bound`], proved and split as an honest one is. Both
/// aggregators exclude it when its norm is above the bound.
pub fn shard_unclipped(
    shape: &Shape,
    binder: &Binder,
    helper_key: &HelperPublicKey,
    update: &[f32],
) -> Result<Report, ShardError> {
    let scale = f64::from(shape.frac_bits).exp2();
    let x: Vec<i64> = (update.iter())
        .map(|&v| (f64::from(v) * scale).clamp(-(2f64.powi(62)), 2f64.powi(62)) as i64)
        .collect();
    let lie = |c: &NormCircuit, x: &[i64]| c.encode(x).or_else(|_| c.encode_claiming_bound(x));
    split(shape, binder, helper_key, &x, &lie)
}

/// How the circuit's input is made from X: [`NormCircuit::encode`] for an honest client.
pub type Encoder<'a> = &'a dyn Fn(&NormCircuit, &[i64]) -> Result<Vec<F>, EncodeError>;

/// The fixed-point `x`, encoded by `encode`, proved and split: [`shard`]'s work after the clip,
/// and what a simulated attacker calls with an encoder that lies.
pub fn split(
    shape: &Shape,
    binder: &Binder,
    helper_key: &HelperPublicKey,
    x: &[i64],
    encode: Encoder,
) -> Result<Report, ShardError> {
    let (seed, blinds) = (random_seed(), [random_seed(), random_seed()]);
    let scratch = shape.circuit([0; 32])?;
    let helper_input = expand(&seed, Usage::InputShare, binder, scratch.input_len());
    let helper_proof = expand(&seed, Usage::ProofShare, binder, scratch.proof_len());
    // Z's seed from the shares of X (PINE's wraparound joint randomness).
    let helper_x = &helper_input[..shape.dim];
    let leader_x = minus(&to_field(x), helper_x);
    let wraparound = [
        part(&blinds[0], Usage::WraparoundPart, binder, &leader_x),
        part(&blinds[1], Usage::WraparoundPart, binder, helper_x),
    ];
    let z_seed = combine(
        Usage::WraparoundSeed,
        binder,
        [&wraparound[0], &wraparound[1]],
    );
    let circuit = shape.circuit(z_seed)?;
    let input = encode(&circuit, x)?;
    let leader_input = minus(&input, &helper_input);
    let parts = [(&leader_input, 0), (&helper_input, 1)].map(|(share, j)| Parts {
        wraparound: wraparound[j],
        joint_rand: part(&blinds[j], Usage::JointRandPart, binder, share),
    });
    let joint_rand_seed = combine(
        Usage::JointRandSeed,
        binder,
        [&parts[0].joint_rand, &parts[1].joint_rand],
    );
    let joint_rand = expand(
        &joint_rand_seed,
        Usage::JointRand,
        binder,
        circuit.joint_rand_len(),
    );
    let proof = circuit
        .prove(
            &input,
            &F::random_vector(circuit.prove_rand_len()),
            &joint_rand,
        )
        .map_err(|e| ShardError::Prove(e.to_string()))?;
    let helper = HelperShare {
        seed,
        blind: blinds[1],
        leader_parts: parts[0],
    };
    Ok(Report {
        leader: LeaderShare {
            input: leader_input,
            proof: minus(&proof, &helper_proof),
            blind: blinds[0],
            helper_parts: parts[1],
        },
        helper: helper_key.seal(binder, &helper.to_bytes())?,
    })
}
