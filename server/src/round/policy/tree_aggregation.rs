//! DP-FTRL's tree aggregation (Kairouz et al. 2021, "Practical and Private (Deep) Learning
//! without Sampling or Shuffling", Alg. 1 with restarts) as a [`NoiseSchedule`]: no sampling
//! amplification is claimed, so clients may be taken as they are available; what the accounting
//! needs instead is that a client contributes at most once per tree. The tree restarts every
//! `tree_steps` steps and when the server restarts (its noise is never written down). Each
//! step's event is its step in the tree ([`TreeRound`]).

use super::noise_schedule::NoiseSchedule;
use crate::identity::ids::ClientId;
use crate::round::strategy::{CorrelatedNoise, FtrlNoise};
use fl_privacy::{PrivacyEvent, TreeRound};
use std::collections::BTreeSet;

/// See the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TreeSchedule {
    /// z: each node's multiplier (one per run: a tree's nodes share it).
    noise_multiplier: f64,
    /// Steps per tree.
    tree_steps: u64,
    /// The current step in its tree, from 1 (0 before the first).
    step: u64,
    /// Who contributed to the current tree.
    members: BTreeSet<ClientId>,
}

impl TreeSchedule {
    /// Trees of `tree_steps` steps (at least 1), nodes of multiplier `z`.
    pub(crate) fn new(noise_multiplier: f64, tree_steps: u64) -> Self {
        Self {
            noise_multiplier,
            tree_steps: tree_steps.max(1),
            step: 0,
            members: BTreeSet::new(),
        }
    }
}

impl NoiseSchedule for TreeSchedule {
    fn noise_multiplier(&self) -> f64 {
        self.noise_multiplier
    }

    fn step(&self) -> u64 {
        self.step
    }

    fn advance(&mut self) {
        if self.step == self.tree_steps {
            self.step = 0;
            self.members.clear();
        }
        self.step += 1;
    }

    fn event(&self) -> PrivacyEvent {
        TreeRound::zero_out(self.noise_multiplier, self.step).into()
    }

    fn may_contribute(&self, client: ClientId) -> bool {
        !self.members.contains(&client)
    }

    fn contributes(&mut self, client: ClientId) -> bool {
        self.members.insert(client)
    }

    fn noise(&self, dim: usize) -> Box<dyn CorrelatedNoise> {
        Box::new(FtrlNoise::new(dim))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Trees of 3 steps: the steps run 1, 2, 3 and start again, each step spends its tree step,
    /// and no identity enters a tree twice.
    #[test]
    fn one_identity_never_twice_in_a_tree() {
        let mut schedule = TreeSchedule::new(1.5, 3);
        let arrivals: [&[ClientId]; 6] = [&[1, 2], &[1, 3], &[4, 2], &[1, 2], &[3, 3], &[5, 6]];
        let mut in_tree = BTreeSet::new();
        for (i, clients) in arrivals.iter().enumerate() {
            schedule.advance();
            let step = i as u64 % 3 + 1;
            if step == 1 {
                in_tree.clear();
            }
            assert_eq!(schedule.step(), step);
            let PrivacyEvent::TreeAggregation(e) = schedule.event() else {
                panic!("a tree step")
            };
            assert_eq!((e.tree_step, e.noise_multiplier), (step, 1.5));
            for &c in *clients {
                let fresh = in_tree.insert(c);
                assert_eq!(schedule.may_contribute(c), fresh, "step {i}, client {c}");
                assert_eq!(schedule.contributes(c), fresh, "step {i}, client {c}");
            }
        }
    }
}
