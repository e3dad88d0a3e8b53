//! An aggregator's part of a round (the aggregator tier): its clients' dense updates, each
//! clipped to the coordinator's S when the round has one and weighted by its example count or by
//! 1, summed into the group's partial aggregate ([`GroupSum`]) that goes to the coordinator; or,
//! when the group runs secure aggregation ([`SecureRule`]), the decoded sum of its survivors,
//! the only thing the aggregator learns. The coordinator's stack adds the noise once, to the
//! total of the groups.

use super::{GroupSum, RoundContext, RoundOutcome, Strategy, StrategyError, Upload};
use fl_model::{CheckedUpdate, WeightedMean};
use std::time::Duration;

/// How a group sums its clients' updates: what the coordinator's stack would have done to each
/// before its sum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct GroupRule {
    /// S: each update is clipped to this L2 norm (central DP's fixed clip).
    pub clip_bound: Option<f64>,
    /// n_k weights each update (FedAvg without privacy); otherwise 1.
    pub weight_by_examples: bool,
    /// The group runs secure aggregation among its sampled clients.
    pub secure: Option<SecureRule>,
}

/// How a group runs secure aggregation: the coordinator's settings, which the group's size
/// turns into a neighbour graph and a floor of survivors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SecureRule {
    /// t as a fraction of a client's neighbours.
    pub threshold: f64,
    /// f: the fewest survivors of each stage, as a fraction of the group's sampled clients.
    pub min_survivor_fraction: f64,
    /// n_min: the fewest survivors of each stage whatever the group's size, which the round's
    /// noise was calibrated and charged for.
    pub min_survivors: usize,
    /// `None`: the complete graph; `Some(k)`: a random k-regular one (0: O(log n)).
    pub degree: Option<usize>,
    /// How long each stage after the first waits.
    pub stage_timeout: Duration,
}

impl SecureRule {
    /// The fewest survivors of a group of `sampled` clients: the group's own, as a round of its
    /// size has them, and at least n_min.
    pub(crate) fn survivors_of(&self, sampled: usize) -> usize {
        let own = fl_secagg::fewest_survivors(self.min_survivor_fraction, sampled);
        own.max(self.min_survivors)
    }
}

/// The group's running sum under its [`GroupRule`]; see the module documentation.
#[derive(Debug)]
pub(crate) struct GroupSummer {
    rule: GroupRule,
    sum: WeightedMean,
    /// A secure group's decoded sum of its survivors.
    secure: Option<GroupSum>,
}

impl GroupSummer {
    /// An empty sum over models of `num_params` parameters.
    pub(crate) fn new(num_params: usize, rule: GroupRule) -> Self {
        Self {
            rule,
            sum: WeightedMean::new(num_params),
            secure: None,
        }
    }

    /// The group's partial aggregate, or `None` when no result was summed.
    pub(crate) fn take(self) -> Result<Option<GroupSum>, StrategyError> {
        if self.secure.is_some() {
            return Ok(self.secure);
        }
        let (weight, contributors) = (self.sum.total_weight(), self.sum.count());
        let Some(sum) = self.sum.sum() else {
            return Ok(None);
        };
        Ok(Some(GroupSum {
            sum: CheckedUpdate::new(sum)?,
            weight,
            contributors,
            clip_bound: self.rule.clip_bound,
        }))
    }
}

impl Strategy for GroupSummer {
    fn absorb(&mut self, _ctx: &RoundContext, upload: Upload) -> Result<(), StrategyError> {
        let update = match upload {
            Upload::Sum(input) if self.rule.secure.is_some() => {
                let sum = CheckedUpdate::new(input.sum)?;
                sum.check_len(self.sum.len())?;
                self.secure = Some(GroupSum {
                    sum,
                    weight: input.contributors as f64,
                    contributors: input.contributors,
                    clip_bound: Some(input.clip_bound),
                });
                return Ok(());
            }
            other => other.dense()?,
        };
        let mut values = update.values;
        values.check_len(self.sum.len())?;
        if let Some(bound) = self.rule.clip_bound {
            // u_k <- u_k / max(1, ||u_k||_2 / S), as the coordinator's central DP clips.
            values.clip_l2(bound);
        }
        let weight = match self.rule.weight_by_examples {
            true => update.num_examples,
            false => 1,
        };
        Ok(self.sum.add(&values, weight)?)
    }

    fn finish_round(&mut self, _ctx: &RoundContext, _global: &[f32]) -> RoundOutcome {
        RoundOutcome::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::round::strategy::SumInput;
    use crate::round::strategy::testing::{ctx, update};

    #[test]
    fn clips_each_update_and_weights_it_by_one() {
        let rule = GroupRule {
            clip_bound: Some(1.0),
            weight_by_examples: false,
            secure: None,
        };
        let mut s = GroupSummer::new(2, rule);
        let c = ctx(1, 2.0, None);
        s.absorb(&c, update(0, 7, vec![3.0, 4.0]).into()).unwrap(); // clipped to (0.6, 0.8)
        s.absorb(&c, update(1, 3, vec![0.2, 0.0]).into()).unwrap(); // inside the bound
        assert!(s.absorb(&c, update(2, 1, vec![0.0]).into()).is_err());
        let group = s.take().unwrap().unwrap();
        assert_eq!(group.contributors, 2);
        assert_eq!(group.weight, 2.0);
        assert_eq!(group.clip_bound, Some(1.0));
        let got: Vec<f32> = group.sum.into_values();
        assert!(
            (got[0] - 0.8).abs() < 1e-6 && (got[1] - 0.8).abs() < 1e-6,
            "{got:?}"
        );
    }

    #[test]
    fn weights_by_examples_without_a_clip_and_is_empty_without_results() {
        let rule = GroupRule {
            clip_bound: None,
            weight_by_examples: true,
            secure: None,
        };
        let mut s = GroupSummer::new(1, rule);
        let c = ctx(1, 2.0, None);
        s.absorb(&c, update(0, 3, vec![2.0]).into()).unwrap();
        s.absorb(&c, update(1, 1, vec![-1.0]).into()).unwrap();
        let group = s.take().unwrap().unwrap();
        assert_eq!((group.weight, group.sum.into_values()), (4.0, vec![5.0]));
        assert!(GroupSummer::new(1, rule).take().unwrap().is_none());
    }
    fn secure_rule(min_survivors: usize) -> SecureRule {
        SecureRule {
            threshold: 0.7,
            min_survivor_fraction: 0.5,
            min_survivors,
            degree: None,
            stage_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_secure_group_forwards_its_survivors_sum_and_nothing_else() {
        let rule = GroupRule {
            clip_bound: None,
            weight_by_examples: false,
            secure: Some(secure_rule(3)),
        };
        let input = |sum: Vec<f32>| SumInput {
            sum,
            contributors: 5,
            clip_bound: 1.5,
            sensitivity: 1.6,
            noise_std: None,
        };
        let c = ctx(1, 6.0, None);
        let mut s = GroupSummer::new(2, rule);
        assert!(s.absorb(&c, Upload::Sum(input(vec![1.0]))).is_err());
        s.absorb(&c, Upload::Sum(input(vec![1.0, -2.0]))).unwrap();
        let group = s.take().unwrap().unwrap();
        assert_eq!(
            (group.contributors, group.weight, group.clip_bound),
            (5, 5.0, Some(1.5))
        );
        assert_eq!(group.sum.into_values(), vec![1.0, -2.0]);
        // A plain group takes no secure sum.
        let plain = GroupRule {
            secure: None,
            ..rule
        };
        let refused = GroupSummer::new(2, plain).absorb(&c, Upload::Sum(input(vec![0.0; 2])));
        assert!(refused.is_err());
    }

    #[test]
    fn a_group_needs_its_own_share_of_survivors_and_at_least_the_rounds_floor() {
        // max(3, ceil(0.5 m_g)), and never below the n_min the noise was charged for.
        assert_eq!(secure_rule(0).survivors_of(4), 3);
        assert_eq!(secure_rule(0).survivors_of(11), 6);
        assert_eq!(secure_rule(5).survivors_of(4), 5);
        assert_eq!(secure_rule(5).survivors_of(20), 10);
    }
}
