//! Round policies: what a round's privacy needs decided before its tasks go out. A
//! [`RoundPolicy`] alone answers whom to sample, the round's context (the expected count the
//! aggregate is divided by, the noise multiplier z_t) and the round's privacy event, which the
//! coordinator spends in the ledger. `crate::run::build` picks one per run from the privacy plan; one
//! file per kind: [`Plain`] (no central accounting), [`SampledGaussian`] (central noise on a
//! sampled round), [`DistributedNoise`] (the clients' discrete Gaussian under secure
//! aggregation), [`Correlated`] (DP-FTRL: no sampling, the participation rule and correlated
//! noise of the run's `fl_privacy::AnyStream`). An asynchronous run has no rounds
//! to plan: [`BufferPolicy`] gives its server steps' contexts and events.

mod buffered;
mod correlated;
mod distributed_noise;
mod plain;
mod sampled_gaussian;

pub(crate) use buffered::BufferPolicy;
pub(crate) use correlated::Correlated;
pub(crate) use distributed_noise::DistributedNoise;
pub(crate) use plain::Plain;
pub(crate) use sampled_gaussian::SampledGaussian;

use crate::error::ServerError;
use crate::identity::ids::{self, ClientId};
use crate::round::strategy::RoundContext;
use fl_common::schedule::Schedule;
use fl_privacy::{PrivacyEvent, Sampling};
use fl_secagg::Calibration;
use rand::Rng;
use rand::rngs::StdRng;
use std::collections::BTreeSet;

/// A round as its policy fixed it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RoundPlan {
    /// m_t: the clients the round asks for.
    pub planned: usize,
    /// Z_t: the clients drawn.
    pub sampled: BTreeSet<ClientId>,
    /// What every strategy call of the round is told.
    pub ctx: RoundContext,
    /// The round's privacy event, for the ledger (`None`: nothing to account centrally).
    pub event: Option<PrivacyEvent>,
    /// A secure round's code and noise, when the policy fixes them with its noise.
    pub calibration: Option<Calibration>,
}

/// The clients one secure sum is planned for and may hold at most: m_t and the clients sampled;
/// under the aggregator tier (`grouped`), where each group's sum reaches the coordinator on its
/// own, the smallest group's sampled clients and the largest's.
pub(crate) fn secure_extent(
    planned: usize,
    sampled: &BTreeSet<ClientId>,
    grouped: bool,
) -> (usize, usize) {
    match grouped {
        false => (planned, sampled.len()),
        true => ids::group_extent(sampled).unwrap_or((0, 0)),
    }
}

/// What decides a round's privacy; see the module documentation.
pub(crate) trait RoundPolicy: Send {
    /// Plans round `round` over the `connected` clients, drawing from `rng` (a CSPRNG).
    fn plan(
        &mut self,
        round: u64,
        connected: &[ClientId],
        rng: &mut StdRng,
    ) -> Result<RoundPlan, ServerError>;

    /// How participants are drawn, as the run's summary states it.
    fn sampling(&self) -> Sampling;

    /// The correction of the round's up-front charge once `survivors` clients' inputs are in its
    /// secure sum under `calibration` (`None`: the charge stands).
    fn settle(&self, _calibration: &Calibration, _survivors: usize) -> Option<PrivacyEvent> {
        None
    }
}

/// The clients of a run and how many each round asks for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cohort {
    /// K.
    pub clients: usize,
    /// m_t, a number or a schedule.
    pub per_round: Schedule,
    /// T.
    pub rounds: u64,
}

impl Cohort {
    /// m_t, rounded to a whole number of clients.
    pub(crate) fn at(&self, round: u64) -> usize {
        self.per_round.at(round, self.rounds).round() as usize
    }
}

/// m of the `available` clients, uniformly without replacement (all of them when fewer are
/// available), from the CSPRNG.
fn fixed_size(available: &[ClientId], m: usize, rng: &mut StdRng) -> BTreeSet<ClientId> {
    let m = m.min(available.len());
    rand::seq::index::sample(rng, available.len(), m)
        .into_iter()
        .map(|i| available[i])
        .collect()
}

/// The log's word on rounds of a fixed size that drew fewer than m clients: said when the
/// shortage starts or changes, and when it ends, not once per round.
#[derive(Debug, Default)]
pub(crate) struct Shortfall {
    /// (drawn, m) of the last round that was short; `None` when it was not.
    last: Option<(usize, usize)>,
}

impl Shortfall {
    /// Notes that round `round` drew `drawn` of the `m` clients it asked for; true when that
    /// was worth a log line (the shortage started, changed or ended).
    pub(crate) fn observe(&mut self, round: u64, drawn: usize, m: usize) -> bool {
        let now = (drawn < m).then_some((drawn, m));
        if now == self.last {
            return false;
        }
        match now {
            Some((available, m)) => tracing::warn!(
                round,
                available,
                m,
                "fewer clients available than m: rounds take all of them until more connect"
            ),
            None => tracing::info!(round, m, "m clients available again"),
        }
        self.last = now;
        true
    }
}

/// Each connected client independently with probability q, from the CSPRNG.
fn poisson(connected: &[ClientId], q: f64, rng: &mut StdRng) -> BTreeSet<ClientId> {
    (connected.iter().copied())
        .filter(|_| rng.random_bool(q))
        .collect()
}

/// The context of a round without central noise over the `sampled` clients.
fn unnoised(round: u64, sampled: &BTreeSet<ClientId>) -> RoundContext {
    RoundContext {
        round,
        expected_clients: sampled.len().max(1) as f64,
        noise_multiplier: None,
        stream_step: None,
    }
}

#[cfg(test)]
mod tests {
    use super::Shortfall;

    #[test]
    fn a_shortage_is_said_when_it_starts_changes_or_ends_not_every_round() {
        let mut shortfall = Shortfall::default();
        // (drawn, m) per round, and whether the log speaks.
        let rounds = [
            ((10, 10), false),
            ((8, 10), true),
            ((8, 10), false),
            ((8, 10), false),
            ((7, 10), true),
            ((10, 10), true),
            ((10, 10), false),
        ];
        for (round, ((drawn, m), says)) in (1..).zip(rounds) {
            assert_eq!(shortfall.observe(round, drawn, m), says, "round {round}");
        }
    }
}
