//! PINE's validity circuit (Rothblum, Omri, Chen, Talwar 2023; draft-chen-cfrg-vdaf-pine, "Summary
//! of PINE Protocols") as a fully linear proof of `prio`'s FLP system: that a secret-shared
//! vector X of d field integers has squared L2 norm at most B, without a range proof per
//! coordinate.
//!
//! The input is `X | bits of V0 | bits of U0 | (bits of V1_k, g_k) for k < r | S_k for k < r`:
//! - the sum check: V0 = sum_i X_i^2 (one `Mul` per coordinate, in a `ParallelSum`) and
//!   V0 + U0 = B, both in b0 bits, so V0 is in [0, B];
//! - the wraparound check, which catches an X whose squares wrap around the modulus: for r
//!   public random Z_k in {-1, 0, 1}^d (each value -1 or 1 with probability 1/4, expanded from the
//!   upload's public Z seed by ChaCha20 with nonce k), Y_k = <Z_k, X> + a = V1_k + S_k with V1_k in b1 bits
//!   (a = 2^(b1 - 1) - 1, so V1_k is in [0, 2a + 1]), g_k S_k = 0 (a repetition the client says
//!   it passed has S_k = 0), and exactly `pass` of the g_k are 1;
//! - every bit a bit: x (x - 1) = 0, combined at random powers of the joint randomness.
//!
//! Written by hand on `prio`'s public `Flp` and gadgets: the crate's own L2 type (bit-encoding
//! every coordinate) was removed from its current release, and no maintained crate ships PINE.

use chacha20::ChaCha20;
use chacha20::cipher::{KeyIvInit, StreamCipher};
use prio::field::{Field64, FieldElement, FieldElementWithInteger};
use prio::flp::gadgets::{Mul, ParallelSum, ParallelSumGadget};
use prio::flp::{Flp, FlpError, Gadget};

/// The field of the proofs: 64 bits, so a coordinate costs 8 bytes.
pub type F = Field64;

/// Field values as 8 little-endian bytes each, as they travel and are hashed.
pub fn field_bytes(values: &[F]) -> Vec<u8> {
    values.iter().flat_map(|&v| <[u8; 8]>::from(v)).collect()
}

/// Field values from 8 little-endian bytes each: `None` for a ragged length or a value not
/// below the modulus.
pub fn field_values(bytes: &[u8]) -> Option<Vec<F>> {
    if !bytes.len().is_multiple_of(8) {
        return None;
    }
    bytes.chunks_exact(8).map(|c| F::try_from(c).ok()).collect()
}

/// The shape of one norm-bounded vector and its proof: d, B, and the wraparound check's
/// repetitions, with the seed of one upload's public random Z.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NormCircuit {
    /// d.
    pub(super) dim: usize,
    /// B: the squared norm bound, in field integers.
    pub(super) bound: u64,
    /// b0: bits of V0 and U0.
    pub(super) b0: usize,
    /// a = alpha' sqrt(B): a repetition passes when -a <= <Z_k, X> <= a + 1.
    pub(super) slack: u64,
    /// b1: bits of V1_k (2a + 2 = 2^b1).
    pub(super) b1: usize,
    /// r.
    pub(super) reps: usize,
    /// The repetitions a client must pass, exactly as many g_k = 1.
    pub(super) pass: usize,
    /// The seed Z_k is expanded from, for every k < r.
    pub(super) z_seed: [u8; 32],
    /// Multiplications per call of the square and the bit gadgets.
    chunk: usize,
}

impl NormCircuit {
    /// The circuit for vectors of `dim` field integers of squared norm at most `bound`, with `reps`
    /// wraparound repetitions of slack `slack` (rounded down to 2^(b1 - 1) - 1), `pass` of which
    /// must pass, and the seed of the upload's public Z.
    pub fn new(
        dim: usize,
        bound: u64,
        (reps, pass, slack): (usize, usize, u64),
        z_seed: [u8; 32],
    ) -> Result<Self, FlpError> {
        let bad = |m: &str| Err(FlpError::InvalidParameter(m.into()));
        if dim == 0 || bound == 0 || reps == 0 || pass > reps || slack < 1 {
            return bad("PINE needs d, B, r, a >= 1 and pass <= r");
        }
        // 2a + 2 = 2^b1 with the largest a' <= a (draft, Remark 4.12 of the paper).
        let b1 = (u64::BITS - (2 * slack + 2).leading_zeros() - 1) as usize;
        let slack = (1u64 << (b1 - 1)) - 1;
        let b0 = (u64::BITS - bound.leading_zeros()) as usize;
        // Field size: at least 3B + 2 (sum check) and the wraparound's bound (draft); d sqrt(B)
        // below q / 2 so that honest sums decode.
        let q = F::modulus() as u128;
        if 81 * u128::from(bound) * 8 >= q || 3 * u128::from(bound) + 2 >= q {
            return bad("B is too large for the 64-bit field");
        }
        let chunk = (dim as f64).sqrt().ceil().max(1.0) as usize;
        Ok(Self {
            dim,
            bound,
            b0,
            slack,
            b1,
            reps,
            pass,
            z_seed,
            chunk,
        })
    }

    /// Bits in the input: V0, U0, and V1_k with g_k for each repetition.
    pub(super) fn bit_len(&self) -> usize {
        2 * self.b0 + self.reps * (self.b1 + 1)
    }

    /// Calls of the bit gadget and of the square gadget.
    fn calls(&self) -> (usize, usize) {
        (
            self.bit_len().div_ceil(self.chunk),
            self.dim.div_ceil(self.chunk),
        )
    }

    /// Where V1_k's bits start; g_k follows them.
    pub(super) fn v1_at(&self, k: usize) -> usize {
        self.dim + 2 * self.b0 + k * (self.b1 + 1)
    }
}

/// sum_i 2^i bits_i.
fn recompose(bits: &[F]) -> F {
    bits.iter().rev().fold(F::zero(), |acc, &b| acc + acc + b)
}

/// `c / num_shares`: a constant of the circuit, split among the shares.
fn shared(c: u64, num_shares: usize) -> Result<F, FlpError> {
    let n = u64::try_from(num_shares).map_err(|_| FlpError::Valid("too many shares".into()))?;
    Ok(F::from(c) * F::from(n).inv())
}

impl NormCircuit {
    /// RC_0: sum_j r_c^(j+1) x_j (x_j - 1) over the bits, one joint random r_c per call.
    fn bits_check(
        &self,
        gadget: &mut Box<dyn Gadget<F>>,
        bits: &[F],
        joint_rand: &[F],
        num_shares: usize,
    ) -> Result<F, FlpError> {
        let one = shared(1, num_shares)?;
        let mut out = F::zero();
        let mut args = vec![F::zero(); 2 * self.chunk];
        for (chunk, &r) in bits.chunks(self.chunk).zip(joint_rand) {
            args.fill(F::zero());
            let mut power = r;
            for (pair, &x) in args.chunks_mut(2).zip(chunk) {
                pair[0] = power * x;
                pair[1] = x - one;
                power *= r;
            }
            out += gadget.eval(&args)?;
        }
        Ok(out)
    }

    /// sum_i X_i^2, `chunk` squares per call.
    fn squares(&self, gadget: &mut Box<dyn Gadget<F>>, x: &[F]) -> Result<F, FlpError> {
        let mut out = F::zero();
        let mut args = vec![F::zero(); 2 * self.chunk];
        for chunk in x.chunks(self.chunk) {
            args.fill(F::zero());
            for (pair, &v) in args.chunks_mut(2).zip(chunk) {
                pair[0] = v;
                pair[1] = v;
            }
            out += gadget.eval(&args)?;
        }
        Ok(out)
    }

    /// For each k < r, <Z_k, v> over the integers. Z_k is the keystream of ChaCha20 under the Z
    /// seed with nonce k, two bits per value, 0 read as -1, 3 as 1, 1 and 2 as 0; each value is
    /// added or subtracted under a mask, without a branch or a field operation: r d of these are
    /// most of a proof's and a query's time.
    pub(super) fn projections<T: Copy + Into<i128>>(&self, values: &[T]) -> Vec<i128> {
        let mut bytes = vec![0u8; self.dim.div_ceil(4)];
        (0..self.reps)
            .map(|k| {
                let mut nonce = [0u8; 12];
                nonce[..8].copy_from_slice(&(k as u64).to_le_bytes());
                bytes.fill(0);
                ChaCha20::new(&self.z_seed.into(), &nonce.into()).write_keystream(&mut bytes);
                let mut acc = 0i128;
                for (four, &b) in values.chunks(4).zip(&bytes) {
                    for (i, &v) in four.iter().enumerate() {
                        let code = (b >> (2 * i)) & 3;
                        let v: i128 = v.into();
                        acc += (v & -i128::from(code == 3)) - (v & -i128::from(code == 0));
                    }
                }
                acc
            })
            .collect()
    }
}

/// An integer as a field element (reduced modulo q).
pub(super) fn reduce(v: i128) -> F {
    F::from(v.rem_euclid(i128::from(F::modulus())) as u64)
}

impl Flp for NormCircuit {
    type Field = F;

    fn gadget(&self) -> Vec<Box<dyn Gadget<F>>> {
        let (bit_calls, square_calls) = self.calls();
        vec![
            Box::new(ParallelSum::new(Mul::new(bit_calls), self.chunk)),
            Box::new(ParallelSum::new(Mul::new(square_calls), self.chunk)),
            Box::new(Mul::new(self.reps)),
        ]
    }

    fn num_gadgets(&self) -> usize {
        3
    }

    /// [RC_0, SC_0, SC_1, WC_0 for each k, WC_1, WC_2], each zero for a valid input.
    fn valid(
        &self,
        gadgets: &mut Vec<Box<dyn Gadget<F>>>,
        input: &[F],
        joint_rand: &[F],
        num_shares: usize,
    ) -> Result<Vec<F>, FlpError> {
        self.valid_call_check(input, joint_rand)?;
        let (x, rest) = input.split_at(self.dim);
        let (bits, s) = rest.split_at(self.bit_len());
        let (bit_rand, mul_rand) = joint_rand.split_at(self.calls().0);
        let mut out = Vec::with_capacity(self.eval_output_len());
        out.push(self.bits_check(&mut gadgets[0], bits, bit_rand, num_shares)?);
        let v0 = recompose(&bits[..self.b0]);
        let u0 = recompose(&bits[self.b0..2 * self.b0]);
        out.push(self.squares(&mut gadgets[1], x)? - v0);
        out.push(v0 + u0 - shared(self.bound, num_shares)?);
        let a = shared(self.slack, num_shares)?;
        let residues: Vec<u64> = x.iter().map(|&v| u64::from(v)).collect();
        let projections = self.projections(&residues);
        let mut flags = Vec::with_capacity(self.reps);
        for (k, (&s_k, &y)) in s.iter().zip(&projections).enumerate() {
            let at = self.v1_at(k) - self.dim;
            let v1 = recompose(&bits[at..at + self.b1]);
            flags.push(bits[at + self.b1]);
            out.push(reduce(y) + a - v1 - s_k);
        }
        let (r, mut power, mut products) = (mul_rand[0], mul_rand[0], F::zero());
        for (&g, &s) in flags.iter().zip(s) {
            products += gadgets[2].eval(&[power * g, s])?;
            power *= r;
        }
        out.push(products);
        let passed = flags.iter().fold(F::zero(), |acc, &g| acc + g);
        out.push(passed - shared(self.pass as u64, num_shares)?);
        Ok(out)
    }

    fn input_len(&self) -> usize {
        self.dim + self.bit_len() + self.reps
    }

    /// For each gadget: its arity, degree 2 times (calls + 1 rounded up to a power of two,
    /// minus 1), and 1 (prio's `Flp::prove`).
    fn proof_len(&self) -> usize {
        let (bit_calls, square_calls) = self.calls();
        let one =
            |arity: usize, calls: usize| arity + 2 * ((1 + calls).next_power_of_two() - 1) + 1;
        one(2 * self.chunk, bit_calls) + one(2 * self.chunk, square_calls) + one(2, self.reps)
    }

    /// The circuit's output, then for each gadget its arity and 1.
    fn verifier_len(&self) -> usize {
        1 + (2 * self.chunk + 1) * 2 + 3
    }

    fn joint_rand_len(&self) -> usize {
        self.calls().0 + 1
    }

    fn eval_output_len(&self) -> usize {
        self.reps + 5
    }

    fn prove_rand_len(&self) -> usize {
        4 * self.chunk + 2
    }
}
