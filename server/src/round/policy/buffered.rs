//! The policy of asynchronous buffered aggregation: each server step's context and privacy
//! event. No client is sampled: clients arrive when they can, so no amplification by sampling
//! is claimed. Under DP-FTRL each server step is a step of the run's noise stream
//! ([`AnyStream`]: a tree's, with restarts, or a banded stream's), whose participation rule decides which
//! identities' updates may enter the buffer; the buffered sum is divided by the public M.

use crate::identity::ids::ClientId;
use crate::round::strategy::RoundContext;
use fl_privacy::{AnyStream, NoiseStream, PrivacyEvent};

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct BufferPolicy {
    /// M: updates per server step.
    pub size: usize,
    /// P: most clients training at once.
    pub concurrency: usize,
    /// The most steps an update may lag.
    pub max_staleness: u64,
    /// DP-FTRL's schedule, at the current step.
    schedule: Option<AnyStream>,
}

impl BufferPolicy {
    /// Steps of M = `size` updates without central accounting.
    pub(crate) fn new(size: usize, concurrency: usize, max_staleness: u64) -> Self {
        Self {
            size,
            concurrency,
            max_staleness,
            schedule: None,
        }
    }

    /// The same, each server step a step of `schedule`, from its first.
    pub(crate) fn with_schedule(mut self, mut schedule: AnyStream) -> Self {
        schedule.advance();
        self.schedule = Some(schedule);
        self
    }

    /// The context of the step that buffers round `round`.
    pub(crate) fn ctx(&self, round: u64) -> RoundContext {
        RoundContext {
            round,
            expected_clients: self.size as f64,
            noise_multiplier: self.schedule.as_ref().map(|s| s.noise_multiplier()),
            stream_step: self.schedule.as_ref().map(|s| s.step()),
        }
    }

    /// The privacy event of the current step, spent before its release.
    pub(crate) fn event(&self) -> Option<PrivacyEvent> {
        self.schedule.as_ref().map(|s| s.event())
    }

    /// Whether `client` may contribute to the current step (always without a schedule).
    pub(crate) fn may_contribute(&self, client: ClientId) -> bool {
        (self.schedule.as_ref()).is_none_or(|s| s.may_contribute(client))
    }

    /// `client`'s update entered the buffer. False when the schedule does not allow it (the
    /// update must then not enter).
    pub(crate) fn contributes(&mut self, client: ClientId) -> bool {
        (self.schedule.as_mut()).is_none_or(|s| s.contributes(client))
    }

    /// A server step was taken: the schedule's next step.
    pub(crate) fn stepped(&mut self) {
        if let Some(s) = &mut self.schedule {
            s.advance();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fl_privacy::TreeStream;
    use std::collections::BTreeSet;

    /// Trees of 3 steps: every step divides by M and carries its tree step, and an identity
    /// refused by the tree does not enter.
    #[test]
    fn steps_follow_the_schedule() {
        let mut policy =
            BufferPolicy::new(2, 4, 5).with_schedule(AnyStream::Tree(TreeStream::new(1.5, 3)));
        let arrivals: [&[ClientId]; 4] = [&[1, 2], &[1, 3], &[4, 2], &[1, 2]];
        let mut in_tree = BTreeSet::new();
        for (i, clients) in arrivals.iter().enumerate() {
            let round = i as u64 + 1;
            let step = (round - 1) % 3 + 1;
            if step == 1 {
                in_tree.clear();
            }
            let ctx = policy.ctx(round);
            assert_eq!((ctx.stream_step, ctx.expected_clients), (Some(step), 2.0));
            assert_eq!(ctx.noise_multiplier, Some(1.5));
            assert!(matches!(
                policy.event(),
                Some(PrivacyEvent::TreeAggregation(_))
            ));
            for &c in *clients {
                let fresh = in_tree.insert(c);
                assert_eq!(policy.may_contribute(c), fresh, "round {round}, client {c}");
                assert_eq!(policy.contributes(c), fresh, "round {round}, client {c}");
            }
            policy.stepped();
        }
    }

    /// Without a schedule, anyone may contribute at every step and no event is spent.
    #[test]
    fn without_a_schedule_steps_spend_nothing() {
        let mut policy = BufferPolicy::new(3, 5, 2);
        assert!(policy.contributes(1) && policy.contributes(1));
        assert_eq!(policy.event(), None);
        assert_eq!(policy.ctx(4).stream_step, None);
    }
}
