//! SignDS aggregation: each upload (s, J) is the sparse update s * 1_J; the server moves the
//! model along their mean with a global learning rate eta_g.

use super::{ClientUpdate, RoundOutcome, RoundPlan, Strategy, StrategyError};
use fl_common::model::LocalConfig;
use fl_common::signds::SignAggregate;

/// w_{t+1} = w_t + eta_g (1/n) sum_clients s * 1_J.
#[derive(Debug)]
pub struct SignDsAvg {
    local: LocalConfig,
    learning_rate: f32,
    h: usize,
    aggregate: SignAggregate,
}

impl SignDsAvg {
    /// For a model of `dim` parameters, uploads of at most `h` indices and step eta_g.
    pub fn new(dim: usize, h: usize, learning_rate: f32, local: LocalConfig) -> Self {
        Self {
            local,
            learning_rate,
            h,
            aggregate: SignAggregate::new(dim, h),
        }
    }
}

impl Strategy for SignDsAvg {
    fn configure_round(&mut self, _round: u64, _plan: &RoundPlan) -> LocalConfig {
        self.local
    }

    fn absorb(&mut self, _round: u64, _update: ClientUpdate) -> Result<(), StrategyError> {
        Err(StrategyError::NeedsSign)
    }

    fn absorb_sign(
        &mut self,
        _round: u64,
        sign: i64,
        indices: &[u64],
    ) -> Result<(), StrategyError> {
        Ok(self.aggregate.add(sign, indices)?)
    }

    fn finish_round(&mut self, _round: u64, global: &[f32]) -> RoundOutcome {
        let fresh = SignAggregate::new(global.len(), self.h);
        let aggregate = std::mem::replace(&mut self.aggregate, fresh);
        RoundOutcome {
            model: aggregate.step(global, self.learning_rate),
            ..RoundOutcome::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_by_the_mean_sign_update_and_refuses_dense_or_bad_uploads() {
        let local = LocalConfig {
            epochs: 1,
            batch_size: 1,
            learning_rate: 0.1,
        };
        let mut s = SignDsAvg::new(4, 2, 0.5, local);
        let dense = ClientUpdate {
            client: 0,
            num_examples: 1,
            values: vec![0.0; 4],
        };
        assert!(matches!(s.absorb(1, dense), Err(StrategyError::NeedsSign)));
        s.absorb_sign(1, 1, &[0, 2]).unwrap();
        s.absorb_sign(1, -1, &[2, 3]).unwrap();
        assert!(s.absorb_sign(1, 1, &[0, 0]).is_err());
        assert!(s.absorb_sign(1, 0, &[1]).is_err());
        assert!(s.absorb_sign(1, 1, &[4]).is_err());
        assert!(s.absorb_sign(1, 1, &[0, 1, 2]).is_err());
        // Mean of (1, 0, 1, 0) and (0, 0, -1, -1), times 0.5.
        let next = s.finish_round(1, &[1.0; 4]).model.unwrap();
        assert_eq!(next, vec![1.25, 1.0, 1.0, 0.75]);
        assert_eq!(s.finish_round(2, &[1.0; 4]).model, None);
    }
}
