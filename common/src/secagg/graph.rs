//! The communication graph of a round: who masks with whom and who holds whose shares.
//!
//! `Complete` is the original protocol (Bonawitz et al. 2017): every pair of clients masks, so a
//! client's cost grows with n. `Regular(k)` is SecAgg+ (Bell et al. 2020): a random k-regular
//! Harary graph H_{k,n} (each client joined to the k/2 nearest on either side of a random
//! cyclic order), with k = O(log n), so per-client cost is O(k) and the server's O(n k).

use rand::seq::SliceRandom;
use rand::{CryptoRng, Rng};
use std::collections::{BTreeMap, BTreeSet};

/// Which graph a round uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphKind {
    /// Every pair of clients are neighbours.
    Complete,
    /// A random k-regular Harary graph; k is rounded up to even and capped at n - 1.
    Regular(usize),
}

/// The default SecAgg+ degree: the smallest even k >= 3 log2(n), at least 4 (Bell et al. take
/// k = O(log n); the constant trades cost against the chance that a neighbourhood falls below t).
pub fn auto_degree(n: usize) -> usize {
    let k = (3.0 * (n.max(2) as f64).log2()).ceil() as usize;
    (k + k % 2).max(4)
}

/// Each client's neighbour set for `clients` (distinct ids).
pub fn build<R: Rng + CryptoRng>(
    kind: GraphKind,
    clients: &[u64],
    rng: &mut R,
) -> BTreeMap<u64, BTreeSet<u64>> {
    let n = clients.len();
    let k = match kind {
        GraphKind::Complete => n.saturating_sub(1),
        GraphKind::Regular(k) => (k + k % 2).min(n.saturating_sub(1)),
    };
    let mut neighbours: BTreeMap<u64, BTreeSet<u64>> =
        clients.iter().map(|&c| (c, BTreeSet::new())).collect();
    if k + 1 >= n {
        for &a in clients {
            for &b in clients {
                if a != b {
                    neighbours.get_mut(&a).expect("listed").insert(b);
                }
            }
        }
        return neighbours;
    }
    let mut order = clients.to_vec();
    order.shuffle(rng);
    for (i, &a) in order.iter().enumerate() {
        for offset in 1..=k / 2 {
            let b = order[(i + offset) % n];
            neighbours.get_mut(&a).expect("listed").insert(b);
            neighbours.get_mut(&b).expect("listed").insert(a);
        }
    }
    neighbours
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn regular_graphs_are_regular_symmetric_and_loop_free() {
        let mut rng = StdRng::seed_from_u64(1);
        let clients: Vec<u64> = (100..1100).collect();
        let k = auto_degree(clients.len());
        assert_eq!(k, 30);
        let g = build(GraphKind::Regular(k), &clients, &mut rng);
        for (a, ns) in &g {
            assert_eq!(ns.len(), k);
            assert!(!ns.contains(a));
            assert!(ns.iter().all(|b| g[b].contains(a)));
        }
    }

    #[test]
    fn complete_and_small_graphs_join_everyone() {
        let mut rng = StdRng::seed_from_u64(2);
        let clients = [1u64, 2, 3, 4, 5];
        for kind in [
            GraphKind::Complete,
            GraphKind::Regular(4),
            GraphKind::Regular(9),
        ] {
            let g = build(kind, &clients, &mut rng);
            assert!(g.values().all(|ns| ns.len() == 4));
        }
        assert_eq!(
            build(GraphKind::Regular(3), &clients, &mut rng)[&1].len(),
            4
        );
        assert!(build(GraphKind::Complete, &[7], &mut rng)[&7].is_empty());
    }
}
