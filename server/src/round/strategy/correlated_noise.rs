//! Correlated noise across the steps of a DP-FTRL stream, for [`super::CentralDp`] on the rounds
//! whose context carries a stream step. The round policy that accounts the stream builds its
//! noise (`crate::round::policy::NoiseSchedule::noise`), so the noise and the ledger cannot
//! disagree. The noise lives in memory only: a secret that is never written to a checkpoint; a
//! restarted server starts a new stream, which its policy accounts as one.

use rand::rngs::StdRng;

/// A stream's noise, step by step; one implementation per mechanism.
pub(crate) trait CorrelatedNoise: Send {
    /// Adds step `step`'s noise, drawn at standard deviation `std`, to the round's `sum`. Fails
    /// when the step cannot follow the stream's (the round must not be released).
    fn add(
        &mut self,
        sum: &mut [f32],
        step: u64,
        std: f64,
        rng: &mut StdRng,
    ) -> Result<(), StepMismatch>;

    /// The coordinator's decision on the round whose noise was added last.
    fn released(&mut self, applied: bool);
}

/// The round's stream step does not follow the stream's: the round must not be released.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct StepMismatch {
    /// The step the stream is at.
    pub stream: u64,
    /// The step the round's context says.
    pub round: u64,
}
