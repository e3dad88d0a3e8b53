//! An L2 bound on each client's update in front of a non-private strategy: the operator's
//! defence against one client's update dragging the model arbitrarily far (plain FedAvg has no
//! clipping of its own).

use super::{Layer, RoundContext, Strategy, StrategyError, Upload};
use crate::config::NormAction;

/// Refuses, or scales down to `bound`, every update u with ||u||_2 > bound, then hands it on.
#[derive(Debug)]
pub(crate) struct NormBound {
    bound: f64,
    action: NormAction,
}

impl NormBound {
    /// The bound ||u||_2 <= `bound`.
    pub(crate) fn new(bound: f64, action: NormAction) -> Self {
        Self { bound, action }
    }
}

impl<S: Strategy> Layer<S> for NormBound {
    const NAME: &'static str = "norm_bound";

    fn absorb(
        &mut self,
        inner: &mut S,
        ctx: &RoundContext,
        upload: Upload,
    ) -> Result<(), StrategyError> {
        let Upload::Dense(mut update) = upload else {
            return inner.absorb(ctx, upload);
        };
        let norm = update.values.norm();
        match self.action {
            NormAction::Refuse if norm > self.bound => {
                return Err(StrategyError::NormTooLarge {
                    norm,
                    bound: self.bound,
                });
            }
            // u * min(1, S / ||u||), as in clipping (Abadi et al. 2016, Alg. 1).
            NormAction::Clip => {
                update.values.clip_l2(self.bound);
            }
            NormAction::Refuse => {}
        }
        inner.absorb(ctx, update.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::round::strategy::FedAvg;
    use crate::round::strategy::testing::ctx;
    use fl_privacy::l2_norm;

    fn fedavg() -> FedAvg {
        FedAvg::new(2)
    }

    fn update(client: crate::identity::ids::ClientId, values: Vec<f32>) -> Upload {
        crate::round::strategy::testing::update(client, 1, values).into()
    }

    #[test]
    fn refuses_updates_beyond_the_bound_and_keeps_the_others() {
        let mut s = NormBound::new(5.0, NormAction::Refuse).around(fedavg());
        let c = ctx(1, 2.0, None);
        s.absorb(&c, update(0, vec![3.0, 4.0])).unwrap();
        let err = s.absorb(&c, update(1, vec![3.0, 4.001])).unwrap_err();
        assert!(matches!(
            err,
            StrategyError::NormTooLarge { bound: 5.0, .. }
        ));
        assert_eq!(s.finish_round(&c, &[0.0, 0.0]).model, Some(vec![3.0, 4.0]));
    }

    /// Scaling by S / ||u|| in f32 can leave ||u|| a few ulps above S; the clipped update never
    /// is (fixed seed, 2,000 random updates of 100 values).
    #[test]
    fn a_clipped_update_is_never_above_the_bound() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let bound = 1.0;
        for _ in 0..2000 {
            let values: Vec<f32> = (0..100).map(|_| rng.random_range(-3.0..3.0)).collect();
            let mut s = NormBound::new(bound, NormAction::Clip).around(FedAvg::new(100));
            let c = ctx(1, 1.0, None);
            s.absorb(
                &c,
                crate::round::strategy::testing::update(0, 1, values).into(),
            )
            .unwrap();
            let clipped = s.finish_round(&c, &[0.0; 100]).model.unwrap();
            let norm = l2_norm(&clipped);
            assert!(norm <= bound, "clipped to {norm:e} > {bound}");
        }
    }

    #[test]
    fn clips_updates_beyond_the_bound_to_it() {
        let mut s = NormBound::new(5.0, NormAction::Clip).around(fedavg());
        let c = ctx(1, 2.0, None);
        s.absorb(&c, update(0, vec![30.0, 40.0])).unwrap();
        s.absorb(&c, update(1, vec![1e38, 0.0])).unwrap();
        let model = s.finish_round(&c, &[0.0, 0.0]).model.unwrap();
        // ((3, 4) + (5, 0)) / 2.
        assert!((model[0] - 4.0).abs() < 1e-5 && (model[1] - 2.0).abs() < 1e-5);
    }
}
