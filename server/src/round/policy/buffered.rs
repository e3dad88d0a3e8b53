//! The policy of asynchronous buffered aggregation: each server step's context and privacy
//! event. No client is sampled: clients arrive when they can, so no amplification by sampling
//! is claimed. Under DP-FTRL each step is a step of the tree (Kairouz et al. 2021, Alg. 1 with
//! restarts), and each identity enters a tree at most once ([`TreeMembers`]); the buffered sum
//! is divided by the public M.

use crate::identity::ids::ClientId;
use crate::round::buffer::TreeMembers;
use crate::round::strategy::RoundContext;
use fl_privacy::{PrivacyEvent, TreeRound};

/// DP-FTRL's trees over server steps.
#[derive(Debug)]
struct Trees {
    /// z: each node's multiplier.
    noise_multiplier: f64,
    /// Steps per tree.
    steps: u64,
    /// The current step in its tree, from 1.
    step: u64,
    /// Who contributed to the current tree.
    members: TreeMembers,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct BufferPolicy {
    /// M: updates per server step.
    pub size: usize,
    /// P: most clients training at once.
    pub concurrency: usize,
    /// The most steps an update may lag.
    pub max_staleness: u64,
    trees: Option<Trees>,
}

impl BufferPolicy {
    /// Steps of M = `size` updates without central accounting.
    pub(crate) fn new(size: usize, concurrency: usize, max_staleness: u64) -> Self {
        Self {
            size,
            concurrency,
            max_staleness,
            trees: None,
        }
    }

    /// The same, each step a step of a DP-FTRL tree of `tree_steps` steps with node multiplier
    /// z; a new tree starts with this process (its noise is never written down).
    pub(crate) fn with_trees(mut self, noise_multiplier: f64, tree_steps: u64) -> Self {
        self.trees = Some(Trees {
            noise_multiplier,
            steps: tree_steps.max(1),
            step: 1,
            members: TreeMembers::default(),
        });
        self
    }

    /// The context of the step that buffers round `round`.
    pub(crate) fn ctx(&self, round: u64) -> RoundContext {
        RoundContext {
            round,
            expected_clients: self.size as f64,
            noise_multiplier: self.trees.as_ref().map(|t| t.noise_multiplier),
            tree_step: self.trees.as_ref().map(|t| t.step),
        }
    }

    /// The privacy event of the current step, spent before its release.
    pub(crate) fn event(&self) -> Option<PrivacyEvent> {
        let t = self.trees.as_ref()?;
        Some(TreeRound::zero_out(t.noise_multiplier, t.step).into())
    }

    /// Whether `client` may still contribute to the current tree (always without trees).
    pub(crate) fn may_contribute(&self, client: ClientId) -> bool {
        self.trees
            .as_ref()
            .is_none_or(|t| !t.members.contains(client))
    }

    /// `client`'s update entered the buffer: it is in the current tree. False when it already
    /// was (the update must then not enter).
    pub(crate) fn contributes(&mut self, client: ClientId) -> bool {
        self.trees.as_mut().is_none_or(|t| t.members.insert(client))
    }

    /// A server step was taken: the tree's next step, or a new tree after its last.
    pub(crate) fn stepped(&mut self) {
        if let Some(t) = &mut self.trees {
            if t.step == t.steps {
                t.step = 1;
                t.members.clear();
            } else {
                t.step += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Trees of 3 steps: the steps run 1, 2, 3 and start again, every step divides by M and
    /// spends its tree step, and no identity enters a tree twice.
    #[test]
    fn one_identity_never_twice_in_a_tree() {
        let mut policy = BufferPolicy::new(2, 4, 5).with_trees(1.5, 3);
        let arrivals: [&[ClientId]; 6] = [&[1, 2], &[1, 3], &[4, 2], &[1, 2], &[3, 3], &[5, 6]];
        let mut in_tree = BTreeSet::new();
        for (i, clients) in arrivals.iter().enumerate() {
            let round = i as u64 + 1;
            let step = (round - 1) % 3 + 1;
            if step == 1 {
                in_tree.clear();
            }
            let ctx = policy.ctx(round);
            assert_eq!((ctx.tree_step, ctx.expected_clients), (Some(step), 2.0));
            let Some(PrivacyEvent::TreeAggregation(e)) = policy.event() else {
                panic!("a tree step")
            };
            assert_eq!((e.tree_step, e.noise_multiplier), (step, 1.5));
            for &c in *clients {
                let fresh = in_tree.insert(c);
                assert_eq!(policy.may_contribute(c), fresh, "round {round}, client {c}");
                assert_eq!(policy.contributes(c), fresh, "round {round}, client {c}");
            }
            policy.stepped();
        }
    }

    /// Without trees, anyone may contribute at every step and no event is spent.
    #[test]
    fn without_trees_steps_spend_nothing() {
        let mut policy = BufferPolicy::new(3, 5, 2);
        assert!(policy.contributes(1) && policy.contributes(1));
        assert_eq!(policy.event(), None);
        assert_eq!(policy.ctx(4).tree_step, None);
    }
}
