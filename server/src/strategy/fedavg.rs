//! Federated averaging (McMahan et al. 2017).

use super::{ClientUpdate, RoundOutcome, RoundPlan, Strategy, StrategyError};
use fl_common::model::{LocalConfig, WeightedMean, apply_update};

/// FedAvg: w_{t+1} = w_t + sum_k n_k u_k / sum_k n_k.
#[derive(Debug)]
pub struct FedAvg {
    local: LocalConfig,
    sum: WeightedMean,
}

impl FedAvg {
    /// FedAvg over models of `num_params` parameters, sending `local` to clients each round.
    pub fn new(num_params: usize, local: LocalConfig) -> Self {
        Self {
            local,
            sum: WeightedMean::new(num_params),
        }
    }
}

impl Strategy for FedAvg {
    fn configure_round(&mut self, _round: u64, _plan: &RoundPlan) -> LocalConfig {
        self.local
    }

    fn absorb(&mut self, _round: u64, update: ClientUpdate) -> Result<(), StrategyError> {
        Ok(self.sum.add(&update.values, update.num_examples)?)
    }

    fn finish_round(&mut self, _round: u64, global: &[f32]) -> RoundOutcome {
        let fresh = WeightedMean::new(global.len());
        let model = std::mem::replace(&mut self.sum, fresh).mean().map(|mean| {
            let mut next = global.to_vec();
            apply_update(&mut next, &mean);
            next
        });
        RoundOutcome {
            model,
            ..RoundOutcome::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fedavg_moves_the_model_by_the_weighted_mean_and_resets() {
        let local = LocalConfig {
            epochs: 1,
            batch_size: 1,
            learning_rate: 0.1,
        };
        let plan = RoundPlan {
            expected_clients: 3.0,
            noise_multiplier: None,
            total_examples: 0,
        };
        let mut s = FedAvg::new(2, local);
        assert_eq!(s.configure_round(1, &plan), local);
        let update = |client, n, values: Vec<f32>| ClientUpdate {
            client,
            num_examples: n,
            values,
        };
        s.absorb(1, update(0, 3, vec![1.0, 1.0])).unwrap();
        s.absorb(1, update(1, 1, vec![-3.0, 5.0])).unwrap();
        assert!(s.absorb(1, update(2, 1, vec![f32::NAN, 0.0])).is_err());
        assert_eq!(s.finish_round(1, &[10.0, 0.0]).model, Some(vec![10.0, 2.0]));
        assert_eq!(s.finish_round(2, &[10.0, 0.0]).model, None);
    }
}
