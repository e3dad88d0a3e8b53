//! The public parameters of a verified round, from which the clients and both aggregators derive
//! the same circuit: d, the clip norm S, the fixed-point precision, and the wraparound check's
//! repetitions; and the binder every derivation of one upload is bound to.

use super::circuit::{F, NormCircuit};
use crate::keys::RoundTag;
use prio::field::FieldElementWithInteger;
use prio::flp::FlpError;

/// r: wraparound repetitions. With `PASS` of them to pass, a vector whose squares wrap around
/// passes with probability below 2^-73 per try (PINE, Theorem 4.10 with a cheater's pass
/// probability of 1/2 per repetition), enough against a client that grinds its shares for a Z.
pub const REPS: usize = 135;
/// The repetitions a client must pass (tau r, tau = 0.9).
pub const PASS: usize = 122;
/// alpha = sqrt(2 ln(2 / eta)) with eta = 0.01: an honest Y_k = <Z_k, X> passes with
/// probability at least 1 - eta (Hoeffding, |Z_i X_i| <= |X_i|), so an honest client fails fewer
/// than 122 of 135 with probability below 1e-11.
const ALPHA: f64 = 3.2552;
/// sqrt(B) at most 2^26: 648 B stays below the 64-bit modulus (the circuit's field check).
const ROOT_BITS: i32 = 26;

/// Why a verified round's shape is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShapeError {
    /// d is zero.
    #[error("a verified round needs at least one coordinate")]
    Empty,
    /// S is not a positive finite number.
    #[error("the clip norm must be positive and finite, not {0}")]
    Clip(f64),
    /// The circuit refused the parameters.
    #[error("the norm circuit: {0}")]
    Circuit(String),
}

/// d, S and the derived fixed point: every party of a round computes the same circuit from it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// d.
    pub dim: usize,
    /// S: the L2 bound of one contribution.
    pub clip: f64,
    /// f: fractional bits, the most that keep floor(S 2^f) <= 2^26.
    pub frac_bits: u32,
}

impl Shape {
    /// The shape of a round of `dim` coordinates clipped to `clip`.
    pub fn new(dim: usize, clip: f64) -> Result<Self, ShapeError> {
        if dim == 0 {
            return Err(ShapeError::Empty);
        }
        if !(clip.is_finite() && clip > 0.0) {
            return Err(ShapeError::Clip(clip));
        }
        let frac_bits = (ROOT_BITS - clip.log2().ceil() as i32).clamp(0, 52) as u32;
        let shape = Self {
            dim,
            clip,
            frac_bits,
        };
        if shape.root() < 1 {
            return Err(ShapeError::Clip(clip));
        }
        shape.circuit([0; 32])?;
        Ok(shape)
    }

    /// floor(S 2^f): the bound on ||X||_2 in field integers.
    fn root(&self) -> u64 {
        (self.clip * f64::from(self.frac_bits).exp2()).floor() as u64
    }

    /// B = floor(S 2^f)^2.
    pub fn bound(&self) -> u64 {
        self.root().pow(2)
    }

    /// a: the least 2^(b1 - 1) - 1 at least alpha sqrt(B), so that the circuit's rounding keeps it.
    fn slack(&self) -> u64 {
        let wanted = (ALPHA * self.root() as f64).ceil() as u64;
        (wanted + 1).next_power_of_two() - 1
    }

    /// The circuit of an upload whose public Z comes from `z_seed`.
    pub fn circuit(&self, z_seed: [u8; 32]) -> Result<NormCircuit, ShapeError> {
        let reps = (REPS, PASS, self.slack());
        NormCircuit::new(self.dim, self.bound(), reps, z_seed)
            .map_err(|e: FlpError| ShapeError::Circuit(e.to_string()))
    }

    /// A field integer of an aggregate as a real number: the signed representative over 2^f.
    pub fn decode(&self, v: F) -> f64 {
        let (v, q) = (u64::from(v), F::modulus());
        let signed = if v > q / 2 {
            -((q - v) as f64)
        } else {
            v as f64
        };
        signed / f64::from(self.frac_bits).exp2()
    }
}

/// Domain string of a verified upload's binder.
const BINDER_DOMAIN: &[u8] = b"flp.v1 verified upload";

/// What every derivation of one upload is bound to: the round, H(task) and the client, so that a
/// share or proof made for another round or another client fails to verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binder(Vec<u8>);

impl Binder {
    /// "flp.v1 verified upload" || round (u64) || H(task) || client id (u64), big-endian.
    pub fn new(tag: &RoundTag, client: u64) -> Self {
        let mut bytes = BINDER_DOMAIN.to_vec();
        bytes.extend_from_slice(&tag.round.to_be_bytes());
        bytes.extend_from_slice(&tag.digest.0);
        bytes.extend_from_slice(&client.to_be_bytes());
        Self(bytes)
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}
