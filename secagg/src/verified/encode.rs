//! The client's side of PINE: its update as fixed-point field integers X with ||X||^2 <= B, and
//! the results the circuit checks (the bits of V0 and U0, and for each wraparound repetition the
//! bits of V1_k, its flag g_k and S_k; draft-chen-cfrg-vdaf-pine, "Wraparound Protocol").

use super::circuit::{F, NormCircuit};

/// Why an update cannot be encoded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EncodeError {
    /// The vector has another length than the circuit's d.
    #[error("the update has {got} values, the circuit {want}")]
    Length {
        /// Values given.
        got: usize,
        /// d.
        want: usize,
    },
    /// ||X||^2 above B.
    #[error("the update's squared norm {0} is above the bound")]
    Norm(u128),
    /// Fewer repetitions passed than the circuit needs (probability below the completeness
    /// error for an honest update).
    #[error("only {passed} of the wraparound repetitions passed, {needed} are needed")]
    Wraparound {
        /// Repetitions passed.
        passed: usize,
        /// Repetitions needed.
        needed: usize,
    },
}

/// `update` clipped to L2 norm `bound`, at `frac_bits` fractional bits, each value rounded toward
/// zero, so that the integers' norm is at most floor(bound 2^f): returns them and B, the square
/// of that bound.
pub fn fixed_point(update: &[f32], bound: f64, frac_bits: u32) -> (Vec<i64>, u64) {
    let scale = f64::from(1u32 << frac_bits);
    let root = (bound * scale).floor();
    let norm = update
        .iter()
        .map(|&v| f64::from(v).powi(2))
        .sum::<f64>()
        .sqrt();
    // u / max(1, ||u|| / C), then x 2^f; |X_i| <= |x_i| 2^f keeps ||X|| <= root up to the
    // float rounding of the factor, which 1 - 2e-12 absorbs.
    let clip = if norm * scale > root {
        root / (norm * scale)
    } else {
        1.0
    };
    let factor = clip * (1.0 - 2e-12);
    let x = update
        .iter()
        .map(|&v| (f64::from(v) * scale * factor).trunc() as i64);
    (x.collect(), (root as u64).pow(2))
}

/// `v` as a field element (negative values as q - |v|).
fn field(v: i128) -> F {
    let magnitude = F::from(v.unsigned_abs() as u64);
    if v < 0 { -magnitude } else { magnitude }
}

/// `x` as field integers.
pub(super) fn to_field(x: &[i64]) -> Vec<F> {
    x.iter().map(|&v| field(i128::from(v))).collect()
}

/// The low `bits` bits of `v`, least significant first.
fn bits_of(v: u128, bits: usize, out: &mut Vec<F>) {
    out.extend((0..bits).map(|i| F::from(((v >> i) & 1) as u64)));
}

impl NormCircuit {
    /// The circuit's input for `x` (the first `pass` repetitions that pass are flagged, the
    /// others given as failed).
    pub fn encode(&self, x: &[i64]) -> Result<Vec<F>, EncodeError> {
        if x.len() != self.dim {
            let (got, want) = (x.len(), self.dim);
            return Err(EncodeError::Length { got, want });
        }
        let v0: u128 = x
            .iter()
            .map(|&v| (i128::from(v) * i128::from(v)) as u128)
            .sum();
        if v0 > u128::from(self.bound) {
            return Err(EncodeError::Norm(v0));
        }
        let mut input = to_field(x);
        bits_of(v0, self.b0, &mut input);
        bits_of(u128::from(self.bound) - v0, self.b0, &mut input);
        let a = i128::from(self.slack);
        let top = 2 * a + 1;
        let (mut passed, mut s) = (0, Vec::with_capacity(self.reps));
        for k in 0..self.reps {
            let z = self.z_row(k);
            // Y_k = <Z_k, X>, exact in integers (|Y_k| <= d sqrt(B)).
            let y: i128 = z
                .iter()
                .zip(x)
                .map(|(&z, &v)| i128::from(z) * i128::from(v))
                .sum();
            let flagged = (-a..=a + 1).contains(&y) && passed < self.pass;
            let v1 = if flagged { y + a } else { top };
            bits_of(v1 as u128, self.b1, &mut input);
            input.push(F::from(u64::from(flagged)));
            passed += usize::from(flagged);
            s.push(field(y + a - v1));
        }
        if passed < self.pass {
            let needed = self.pass;
            return Err(EncodeError::Wraparound { passed, needed });
        }
        input.extend(s);
        Ok(input)
    }
}
