//! Central differential privacy at the client level around an inner summing strategy (Geyer,
//! Klein, Nabi 2017, Alg. 1, with the clipping done as the paper states it, not as its code did;
//! the decorator shape is Flower's `DifferentialPrivacyServerSideFixedClipping`):
//!
//! 1. each update is clipped over the whole model: u_k <- u_k / max(1, ||u_k||_2 / S) (under
//!    secure aggregation the clients clip, and the inner sum says its own sensitivity);
//! 2. the inner strategy sums the clipped updates, unweighted (weighting by example counts would
//!    change the sensitivity) but for an asynchronous update's staleness discount a_k <= 1,
//!    applied after the clip, which keeps each contribution within S; and N(0, z^2 S^2) is added
//!    to every coordinate of the sum;
//! 3. the noised sum is divided by the expected number of participants (m_t, or q_t K under
//!    Poisson sampling), never by the number that actually answered, which is private.
//!
//! The clip bound S is fixed, the paper's per-round median of the update norms (not private: the
//! run is marked as leaking through S), or adapted towards a target quantile of the norms with a
//! privately noised count (Andrew et al. 2021), whose cost is folded into the round's noise
//! multiplier.
//!
//! A round whose context carries a DP-FTRL stream step gets the stream's correlated noise
//! instead of an independent draw ([`CorrelatedNoise`], built by the stream that accounts
//! it, so the noise and the ledger cannot disagree).

use super::{
    Layer, RestoreError, RoundContext, RoundOutcome, StrategyError, StrategyState, SumStrategy,
    Upload, moved,
};
use crate::config::plan::ClipRule;
use crate::identity::ids::ClientId;
use fl_model::CheckedUpdate;
use fl_privacy::{CorrelatedNoise, StepMismatch, add_gaussian_noise, median};
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal};

/// Central DP, a [`Layer`] around a [`SumStrategy`]; see the module documentation.
pub(crate) struct CentralDp {
    num_params: usize,
    rule: ClipRule,
    rng: StdRng,
    /// Raw updates with their staleness weights, kept until the median is known (median rule
    /// only).
    held: Vec<(CheckedUpdate, f64)>,
    /// Updates absorbed this round, and those whose norm was at most S (quantile rule).
    counts: ClipCounts,
    /// DP-FTRL's correlated noise, for the rounds with a stream step.
    stream: Option<Box<dyn CorrelatedNoise>>,
}

/// The clip counts of a round (quantile rule).
#[derive(Debug, Default, Clone, Copy)]
struct ClipCounts {
    absorbed: usize,
    unclipped: usize,
}

impl ClipCounts {
    /// The centred statistic sum_i (b_i - 1/2), b_i = [||u_i|| <= S]: adding or removing one
    /// client moves it by exactly 1/2 (Andrew et al. 2021, Sec. 3; TF-Privacy's quantile
    /// estimator query). The raw count sum_i b_i would move by 1, twice what the accountant
    /// assumes.
    fn centred(self) -> f64 {
        self.unclipped as f64 - 0.5 * self.absorbed as f64
    }
}

impl CentralDp {
    /// Central DP over `num_params` parameters; `rng` must be a CSPRNG seeded from the OS in
    /// production.
    pub(crate) fn new(num_params: usize, rule: ClipRule, rng: StdRng) -> Self {
        Self {
            num_params,
            rule,
            rng,
            held: Vec::new(),
            counts: ClipCounts::default(),
            stream: None,
        }
    }

    /// The same, adding `stream`'s noise on the rounds with a stream step.
    pub(crate) fn with_stream(mut self, stream: Box<dyn CorrelatedNoise>) -> Self {
        self.stream = Some(stream);
        self
    }

    /// Adds the round's noise of standard deviation `std` to `sum`: the stream's on a DP-FTRL
    /// round, an independent draw otherwise. Fails when the round's step cannot follow the
    /// stream's, or there is no stream (it must not be released).
    fn add_noise(
        &mut self,
        ctx: &RoundContext,
        sum: &mut [f32],
        std: f64,
    ) -> Result<(), StepMismatch> {
        match (ctx.stream_step, &mut self.stream) {
            (Some(step), Some(stream)) => stream.add(sum, step, std, &mut self.rng),
            (Some(step), None) => Err(StepMismatch {
                stream: 0,
                round: step,
            }),
            (None, _) => {
                add_gaussian_noise(sum, std, &mut self.rng);
                Ok(())
            }
        }
    }

    /// S for the updates being absorbed (fixed and quantile rules).
    fn current_bound(&self) -> Option<f64> {
        match self.rule {
            ClipRule::Fixed(s) => Some(s),
            ClipRule::Quantile(q) => Some(q.bound),
            ClipRule::Median => None,
        }
    }

    /// Hands clipped `values` to the inner sum with weight 1, discounted by its staleness
    /// weight a_k <= 1 (after the clip: the contribution's norm stays at most S).
    fn sum_clipped<S: SumStrategy>(
        inner: &mut S,
        ctx: &RoundContext,
        (client, staleness_weight): (ClientId, f64),
        values: CheckedUpdate,
    ) -> Result<(), StrategyError> {
        let update = super::ClientUpdate {
            client,
            num_examples: 1,
            values,
            release: None,
            staleness_weight,
        };
        inner.absorb(ctx, update.into())
    }

    /// Hands a group's sum, each of its updates clipped to the round's fixed S by its aggregator
    /// (part of the trusted curator), to the inner sum; refused unless the bounds agree.
    fn absorb_group<S: SumStrategy>(
        &mut self,
        inner: &mut S,
        ctx: &RoundContext,
        group: super::GroupSum,
    ) -> Result<(), StrategyError> {
        let want = match self.rule {
            ClipRule::Fixed(s) => s,
            _ => f64::NAN,
        };
        if group.clip_bound != Some(want) {
            let got = group.clip_bound;
            return Err(StrategyError::GroupClip { got, want });
        }
        self.counts.absorbed += group.contributors;
        inner.absorb(ctx, Upload::Group(group))
    }

    /// The median rule's S: the median of the held updates' norms, which are then clipped to it
    /// and summed.
    fn clip_held_to_median<S: SumStrategy>(
        &mut self,
        inner: &mut S,
        ctx: &RoundContext,
    ) -> Option<f64> {
        let norms: Vec<f64> = self.held.iter().map(|(u, _)| u.norm()).collect();
        let s = median(&norms)?;
        for (mut values, weight) in std::mem::take(&mut self.held) {
            values.clip_l2(s);
            // Checked when held: the inner sum takes it.
            let _ = Self::sum_clipped(inner, ctx, (0, weight), values);
        }
        Some(s)
    }

    /// S <- S exp(-eta (b~ - gamma)), b~ = (sum_i (b_i - 1/2) + N(0, sigma_b^2)) / expected
    /// + 1/2 (Andrew et al. 2021, Alg. 1 with the centred count).
    fn adapt_bound(&mut self, ctx: &RoundContext, counts: ClipCounts) {
        if let ClipRule::Quantile(q) = &mut self.rule {
            let noise = Normal::new(0.0, q.count_noise)
                .expect("sigma_b validated positive")
                .sample(&mut self.rng);
            let fraction = (counts.centred() + noise) / ctx.expected_clients + 0.5;
            q.bound *= (-q.learning_rate * (fraction - q.target)).exp();
        }
    }
}

impl<S: SumStrategy> Layer<S> for CentralDp {
    const NAME: &'static str = "central_dp";

    fn state(&self) -> StrategyState {
        StrategyState {
            scalars: match self.rule {
                ClipRule::Quantile(q) => serde_json::json!({ "clip_bound": q.bound }),
                _ => serde_json::Value::Null,
            },
            ..StrategyState::default()
        }
    }

    fn restore(&mut self, state: &StrategyState) -> Result<(), RestoreError> {
        if let ClipRule::Quantile(q) = &mut self.rule {
            let bound = state.scalars["clip_bound"]
                .as_f64()
                .filter(|b| *b > 0.0 && b.is_finite())
                .ok_or(RestoreError("adaptive clip bound"))?;
            q.bound = bound;
        }
        Ok(())
    }

    fn absorb(
        &mut self,
        inner: &mut S,
        ctx: &RoundContext,
        upload: Upload,
    ) -> Result<(), StrategyError> {
        // A secure sum was clipped by the clients and says its own sensitivity; a group's sum
        // by its aggregator, to the round's S.
        let update = match upload {
            Upload::Dense(update) => update,
            Upload::Group(group) => return self.absorb_group(inner, ctx, group),
            other => return inner.absorb(ctx, other),
        };
        let (mut values, weight) = (update.values, update.staleness_weight);
        values.check_len(self.num_params)?;
        match self.current_bound() {
            None => self.held.push((values, weight)),
            Some(bound) => {
                let norm = values.clip_l2(bound);
                Self::sum_clipped(inner, ctx, (update.client, weight), values)?;
                self.counts.absorbed += 1;
                self.counts.unclipped += usize::from(norm <= bound);
            }
        }
        Ok(())
    }

    fn released(&mut self, inner: &mut S, applied: bool) {
        if let Some(stream) = &mut self.stream {
            stream.released(applied);
        }
        inner.released(applied);
    }

    fn finish_round(&mut self, inner: &mut S, ctx: &RoundContext, global: &[f32]) -> RoundOutcome {
        let bound = match self.rule {
            ClipRule::Median => self.clip_held_to_median(inner, ctx),
            _ => self.current_bound(),
        };
        let counts = std::mem::take(&mut self.counts);
        let sum = inner.take_sum();
        // No update and no median: nothing to release this round.
        let (Some(bound), Some(sum)) = (bound, sum) else {
            return RoundOutcome::default();
        };
        let z = ctx.noise_multiplier.unwrap_or(0.0);
        let z_sum = match self.rule {
            ClipRule::Quantile(q) => q.sum_multiplier(z),
            _ => z,
        };
        // The sum's sensitivity: S, or the inner sum's own when larger (quantisation).
        let sensitivity = sum.sensitivity.map_or(bound, |s| s.max(bound));
        // Gaussian mechanism on the sum: N(0, z^2 Delta^2) per coordinate.
        let noise_std = z_sum * sensitivity;
        let mut delta = sum.values;
        if let Err(e) = self.add_noise(ctx, &mut delta, noise_std) {
            // Logged at once: the stream's position is public, nothing of the aggregate.
            tracing::error!(
                stream = e.stream,
                round = e.round,
                "noise stream step out of order: no release"
            );
            return RoundOutcome {
                withheld: Some(format!(
                    "noise stream step out of order (stream {}, round {}): the aggregate is not \
                     released",
                    e.stream, e.round
                )),
                ..RoundOutcome::default()
            };
        }
        // Delta w_t = (sum + noise) / expected participants.
        let scale = (1.0 / ctx.expected_clients) as f32;
        delta.iter_mut().for_each(|v| *v *= scale);
        self.adapt_bound(ctx, counts);
        RoundOutcome {
            model: Some(moved(global, &delta)),
            clip_bound: Some(bound),
            noise_std: Some(noise_std),
            rho: None,
            withheld: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plan::QuantileClip;
    use crate::round::strategy::layer::Decorated;
    use crate::round::strategy::testing::ctx;
    use crate::round::strategy::{Divisor, FedAvg, SecureSum, Strategy, SumInput};
    use fl_privacy::NoiseStream;
    use rand::SeedableRng;

    /// One client's update, claiming 7 examples (central DP must ignore the claim).
    fn update(values: Vec<f32>) -> Upload {
        crate::round::strategy::testing::update(0, 7, values).into()
    }

    fn plan(round: u64, expected: f64, z: f64) -> RoundContext {
        ctx(round, expected, Some(z))
    }

    /// Central DP around FedAvg, over `d` parameters.
    fn dp(d: usize, rule: ClipRule, seed: u64) -> Decorated<CentralDp, FedAvg> {
        CentralDp::new(d, rule, StdRng::seed_from_u64(seed)).around(FedAvg::new(d))
    }

    #[test]
    fn without_noise_it_averages_clipped_updates_over_the_expected_count() {
        let mut s = dp(2, ClipRule::Fixed(1.0), 1);
        let c = plan(1, 4.0, 0.0);
        s.absorb(&c, update(vec![3.0, 4.0])).unwrap(); // clipped to (0.6, 0.8)
        s.absorb(&c, update(vec![0.2, 0.0])).unwrap(); // inside the bound
        let out = s.finish_round(&c, &[1.0, 1.0]);
        let m = out.model.unwrap();
        assert!((m[0] - (1.0 + 0.8 / 4.0)).abs() < 1e-6, "{m:?}");
        assert!((m[1] - (1.0 + 0.8 / 4.0)).abs() < 1e-6, "{m:?}");
        assert_eq!(out.clip_bound, Some(1.0));
        assert_eq!(out.noise_std, Some(0.0));
    }

    /// A group's sum (the aggregator tier), clipped by its aggregator to the round's S, joins
    /// the sum as it is and counts its contributors; one clipped to another S is refused.
    #[test]
    fn a_group_sum_clipped_to_the_rounds_bound_is_summed_and_another_refused() {
        let group = |sum: Vec<f32>, clip_bound| {
            Upload::Group(crate::round::strategy::GroupSum {
                sum: CheckedUpdate::new(sum).unwrap(),
                weight: 2.0,
                contributors: 2,
                clip_bound,
            })
        };
        let mut s = dp(2, ClipRule::Fixed(1.0), 1);
        let c = plan(1, 4.0, 0.0);
        let refused = s.absorb(&c, group(vec![5.0, 5.0], Some(2.0)));
        assert!(
            matches!(refused, Err(StrategyError::GroupClip { .. })),
            "{refused:?}"
        );
        assert!(s.absorb(&c, group(vec![5.0, 5.0], None)).is_err());
        s.absorb(&c, group(vec![0.8, 0.8], Some(1.0))).unwrap();
        s.absorb(&c, update(vec![3.0, 4.0])).unwrap(); // clipped to (0.6, 0.8)
        let m = s.finish_round(&c, &[0.0, 0.0]).model.unwrap();
        assert!(
            (m[0] - 1.4 / 4.0).abs() < 1e-6 && (m[1] - 1.6 / 4.0).abs() < 1e-6,
            "{m:?}"
        );
    }

    /// A DP-FTRL step that does not follow the tree's last one releases nothing, and says why
    /// (the release rule would otherwise blame too few results).
    #[test]
    fn a_tree_step_out_of_order_withholds_the_aggregate_and_says_why() {
        let tree = fl_privacy::TreeStream::new(1.0, 4).noise(1);
        let mut s = CentralDp::new(1, ClipRule::Fixed(1.0), StdRng::seed_from_u64(1))
            .with_stream(tree)
            .around(FedAvg::new(1));
        for (round, step) in [(1, 1), (2, 3)] {
            let c = RoundContext {
                stream_step: Some(step),
                ..plan(round, 2.0, 1.0)
            };
            s.absorb(&c, update(vec![0.5])).unwrap();
            let out = s.finish_round(&c, &[0.0]);
            match step {
                1 => assert!(out.model.is_some() && out.withheld.is_none(), "{out:?}"),
                _ => {
                    assert!(out.model.is_none(), "{out:?}");
                    let reason = out.withheld.unwrap();
                    assert!(reason.contains("step out of order"), "{reason}");
                }
            }
        }
    }

    #[test]
    fn median_rule_clips_to_the_median_norm() {
        let mut s = dp(1, ClipRule::Median, 1);
        let c = plan(1, 3.0, 0.0);
        for v in [1.0, 2.0, 10.0] {
            s.absorb(&c, update(vec![v])).unwrap();
        }
        let out = s.finish_round(&c, &[0.0]);
        assert_eq!(out.clip_bound, Some(2.0));
        let m = out.model.unwrap()[0];
        assert!((m - 5.0 / 3.0).abs() < 1e-6, "{m}");
    }

    #[test]
    fn quantile_rule_moves_the_bound_towards_the_target_quantile() {
        let q = QuantileClip {
            bound: 1.0,
            target: 0.5,
            learning_rate: 0.2,
            count_noise: 1e-9,
        };
        // z must stay below 2 sigma_b (checked at start-up); both are tiny here so the
        // update is deterministic to 1e-6.
        let mut s = dp(1, ClipRule::Quantile(q), 1);
        // All norms 5 > S: the unclipped fraction is 0 < 0.5, so S grows by e^{0.1} each round.
        for round in 1..=3 {
            let c = plan(round, 4.0, 1e-10);
            for _ in 0..4 {
                s.absorb(&c, update(vec![5.0])).unwrap();
            }
            s.finish_round(&c, &[0.0]);
        }
        let ClipRule::Quantile(q) = s.layer.rule else {
            unreachable!()
        };
        assert!((q.bound - (0.3f64).exp()).abs() < 1e-6, "{}", q.bound);
    }

    /// The released clip-count statistic of neighbouring rounds (one client more, clipped or
    /// not; same noise draw) differs by at most 1/2: the sensitivity the multiplier formula
    /// assumes (Andrew et al. 2021, Thm 1). Read through the next bound:
    /// ln S' = ln S - eta (b~ - gamma), with b~ = (statistic + noise) / expected + 1/2.
    #[test]
    fn one_client_more_moves_the_released_count_by_at_most_a_half() {
        let q = QuantileClip {
            bound: 1.0,
            target: 0.5,
            learning_rate: 0.2,
            count_noise: 3.0,
        };
        let expected = 4.0;
        let next_bound = |norms: &[f32]| {
            let rule = ClipRule::Quantile(q);
            let mut s = dp(1, rule, 7);
            let c = plan(1, expected, 1.0);
            for &n in norms {
                s.absorb(&c, update(vec![n])).unwrap();
            }
            s.finish_round(&c, &[0.0]);
            s.state().scalars["central_dp"]["clip_bound"]
                .as_f64()
                .unwrap()
        };
        let base = [0.5, 2.0, 0.1];
        for extra in [0.3, 5.0] {
            let mut neighbour = base.to_vec();
            neighbour.push(extra);
            let moved = (next_bound(&base).ln() - next_bound(&neighbour).ln()).abs();
            let statistic_moved = moved / q.learning_rate * expected;
            assert!(
                statistic_moved <= 0.5 + 1e-9,
                "a client of norm {extra} moved the released count by {statistic_moved}"
            );
        }
    }

    #[test]
    fn quantile_sum_multiplier_composes_back_to_z() {
        let q = QuantileClip {
            bound: 1.0,
            target: 0.5,
            learning_rate: 0.2,
            count_noise: 5.0,
        };
        let z_sum = q.sum_multiplier(1.0);
        let combined = (z_sum.powi(-2) + (2.0 * 5.0f64).powi(-2)).powf(-0.5);
        assert!((combined - 1.0).abs() < 1e-12);
        assert!(z_sum > 1.0);
    }

    #[test]
    fn refuses_bad_updates() {
        let mut s = dp(2, ClipRule::Fixed(1.0), 1);
        let c = plan(1, 1.0, 1.0);
        assert!(s.absorb(&c, update(vec![0.0])).is_err());
        assert!(s.absorb(&c, update(vec![0.0; 3])).is_err());
    }

    #[test]
    fn around_a_secure_sum_it_noises_with_the_quantised_sensitivity_and_the_expected_count() {
        let rule = ClipRule::Fixed(1.0);
        let inner = SecureSum::new(Divisor::Survivors);
        let mut s = CentralDp::new(1000, rule, StdRng::seed_from_u64(2)).around(inner);
        let c = plan(1, 5.0, 2.0);
        let input = SumInput {
            sum: vec![0.0; 1000],
            contributors: 3,
            clip_bound: 1.0,
            sensitivity: 1.001,
            noise_std: None,
        };
        s.absorb(&c, Upload::Sum(input)).unwrap();
        let out = s.finish_round(&c, &vec![0.0; 1000]);
        assert_eq!(out.noise_std, Some(2.0 * 1.001));
        let model = out.model.unwrap();
        // Each coordinate is N(0, (2.002/5)^2); the sample std is within 10% for 1000 draws
        // (its relative standard error is 1/sqrt(2000) = 2.2%).
        let std = (model.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / 1000.0).sqrt();
        assert!((std / (2.002 / 5.0) - 1.0).abs() < 0.1, "{std}");
    }
}
