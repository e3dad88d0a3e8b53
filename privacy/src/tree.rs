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
//! The online tree is written here: it is a few lines over [`super::add_gaussian_noise`], and no
//! maintained crate offers it.

use super::ddg::Neighbours;
use super::gaussian::add_gaussian_noise;
use super::ledger_event::{LedgerEvent, gaussian_curve};
use super::sampled_gaussian::{GaussianRound, Sampling};
use rand::{CryptoRng, Rng};
use serde::{Deserialize, Serialize};

/// One round of tree aggregation, as the accountant sees it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TreeRound {
    /// z: each node's noise standard deviation over the clip bound S.
    pub noise_multiplier: f64,
    /// n: the round's step in its tree, from 1 (1 starts a new tree).
    pub tree_step: u64,
    /// The neighbouring relation (DP-FTRL's is zero-out, dp_accounting's `REPLACE_SPECIAL`;
    /// replace-one doubles a node's sensitivity).
    pub neighbours: Neighbours,
}

impl TreeRound {
    /// A zero-out round: step `tree_step` of a tree of nodes of multiplier `noise_multiplier`.
    pub fn zero_out(noise_multiplier: f64, tree_step: u64) -> Self {
        Self {
            noise_multiplier,
            tree_step,
            neighbours: Neighbours::ZeroOut,
        }
    }

    /// The node this step adds to a client's worst case: a Gaussian mechanism without sampling
    /// (q = 1) of multiplier z over the relation's sensitivity factor when n is a power of two,
    /// nothing otherwise (module documentation).
    pub fn node(&self) -> Option<GaussianRound> {
        self.tree_step.is_power_of_two().then_some(GaussianRound {
            q: 1.0,
            noise_multiplier: self.noise_multiplier / self.neighbours.sensitivity(1.0),
            sampling: Sampling::Poisson,
        })
    }
}

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

impl LedgerEvent for TreeRound {
    fn rdp_curve(&self, orders: &[f64]) -> Vec<f64> {
        gaussian_curve(self.node(), orders)
    }

    /// Its new node, if the step adds one to a client's worst case.
    fn as_gaussian(&self) -> Option<Option<GaussianRound>> {
        Some(self.node())
    }

    /// Correlated noise in memory only: a restarted server starts a new tree.
    fn reruns_after_crash(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Accountant, AccountantKind, PrivacyEvent, RdpAccountant};

    /// The rounds a node budget allows are the most rounds whose trees hold at most that many
    /// nodes.
    #[test]
    fn the_rounds_within_a_node_budget_are_the_most_that_fit() {
        for n in [1, 2, 3, 4, 7, 10, 64] {
            for nodes in 0..40 {
                let t = tree_rounds_within(nodes, n);
                assert!(tree_nodes(t, n) <= nodes, "n = {n}, {nodes} nodes: {t}");
                assert!(tree_nodes(t + 1, n) > nodes, "n = {n}, {nodes} nodes: {t}");
            }
        }
    }
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn depth_counts_the_levels_of_a_leaf() {
        let depths: Vec<u64> = (0..=9).map(tree_depth).collect();
        assert_eq!(depths, [0, 1, 2, 2, 3, 3, 3, 3, 4, 4]);
        assert_eq!(tree_nodes(25, 10), 4 + 4 + 3);
        assert_eq!(tree_nodes(20, 10), 8);
        // Replace-one neighbours move a node by 2S: multiplier z/2.
        let replace_one = TreeRound {
            neighbours: Neighbours::ReplaceOne,
            ..TreeRound::zero_out(3.0, 4)
        };
        assert_eq!(replace_one.node().unwrap().noise_multiplier, 1.5);
        // Per step: one node exactly at the powers of two.
        for n in 1..=300u64 {
            let added = u64::from(TreeRound::zero_out(1.0, n).node().is_some());
            assert_eq!(added, tree_depth(n) - tree_depth(n - 1), "step {n}");
        }
    }

    /// The noise in S_t is the sum of one independent node per set bit of t: its variance is
    /// popcount(t) std^2, and nodes that S_t and S_{t+1} share cancel in their difference.
    #[test]
    fn prefix_noise_has_one_node_per_set_bit() {
        let (dim, std) = (40_000, 0.5);
        let mut tree = TreeNoise::new(dim);
        let mut rng = StdRng::seed_from_u64(11);
        let mut previous = vec![0.0f32; dim];
        for t in 1..=12u64 {
            let noise = tree.advance(std, &mut rng).to_vec();
            let var = noise.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / dim as f64;
            let expected = f64::from(t.count_ones()) * std * std;
            // The sample variance of n draws has relative standard error sqrt(2/n) = 0.7%:
            // checked at 5 of them.
            assert!(
                (var / expected - 1.0).abs() < 5.0 * (2.0 / dim as f64).sqrt(),
                "t = {t}: {var} vs {expected}"
            );
            // From t = 4 to 5 the node [1, 4] stays: the difference is the new leaf alone.
            if t == 5 {
                let diff: Vec<f32> = noise.iter().zip(&previous).map(|(a, b)| a - b).collect();
                let var = diff.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / dim as f64;
                assert!((var / (std * std) - 1.0).abs() < 0.05, "{var}");
            }
            previous = noise;
        }
        assert_eq!(tree.step(), 12);
    }

    /// Reference values from Google's dp_accounting 0.6.0 (`scripts/tree-reference.py`): RDP
    /// accountant, `REPLACE_SPECIAL`, `SelfComposedDpEvent(SingleEpochTreeAggregationDpEvent(z,
    /// n), trees)`: epsilon at delta = 1e-5 for `trees` trees of n steps each.
    const DP_ACCOUNTING: &str = include_str!("../tests/data/tree_rdp.csv");

    /// The ledger's rounds, step by step, give dp_accounting's epsilon for whole trees to 1%.
    #[test]
    fn tree_rounds_match_dp_accounting() {
        let mut rows = 0;
        for line in DP_ACCOUNTING.lines().skip(1) {
            let f: Vec<f64> = line.split(',').map(|v| v.parse().unwrap()).collect();
            let (z, n, trees, delta, reference) = (f[0], f[1] as u64, f[2] as u64, f[3], f[4]);
            let mut acc = RdpAccountant::default();
            for _ in 0..trees {
                for step in 1..=n {
                    let round = TreeRound::zero_out(z, step);
                    acc.compose(&PrivacyEvent::TreeAggregation(round), 1);
                }
            }
            let eps = acc.epsilon(delta);
            assert!(
                (eps / reference - 1.0).abs() < 0.01,
                "z = {z}, {trees} trees of {n}: {eps} vs dp_accounting {reference}"
            );
            rows += 1;
        }
        assert!(rows >= 10, "{rows} reference rows");
    }

    /// Under PLD the tree's nodes are Gaussian mechanisms without sampling: D nodes of
    /// multiplier z are one Gaussian of multiplier z / sqrt(D), whose exact delta(epsilon) is
    /// Balle and Wang's (2018, Thm 8). PLD's discretisation errs upwards: within 2% above.
    #[test]
    fn pld_of_the_tree_is_the_composed_gaussian() {
        let (z, n, trees) = (3.0, 100, 3);
        let mut acc = AccountantKind::Pld.accountant();
        for _ in 0..trees {
            for step in 1..=n {
                let round = TreeRound::zero_out(z, step);
                acc.compose(&PrivacyEvent::TreeAggregation(round), 1);
            }
        }
        let nodes = tree_nodes(trees * n, n) as f64;
        assert_eq!(nodes, 21.0);
        for eps in [1.0, 2.0, 4.0] {
            let exact = crate::gaussian_delta(z / nodes.sqrt(), 1.0, eps);
            let pld = acc.delta(eps);
            assert!(
                pld >= exact * 0.999 && pld <= exact * 1.02,
                "eps {eps}: PLD {pld} vs exact {exact}"
            );
        }
    }
}
