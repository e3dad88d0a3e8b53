//! The client's side of PINE: its update as fixed-point field integers X with ||X||^2 <= B, and
//! the results the circuit checks (the bits of V0 and U0, and for each wraparound repetition the
//! bits of V1_k, its flag g_k and S_k; draft-chen-cfrg-vdaf-pine, "Wraparound Protocol").

use super::circuit::{F, NormCircuit, reduce};

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
        let v0 = self.squared_norm(x)?;
        if v0 > u128::from(self.bound) {
            return Err(EncodeError::Norm(v0));
        }
        self.encode_claiming(x, v0, false)
    }

    /// A compromised client's input for `x`, whatever its norm (simulations and tests of the
    /// defence): the sum check claims V0 = B, and the first `pass` repetitions are flagged
    /// whether they pass or not, S_k making each projection's equation hold. The proof of such
    /// an input fails for any `x` above the bound.
    pub fn encode_claiming_bound(&self, x: &[i64]) -> Result<Vec<F>, EncodeError> {
        self.squared_norm(x)?;
        self.encode_claiming(x, u128::from(self.bound), true)
    }

    /// ||x||^2, exact, for an `x` of the circuit's length.
    fn squared_norm(&self, x: &[i64]) -> Result<u128, EncodeError> {
        if x.len() != self.dim {
            let (got, want) = (x.len(), self.dim);
            return Err(EncodeError::Length { got, want });
        }
        Ok(x.iter()
            .map(|&v| (i128::from(v) * i128::from(v)) as u128)
            .sum())
    }

    /// The input with V0 = `v0` (U0 = B - V0), each repetition flagged when it passes or, with
    /// `force`, until `pass` are.
    fn encode_claiming(&self, x: &[i64], v0: u128, force: bool) -> Result<Vec<F>, EncodeError> {
        let mut input = to_field(x);
        bits_of(v0, self.b0, &mut input);
        bits_of(u128::from(self.bound) - v0, self.b0, &mut input);
        let a = i128::from(self.slack);
        let top = 2 * a + 1;
        let (mut passed, mut s) = (0, Vec::with_capacity(self.reps));
        // Y_k = <Z_k, X>, exact in integers (|Y_k| <= d sqrt(B) for an honest X).
        for y in self.projections(x) {
            let passes = (-a..=a + 1).contains(&y);
            let flagged = (passes || force) && passed < self.pass;
            let v1 = match (flagged, passes) {
                (true, true) => y + a,
                (true, false) => (y + a).rem_euclid(top + 1),
                (false, _) => top,
            };
            bits_of(v1 as u128, self.b1, &mut input);
            input.push(F::from(u64::from(flagged)));
            passed += usize::from(flagged);
            s.push(reduce(y + a - v1));
        }
        if passed < self.pass {
            let needed = self.pass;
            return Err(EncodeError::Wraparound { passed, needed });
        }
        input.extend(s);
        Ok(input)
    }
}
