//! The identities the server hands out.

use std::collections::{BTreeMap, BTreeSet};

/// Identity the server assigns at Join.
pub(crate) type ClientId = u64;

/// An aggregator's group at its coordinator (the aggregator tier), from 1.
pub(crate) type GroupId = u32;

/// The bits of a group member's id that hold the id its aggregator gave it: a coordinator names
/// client c of group g `g << 40 | c`, and its own clients (below 2^40) keep theirs.
const MEMBER_BITS: u32 = 40;

/// The coordinator's id of client `local` of `group`, or `None` when `local` does not fit.
pub(crate) fn member(group: GroupId, local: ClientId) -> Option<ClientId> {
    (local >> MEMBER_BITS == 0).then(|| (u64::from(group) << MEMBER_BITS) | local)
}

/// The group of a coordinator's client id and the id its aggregator gave it; `None` for a
/// client of the coordinator's own.
pub(crate) fn group_of(id: ClientId) -> Option<(GroupId, ClientId)> {
    let group = GroupId::try_from(id >> MEMBER_BITS).ok()?;
    (group > 0).then_some((group, id & ((1 << MEMBER_BITS) - 1)))
}

/// The sizes of the groups with clients in `sampled` (the aggregator tier), fewest and most;
/// `None` when none of them belongs to a group.
pub(crate) fn group_extent(sampled: &BTreeSet<ClientId>) -> Option<(usize, usize)> {
    let mut sizes: BTreeMap<GroupId, usize> = BTreeMap::new();
    for (group, _) in sampled.iter().filter_map(|&id| group_of(id)) {
        *sizes.entry(group).or_default() += 1;
    }
    let fewest = sizes.values().min().copied()?;
    Some((fewest, sizes.values().max().copied().unwrap_or(fewest)))
}

/// What the registry keeps across a restart: the enrolled names' ids, and the first id not yet
/// handed out (so that no new client takes the id, and the strategy state, of an earlier one).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Identities {
    /// Enrolled name -> client id.
    pub names: BTreeMap<String, ClientId>,
    /// The next id to hand out.
    pub next_id: ClientId,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rounds_groups_are_told_apart_by_their_members_ids() {
        let sampled: BTreeSet<ClientId> = [(1, 0), (1, 7), (1, 9), (3, 2), (2, 0), (2, 1)]
            .into_iter()
            .map(|(g, c)| member(g, c).unwrap())
            .collect();
        assert_eq!(group_extent(&sampled), Some((1, 3)));
        assert_eq!(group_of(member(3, 2).unwrap()), Some((3, 2)));
        // The coordinator's own clients belong to no group.
        assert_eq!(group_extent(&[4, 5].into_iter().collect()), None);
        assert_eq!(member(1, 1 << MEMBER_BITS), None);
    }
}
