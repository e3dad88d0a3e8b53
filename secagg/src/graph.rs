//! The communication graph of a round: who masks with whom and who holds whose shares.
//!
//! `Complete` is the original protocol (Bonawitz et al. 2017): every pair of clients masks, so a
//! client's cost grows with n. `Regular(k)` is SecAgg+ (Bell et al. 2020): a k-regular Harary
//! graph H_{k,n} (each client joined to the k/2 nearest on either side of a cyclic order), with
//! k = O(log n), so per-client cost is O(k) and the server's O(n k).
//!
//! The server does not draw the cyclic order: it is derived from public data that every client
//! can recompute and check (docs/src/reference/protocol.md, "Neighbour graph"). A client's place is
//! SHA-256("flp.v1 secagg graph" || round || H(task) || label), its label being 0x01, u16 length
//! and the name its certificate gives it, or 0x00 and its id u64 when keys are unsigned; U1 is
//! ordered by place. The server cannot choose a certified client's place (the authority names
//! clients, and the server learns a round's places only once it fixed the task); what it can
//! still choose is whom to admit, which docs/src/explanation/threat-model.md bounds.

use super::keys::RoundTag;
use super::messages::Member;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};

/// Domain string of a client's place in the cyclic order.
const PLACE_DOMAIN: &[u8] = b"flp.v1 secagg graph";

/// Which graph a round uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphKind {
    /// Every pair of clients are neighbours.
    Complete,
    /// A k-regular Harary graph; k is rounded up to even and capped at n - 1.
    Regular(usize),
}

/// The default SecAgg+ degree: the smallest even k >= 3 log2(n), at least 4 (Bell et al. take
/// k = O(log n); the constant trades cost against the chance that a neighbourhood falls below t).
pub fn auto_degree(n: usize) -> usize {
    let k = (3.0 * (n.max(2) as f64).log2()).ceil() as usize;
    (k + k % 2).max(4)
}

/// A member's place in the round's cyclic order.
fn place(tag: &RoundTag, member: &Member) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(PLACE_DOMAIN);
    h.update(tag.round.to_be_bytes());
    h.update(tag.digest.0);
    match &member.name {
        Some(name) => {
            h.update([1u8]);
            h.update((name.len() as u16).to_be_bytes());
            h.update(name.as_bytes());
        }
        None => {
            h.update([0u8]);
            h.update(member.id.to_be_bytes());
        }
    }
    h.finalize().into()
}

/// The degree of a `kind` graph over `n` members: n - 1 for the complete graph, k rounded up to
/// even and capped at n - 1 for a regular one.
fn degree(kind: GraphKind, n: usize) -> usize {
    match kind {
        GraphKind::Complete => n.saturating_sub(1),
        GraphKind::Regular(k) => (k + k % 2).min(n.saturating_sub(1)),
    }
}

/// The members' ids in the round's cyclic order (by place).
fn cyclic_order(tag: &RoundTag, members: &[Member]) -> Vec<u64> {
    let mut order: Vec<([u8; 32], u64)> = members.iter().map(|m| (place(tag, m), m.id)).collect();
    order.sort_unstable();
    order.into_iter().map(|(_, id)| id).collect()
}

/// Each member's neighbour set (members have distinct ids).
pub fn derive(tag: &RoundTag, kind: GraphKind, members: &[Member]) -> BTreeMap<u64, BTreeSet<u64>> {
    let n = members.len();
    let k = degree(kind, n);
    let mut neighbours: BTreeMap<u64, BTreeSet<u64>> =
        members.iter().map(|m| (m.id, BTreeSet::new())).collect();
    if k + 1 >= n {
        for a in members {
            let others = members.iter().filter(|b| b.id != a.id).map(|b| b.id);
            neighbours.get_mut(&a.id).expect("listed").extend(others);
        }
        return neighbours;
    }
    let order = cyclic_order(tag, members);
    for (i, &a) in order.iter().enumerate() {
        for offset in 1..=k / 2 {
            let b = order[(i + offset) % n];
            neighbours.get_mut(&a).expect("listed").insert(b);
            neighbours.get_mut(&b).expect("listed").insert(a);
        }
    }
    neighbours
}

/// `me`'s neighbour set in [`derive`]'s graph, without deriving the others' (a client checks
/// only its own): the k/2 members on either side of it in the cyclic order. `None` when `me` is
/// not a member.
pub fn neighbours_of(
    tag: &RoundTag,
    kind: GraphKind,
    members: &[Member],
    me: u64,
) -> Option<BTreeSet<u64>> {
    let n = members.len();
    let k = degree(kind, n);
    members.iter().find(|m| m.id == me)?;
    if k + 1 >= n {
        return Some(members.iter().map(|m| m.id).filter(|&b| b != me).collect());
    }
    let order = cyclic_order(tag, members);
    let i = order.iter().position(|&a| a == me)?;
    let around =
        (1..=k / 2).flat_map(|offset| [order[(i + offset) % n], order[(i + n - offset) % n]]);
    Some(around.collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::TaskDigest;

    fn tag(round: u64) -> RoundTag {
        RoundTag {
            round,
            digest: TaskDigest([7; 32]),
        }
    }

    fn members(ids: impl IntoIterator<Item = u64>) -> Vec<Member> {
        (ids.into_iter().map(|id| Member {
            id,
            name: None,
            keys: [0; 32],
        }))
        .collect()
    }

    #[test]
    fn regular_graphs_are_regular_symmetric_and_loop_free() {
        let clients = members(100..1100);
        let k = auto_degree(clients.len());
        assert_eq!(k, 30);
        let g = derive(&tag(1), GraphKind::Regular(k), &clients);
        for (a, ns) in &g {
            assert_eq!(ns.len(), k);
            assert!(!ns.contains(a));
            assert!(ns.iter().all(|b| g[b].contains(a)));
        }
    }

    /// One member's neighbours, derived alone, are its row of the whole graph.
    #[test]
    fn one_members_neighbours_match_the_whole_graph() {
        for (ids, kind) in [
            (members(0..50), GraphKind::Regular(6)),
            (members(0..50), GraphKind::Regular(7)),
            (members(0..9), GraphKind::Regular(8)),
            (members(3..40), GraphKind::Complete),
        ] {
            let g = derive(&tag(4), kind, &ids);
            for m in &ids {
                assert_eq!(
                    neighbours_of(&tag(4), kind, &ids, m.id).as_ref(),
                    Some(&g[&m.id])
                );
            }
            assert_eq!(neighbours_of(&tag(4), kind, &ids, 1000), None);
        }
    }

    #[test]
    fn complete_and_small_graphs_join_everyone() {
        let clients = members(1..=5);
        for kind in [
            GraphKind::Complete,
            GraphKind::Regular(4),
            GraphKind::Regular(9),
        ] {
            let g = derive(&tag(2), kind, &clients);
            assert!(g.values().all(|ns| ns.len() == 4));
        }
        assert_eq!(
            derive(&tag(2), GraphKind::Regular(3), &clients)[&1].len(),
            4
        );
        assert!(derive(&tag(2), GraphKind::Complete, &members([7]))[&7].is_empty());
    }

    /// A certified client's neighbours follow its name, not the id the server gave it, and
    /// another task places the clients anew.
    #[test]
    fn names_not_ids_place_certified_clients() {
        let named = |first: u64| -> Vec<Member> {
            (0..20)
                .map(|i| Member {
                    id: first + i,
                    name: Some(format!("site-{i}")),
                    keys: [0; 32],
                })
                .collect()
        };
        let kind = GraphKind::Regular(4);
        let a = derive(&tag(3), kind, &named(0));
        let b = derive(&tag(3), kind, &named(100));
        for i in 0..20 {
            let shifted: BTreeSet<u64> = b[&(i + 100)].iter().map(|v| v - 100).collect();
            assert_eq!(a[&i], shifted);
        }
        let other_task = RoundTag {
            digest: TaskDigest([8; 32]),
            ..tag(3)
        };
        assert_ne!(a, derive(&other_task, kind, &named(0)));
    }
}
