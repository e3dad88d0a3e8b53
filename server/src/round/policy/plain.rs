//! Rounds the server does not account centrally (no privacy, client-side mechanisms, secure
//! aggregation without noise): m_t clients drawn uniformly, the aggregate over those that
//! answer.

use super::{Cohort, RoundPlan, RoundPolicy, fixed_size, unnoised};
use crate::error::ServerError;
use crate::identity::ids::ClientId;
use fl_privacy::Sampling;
use rand::rngs::StdRng;

/// See the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plain {
    /// Who takes part.
    pub cohort: Cohort,
}

impl RoundPolicy for Plain {
    fn plan(
        &mut self,
        round: u64,
        connected: &[ClientId],
        rng: &mut StdRng,
    ) -> Result<RoundPlan, ServerError> {
        let planned = self.cohort.at(round);
        let sampled = fixed_size(connected, planned, rng);
        Ok(RoundPlan {
            planned,
            ctx: unnoised(round, &sampled),
            sampled,
            event: None,
            calibration: None,
        })
    }

    fn sampling(&self) -> Sampling {
        Sampling::Fixed
    }
}
