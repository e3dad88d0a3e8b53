//! The distributed discrete Gaussian under secure aggregation (Kairouz, Liu, Steinke 2021): m_t
//! clients drawn uniformly; each adds discrete Gaussian noise to its quantised update, calibrated
//! ([`Calibration::plan`]) so that the survivors it is calibrated for (by default the fewest the
//! round accepts) carry noise of multiplier z_t. The round is charged for its fewest survivors
//! before it runs and settled for the survivors it had ([`RoundPolicy::settle`]). Under the
//! aggregator tier the coordinator sees each group's sum, so the noise is calibrated and charged
//! for the smallest group's fewest survivors ([`secure_extent`]), and never settled lower.

use super::{Cohort, RoundPlan, RoundPolicy, fixed_size, secure_extent};
use crate::error::ServerError;
use crate::identity::ids::ClientId;
use crate::round::strategy::RoundContext;
use fl_common::schedule::Schedule;
use fl_privacy::{PrivacyEvent, Sampling};
use fl_secagg::{Calibration, RoundShape};
use rand::rngs::StdRng;

/// See the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DistributedNoise {
    /// Who takes part.
    pub cohort: Cohort,
    /// z_t.
    pub noise_multiplier: Schedule,
    /// The round's ring, clip bound, dimension and survivor fraction; `planned`, `sampled` and
    /// `distributed_noise` are filled in each round.
    pub shape: RoundShape,
    /// The round's sums are the groups' (the aggregator tier).
    pub grouped: bool,
}

impl RoundPolicy for DistributedNoise {
    fn plan(
        &mut self,
        round: u64,
        connected: &[ClientId],
        rng: &mut StdRng,
    ) -> Result<RoundPlan, ServerError> {
        let planned = self.cohort.at(round);
        let sampled = fixed_size(connected, planned, rng);
        let z = self.noise_multiplier.at(round, self.cohort.rounds);
        let (fewest, most) = secure_extent(planned, &sampled, self.grouped);
        let calibration = Calibration::plan(&RoundShape {
            planned: fewest,
            sampled: most,
            distributed_noise: Some(z),
            ..self.shape
        })
        .map_err(ServerError::Calibration)?;
        Ok(RoundPlan {
            planned,
            ctx: RoundContext {
                round,
                expected_clients: sampled.len().max(1) as f64,
                noise_multiplier: Some(z),
                stream_step: None,
            },
            sampled,
            event: calibration.ddg.map(PrivacyEvent::from),
            calibration: Some(calibration),
        })
    }

    fn sampling(&self) -> Sampling {
        Sampling::Fixed
    }

    fn settle(&self, calibration: &Calibration, survivors: usize) -> Option<PrivacyEvent> {
        // The groups' survivors are counted by their aggregators, which the coordinator does
        // not trust to count: the charge for the fewest stands.
        if self.grouped {
            return None;
        }
        calibration
            .settle(survivors)
            .map(PrivacyEvent::DdgSettlement)
    }
}
