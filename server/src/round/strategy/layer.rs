//! The one forwarding mechanism of the decorators: a [`Layer`] says what it does around its inner
//! strategy, and [`Decorated`] is the strategy of the two. `Decorated` forwards every call the
//! layer does not take over, and always merges the inner strategy's checkpoint state with the
//! layer's own, so no decorator can drop its inner strategy's state, tensors or accounts (the
//! shape of tower's `Layer` and `Service`).

use super::{
    RestoreError, RoundContext, RoundInstructions, RoundOutcome, Strategy, StrategyError,
    StrategyState, Upload, Views,
};

/// What a decorator does around an inner strategy of type `S`; every hook is given the inner
/// strategy and by default hands the call on to it.
pub(crate) trait Layer<S: Strategy>: Send {
    /// The key its checkpoint scalars are kept under, apart from the inner strategy's and every
    /// other layer's (so a key of its own can never overwrite theirs).
    const NAME: &'static str;

    /// What the sampled clients are told: by default the inner strategy's instructions.
    fn configure_round(&mut self, inner: &mut S, ctx: &RoundContext) -> RoundInstructions {
        inner.configure_round(ctx)
    }

    /// Takes one upload: by default the inner strategy takes it.
    fn absorb(
        &mut self,
        inner: &mut S,
        ctx: &RoundContext,
        upload: Upload,
    ) -> Result<(), StrategyError> {
        inner.absorb(ctx, upload)
    }

    /// Ends the round: by default the inner strategy ends it.
    fn finish_round(&mut self, inner: &mut S, ctx: &RoundContext, global: &[f32]) -> RoundOutcome {
        inner.finish_round(ctx, global)
    }

    /// Told whether the coordinator released the round's model: by default the inner strategy
    /// is told.
    fn released(&mut self, inner: &mut S, applied: bool) {
        inner.released(applied);
    }

    /// The layer's own checkpoint state: scalars (kept under [`Layer::NAME`]), tensors under
    /// names of its own, its clients' local ledgers.
    fn state(&self) -> StrategyState {
        StrategyState::default()
    }

    /// Restores the layer's own part of `state`, whose scalars are the layer's own (the inner
    /// strategy restores its part from the rest).
    fn restore(&mut self, _state: &StrategyState) -> Result<(), RestoreError> {
        Ok(())
    }

    /// What the layer shows beyond the aggregate ([`Views`]), over its inner strategy's: none
    /// of its own by default.
    fn views(&self) -> Views<'_> {
        Views::default()
    }

    /// This layer around `inner`.
    fn around(self, inner: S) -> Decorated<Self, S>
    where
        Self: Sized,
    {
        Decorated { layer: self, inner }
    }
}

/// A [`Layer`] around its inner strategy: the strategy of the two.
#[derive(Debug)]
pub(crate) struct Decorated<L, S> {
    /// The decorator's own part.
    pub layer: L,
    /// The strategy it decorates.
    pub inner: S,
}

impl<L: Layer<S>, S: Strategy> Strategy for Decorated<L, S> {
    fn configure_round(&mut self, ctx: &RoundContext) -> RoundInstructions {
        self.layer.configure_round(&mut self.inner, ctx)
    }

    fn absorb(&mut self, ctx: &RoundContext, upload: Upload) -> Result<(), StrategyError> {
        self.layer.absorb(&mut self.inner, ctx, upload)
    }

    fn state(&self) -> StrategyState {
        merged(self.inner.state(), self.layer.state(), L::NAME)
    }

    fn restore(&mut self, mut state: StrategyState) -> Result<(), RestoreError> {
        // The layer sees its own scalars; a checkpoint written before they were kept apart
        // holds every scalar in one object, which the layer then reads whole.
        let own = match &mut state.scalars {
            serde_json::Value::Object(all) => all.remove(L::NAME),
            _ => None,
        };
        let rest = match own {
            Some(own) => std::mem::replace(&mut state.scalars, own),
            None => state.scalars.clone(),
        };
        self.layer.restore(&state)?;
        state.scalars = rest;
        self.inner.restore(state)
    }

    fn views(&self) -> Views<'_> {
        self.layer.views().over(self.inner.views())
    }

    fn finish_round(&mut self, ctx: &RoundContext, global: &[f32]) -> RoundOutcome {
        self.layer.finish_round(&mut self.inner, ctx, global)
    }

    fn released(&mut self, applied: bool) {
        self.layer.released(&mut self.inner, applied);
    }
}

/// The inner strategy's state with the layer's added: the layer's scalars under `name` in the
/// inner strategy's object, tensors and local ledgers side by side.
fn merged(mut inner: StrategyState, own: StrategyState, name: &str) -> StrategyState {
    if !own.scalars.is_null() {
        let mut all = match inner.scalars {
            serde_json::Value::Object(all) => all,
            serde_json::Value::Null => serde_json::Map::new(),
            other => serde_json::Map::from_iter([("inner".to_string(), other)]),
        };
        all.insert(name.to_string(), own.scalars);
        inner.scalars = serde_json::Value::Object(all);
    }
    inner.tensors.extend(own.tensors);
    inner.local_ledgers.extend(own.local_ledgers);
    inner
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plan::{ClipRule, QuantileClip};
    use crate::round::strategy::testing::{ctx, update};
    use crate::round::strategy::{CentralDp, RoundSum, SumStrategy};
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    /// A summing strategy with state of its own: how many updates it has absorbed over the run,
    /// and a tensor of their running sum (the shape of server momentum).
    #[derive(Default)]
    struct Stateful {
        absorbed: u64,
        sum: Vec<f32>,
        total: Vec<f32>,
    }

    impl Strategy for Stateful {
        fn absorb(&mut self, _: &RoundContext, upload: Upload) -> Result<(), StrategyError> {
            let u = upload.dense()?;
            self.sum.resize(u.values.len(), 0.0);
            self.total.resize(u.values.len(), 0.0);
            for ((s, t), v) in self
                .sum
                .iter_mut()
                .zip(&mut self.total)
                .zip(u.values.iter())
            {
                *s += v;
                *t += v;
            }
            self.absorbed += 1;
            Ok(())
        }

        fn state(&self) -> StrategyState {
            StrategyState {
                scalars: serde_json::json!({ "absorbed": self.absorbed }),
                tensors: vec![("total".into(), self.total.clone())],
                ..StrategyState::default()
            }
        }

        fn restore(&mut self, state: StrategyState) -> Result<(), RestoreError> {
            self.absorbed = state.scalars["absorbed"]
                .as_u64()
                .ok_or(RestoreError("count"))?;
            let (_, total) = (state.tensors.into_iter())
                .find(|(name, _)| name == "total")
                .ok_or(RestoreError("total"))?;
            self.total = total;
            Ok(())
        }

        fn finish_round(&mut self, _: &RoundContext, _: &[f32]) -> RoundOutcome {
            RoundOutcome::default()
        }
    }

    impl SumStrategy for Stateful {
        fn take_sum(&mut self) -> Option<RoundSum> {
            Some(RoundSum {
                values: std::mem::take(&mut self.sum),
                sensitivity: None,
            })
        }
    }

    fn central(inner: Stateful) -> Decorated<CentralDp, Stateful> {
        let rule = ClipRule::Quantile(QuantileClip {
            bound: 1.0,
            target: 0.5,
            learning_rate: 0.2,
            count_noise: 5.0,
        });
        CentralDp::new(2, rule, StdRng::seed_from_u64(1)).around(inner)
    }

    /// A stateful strategy under central DP keeps its state across a resume, beside the
    /// decorator's own adaptive clip bound.
    #[test]
    fn a_stateful_inner_strategy_under_central_dp_survives_a_resume() {
        let mut s = central(Stateful::default());
        for round in 1..=2 {
            let c = ctx(round, 2.0, Some(1.0));
            s.absorb(&c, update(1, 1, vec![0.1, 0.2]).into()).unwrap();
            s.absorb(&c, update(2, 1, vec![3.0, 4.0]).into()).unwrap();
            s.finish_round(&c, &[0.0, 0.0]);
        }
        let state = s.state();
        let mut resumed = central(Stateful::default());
        resumed.restore(state.clone()).unwrap();
        assert_eq!(resumed.inner.absorbed, 4);
        assert_eq!(resumed.inner.total, s.inner.total);
        assert_eq!(resumed.state(), state);
        let bound = state.scalars["central_dp"]["clip_bound"].as_f64().unwrap();
        assert!(bound != 1.0, "the clip bound adapted: {bound}");
    }

    /// A layer that counts rounds under the same scalar key as the inner strategy's count.
    struct Rounds(u64);

    impl Layer<Stateful> for Rounds {
        const NAME: &'static str = "rounds";

        fn finish_round(
            &mut self,
            inner: &mut Stateful,
            c: &RoundContext,
            g: &[f32],
        ) -> RoundOutcome {
            self.0 += 1;
            inner.finish_round(c, g)
        }

        fn state(&self) -> StrategyState {
            StrategyState {
                scalars: serde_json::json!({ "absorbed": self.0 }),
                ..StrategyState::default()
            }
        }

        fn restore(&mut self, state: &StrategyState) -> Result<(), RestoreError> {
            self.0 = state.scalars["absorbed"]
                .as_u64()
                .ok_or(RestoreError("count"))?;
            Ok(())
        }
    }

    /// A layer's scalar of the same name as its inner strategy's does not overwrite it: each
    /// comes back as it was. A checkpoint written with every scalar in one object (before
    /// layers kept theirs apart) still restores.
    #[test]
    fn a_layers_scalars_never_overwrite_the_inner_strategys() {
        let mut s = Rounds(0).around(Stateful::default());
        let c = ctx(1, 1.0, None);
        for _ in 0..3 {
            s.absorb(&c, update(1, 1, vec![0.5]).into()).unwrap();
        }
        s.finish_round(&c, &[0.0]);
        let state = s.state();
        let mut resumed = Rounds(0).around(Stateful::default());
        resumed.restore(state.clone()).unwrap();
        assert_eq!((resumed.layer.0, resumed.inner.absorbed), (1, 3));
        assert_eq!(resumed.state(), state);

        let flat = StrategyState {
            scalars: serde_json::json!({ "absorbed": 3 }),
            ..state
        };
        let mut old = Rounds(0).around(Stateful::default());
        old.restore(flat).unwrap();
        assert_eq!((old.layer.0, old.inner.absorbed), (3, 3));
    }
}
