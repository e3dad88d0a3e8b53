//! A DP-FTRL stream's schedule, one value the round policy owns: the step it is at, who may
//! still contribute (the participation rule the accounting assumes), the step's privacy event,
//! and the stream's noise for the central-DP layer. One implementation per mechanism:
//! [`super::TreeSchedule`] (each client once per tree), [`super::BandedSchedule`] (once every b
//! steps, at most k times). The synchronous policy ([`super::Correlated`]) and the asynchronous
//! one ([`super::BufferPolicy`]) drive it the same way; a new mechanism is a schedule, its noise
//! (`crate::round::strategy::CorrelatedNoise`) and its accounting in `fl_privacy`.

use crate::identity::ids::ClientId;
use crate::round::strategy::CorrelatedNoise;
use fl_privacy::PrivacyEvent;

/// See the module documentation.
pub(crate) trait NoiseSchedule: Send + std::fmt::Debug {
    /// z: the multiplier of the stream's noise (one per run).
    fn noise_multiplier(&self) -> f64;

    /// The current step, from 1 (0 before the first).
    fn step(&self) -> u64;

    /// Moves to the next step.
    fn advance(&mut self);

    /// The current step's privacy event, spent before its release.
    fn event(&self) -> PrivacyEvent;

    /// Whether `client` may contribute to the current step.
    fn may_contribute(&self, client: ClientId) -> bool;

    /// Records `client`'s contribution to the current step; false (and nothing recorded) when
    /// it may not contribute.
    fn contributes(&mut self, client: ClientId) -> bool;

    /// The stream's noise over `dim` coordinates, for the central-DP layer.
    fn noise(&self, dim: usize) -> Box<dyn CorrelatedNoise>;
}
