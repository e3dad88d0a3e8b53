//! An upload checked once, where it enters the server: every value finite, its L2 norm measured
//! in the same pass. What the server then does with it (the paper's moments, the clip, the
//! weighted sum, a norm bound) takes the check and the norm from the type instead of reading the
//! update again: each of those reads is a pass over a model-sized vector, per client.

use super::aggregate::{UpdateError, check_len, first_non_finite};
use crate::norms::{scale_into_bound, squared_l2_norm};
use std::ops::Deref;

/// Values found finite, with their L2 norm. Read-only but through [`CheckedUpdate::clip_l2`],
/// which keeps the norm true.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedUpdate {
    values: Vec<f32>,
    /// ||values||_2^2, in f64.
    squared_norm: f64,
}

impl CheckedUpdate {
    /// Checks that every value is finite, measuring the norm as it does: the f64 sum of squares
    /// of f32 values (each square below 1.2e77) is finite exactly when every value is. Refused
    /// values name the first NaN or infinity.
    pub fn new(values: Vec<f32>) -> Result<Self, UpdateError> {
        let squared_norm = squared_l2_norm(&values);
        if !squared_norm.is_finite()
            && let Some(e) = first_non_finite(&values)
        {
            return Err(e);
        }
        Ok(Self {
            values,
            squared_norm,
        })
    }

    /// ||u||_2.
    pub fn norm(&self) -> f64 {
        self.squared_norm.sqrt()
    }

    /// ||u||_2^2, as summed (no square root taken and squared again).
    pub fn squared_norm(&self) -> f64 {
        self.squared_norm
    }

    /// Checks that there are `expected_len` values (the length each strategy knows).
    pub fn check_len(&self, expected_len: usize) -> Result<(), UpdateError> {
        check_len(&self.values, expected_len)
    }

    /// Clips to L2 norm at most `bound` (Geyer et al., Alg. 1): u <- u / max(1, ||u||_2 / S),
    /// from the norm measured at the check. Returns ||u||_2 before clipping.
    pub fn clip_l2(&mut self, bound: f64) -> f64 {
        let before = self.norm();
        let after = scale_into_bound(&mut self.values, bound, before);
        if after != before {
            self.squared_norm = after * after;
        }
        before
    }

    /// The values.
    pub fn into_values(self) -> Vec<f32> {
        self.values
    }
}

impl Deref for CheckedUpdate {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        &self.values
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::norms::{clip_l2, l2_norm};

    /// The check refuses every NaN and infinity, naming the first, and keeps the largest finite
    /// values, whose squares an f32 sum would overflow; its norm and its clip are those of
    /// `l2_norm` and `clip_l2`.
    #[test]
    fn the_check_refuses_non_finite_values_and_measures_the_rest() {
        let clean: Vec<f32> = (0..130).map(|i| (i as f32 - 60.0) * 0.25).collect();
        let mut huge = clean.clone();
        huge[..100].fill(f32::MAX);
        huge[100] = f32::MIN;
        for good in [clean.clone(), huge] {
            let mut checked = CheckedUpdate::new(good.clone()).unwrap();
            assert_eq!(checked.norm(), l2_norm(&good));
            let mut plain = good.clone();
            assert_eq!(checked.clip_l2(1.0), clip_l2(&mut plain, 1.0));
            assert_eq!(*checked, *plain);
            assert_eq!(checked.norm(), l2_norm(&plain));
            assert!(checked.norm() <= 1.0);
        }
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for at in [0, 7, 64, 129] {
                // Two of them: the first is named.
                let (mut u, next) = (clean.clone(), (at + 1) % clean.len());
                (u[at], u[next]) = (bad, bad);
                let e = CheckedUpdate::new(u).unwrap_err();
                let first = at.min(next);
                assert!(matches!(e, UpdateError::NonFinite { index, .. } if index == first));
            }
        }
        let checked = CheckedUpdate::new(clean.clone()).unwrap();
        assert!(checked.check_len(130).is_ok());
        assert_eq!(
            checked.check_len(131),
            Err(UpdateError::WrongLength {
                expected: 131,
                got: 130
            })
        );
    }

    /// A short update keeps its values and norm through the clip.
    #[test]
    fn a_short_update_is_not_clipped() {
        let mut u = CheckedUpdate::new(vec![0.3, 0.4]).unwrap();
        assert!((u.clip_l2(1.0) - 0.5).abs() < 1e-7);
        assert_eq!(u.into_values(), vec![0.3, 0.4]);
    }
}
