//! Aggregation of client updates: validation of an uploaded update and the weighted mean of
//! FedAvg (McMahan et al. 2017): w_{t+1} = w_t + sum_k n_k u_k / sum_k n_k, with u_k = w_k - w_t.

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

/// Checks that `update` has `expected_len` finite values.
pub fn check_update(update: &[f32], expected_len: usize) -> Result<(), UpdateError> {
    if update.len() != expected_len {
        return Err(UpdateError::WrongLength {
            expected: expected_len,
            got: update.len(),
        });
    }
    if let Some(index) = update.iter().position(|v| !v.is_finite()) {
        return Err(UpdateError::NonFinite {
            index,
            value: update[index].to_string(),
        });
    }
    Ok(())
}

/// Running weighted sum of updates, absorbed one at a time so that a round never holds more than
/// one update beyond the sum.
#[derive(Debug, Clone)]
pub struct WeightedMean {
    sum: Vec<f32>,
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

    /// Adds n_k u_k; the update is validated first and nothing is added when it is refused.
    pub fn add(&mut self, update: &[f32], weight: u64) -> Result<(), UpdateError> {
        check_update(update, self.sum.len())?;
        if weight == 0 {
            return Err(UpdateError::ZeroWeight);
        }
        let w = weight as f32;
        for (s, u) in self.sum.iter_mut().zip(update) {
            *s += w * u;
        }
        self.total_weight += weight as f64;
        self.count += 1;
        Ok(())
    }

    /// Number of updates absorbed.
    pub fn count(&self) -> usize {
        self.count
    }

    /// sum_k n_k u_k / sum_k n_k, or `None` when nothing was absorbed.
    pub fn mean(&self) -> Option<Vec<f32>> {
        if self.count == 0 {
            return None;
        }
        let inv = (1.0 / self.total_weight) as f32;
        Some(self.sum.iter().map(|s| s * inv).collect())
    }
}

/// Adds `delta` to `params` in place: w_{t+1} = w_t + delta.
pub fn apply_update(params: &mut [f32], delta: &[f32]) {
    for (p, d) in params.iter_mut().zip(delta) {
        *p += d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_mean_weights_by_examples() {
        let mut m = WeightedMean::new(2);
        assert_eq!(m.mean(), None);
        m.add(&[1.0, 0.0], 1).unwrap();
        m.add(&[4.0, 3.0], 2).unwrap();
        assert_eq!(m.count(), 2);
        assert_eq!(m.mean().unwrap(), vec![3.0, 2.0]);
    }

    #[test]
    fn refuses_bad_updates_without_changing_the_sum() {
        let mut m = WeightedMean::new(3);
        m.add(&[1.0, 1.0, 1.0], 1).unwrap();
        assert!(matches!(
            m.add(&[1.0, 2.0], 1),
            Err(UpdateError::WrongLength {
                expected: 3,
                got: 2
            })
        ));
        assert!(matches!(
            m.add(&[1.0, f32::NAN, 0.0], 1),
            Err(UpdateError::NonFinite { index: 1, .. })
        ));
        assert!(matches!(
            m.add(&[f32::INFINITY, 0.0, 0.0], 1),
            Err(UpdateError::NonFinite { index: 0, .. })
        ));
        assert_eq!(m.add(&[0.0; 3], 0), Err(UpdateError::ZeroWeight));
        assert_eq!(m.mean().unwrap(), vec![1.0, 1.0, 1.0]);
    }
}
