//! Banded matrix-factorization DP-FTRL (Choquette-Choo et al. 2023) as a [`NoiseSchedule`]: no
//! sampling amplification is claimed; what the accounting needs instead is that each enrolled
//! identity contributes at most once every b steps and at most k times in a stream
//! (`fl_privacy::BandedRound` says why). The stream and the identities' records start again
//! with the server process (its noise is never written down), and the new stream is accounted
//! from its own first step.

use super::noise_schedule::NoiseSchedule;
use crate::identity::ids::ClientId;
use crate::round::strategy::{BandedStream, CorrelatedNoise};
use fl_privacy::{BandedFactorization, BandedRound, Neighbours, PrivacyEvent};
use std::collections::HashMap;

/// See the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BandedSchedule {
    /// z: the multiplier of Z.
    noise_multiplier: f64,
    /// C's bands, p <= b.
    factorization: BandedFactorization,
    /// b.
    min_separation: u64,
    /// k (`None`: only b limits).
    max_participations: Option<u64>,
    /// t, from 1 (0 before the first).
    step: u64,
    /// Each identity's last step and contributions in this stream.
    seen: HashMap<ClientId, (u64, u64)>,
}

impl BandedSchedule {
    /// A stream of `factorization` (p <= `min_separation`, checked by the configuration) at
    /// multiplier `z`.
    pub(crate) fn new(
        noise_multiplier: f64,
        factorization: BandedFactorization,
        min_separation: u64,
        max_participations: Option<u64>,
    ) -> Self {
        Self {
            noise_multiplier,
            factorization,
            min_separation: min_separation.max(1),
            max_participations,
            step: 0,
            seen: HashMap::new(),
        }
    }
}

impl NoiseSchedule for BandedSchedule {
    fn noise_multiplier(&self) -> f64 {
        self.noise_multiplier
    }

    fn step(&self) -> u64 {
        self.step
    }

    fn advance(&mut self) {
        self.step += 1;
    }

    fn event(&self) -> PrivacyEvent {
        BandedRound {
            noise_multiplier: self.noise_multiplier,
            step: self.step,
            bands: self.factorization.bands() as u64,
            min_separation: self.min_separation,
            max_participations: self.max_participations,
            neighbours: Neighbours::ZeroOut,
        }
        .into()
    }

    fn may_contribute(&self, client: ClientId) -> bool {
        self.seen.get(&client).is_none_or(|&(last, count)| {
            self.step >= last + self.min_separation
                && self.max_participations.is_none_or(|k| count < k)
        })
    }

    fn contributes(&mut self, client: ClientId) -> bool {
        let may = self.may_contribute(client);
        if may {
            let entry = self.seen.entry(client).or_insert((0, 0));
            *entry = (self.step, entry.1 + 1);
        }
        may
    }

    fn noise(&self, dim: usize) -> Box<dyn CorrelatedNoise> {
        Box::new(BandedStream::new(&self.factorization, dim))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// b = 3, k = 2: an identity returns no sooner than 3 steps later, and not a third time;
    /// events carry the step and the rule they were accounted under.
    #[test]
    fn an_identity_returns_only_after_b_steps_and_at_most_k_times() {
        let c = BandedFactorization::square_root(3);
        let mut schedule = BandedSchedule::new(2.0, c, 3, Some(2));
        let mut took = Vec::new();
        for step in 1..=10u64 {
            schedule.advance();
            assert_eq!(schedule.step(), step);
            if schedule.contributes(7) {
                took.push(step);
            }
            assert!(!schedule.may_contribute(7) && !schedule.contributes(7));
            let PrivacyEvent::BandedMatrix(e) = schedule.event() else {
                panic!("a banded step")
            };
            assert_eq!((e.step, e.bands, e.min_separation), (step, 3, 3));
            assert_eq!(e.max_participations, Some(2));
        }
        assert_eq!(took, [1, 4]);
    }
}
