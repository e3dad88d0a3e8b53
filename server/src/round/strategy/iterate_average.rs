//! An exponential moving average of the released global models (Polyak-Ruppert averaging in the
//! form De et al. 2022, "Unlocking High-Accuracy Differentially Private Image Classification
//! through Scale", use for DP-SGD): the clients keep training from the iterate x_t, while the
//! model the server evaluates and writes at the end is the average a_t. Under noise the iterate
//! wanders around the optimum; the average smooths the last rounds' noise out of the model.
//!
//! Every x_t is already a mechanism's output (or a server optimizer's step on one), so the average
//! is post-processing: no privacy cost and no ledger entry. A round the coordinator does not
//! release leaves the average as it was.

use super::{Layer, RestoreError, RoundContext, RoundOutcome, Strategy, StrategyState, Views};

/// The average's checkpoint name.
const AVERAGE: &str = "iterate_average";

/// A moving average of the released models around an inner strategy.
#[derive(Debug)]
pub(crate) struct IterateAverage {
    /// beta: the decay the warm-up rises to.
    decay: f64,
    /// a_t, empty before the first released round.
    average: Vec<f32>,
    /// How many models a_t averages (t).
    count: u64,
    /// The model the round just finished proposed, averaged in only if it is released.
    pending: Option<Vec<f32>>,
}

impl IterateAverage {
    /// An average of decay `decay` (in [0, 1)) with nothing averaged yet.
    pub(crate) fn new(decay: f64) -> Self {
        Self {
            decay,
            average: Vec::new(),
            count: 0,
            pending: None,
        }
    }

    /// beta_t = min(beta, (1 + t) / (10 + t)) (TensorFlow's `ExponentialMovingAverage` with
    /// `num_updates`, as De et al. 2022 use it): the first models are not outweighed by x_0.
    fn decay_at(&self, t: u64) -> f64 {
        let t = t as f64;
        self.decay.min((1.0 + t) / (10.0 + t))
    }

    /// a_t = beta_t a_{t-1} + (1 - beta_t) x_t, with a_1 = x_1.
    fn take(&mut self, x: Vec<f32>) {
        self.count += 1;
        if self.average.len() != x.len() {
            self.average = x;
            return;
        }
        let beta = self.decay_at(self.count);
        for (a, x) in self.average.iter_mut().zip(x) {
            *a = (beta * f64::from(*a) + (1.0 - beta) * f64::from(x)) as f32;
        }
    }
}

impl<S: Strategy> Layer<S> for IterateAverage {
    const NAME: &'static str = "iterate_average";

    fn finish_round(&mut self, inner: &mut S, ctx: &RoundContext, global: &[f32]) -> RoundOutcome {
        let outcome = inner.finish_round(ctx, global);
        self.pending = outcome.model.clone();
        outcome
    }

    fn released(&mut self, inner: &mut S, applied: bool) {
        if let (true, Some(x)) = (applied, self.pending.take()) {
            self.take(x);
        }
        self.pending = None;
        inner.released(applied);
    }

    fn views(&self) -> Views<'_> {
        Views {
            average: (!self.average.is_empty()).then_some(self.average.as_slice()),
            ..Views::default()
        }
    }

    fn state(&self) -> StrategyState {
        StrategyState {
            scalars: serde_json::json!({ "iterate_average_count": self.count }),
            tensors: vec![(AVERAGE.to_string(), self.average.clone())],
            ..StrategyState::default()
        }
    }

    fn restore(&mut self, state: &StrategyState) -> Result<(), RestoreError> {
        let average = (state.tensor(AVERAGE)).ok_or(RestoreError("iterate average"))?;
        let count = state.scalars["iterate_average_count"]
            .as_u64()
            .ok_or(RestoreError("iterate average count"))?;
        (self.average, self.count) = (average, count);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::round::strategy::layer::Decorated;
    use crate::round::strategy::testing::ctx;
    use crate::round::strategy::{StrategyError, Upload};

    /// An inner strategy whose round t proposes the model [t].
    struct Counts;

    impl Strategy for Counts {
        fn absorb(&mut self, _: &RoundContext, _: Upload) -> Result<(), StrategyError> {
            Ok(())
        }

        fn finish_round(&mut self, ctx: &RoundContext, _: &[f32]) -> RoundOutcome {
            RoundOutcome {
                model: Some(vec![ctx.round as f32]),
                ..RoundOutcome::default()
            }
        }
    }

    fn averaged(decay: f64) -> Decorated<IterateAverage, Counts> {
        IterateAverage::new(decay).around(Counts)
    }

    /// Runs rounds `from..=to`, releasing those `release` accepts.
    fn run(s: &mut impl Strategy, from: u64, to: u64, release: impl Fn(u64) -> bool) {
        for t in from..=to {
            s.finish_round(&ctx(t, 1.0, None), &[0.0]);
            s.released(release(t));
        }
    }

    /// The average against values computed by hand: models 1, 2, 3 with beta = 0.5 (the
    /// warm-up's (1 + t) / (10 + t) is 0.25 at t = 2 and 0.31 at t = 3, below beta):
    /// a_1 = 1, a_2 = 0.25 + 0.75 * 2 = 1.75, a_3 = (4/13) 1.75 + (9/13) 3 = 2.6153846.
    #[test]
    fn the_average_takes_the_hand_computed_values() {
        let mut s = averaged(0.5);
        assert_eq!(s.views().average, None);
        run(&mut s, 1, 3, |_| true);
        let a = f64::from(s.views().average.unwrap()[0]);
        assert!((a - 2.615_384_6).abs() < 1e-6, "{a}");
        // Past the warm-up, beta itself: (1 + t) / (10 + t) >= 0.5 from t = 8 on.
        let mut late = averaged(0.5);
        run(&mut late, 1, 20, |_| true);
        let mut next = averaged(0.5);
        next.restore(late.state()).unwrap();
        run(&mut next, 21, 21, |_| true);
        let (before, after) = (
            late.views().average.unwrap()[0],
            next.views().average.unwrap()[0],
        );
        assert!((after - (0.5 * before + 0.5 * 21.0)).abs() < 1e-5);
    }

    /// A round the coordinator does not release is not averaged; the average survives a resume.
    #[test]
    fn unreleased_rounds_are_left_out_and_the_average_survives_a_resume() {
        let mut skipping = averaged(0.9);
        run(&mut skipping, 1, 4, |t| t != 2);
        let mut released = averaged(0.9);
        for t in [1, 3, 4] {
            run(&mut released, t, t, |_| true);
        }
        assert_eq!(skipping.views().average, released.views().average);
        let mut resumed = averaged(0.9);
        resumed.restore(skipping.state()).unwrap();
        assert_eq!(resumed.state(), skipping.state());
        run(&mut resumed, 5, 5, |_| true);
        run(&mut skipping, 5, 5, |_| true);
        assert_eq!(resumed.views().average, skipping.views().average);
        assert!(averaged(0.9).restore(StrategyState::default()).is_err());
    }
}
