//! Aggregation under secure aggregation: the server never holds an individual update, only the
//! unmasked sum of the survivors' clipped, quantised updates (decoded to floats). The next model
//! is w_t + sum / divisor:
//!
//! - no noise: divisor = the number of survivors (public to the server anyway);
//! - distributed noise: the clients' discrete Gaussian noise is already in the sum; the divisor
//!   is the expected number of participants;
//! - central noise: `CentralDp<SecureSum>` adds N(0, z^2 S_q^2) to the decoded sum, with
//!   S_q = S + sqrt(d)/gamma the decoded sum's sensitivity, and divides by the expected count.

use super::{
    RoundContext, RoundOutcome, RoundSum, Strategy, StrategyError, SumInput, SumStrategy, Upload,
    moved,
};

/// What the secure sum is divided by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Divisor {
    /// |U3|: no noise, so the count of survivors decides nothing private.
    Survivors,
    /// The expected number of participants (the sum carries distributed noise).
    Expected,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct SecureSum {
    divisor: Divisor,
    input: Option<SumInput>,
}

impl SecureSum {
    /// Divides the round's sum by `divisor`.
    pub(crate) fn new(divisor: Divisor) -> Self {
        Self {
            divisor,
            input: None,
        }
    }
}

impl Strategy for SecureSum {
    fn absorb(&mut self, _ctx: &RoundContext, upload: Upload) -> Result<(), StrategyError> {
        match upload {
            Upload::Sum(input) => {
                self.input = Some(input);
                Ok(())
            }
            Upload::Dense(_) | Upload::Sign(_) | Upload::Group(_) | Upload::Verified(_) => {
                Err(StrategyError::NeedsSum)
            }
        }
    }

    fn finish_round(&mut self, ctx: &RoundContext, global: &[f32]) -> RoundOutcome {
        let Some(mut input) = self.input.take() else {
            return RoundOutcome::default();
        };
        let divisor = match self.divisor {
            Divisor::Survivors => input.contributors.max(1) as f64,
            Divisor::Expected => ctx.expected_clients,
        };
        let scale = (1.0 / divisor) as f32;
        input.sum.iter_mut().for_each(|v| *v *= scale);
        RoundOutcome {
            model: Some(moved(global, &input.sum)),
            clip_bound: Some(input.clip_bound),
            noise_std: input.noise_std,
            rho: None,
            withheld: None,
        }
    }
}

impl SumStrategy for SecureSum {
    fn take_sum(&mut self) -> Option<RoundSum> {
        self.input.take().map(|input| RoundSum {
            values: input.sum,
            sensitivity: Some(input.sensitivity),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::round::strategy::testing::{ctx, update};

    fn input(sum: Vec<f32>, contributors: usize) -> SumInput {
        SumInput {
            sum,
            contributors,
            clip_bound: 1.0,
            sensitivity: 1.001,
            noise_std: None,
        }
    }

    #[test]
    fn without_noise_it_averages_over_the_survivors_and_refuses_single_updates() {
        let mut s = SecureSum::new(Divisor::Survivors);
        let c = ctx(1, 10.0, None);
        let single = update(1, 1, vec![0.0; 2]).into();
        assert!(matches!(s.absorb(&c, single), Err(StrategyError::NeedsSum)));
        s.absorb(&c, Upload::Sum(input(vec![4.0, -2.0], 4)))
            .unwrap();
        let out = s.finish_round(&c, &[1.0, 1.0]);
        assert_eq!(out.model.unwrap(), vec![2.0, 0.5]);
        assert_eq!(out.noise_std, None);
        // A round without a sum leaves the model alone.
        assert_eq!(s.finish_round(&ctx(2, 10.0, None), &[1.0]).model, None);
    }

    #[test]
    fn with_distributed_noise_it_divides_by_the_expected_count() {
        let mut s = SecureSum::new(Divisor::Expected);
        let c = ctx(1, 8.0, Some(1.0));
        let noised = SumInput {
            noise_std: Some(0.5),
            ..input(vec![4.0, -2.0], 3)
        };
        s.absorb(&c, Upload::Sum(noised)).unwrap();
        let out = s.finish_round(&c, &[1.0, 1.0]);
        assert_eq!(out.model.unwrap(), vec![1.5, 0.75]);
        assert_eq!(out.noise_std, Some(0.5));
    }
}
