//! Aggregation under secure aggregation: the server never holds an individual update, only the
//! unmasked sum of the survivors' clipped, quantised updates (decoded to floats). The next model
//! is w_t + (sum + noise) / divisor:
//!
//! - no noise: divisor = the number of survivors (public to the server anyway);
//! - central noise: N(0, z^2 S_q^2) is added to the decoded sum, with S_q = S + sqrt(d)/gamma the
//!   decoded sum's sensitivity (clipping plus at most one level of rounding per coordinate), and
//!   the divisor is the expected number of participants, as in DP-FedAvg;
//! - distributed noise: the clients' discrete Gaussian noise is already in the sum; the divisor
//!   is the expected number of participants.

use super::{ClientUpdate, RoundOutcome, RoundPlan, Strategy, StrategyError, SumInput};
use fl_common::model::{LocalConfig, apply_update};
use fl_common::privacy::add_gaussian_noise;
use rand::rngs::StdRng;

/// Where the noise comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SumNoise {
    /// None: the sum is hidden per client but not differentially private.
    None,
    /// Added here to the decoded sum.
    Central,
    /// Added by each client before masking.
    Distributed,
}

/// See the module documentation.
pub struct SecureSum {
    local: LocalConfig,
    noise: SumNoise,
    rng: StdRng,
    plan: RoundPlan,
    input: Option<SumInput>,
}

impl SecureSum {
    /// `rng` (for central noise) must be a CSPRNG seeded from the OS in production.
    pub fn new(local: LocalConfig, noise: SumNoise, rng: StdRng) -> Self {
        Self {
            local,
            noise,
            rng,
            plan: RoundPlan {
                expected_clients: 1.0,
                noise_multiplier: None,
                total_examples: 0,
            },
            input: None,
        }
    }
}

impl Strategy for SecureSum {
    fn configure_round(&mut self, _round: u64, plan: &RoundPlan) -> LocalConfig {
        self.plan = *plan;
        self.input = None;
        self.local
    }

    fn absorb(&mut self, _round: u64, _update: ClientUpdate) -> Result<(), StrategyError> {
        Err(StrategyError::NeedsSum)
    }

    fn absorb_sum(&mut self, _round: u64, input: SumInput) -> Result<(), StrategyError> {
        self.input = Some(input);
        Ok(())
    }

    fn finish_round(&mut self, _round: u64, global: &[f32]) -> RoundOutcome {
        let Some(SumInput {
            mut sum,
            contributors,
            clip_bound,
            sensitivity,
            noise_std,
        }) = self.input.take()
        else {
            return RoundOutcome::default();
        };
        let z = self.plan.noise_multiplier.unwrap_or(0.0);
        let (divisor, noise_std) = match self.noise {
            SumNoise::None => (contributors.max(1) as f64, None),
            SumNoise::Central => {
                // Gaussian mechanism on the decoded sum: N(0, z^2 S_q^2) per coordinate.
                let std = z * sensitivity;
                add_gaussian_noise(&mut sum, std, &mut self.rng);
                (self.plan.expected_clients, Some(std))
            }
            SumNoise::Distributed => (self.plan.expected_clients, noise_std),
        };
        let scale = (1.0 / divisor) as f32;
        sum.iter_mut().for_each(|v| *v *= scale);
        let mut model = global.to_vec();
        apply_update(&mut model, &sum);
        RoundOutcome {
            model: Some(model),
            clip_bound: Some(clip_bound),
            noise_std,
            rho: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    const LOCAL: LocalConfig = LocalConfig {
        epochs: 1,
        batch_size: 1,
        learning_rate: 0.1,
    };

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
        let mut s = SecureSum::new(LOCAL, SumNoise::None, StdRng::seed_from_u64(1));
        let plan = RoundPlan {
            expected_clients: 10.0,
            noise_multiplier: None,
            total_examples: 0,
        };
        s.configure_round(1, &plan);
        let single = ClientUpdate {
            client: 1,
            num_examples: 1,
            values: vec![0.0; 2],
        };
        assert!(matches!(s.absorb(1, single), Err(StrategyError::NeedsSum)));
        s.absorb_sum(1, input(vec![4.0, -2.0], 4)).unwrap();
        let out = s.finish_round(1, &[1.0, 1.0]);
        assert_eq!(out.model.unwrap(), vec![2.0, 0.5]);
        assert_eq!(out.noise_std, None);
        // A round without a sum leaves the model alone.
        s.configure_round(2, &plan);
        assert_eq!(s.finish_round(2, &[1.0]).model, None);
    }

    #[test]
    fn central_noise_uses_the_quantised_sensitivity_and_the_expected_count() {
        let mut s = SecureSum::new(LOCAL, SumNoise::Central, StdRng::seed_from_u64(2));
        s.configure_round(
            1,
            &RoundPlan {
                expected_clients: 5.0,
                noise_multiplier: Some(2.0),
                total_examples: 0,
            },
        );
        s.absorb_sum(1, input(vec![0.0; 1000], 3)).unwrap();
        let out = s.finish_round(1, &vec![0.0; 1000]);
        assert_eq!(out.noise_std, Some(2.0 * 1.001));
        let model = out.model.unwrap();
        // Each coordinate is N(0, (2.002/5)^2); the sample std is within 10% for 1000 draws
        // (its relative standard error is 1/sqrt(2000) = 2.2%).
        let std = (model.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / 1000.0).sqrt();
        assert!((std / (2.002 / 5.0) - 1.0).abs() < 0.1, "{std}");
    }
}
