//! Synchronous DP-FTRL rounds over the run's noise stream ([`AnyStream`]): each round is the
//! stream's next step, and takes its m_t from the connected clients the stream still allows
//! (fewer when fewer are allowed); no sampling amplification is claimed. The round's event is
//! the stream's, its noise the stream's, and the aggregate is divided by the public m_t.

use super::{Cohort, RoundPlan, RoundPolicy, fixed_size};
use crate::error::ServerError;
use crate::identity::ids::ClientId;
use crate::round::strategy::RoundContext;
use fl_privacy::{AnyStream, NoiseStream, Sampling};
use rand::rngs::StdRng;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Correlated {
    cohort: Cohort,
    schedule: AnyStream,
}

impl Correlated {
    /// Rounds of `cohort` over `schedule`, from its first step.
    pub(crate) fn new(cohort: Cohort, schedule: AnyStream) -> Self {
        Self { cohort, schedule }
    }
}

impl RoundPolicy for Correlated {
    fn plan(
        &mut self,
        round: u64,
        connected: &[ClientId],
        rng: &mut StdRng,
    ) -> Result<RoundPlan, ServerError> {
        self.schedule.advance();
        let planned = self.cohort.at(round);
        let allowed: Vec<ClientId> = (connected.iter().copied())
            .filter(|c| self.schedule.may_contribute(*c))
            .collect();
        let sampled = fixed_size(&allowed, planned, rng);
        for client in &sampled {
            self.schedule.contributes(*client);
        }
        Ok(RoundPlan {
            planned,
            sampled,
            ctx: RoundContext {
                round,
                expected_clients: planned.max(1) as f64,
                noise_multiplier: Some(self.schedule.noise_multiplier()),
                stream_step: Some(self.schedule.step()),
            },
            event: Some(self.schedule.event()),
            calibration: None,
        })
    }

    fn sampling(&self) -> Sampling {
        Sampling::Fixed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fl_privacy::{PrivacyEvent, TreeStream};
    use rand::SeedableRng;
    use std::collections::BTreeSet;

    /// 10 clients, 3 per round, trees of 3 rounds: no client twice in a tree, the steps run
    /// 1, 2, 3 and start again, and the divisor is the public m.
    #[test]
    fn no_client_returns_within_a_tree() {
        let cohort = Cohort {
            clients: 10,
            per_round: 3.0.into(),
            rounds: 9,
        };
        let mut policy = Correlated::new(cohort, AnyStream::Tree(TreeStream::new(2.0, 3)));
        let connected: Vec<ClientId> = (0..10).collect();
        let mut rng = StdRng::seed_from_u64(5);
        let mut tree = BTreeSet::new();
        for round in 1..=9u64 {
            let plan = policy.plan(round, &connected, &mut rng).unwrap();
            let step = (round - 1) % 3 + 1;
            if step == 1 {
                tree.clear();
            }
            assert_eq!(plan.ctx.stream_step, Some(step));
            assert_eq!(plan.ctx.expected_clients, 3.0);
            assert_eq!(plan.sampled.len(), 3);
            assert!(
                plan.sampled.iter().all(|c| tree.insert(*c)),
                "round {round}"
            );
            let Some(PrivacyEvent::TreeAggregation(e)) = plan.event else {
                panic!("a tree round")
            };
            assert_eq!((e.tree_step, e.noise_multiplier), (step, 2.0));
        }
    }

    /// When fewer allowed clients are connected than m, the round takes those it has.
    #[test]
    fn a_tree_short_of_fresh_clients_takes_fewer() {
        let cohort = Cohort {
            clients: 4,
            per_round: 3.0.into(),
            rounds: 2,
        };
        let mut policy = Correlated::new(cohort, AnyStream::Tree(TreeStream::new(1.0, 5)));
        let connected: Vec<ClientId> = (0..4).collect();
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(
            policy.plan(1, &connected, &mut rng).unwrap().sampled.len(),
            3
        );
        let second = policy.plan(2, &connected, &mut rng).unwrap();
        assert_eq!(second.sampled.len(), 1);
        assert_eq!(second.ctx.expected_clients, 3.0);
    }
}
