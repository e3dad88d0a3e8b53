//! DP-FTRL's rounds (Kairouz et al. 2021, "Practical and Private (Deep) Learning without
//! Sampling or Shuffling"): no sampling amplification is claimed, so clients may be taken as
//! they are available; what the accounting needs instead is that a client contributes at most
//! once per tree. The policy keeps the clients of the current tree and draws each round's m_t
//! from the connected clients not among them; the tree restarts every `tree_rounds` rounds and
//! when the server restarts (its noise is never written down, see
//! `crate::round::strategy::CentralDp`). Each round's event is its step in the tree
//! ([`TreeRound`]); the aggregate is divided by the public m_t.

use super::{Cohort, RoundPlan, RoundPolicy, fixed_size};
use crate::error::ServerError;
use crate::identity::ids::ClientId;
use crate::round::strategy::RoundContext;
use fl_privacy::{PrivacyEvent, Sampling, TreeRound};
use rand::rngs::StdRng;
use std::collections::BTreeSet;

/// See the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TreeAggregation {
    cohort: Cohort,
    /// z: each node's multiplier (one per run: a tree's nodes share it).
    noise_multiplier: f64,
    /// Rounds per tree.
    tree_rounds: u64,
    /// Steps taken in the current tree.
    step: u64,
    /// The clients drawn in the current tree.
    used: BTreeSet<ClientId>,
}

impl TreeAggregation {
    /// Trees of `tree_rounds` rounds (at least 1) over `cohort`, nodes of multiplier `z`.
    pub(crate) fn new(cohort: Cohort, noise_multiplier: f64, tree_rounds: u64) -> Self {
        Self {
            cohort,
            noise_multiplier,
            tree_rounds: tree_rounds.max(1),
            step: 0,
            used: BTreeSet::new(),
        }
    }
}

impl RoundPolicy for TreeAggregation {
    fn plan(
        &mut self,
        round: u64,
        connected: &[ClientId],
        rng: &mut StdRng,
    ) -> Result<RoundPlan, ServerError> {
        if self.step == self.tree_rounds {
            self.step = 0;
            self.used.clear();
        }
        self.step += 1;
        let planned = self.cohort.at(round);
        let fresh: Vec<ClientId> = (connected.iter().copied())
            .filter(|c| !self.used.contains(c))
            .collect();
        let sampled = fixed_size(&fresh, planned, rng);
        self.used.extend(&sampled);
        let event = TreeRound::zero_out(self.noise_multiplier, self.step);
        Ok(RoundPlan {
            planned,
            sampled,
            ctx: RoundContext {
                round,
                expected_clients: planned.max(1) as f64,
                noise_multiplier: Some(self.noise_multiplier),
                tree_step: Some(self.step),
            },
            event: Some(PrivacyEvent::from(event)),
            calibration: None,
        })
    }

    fn sampling(&self) -> Sampling {
        Sampling::Fixed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// 10 clients, 3 per round, trees of 3 rounds: no client twice in a tree, the steps run
    /// 1, 2, 3 and start again, and the divisor is the public m.
    #[test]
    fn no_client_returns_within_a_tree() {
        let cohort = Cohort {
            clients: 10,
            per_round: 3.0.into(),
            rounds: 9,
        };
        let mut policy = TreeAggregation::new(cohort, 2.0, 3);
        let connected: Vec<ClientId> = (0..10).collect();
        let mut rng = StdRng::seed_from_u64(5);
        let mut tree = BTreeSet::new();
        for round in 1..=9u64 {
            let plan = policy.plan(round, &connected, &mut rng).unwrap();
            let step = (round - 1) % 3 + 1;
            if step == 1 {
                tree.clear();
            }
            assert_eq!(plan.ctx.tree_step, Some(step));
            assert_eq!(plan.ctx.expected_clients, 3.0);
            assert_eq!(plan.sampled.len(), 3);
            assert!(
                plan.sampled.iter().all(|c| tree.insert(*c)),
                "round {round}"
            );
            let Some(PrivacyEvent::TreeAggregation(e)) = plan.event else {
                panic!("a tree round")
            };
            assert_eq!((e.tree_step, e.noise_multiplier), (step, 2.0));
        }
    }

    /// When fewer fresh clients are connected than m, the round takes those it has.
    #[test]
    fn a_tree_short_of_fresh_clients_takes_fewer() {
        let cohort = Cohort {
            clients: 4,
            per_round: 3.0.into(),
            rounds: 2,
        };
        let mut policy = TreeAggregation::new(cohort, 1.0, 5);
        let connected: Vec<ClientId> = (0..4).collect();
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(
            policy.plan(1, &connected, &mut rng).unwrap().sampled.len(),
            3
        );
        let second = policy.plan(2, &connected, &mut rng).unwrap();
        assert_eq!(second.sampled.len(), 1);
        assert_eq!(second.ctx.expected_clients, 3.0);
    }
}
