//! Aggregation of client updates: validation of an uploaded update and the weighted mean of
//! FedAvg (McMahan et al. 2017): w_{t+1} = w_t + sum_k n_k u_k / sum_k n_k, with u_k = w_k - w_t.

use super::CheckedUpdate;
use multiversion::multiversion;

/// Why an update is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UpdateError {
    /// The update does not have one value per model parameter.
    #[error("update has {got} values, the model has {expected} parameters")]
    WrongLength {
        /// Parameters of the model.
        expected: usize,
        /// Values sent.
        got: usize,
    },
    /// The update contains NaN or an infinity.
    #[error("update value {index} is {value} (NaN and infinities are refused)")]
    NonFinite {
        /// Position of the first offending value.
        index: usize,
        /// The value, as text.
        value: String,
    },
    /// The update's weight (example count) is zero.
    #[error("update claims zero training examples")]
    ZeroWeight,
}

/// Values [`all_finite`] tests before it may stop: a search that may stop at every value
/// (`Iterator::all`, `position`) does not vectorise; a block tested whole does.
const FINITE_BLOCK: usize = 64;

/// Whether no value is NaN or infinite. Every client tests its result before it uploads (the
/// server checks an upload in the pass that measures it, [`super::CheckedUpdate`]), so this
/// runs at the memory's rate rather than a value at a time (compiled per SIMD level, see
/// `add_weighted`).
#[multiversion(targets = "simd")]
pub fn all_finite(values: &[f32]) -> bool {
    values
        .chunks(FINITE_BLOCK)
        .all(|block| block.iter().fold(true, |finite, v| finite & v.is_finite()))
}

/// Checks that `update` has `expected_len` values.
pub(crate) fn check_len(update: &[f32], expected_len: usize) -> Result<(), UpdateError> {
    if update.len() == expected_len {
        return Ok(());
    }
    Err(UpdateError::WrongLength {
        expected: expected_len,
        got: update.len(),
    })
}

/// The error naming the first NaN or infinity of `update`, if it holds one.
pub(crate) fn first_non_finite(update: &[f32]) -> Option<UpdateError> {
    let index = update.iter().position(|v| !v.is_finite())?;
    Some(UpdateError::NonFinite {
        index,
        value: update[index].to_string(),
    })
}

/// Running weighted sum of updates, absorbed one at a time so that a round never holds more than
/// one update beyond the sum. The sum is kept in f64: finite f32 updates (|u| < 3.4e38) times
/// weights below 2^64 stay far inside f64's range, so no admitted update overflows it.
#[derive(Debug, Clone)]
pub struct WeightedMean {
    sum: Vec<f64>,
    total_weight: f64,
    count: usize,
}

impl WeightedMean {
    /// An empty sum over vectors of `len` values.
    pub fn new(len: usize) -> Self {
        Self {
            sum: vec![0.0; len],
            total_weight: 0.0,
            count: 0,
        }
    }

    /// Adds n_k u_k; nothing is added when the update's length or weight is refused.
    pub fn add(&mut self, update: &CheckedUpdate, weight: u64) -> Result<(), UpdateError> {
        self.add_discounted(update, weight, 1.0)
    }

    /// Adds n_k a_k u_k, with n_k counted in the total weight the mean divides by: a_k in
    /// (0, 1] discounts a stale update (FedBuff, Nguyen et al. 2022, Alg. 1: the buffer sums
    /// a(s) u_k and the step divides by the count, not by the discounts).
    pub fn add_discounted(
        &mut self,
        update: &CheckedUpdate,
        weight: u64,
        discount: f64,
    ) -> Result<(), UpdateError> {
        update.check_len(self.sum.len())?;
        if weight == 0 {
            return Err(UpdateError::ZeroWeight);
        }
        add_weighted(&mut self.sum, weight as f64 * discount, update);
        self.total_weight += weight as f64;
        self.count += 1;
        Ok(())
    }

    /// Adds a partial sum sum_k n_k u_k of `count` updates whose weights n_k sum to `weight`
    /// (another process's share of the round, e.g. an aggregator's group); nothing is added when
    /// its length or weight is refused.
    pub fn add_sum(
        &mut self,
        sum: &CheckedUpdate,
        weight: f64,
        count: usize,
    ) -> Result<(), UpdateError> {
        sum.check_len(self.sum.len())?;
        if count == 0 || !(weight.is_finite() && weight > 0.0) {
            return Err(UpdateError::ZeroWeight);
        }
        add_weighted(&mut self.sum, 1.0, sum);
        self.total_weight += weight;
        self.count += count;
        Ok(())
    }

    /// sum_k n_k, the weights of the updates absorbed.
    pub fn total_weight(&self) -> f64 {
        self.total_weight
    }

    /// Number of updates absorbed.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Length of the vectors summed.
    pub fn len(&self) -> usize {
        self.sum.len()
    }

    /// Whether the vectors summed are empty (a model without parameters).
    pub fn is_empty(&self) -> bool {
        self.sum.is_empty()
    }

    /// sum_k n_k u_k, or `None` when nothing was absorbed.
    pub fn sum(&self) -> Option<Vec<f32>> {
        (self.count > 0).then(|| self.sum.iter().map(|&s| s as f32).collect())
    }

    /// sum_k n_k u_k / sum_k n_k, or `None` when nothing was absorbed. A mean beyond f32's range
    /// comes out infinite; [`check_model`] stops it before it is applied.
    pub fn mean(&self) -> Option<Vec<f32>> {
        if self.count == 0 {
            return None;
        }
        Some(
            self.sum
                .iter()
                .map(|s| (s / self.total_weight) as f32)
                .collect(),
        )
    }
}

/// sum <- sum + w u, elementwise in f64.
///
/// Why multiversioned: the workspace compiles for baseline x86-64, whose SSE2 converts and adds
/// two f64 at a time, and the server runs this (for the mean and the moments, beside the norm and
/// the clip's scaling in [`crate::norms`]) over every upload. The `multiversion` crate
/// compiles it per x86-64 level and calls the widest the CPU has (as for the CNN's loops,
/// `crate::sequential::kernels`); each value's arithmetic is the same at every width.
#[multiversion(targets = "simd")]
pub fn add_weighted(sum: &mut [f64], w: f64, u: &[f32]) {
    for (s, u) in sum.iter_mut().zip(u) {
        *s += w * f64::from(*u);
    }
}

/// Why an aggregated model is not released.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ModelFault {
    /// A parameter is NaN or infinite.
    #[error("parameter {index} of the aggregate is {value}")]
    NonFinite {
        /// Position of the first offending parameter.
        index: usize,
        /// The value, as text.
        value: String,
    },
    /// A parameter's magnitude is beyond the configured bound.
    #[error("parameter {index} of the aggregate is {value:e}, beyond the bound {bound:e}")]
    Absurd {
        /// Position of the first offending parameter.
        index: usize,
        /// The value.
        value: f32,
        /// The bound on |w_j|.
        bound: f32,
    },
}

/// Checks that every parameter of `params` is finite and at most `max_abs` in magnitude.
pub fn check_model(params: &[f32], max_abs: f32) -> Result<(), ModelFault> {
    let Some(index) = params
        .iter()
        .position(|w| !w.is_finite() || w.abs() > max_abs)
    else {
        return Ok(());
    };
    let value = params[index];
    Err(if value.is_finite() {
        ModelFault::Absurd {
            index,
            value,
            bound: max_abs,
        }
    } else {
        ModelFault::NonFinite {
            index,
            value: value.to_string(),
        }
    })
}

/// Adds `delta` to `params` in place: w_{t+1} = w_t + delta.
pub fn apply_update(params: &mut [f32], delta: &[f32]) {
    for (p, d) in params.iter_mut().zip(delta) {
        *p += d;
    }
}

/// Turns a client's trained weights w_k into its update in place: u_k = w_k - w_t. Compiled per
/// SIMD level (see `add_weighted`): every client runs it once a round.
#[multiversion(targets = "simd")]
pub fn subtract_global(weights: &mut [f32], global: &[f32]) {
    for (w, g) in weights.iter_mut().zip(global) {
        *w -= g;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A partial sum counts as its updates: the mean over two sums is the mean over their
    /// updates; a sum of no weight or of another length is refused and changes nothing.
    #[test]
    fn partial_sums_add_up_to_the_mean_of_their_updates() {
        let mut mean = WeightedMean::new(2);
        let a = CheckedUpdate::new(vec![3.0, 6.0]).unwrap(); // 3 examples of (1, 2)
        let b = CheckedUpdate::new(vec![1.0, 0.0]).unwrap(); // 1 example of (1, 0)
        mean.add_sum(&a, 3.0, 2).unwrap();
        assert!(mean.add_sum(&b, 0.0, 1).is_err());
        assert!(
            mean.add_sum(&CheckedUpdate::new(vec![1.0]).unwrap(), 1.0, 1)
                .is_err()
        );
        mean.add_sum(&b, 1.0, 1).unwrap();
        assert_eq!((mean.count(), mean.total_weight()), (3, 4.0));
        assert_eq!(mean.mean(), Some(vec![1.0, 1.5]));
    }

    /// The update is w_k - w_t value by value, over lengths around the SIMD widths.
    #[test]
    fn an_update_is_the_trained_weights_less_the_global_model() {
        for len in [0, 1, 7, 16, 33, 100] {
            let global: Vec<f32> = (0..len).map(|i| i as f32 * 0.37 - 3.0).collect();
            let trained: Vec<f32> = (0..len).map(|i| (i * i) as f32 * 0.011 + 0.5).collect();
            let mut update = trained.clone();
            subtract_global(&mut update, &global);
            let expected: Vec<f32> = trained.iter().zip(&global).map(|(w, g)| w - g).collect();
            assert_eq!(update, expected, "length {len}");
        }
    }

    /// One NaN or infinity anywhere (first, last, at and around the block boundaries, in the
    /// tail) is found, in vectors of lengths around multiples of the block.
    #[test]
    fn all_finite_finds_any_non_finite_value() {
        for len in [0usize, 1, 63, 64, 65, 127, 128, 130, 1000] {
            let clean: Vec<f32> = (0..len).map(|i| i as f32 * 0.5 - 3.0).collect();
            assert!(all_finite(&clean), "length {len}");
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                for at in [0, 1, 62, 63, 64, 65, 127, 128, 129, len.saturating_sub(1)] {
                    if at >= len {
                        continue;
                    }
                    let mut v = clean.clone();
                    v[at] = bad;
                    assert!(!all_finite(&v), "{bad} at {at} of {len}");
                }
            }
        }
        assert!(all_finite(&[f32::MAX, f32::MIN, f32::MIN_POSITIVE, -0.0]));
    }

    fn checked(values: &[f32]) -> CheckedUpdate {
        CheckedUpdate::new(values.to_vec()).unwrap()
    }

    #[test]
    fn weighted_mean_weights_by_examples() {
        let mut m = WeightedMean::new(2);
        assert_eq!(m.mean(), None);
        m.add(&checked(&[1.0, 0.0]), 1).unwrap();
        m.add(&checked(&[4.0, 3.0]), 2).unwrap();
        assert_eq!(m.count(), 2);
        assert_eq!(m.mean().unwrap(), vec![3.0, 2.0]);
    }

    #[test]
    fn refuses_bad_updates_without_changing_the_sum() {
        let mut m = WeightedMean::new(3);
        m.add(&checked(&[1.0, 1.0, 1.0]), 1).unwrap();
        assert!(matches!(
            m.add(&checked(&[1.0, 2.0]), 1),
            Err(UpdateError::WrongLength {
                expected: 3,
                got: 2
            })
        ));
        assert_eq!(m.add(&checked(&[0.0; 3]), 0), Err(UpdateError::ZeroWeight));
        assert_eq!(m.mean().unwrap(), vec![1.0, 1.0, 1.0]);
    }

    #[test]
    fn the_largest_finite_updates_do_not_overflow_the_sum() {
        let mut m = WeightedMean::new(2);
        m.add(&checked(&[f32::MAX, -f32::MAX]), u64::MAX).unwrap();
        m.add(&checked(&[f32::MAX, 1.0]), u64::MAX).unwrap();
        m.add(&checked(&[1.0, 1.0]), 1).unwrap();
        let mean = m.mean().unwrap();
        // (2 MAX 2^64 + 1) / (2^65 + 1) and (-MAX 2^64 + 2^64 + 1) / (2^65 + 1).
        assert_eq!(mean[0], f32::MAX, "{mean:?}");
        assert!((mean[1] / (-f32::MAX / 2.0) - 1.0).abs() < 1e-6, "{mean:?}");
    }

    #[test]
    fn check_model_refuses_non_finite_and_absurd_parameters() {
        assert_eq!(check_model(&[0.0, -1e6, 1e6], 1e6), Ok(()));
        assert!(matches!(
            check_model(&[0.0, f32::NAN], 1e6),
            Err(ModelFault::NonFinite { index: 1, .. })
        ));
        assert!(matches!(
            check_model(&[f32::NEG_INFINITY], 1e6),
            Err(ModelFault::NonFinite { index: 0, .. })
        ));
        assert!(matches!(
            check_model(&[1.0, -2e6], 1e6),
            Err(ModelFault::Absurd { index: 1, .. })
        ));
    }
}
