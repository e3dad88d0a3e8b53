//! Tree aggregation for DP-FTRL (Kairouz, McMahan, Song, Thakkar, Thakurta, Xu 2021, "Practical
//! and Private (Deep) Learning without Sampling or Shuffling"): the noise and its accounting.
//!
//! Round t of a tree releases the prefix sum S_t = sum_{i <= t} g_i of the clipped sums g_i with
//! the noise of the dyadic intervals that cover [1, t], one N(0, sigma^2) vector per node of a
//! binary tree over the rounds (the paper's Alg. 1, "tree aggregation"). The model moves by
//! differences of consecutive S_t: post-processing of the tree's node values.
//!
//! Accounting. Each client contributes at most once per tree, and a neighbouring dataset zeroes
//! one client's contributions where they occur (dp_accounting's `REPLACE_SPECIAL`; the
//! participation pattern does not change). After n steps the released nodes are the complete
//! dyadic intervals inside [1, n]: a leaf lies in at most depth(n) = ceil(log2(n + 1)) of them
//! (one per level l with 2^l <= n), so the tree is a Gaussian mechanism of sensitivity
//! S sqrt(depth(n)), RDP alpha depth(n) / (2 z^2) (the paper's App. D; dp_accounting's
//! `_compute_rdp_single_epoch_tree_aggregation`). Trees compose. Per round,
//! depth(n) - depth(n - 1) = [n is a power of two]: step n releases one more node of multiplier z
//! exactly when n is a power of two ([`TreeRound::node`]), so the rounds of the ledger compose to
//! sum over trees of depth(n_i) nodes. This counts every tree separately, which is valid when a
//! client may return in a later tree; dp_accounting's single-epoch event (a client in at most one
//! tree in all) charges only the deepest tree and is smaller.
//!
//! The participation rule is [`TreeStream`]'s: no sampling amplification is claimed, so clients
//! may be taken as they are available, each at most once per tree; the tree restarts every
//! `rounds` steps and when the server restarts (its noise is never written down).
//!
//! The online tree is written here: it is a few lines over [`crate::add_gaussian_noise`], and no
//! maintained crate offers it.

mod round;

pub use round::TreeRound;

use super::{Charges, CorrelatedNoise, NoiseStream, StepMismatch, StreamError, StreamRun};
use crate::gaussian::add_gaussian_noise;
use crate::sampled_gaussian::GaussianRound;
use rand::rngs::StdRng;
use rand::{CryptoRng, Rng};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// depth(n) = ceil(log2(n + 1)): the nodes of a tree of n steps that hold one leaf.
pub fn tree_depth(steps: u64) -> u64 {
    u64::from(u64::BITS - steps.leading_zeros())
}

/// The Gaussian nodes a client's worst case holds after `rounds` rounds of trees restarted every
/// `tree_rounds` rounds: sum over trees of depth(n_i).
pub fn tree_nodes(rounds: u64, tree_rounds: u64) -> u64 {
    let tree_rounds = tree_rounds.max(1);
    (rounds / tree_rounds) * tree_depth(tree_rounds) + tree_depth(rounds % tree_rounds)
}

/// The most rounds whose trees of `tree_rounds` rounds hold at most `nodes` Gaussian nodes (the
/// inverse of [`tree_nodes`]): whole trees of depth(n) nodes, then 2^r - 1 steps of a tree for
/// the r nodes left (depth(2^r - 1) = r).
pub fn tree_rounds_within(nodes: u64, tree_rounds: u64) -> u64 {
    let n = tree_rounds.max(1);
    let (trees, rest) = (nodes / tree_depth(n), nodes % tree_depth(n));
    trees * n + ((1u64 << rest) - 1)
}

/// The noise of one tree, online: after step t it holds one N(0, std^2) vector per node of the
/// dyadic decomposition of [1, t] (the set bits of t) and their sum, the noise in S_t.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeNoise {
    dim: usize,
    /// t: the steps taken.
    step: u64,
    /// (level, noise) of the decomposition's nodes, highest level first.
    nodes: Vec<(u32, Vec<f32>)>,
    /// Their sum.
    total: Vec<f32>,
}

impl TreeNoise {
    /// A tree over `dim` coordinates before its first step.
    pub fn new(dim: usize) -> Self {
        Self {
            dim,
            step: 0,
            nodes: Vec::new(),
            total: vec![0.0; dim],
        }
    }

    /// t.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Takes step t + 1 and returns the noise in S_{t+1}. The nodes below level
    /// l = trailing_zeros(t + 1) end inside the new node of level l, which replaces them with
    /// fresh N(0, std^2) noise; higher nodes stay. `rng` must be a CSPRNG.
    pub fn advance<R: Rng + CryptoRng>(&mut self, std: f64, rng: &mut R) -> &[f32] {
        self.step += 1;
        let level = self.step.trailing_zeros();
        while self.nodes.last().is_some_and(|(l, _)| *l < level) {
            self.nodes.pop();
        }
        let mut node = vec![0.0f32; self.dim];
        add_gaussian_noise(&mut node, std, rng);
        self.nodes.push((level, node));
        // Summed afresh (log2 t vectors) rather than updated, so no rounding error accumulates.
        self.total.iter_mut().for_each(|v| *v = 0.0);
        for (_, node) in &self.nodes {
            for (t, n) in self.total.iter_mut().zip(node) {
                *t += n;
            }
        }
        &self.total
    }
}

/// `[privacy.noise.tree]`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TreeSettings {
    /// Steps per tree (the restart period); unset: K / m_1 (K / M asynchronously), one pass over
    /// the clients. Each client contributes at most once per tree, which needs stable
    /// identities: `fl-server` refuses DP-FTRL without `server.enrollment`, and `fl sim` enrolls
    /// its own clients.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rounds: Option<u64>,
}

/// Tree aggregation as a run's stream: trees of `rounds` steps, each identity at most once per
/// tree (module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct TreeStream {
    /// z: each node's multiplier (one per run: a tree's nodes share it).
    noise_multiplier: f64,
    /// Steps per tree.
    tree_steps: u64,
    /// The current step in its tree, from 1 (0 before the first).
    step: u64,
    /// Who contributed to the current tree.
    members: BTreeSet<u64>,
}

impl TreeStream {
    /// Trees of `tree_steps` steps (at least 1), nodes of multiplier `z`.
    pub fn new(noise_multiplier: f64, tree_steps: u64) -> Self {
        Self {
            noise_multiplier,
            tree_steps: tree_steps.max(1),
            step: 0,
            members: BTreeSet::new(),
        }
    }

    /// Steps per tree.
    pub fn tree_steps(&self) -> u64 {
        self.tree_steps
    }
}

impl NoiseStream for TreeStream {
    type Settings = TreeSettings;
    type Event = TreeRound;

    /// Trees of `rounds` steps, one pass by default; asynchronously a tree's steps must fill
    /// with distinct identities.
    fn plan(settings: &TreeSettings, run: &StreamRun) -> Result<Self, StreamError> {
        let rounds = run.period("rounds", settings.rounds)?;
        run.check_fills("rounds", rounds)?;
        Ok(Self::new(run.noise_multiplier, rounds))
    }

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

    fn event(&self) -> TreeRound {
        TreeRound::zero_out(self.noise_multiplier, self.step)
    }

    fn may_contribute(&self, identity: u64) -> bool {
        !self.members.contains(&identity)
    }

    fn contributes(&mut self, identity: u64) -> bool {
        self.members.insert(identity)
    }

    fn noise(&self, dim: usize) -> Box<dyn CorrelatedNoise> {
        Box::new(PrefixNoise::new(dim))
    }

    /// The nodes of the trees of `steps` steps, each a Gaussian of multiplier z.
    fn charges(&self, steps: u64) -> Charges {
        Charges {
            charge: GaussianRound::unsampled(self.noise_multiplier),
            count: tree_nodes(steps, self.tree_steps),
        }
    }

    fn steps_within(&self, count: u64, cap: u64) -> u64 {
        tree_rounds_within(count, self.tree_steps).min(cap)
    }
}

/// The noise of the current tree on the released sums, and the noise already in the model.
///
/// Round t of a tree releases the prefix sum S_t = sum_{i <= t} g_i + N_t, N_t the tree's noise
/// ([`TreeNoise`]); the model moves by differences of released prefix sums, so the noise in the
/// global model is always N of the last released round of the tree: the round's sum g_t gets
/// N_t - N_applied.
#[derive(Debug)]
struct PrefixNoise {
    tree: TreeNoise,
    /// N_applied: the tree noise in the global model (zero at the tree's start).
    applied: Vec<f32>,
    /// N_t of the round awaiting the curator's release decision.
    pending: Option<Vec<f32>>,
}

impl PrefixNoise {
    /// An empty tree over `dim` coordinates.
    fn new(dim: usize) -> Self {
        Self {
            tree: TreeNoise::new(dim),
            applied: vec![0.0; dim],
            pending: None,
        }
    }
}

impl CorrelatedNoise for PrefixNoise {
    /// Adds N_t - N_applied to the round's sum, N_t drawn at node standard deviation `std`,
    /// round t being step `step` of its tree (1 starts a new one).
    fn add(
        &mut self,
        sum: &mut [f32],
        step: u64,
        std: f64,
        rng: &mut StdRng,
    ) -> Result<(), StepMismatch> {
        if step == 1 {
            *self = Self::new(sum.len());
        }
        if step != self.tree.step() + 1 {
            return Err(StepMismatch {
                stream: self.tree.step(),
                round: step,
            });
        }
        let noise = self.tree.advance(std, rng);
        for ((s, n), a) in sum.iter_mut().zip(noise).zip(&self.applied) {
            *s += n - a;
        }
        self.pending = Some(noise.to_vec());
        Ok(())
    }

    /// A released round's N_t is now in the model.
    fn released(&mut self, applied: bool) {
        if let (true, Some(noise)) = (applied, self.pending.take()) {
            self.applied = noise;
        }
        self.pending = None;
    }
}

#[cfg(test)]
mod tests;
