//! A stream's correlated noise across its steps, for the curator's sum on the rounds whose
//! context carries a stream step. The stream that accounts the steps builds it
//! ([`NoiseStream::noise`](super::NoiseStream::noise)), so the noise and the ledger cannot
//! disagree. It lives in memory only: a secret never written to a checkpoint; a restarted
//! server starts a new stream, which is accounted as one.

use rand::rngs::StdRng;

/// A stream's noise, step by step; one implementation per stream.
pub trait CorrelatedNoise: Send {
    /// Adds step `step`'s noise, drawn at standard deviation `std`, to the round's `sum`. Fails
    /// when the step cannot follow the stream's (the round must not be released). `rng` is the
    /// curator's CSPRNG.
    fn add(
        &mut self,
        sum: &mut [f32],
        step: u64,
        std: f64,
        rng: &mut StdRng,
    ) -> Result<(), StepMismatch>;

    /// The curator's decision on the round whose noise was added last.
    fn released(&mut self, applied: bool);
}

/// The round's stream step does not follow the stream's: the round must not be released.
#[derive(Debug, PartialEq, Eq)]
pub struct StepMismatch {
    /// The step the stream is at.
    pub stream: u64,
    /// The step the round's context says.
    pub round: u64,
}
