//! Federated averaging (McMahan et al. 2017).

use super::{
    RoundContext, RoundOutcome, RoundSum, Strategy, StrategyError, SumStrategy, Upload, moved,
};
use fl_model::WeightedMean;

/// FedAvg: w_{t+1} = w_t + sum_k n_k a_k u_k / sum_k n_k, a_k the staleness discount (1 in
/// synchronous rounds).
#[derive(Debug)]
pub(crate) struct FedAvg {
    sum: WeightedMean,
}

impl FedAvg {
    /// FedAvg over models of `num_params` parameters.
    pub(crate) fn new(num_params: usize) -> Self {
        Self {
            sum: WeightedMean::new(num_params),
        }
    }

    /// The round's weighted sum, leaving an empty one for the next round.
    fn take(&mut self) -> WeightedMean {
        let fresh = WeightedMean::new(self.sum.len());
        std::mem::replace(&mut self.sum, fresh)
    }
}

impl Strategy for FedAvg {
    fn absorb(&mut self, _ctx: &RoundContext, upload: Upload) -> Result<(), StrategyError> {
        if let Upload::Group(group) = upload {
            return Ok((self.sum).add_sum(&group.sum, group.weight, group.contributors)?);
        }
        let update = upload.dense()?;
        let (n, a) = (update.num_examples, update.staleness_weight);
        Ok(self.sum.add_discounted(&update.values, n, a)?)
    }

    fn finish_round(&mut self, _ctx: &RoundContext, global: &[f32]) -> RoundOutcome {
        RoundOutcome {
            model: self.take().mean().map(|mean| moved(global, &mean)),
            ..RoundOutcome::default()
        }
    }
}

impl SumStrategy for FedAvg {
    fn take_sum(&mut self) -> Option<RoundSum> {
        let taken = self.take();
        let values = taken.sum().unwrap_or_else(|| vec![0.0; taken.len()]);
        Some(RoundSum {
            values,
            sensitivity: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::round::strategy::testing::{ctx, update};

    #[test]
    fn fedavg_moves_the_model_by_the_weighted_mean_and_resets() {
        let mut s = FedAvg::new(2);
        let c = ctx(1, 3.0, None);
        s.absorb(&c, update(0, 3, vec![1.0, 1.0]).into()).unwrap();
        s.absorb(&c, update(1, 1, vec![-3.0, 5.0]).into()).unwrap();
        assert!(
            s.absorb(&c, update(2, 1, vec![0.0, 0.0, 0.0]).into())
                .is_err()
        );
        assert_eq!(
            s.finish_round(&c, &[10.0, 0.0]).model,
            Some(vec![10.0, 2.0])
        );
        assert_eq!(s.finish_round(&ctx(2, 3.0, None), &[10.0, 0.0]).model, None);
    }

    #[test]
    fn its_sum_is_the_weighted_sum_and_resets() {
        let mut s = FedAvg::new(2);
        let c = ctx(1, 3.0, None);
        s.absorb(&c, update(0, 2, vec![1.0, 1.0]).into()).unwrap();
        s.absorb(&c, update(1, 1, vec![-3.0, 5.0]).into()).unwrap();
        assert_eq!(s.take_sum().unwrap().values, vec![-1.0, 7.0]);
        // An empty round sums to zero.
        assert_eq!(s.take_sum().unwrap().values, vec![0.0, 0.0]);
    }
}
