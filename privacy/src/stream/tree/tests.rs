use super::*;
use crate::{Accountant, AccountantKind, Neighbours, PrivacyEvent, RdpAccountant};
use rand::SeedableRng;
use rand::rngs::StdRng;

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
const DP_ACCOUNTING: &str = include_str!("../../../tests/data/tree_rdp.csv");

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

/// Trees of 3 steps: the steps run 1, 2, 3 and start again, each step spends its tree step,
/// and no identity enters a tree twice.
#[test]
fn one_identity_never_twice_in_a_tree() {
    let mut stream = TreeStream::new(1.5, 3);
    let arrivals: [&[u64]; 6] = [&[1, 2], &[1, 3], &[4, 2], &[1, 2], &[3, 3], &[5, 6]];
    let mut in_tree = BTreeSet::new();
    for (i, clients) in arrivals.iter().enumerate() {
        stream.advance();
        let step = i as u64 % 3 + 1;
        if step == 1 {
            in_tree.clear();
        }
        assert_eq!(stream.step(), step);
        let e = stream.event();
        assert_eq!((e.tree_step, e.noise_multiplier), (step, 1.5));
        for &c in *clients {
            let fresh = in_tree.insert(c);
            assert_eq!(stream.may_contribute(c), fresh, "step {i}, client {c}");
            assert_eq!(stream.contributes(c), fresh, "step {i}, client {c}");
        }
    }
}

/// Zero sums through three rounds with the second not released: the model's noise (the sum
/// of what was applied) is always the tree's N_t of the last released round, and the tree
/// accepts only the next step or a restart.
#[test]
fn the_model_carries_the_noise_of_the_last_released_prefix() {
    let (dim, std) = (8, 1.0);
    let mut noise = PrefixNoise::new(dim);
    let mut rng = StdRng::seed_from_u64(3);
    let mut model = vec![0.0f32; dim];
    for (step, release) in [(1, true), (2, false), (3, true)] {
        let mut sum = vec![0.0f32; dim];
        noise.add(&mut sum, step, std, &mut rng).unwrap();
        let n_t = noise.pending.clone().unwrap();
        noise.released(release);
        if release {
            model.iter_mut().zip(&sum).for_each(|(m, s)| *m += s);
            for (m, n) in model.iter().zip(&n_t) {
                assert!((m - n).abs() < 1e-5, "step {step}: {m} vs {n}");
            }
        }
    }
    let mut sum = vec![0.0f32; dim];
    let skipped = noise.add(&mut sum, 5, std, &mut rng);
    assert_eq!(
        skipped,
        Err(StepMismatch {
            stream: 3,
            round: 5
        })
    );
    noise.add(&mut sum, 1, std, &mut rng).unwrap();
    assert!(noise.applied.iter().all(|a| *a == 0.0), "a new tree");
}
