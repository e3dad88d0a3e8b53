//! The coordinator's registry of aggregators (the aggregator tier): which name holds which
//! group, each live aggregator's stream towards it and the clients it reports connected. A name
//! keeps its group across the aggregator's restarts. A second stream under a live name is
//! refused (one aggregator's token cannot take over another's group; a restarted aggregator
//! retries until its old stream has ended), and no more aggregators are live at once than
//! `server.aggregators`.

use crate::identity::ids::{self, ClientId, GroupId};
use fl_proto::v1::CoordinatorMessage;
use std::collections::{BTreeMap, HashMap};
use tokio::sync::mpsc;
use tonic::Status;

/// The sending half of an aggregator's Aggregate stream.
pub(crate) type GroupOutbox = mpsc::Sender<Result<CoordinatorMessage, Status>>;

/// A live aggregator.
#[derive(Debug)]
struct Live {
    /// The aggregator's name.
    name: String,
    /// Which of the name's streams this is.
    generation: u64,
    /// Towards its stream.
    outbox: GroupOutbox,
    /// Its connected clients, by the coordinator's ids.
    members: Vec<ClientId>,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    by_name: HashMap<String, GroupId>,
    live: BTreeMap<GroupId, Live>,
    next_generation: u64,
    /// Most aggregators live at once.
    cap: usize,
}

/// Why an aggregator's stream is refused a group.
#[derive(Debug, thiserror::Error, PartialEq)]
pub(crate) enum AttachRefusal {
    /// Its name is live on another stream.
    #[error("an aggregator named {0:?} is connected already")]
    LiveName(String),
    /// `server.aggregators` are live.
    #[error("{0} aggregators are connected, as many as server.aggregators allows")]
    Full(usize),
    /// No group id is left.
    #[error("no group left for another aggregator")]
    NoId,
}

/// Why a population report is refused.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("client id {0} does not fit a group member's id")]
pub(crate) struct TooLarge(pub ClientId);

impl Groups {
    /// No aggregator yet, at most `cap` live at once.
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            cap,
            ..Self::default()
        }
    }

    /// Binds `name`'s stream: its group (the one it had, or a new one) and the stream's
    /// generation; refused while the name is live, when `cap` aggregators are, or when no group
    /// id is left.
    pub(crate) fn attach(
        &mut self,
        name: &str,
        outbox: GroupOutbox,
    ) -> Result<(GroupId, u64), AttachRefusal> {
        let known = self.by_name.get(name).copied();
        if known.is_some_and(|g| self.live.contains_key(&g)) {
            return Err(AttachRefusal::LiveName(name.to_owned()));
        }
        if self.live.len() >= self.cap {
            return Err(AttachRefusal::Full(self.cap));
        }
        let next = GroupId::try_from(self.by_name.len() + 1).map_err(|_| AttachRefusal::NoId)?;
        let group = known.unwrap_or(next);
        ids::member(group, 0).ok_or(AttachRefusal::NoId)?;
        self.by_name.insert(name.to_owned(), group);
        self.next_generation += 1;
        let generation = self.next_generation;
        let live = Live {
            name: name.to_owned(),
            generation,
            outbox,
            members: Vec::new(),
        };
        self.live.insert(group, live);
        Ok((group, generation))
    }

    /// Records that stream `generation` of `group` reports `clients` (its own ids) connected;
    /// a stale stream's report changes nothing.
    pub(crate) fn report(
        &mut self,
        group: GroupId,
        generation: u64,
        clients: &[ClientId],
    ) -> Result<(), TooLarge> {
        let members = (clients.iter())
            .map(|&c| ids::member(group, c).ok_or(TooLarge(c)))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(live) = self.live.get_mut(&group)
            && live.generation == generation
        {
            live.members = members;
        }
        Ok(())
    }

    /// Forgets stream `generation` of `group`; false when it is not the group's live stream.
    pub(crate) fn detach(&mut self, group: GroupId, generation: u64) -> bool {
        let current = self
            .live
            .get(&group)
            .is_some_and(|l| l.generation == generation);
        if current {
            self.live.remove(&group);
        }
        current
    }

    /// Every live group's connected clients, by the coordinator's ids.
    pub(crate) fn members(&self) -> impl Iterator<Item = ClientId> + '_ {
        self.live.values().flat_map(|l| l.members.iter().copied())
    }

    /// Forgets every live stream; returns the ways towards them, for their last message.
    pub(crate) fn close_all(&mut self) -> Vec<GroupOutbox> {
        std::mem::take(&mut self.live)
            .into_values()
            .map(|l| l.outbox)
            .collect()
    }

    /// The stream towards `group`, if it is live.
    pub(crate) fn outbox(&self, group: GroupId) -> Option<GroupOutbox> {
        self.live.get(&group).map(|l| l.outbox.clone())
    }

    /// The name of live group `group`'s aggregator and its clients connected.
    pub(crate) fn describe(&self, group: GroupId) -> Option<(String, usize)> {
        (self.live.get(&group)).map(|l| (l.name.clone(), l.members.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outbox() -> GroupOutbox {
        mpsc::channel(1).0
    }

    #[test]
    fn a_name_keeps_its_group_and_a_stale_stream_changes_nothing() {
        let mut g = Groups::new(2);
        let (a, first) = g.attach("agg-a", outbox()).unwrap();
        let (b, _) = g.attach("agg-b", outbox()).unwrap();
        assert_eq!((a, b), (1, 2));
        g.report(a, first, &[0, 5]).unwrap();
        assert_eq!(
            g.members().collect::<Vec<_>>(),
            vec![1 << 40, (1 << 40) | 5]
        );
        // A second stream under agg-a's live name is refused, and a third aggregator too.
        let taken = g.attach("agg-a", outbox()).unwrap_err();
        assert_eq!(taken, AttachRefusal::LiveName("agg-a".into()));
        assert_eq!(g.attach("agg-c", outbox()), Err(AttachRefusal::Full(2)));
        assert_eq!(g.members().count(), 2);
        // agg-a's stream ends and it restarts: same group, a new stream; the old stream's
        // reports and end are stale.
        assert!(g.detach(a, first));
        let (again, second) = g.attach("agg-a", outbox()).unwrap();
        assert_eq!(again, a);
        g.report(a, first, &[7]).unwrap();
        assert!(!g.detach(a, first));
        assert_eq!(g.members().count(), 0);
        g.report(a, second, &[7]).unwrap();
        assert_eq!(g.members().collect::<Vec<_>>(), vec![(1 << 40) | 7]);
        assert!(g.detach(a, second));
        assert!(g.outbox(a).is_none() && g.outbox(b).is_some());
        assert_eq!(g.describe(b), Some(("agg-b".into(), 0)));
    }

    #[test]
    fn refuses_a_client_id_beyond_a_member_id() {
        let mut g = Groups::new(1);
        let (a, generation) = g.attach("agg-a", outbox()).unwrap();
        assert_eq!(g.report(a, generation, &[1 << 40]), Err(TooLarge(1 << 40)));
    }
}
