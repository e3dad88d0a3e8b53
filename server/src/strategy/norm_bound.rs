//! An L2 bound on each client's update in front of a non-private strategy: the operator's
//! defence against one client's update dragging the model arbitrarily far (plain FedAvg has no
//! clipping of its own).

use super::{
    RoundContext, RoundInstructions, RoundOutcome, Strategy, StrategyError, StrategyState, Upload,
};
use crate::config::NormAction;
use crate::registry::ClientId;

/// Refuses, or scales down to `bound`, every update u with ||u||_2 > bound, then hands it on.
#[derive(Debug)]
pub struct NormBound<S> {
    inner: S,
    bound: f64,
    action: NormAction,
}

impl<S: Strategy> NormBound<S> {
    /// `inner` behind the bound ||u||_2 <= `bound`.
    pub fn new(inner: S, bound: f64, action: NormAction) -> Self {
        Self {
            inner,
            bound,
            action,
        }
    }
}

impl<S: Strategy> Strategy for NormBound<S> {
    fn configure_round(&mut self, ctx: &RoundContext) -> RoundInstructions {
        self.inner.configure_round(ctx)
    }

    fn absorb(&mut self, ctx: &RoundContext, upload: Upload) -> Result<(), StrategyError> {
        let Upload::Dense(mut update) = upload else {
            return self.inner.absorb(ctx, upload);
        };
        let norm = update
            .values
            .iter()
            .map(|&v| f64::from(v).powi(2))
            .sum::<f64>()
            .sqrt();
        if norm > self.bound {
            match self.action {
                NormAction::Refuse => {
                    return Err(StrategyError::NormTooLarge {
                        norm,
                        bound: self.bound,
                    });
                }
                // u * min(1, S / ||u||), as in clipping (Abadi et al. 2016, Alg. 1).
                NormAction::Clip => {
                    let scale = self.bound / norm;
                    for v in &mut update.values {
                        *v = (f64::from(*v) * scale) as f32;
                    }
                }
            }
        }
        self.inner.absorb(ctx, update.into())
    }

    fn client_tensor(&self, client: ClientId, global: &[f32]) -> Option<Vec<f32>> {
        self.inner.client_tensor(client, global)
    }

    fn state(&self) -> StrategyState {
        self.inner.state()
    }

    fn restore(&mut self, state: StrategyState) -> Result<(), String> {
        self.inner.restore(state)
    }

    fn finish_round(&mut self, ctx: &RoundContext, global: &[f32]) -> RoundOutcome {
        self.inner.finish_round(ctx, global)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::FedAvg;
    use crate::strategy::testing::ctx;

    fn fedavg() -> FedAvg {
        FedAvg::new(2)
    }

    fn update(client: ClientId, values: Vec<f32>) -> Upload {
        crate::strategy::testing::update(client, 1, values).into()
    }

    #[test]
    fn refuses_updates_beyond_the_bound_and_keeps_the_others() {
        let mut s = NormBound::new(fedavg(), 5.0, NormAction::Refuse);
        let c = ctx(1, 2.0, None);
        s.absorb(&c, update(0, vec![3.0, 4.0])).unwrap();
        let err = s.absorb(&c, update(1, vec![3.0, 4.001])).unwrap_err();
        assert!(matches!(
            err,
            StrategyError::NormTooLarge { bound: 5.0, .. }
        ));
        assert_eq!(s.finish_round(&c, &[0.0, 0.0]).model, Some(vec![3.0, 4.0]));
    }

    #[test]
    fn clips_updates_beyond_the_bound_to_it() {
        let mut s = NormBound::new(fedavg(), 5.0, NormAction::Clip);
        let c = ctx(1, 2.0, None);
        s.absorb(&c, update(0, vec![30.0, 40.0])).unwrap();
        s.absorb(&c, update(1, vec![1e38, 0.0])).unwrap();
        let model = s.finish_round(&c, &[0.0, 0.0]).model.unwrap();
        // ((3, 4) + (5, 0)) / 2.
        assert!((model[0] - 4.0).abs() < 1e-5 && (model[1] - 2.0).abs() < 1e-5);
    }
}
