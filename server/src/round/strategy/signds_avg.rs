//! SignDS aggregation: each upload (s, J) is the sparse update s * 1_J; the server moves the
//! model along their mean with a global learning rate eta_g.

use super::{RoundContext, RoundOutcome, Strategy, StrategyError, Upload};
use fl_privacy::signds::SignAggregate;

/// w_{t+1} = w_t + eta_g (1/n) sum_clients s * 1_J.
#[derive(Debug)]
pub(crate) struct SignDsAvg {
    learning_rate: f32,
    h: usize,
    aggregate: SignAggregate,
}

impl SignDsAvg {
    /// For a model of `dim` parameters, uploads of at most `h` indices and step eta_g.
    pub(crate) fn new(dim: usize, h: usize, learning_rate: f32) -> Self {
        Self {
            learning_rate,
            h,
            aggregate: SignAggregate::new(dim, h),
        }
    }
}

impl Strategy for SignDsAvg {
    fn absorb(&mut self, _ctx: &RoundContext, upload: Upload) -> Result<(), StrategyError> {
        match upload {
            Upload::Sign(u) if u.release.is_some() => Err(StrategyError::UnexpectedRelease),
            Upload::Sign(u) => Ok(self.aggregate.add(u.sign, &u.indices)?),
            Upload::Dense(_) | Upload::Verified(_) => Err(StrategyError::NeedsSign),
            Upload::Sum(_) | Upload::Group(_) => Err(StrategyError::NeedsUpdates),
        }
    }

    fn finish_round(&mut self, _ctx: &RoundContext, global: &[f32]) -> RoundOutcome {
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
    use crate::round::strategy::SignUpload;
    use crate::round::strategy::testing::{ctx, update};

    #[test]
    fn moves_by_the_mean_sign_update_and_refuses_dense_or_bad_uploads() {
        let mut s = SignDsAvg::new(4, 2, 0.5);
        let c = ctx(1, 2.0, None);
        let dense = update(0, 1, vec![0.0; 4]).into();
        assert!(matches!(s.absorb(&c, dense), Err(StrategyError::NeedsSign)));
        let sign = |sign, indices: &[u64]| {
            Upload::Sign(SignUpload {
                client: 0,
                release: None,
                sign,
                indices: indices.to_vec(),
            })
        };
        s.absorb(&c, sign(1, &[0, 2])).unwrap();
        s.absorb(&c, sign(-1, &[2, 3])).unwrap();
        assert!(s.absorb(&c, sign(1, &[0, 0])).is_err());
        assert!(s.absorb(&c, sign(0, &[1])).is_err());
        assert!(s.absorb(&c, sign(1, &[4])).is_err());
        assert!(s.absorb(&c, sign(1, &[0, 1, 2])).is_err());
        // Mean of (1, 0, 1, 0) and (0, 0, -1, -1), times 0.5.
        let next = s.finish_round(&c, &[1.0; 4]).model.unwrap();
        assert_eq!(next, vec![1.25, 1.0, 1.0, 0.75]);
        assert_eq!(s.finish_round(&ctx(2, 2.0, None), &[1.0; 4]).model, None);
    }
}
