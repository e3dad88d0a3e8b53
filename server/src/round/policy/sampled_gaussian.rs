//! Central Gaussian noise on a sampled round (Geyer et al. 2017; McMahan et al. 2018): the round
//! is a subsampled Gaussian mechanism with rate q_t and multiplier z_t, or, when the
//! participants are public ([`CentralAccounting::Unsampled`]), the Gaussian mechanism of
//! multiplier z_t without amplification.
//!
//! - Poisson sampling includes each connected client with q_t = m_t / K, and the aggregate is
//!   divided by the public expectation q_t K = m_t, never by the private number that took part.
//! - Fixed-size sampling draws m_t of the connected clients, so its rate is taken as
//!   m_t / min(K, connected): when fewer than K are connected the real rate is higher than
//!   m_t / K, and this errs towards a larger epsilon.

use super::{Cohort, RoundPlan, RoundPolicy, fixed_size, poisson};
use crate::config::plan::CentralAccounting;
use crate::error::ServerError;
use crate::identity::ids::ClientId;
use crate::round::strategy::RoundContext;
use fl_common::schedule::Schedule;
use fl_privacy::{GaussianRound, PrivacyEvent, Sampling, UnsampledGaussian};
use rand::rngs::StdRng;

/// See the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SampledGaussian {
    /// Who takes part.
    pub cohort: Cohort,
    /// Poisson or fixed-size.
    pub sampling: Sampling,
    /// Sampled, or with the participants public.
    pub accounting: CentralAccounting,
    /// z_t.
    pub noise_multiplier: Schedule,
}

impl SampledGaussian {
    /// The accountant's view of round `round` when `connected` clients are connected.
    pub(crate) fn event(&self, round: u64, connected: usize) -> PrivacyEvent {
        let noise_multiplier = self.noise_multiplier.at(round, self.cohort.rounds);
        match self.accounting {
            CentralAccounting::Unsampled(neighbours) => PrivacyEvent::from(UnsampledGaussian {
                noise_multiplier,
                neighbours,
            }),
            CentralAccounting::Sampled => PrivacyEvent::from(self.sampled(round, connected)),
        }
    }

    /// The sampled round `round` when `connected` clients are connected.
    fn sampled(&self, round: u64, connected: usize) -> GaussianRound {
        let m = self.cohort.at(round);
        let q = match self.sampling {
            Sampling::Poisson => m as f64 / self.cohort.clients as f64,
            Sampling::Fixed => {
                let population = self.cohort.clients.min(connected).max(m).max(1);
                m as f64 / population as f64
            }
        };
        GaussianRound {
            q,
            noise_multiplier: self.noise_multiplier.at(round, self.cohort.rounds),
            sampling: self.sampling,
        }
    }
}

impl RoundPolicy for SampledGaussian {
    fn plan(
        &mut self,
        round: u64,
        connected: &[ClientId],
        rng: &mut StdRng,
    ) -> Result<RoundPlan, ServerError> {
        let planned = self.cohort.at(round);
        let q = planned as f64 / self.cohort.clients as f64;
        let (sampled, expected_clients) = match self.sampling {
            Sampling::Poisson => (poisson(connected, q, rng), planned as f64),
            Sampling::Fixed => {
                let sampled = fixed_size(connected, planned, rng);
                let expected = sampled.len().max(1) as f64;
                (sampled, expected)
            }
        };
        Ok(RoundPlan {
            planned,
            sampled,
            ctx: RoundContext {
                round,
                expected_clients,
                noise_multiplier: Some(self.noise_multiplier.at(round, self.cohort.rounds)),
                stream_step: None,
            },
            event: Some(self.event(round, connected.len())),
            calibration: None,
        })
    }

    fn sampling(&self) -> Sampling {
        self.sampling
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn policy(sampling: Sampling) -> SampledGaussian {
        SampledGaussian {
            cohort: Cohort {
                clients: 100,
                per_round: 10.0.into(),
                rounds: 5,
            },
            sampling,
            accounting: CentralAccounting::Sampled,
            noise_multiplier: 1.5.into(),
        }
    }

    /// Poisson rounds divide by the public m_t and are accounted at q = m/K; fixed-size rounds
    /// with fewer than K connected are accounted at the higher rate m / connected.
    #[test]
    fn the_rate_and_the_divisor_follow_the_sampling() {
        let connected: Vec<ClientId> = (0..50).collect();
        let mut rng = StdRng::seed_from_u64(3);
        let poisson = policy(Sampling::Poisson)
            .plan(1, &connected, &mut rng)
            .unwrap();
        assert_eq!(poisson.ctx.expected_clients, 10.0);
        assert_eq!(poisson.ctx.noise_multiplier, Some(1.5));
        let Some(PrivacyEvent::SampledGaussian(e)) = poisson.event else {
            panic!("a Gaussian round")
        };
        assert_eq!(e.q, 0.1);
        let fixed = policy(Sampling::Fixed)
            .plan(1, &connected, &mut rng)
            .unwrap();
        assert_eq!(
            (fixed.sampled.len(), fixed.ctx.expected_clients),
            (10, 10.0)
        );
        let Some(PrivacyEvent::SampledGaussian(e)) = fixed.event else {
            panic!("a Gaussian round")
        };
        assert_eq!(e.q, 10.0 / 50.0);
    }
}
