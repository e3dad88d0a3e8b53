//! The aggregation interface (after Flower's `Strategy`): configure a round, absorb one client's
//! result at a time, finish the round. FedAvg implements it; privacy mechanisms are meant to wrap
//! it as decorators rather than branch inside the round loop.

use crate::registry::ClientId;
use fl_common::model::{LocalConfig, UpdateError, WeightedMean, apply_update};

/// One client's validated-for-shape result.
#[derive(Debug, Clone)]
pub struct ClientUpdate {
    /// Who sent it.
    pub client: ClientId,
    /// n_k: examples it trained on (its weight).
    pub num_examples: u64,
    /// u_k = w_k - w_t.
    pub values: Vec<f32>,
}

/// Why a strategy refused a client's update.
#[derive(Debug, thiserror::Error)]
pub enum StrategyError {
    /// The update itself is unusable.
    #[error(transparent)]
    Update(#[from] UpdateError),
}

/// A server-side aggregation rule.
pub trait Strategy: Send {
    /// Instructions for the clients sampled in `round`.
    fn configure_round(&mut self, round: u64) -> LocalConfig;
    /// Takes one client's update into the round's aggregate; a refused update changes nothing.
    fn absorb(&mut self, round: u64, update: ClientUpdate) -> Result<(), StrategyError>;
    /// Ends the round: the next global model from `global`, or `None` to keep `global`
    /// (nothing was absorbed).
    fn finish_round(&mut self, round: u64, global: &[f32]) -> Option<Vec<f32>>;
}

/// Federated averaging (McMahan et al. 2017): w_{t+1} = w_t + sum_k n_k u_k / sum_k n_k.
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
    fn configure_round(&mut self, _round: u64) -> LocalConfig {
        self.local
    }

    fn absorb(&mut self, _round: u64, update: ClientUpdate) -> Result<(), StrategyError> {
        Ok(self.sum.add(&update.values, update.num_examples)?)
    }

    fn finish_round(&mut self, _round: u64, global: &[f32]) -> Option<Vec<f32>> {
        let fresh = WeightedMean::new(global.len());
        let mean = std::mem::replace(&mut self.sum, fresh).mean()?;
        let mut next = global.to_vec();
        apply_update(&mut next, &mean);
        Some(next)
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
        let mut s = FedAvg::new(2, local);
        assert_eq!(s.configure_round(1), local);
        let update = |client, n, values: Vec<f32>| ClientUpdate {
            client,
            num_examples: n,
            values,
        };
        s.absorb(1, update(0, 3, vec![1.0, 1.0])).unwrap();
        s.absorb(1, update(1, 1, vec![-3.0, 5.0])).unwrap();
        assert!(s.absorb(1, update(2, 1, vec![f32::NAN, 0.0])).is_err());
        assert_eq!(s.finish_round(1, &[10.0, 0.0]), Some(vec![10.0, 2.0]));
        assert_eq!(s.finish_round(2, &[10.0, 0.0]), None);
    }
}
