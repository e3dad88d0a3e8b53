//! Client-side (local) mechanisms. Each one is a module here that answers every question about
//! itself through [`ClientMechanism`], a trait with no default methods: its settings (the
//! `[local]` table when `privacy.mode` names it), the mechanism a round asks for and its checks,
//! how a client's own limits tighten it, the training rule it needs, what it releases and what
//! that release spends, what the server accepts from a client, and how the server combines the
//! releases. The closed types of the list ([`LocalKind`], [`LocalMechanism`], [`LocalSettings`])
//! are written by one `local_mechanisms!` invocation, so no dispatch is edited by hand.
//!
//! A new mechanism is its module here, its line in the list (with its `mod` line), and its page
//! in the book.

#[macro_use]
mod generate;
mod gaussian;
mod laplace;
mod parameters;
mod protect;
mod release;
mod signds;

pub use gaussian::{GaussianLdp, GaussianSettings};
pub use laplace::{LaplaceLdp, LaplaceSettings};
pub use protect::{Output, ProtectError, Protected, Released};
pub use release::{ClientLimits, LocalPrivacyError, Release, ReleaseCost};
pub use signds::{SignDsLdp, SignDsSettings};

use crate::sampled_gaussian::AccountingError;
use fl_model::{GradientRule, LocalConfig};
use rand::{CryptoRng, Rng};

/// How the server combines a mechanism's releases.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReleaseAggregation {
    /// FedAvg over the released dense updates (any robust rule applies: it is post-processing).
    Mean,
    /// A step of `learning_rate` along the mean sparse sign update (SignDS's server).
    SignStep {
        /// eta_g.
        learning_rate: f64,
    },
}

/// One client-side mechanism: a round's parameters (the implementing type, which also travels
/// on the wire, field by field) and everything the system asks of it.
pub trait ClientMechanism: Sized + Listed {
    /// Its `[local]` table: every key with a default, unknown keys refused.
    type Settings;

    /// Whether local training under it needs per-example work that only the built-in trainer
    /// does (a client with another trainer refuses the round).
    const NEEDS_BUILT_IN_TRAINER: bool;

    /// Whether it protects inexact ADMM's primal step (`train.algorithm = "iadmm"`).
    const PROTECTS_ADMM: bool;

    /// Checks its settings, as far as they go without the model.
    fn validate(settings: &Self::Settings) -> Result<(), LocalPrivacyError>;

    /// The round's mechanism for a model of `dim` parameters, from its settings, checked.
    fn resolve(settings: &Self::Settings, dim: usize) -> Result<Self, LocalPrivacyError>;

    /// How the server combines the releases.
    fn aggregation(settings: &Self::Settings) -> ReleaseAggregation;

    /// Checks a round's parameters (as a client reads them) for a model of `dim` parameters.
    fn check(&self, dim: usize) -> Result<(), LocalPrivacyError>;

    /// How many values one release of a model of `dim` parameters holds: d for a dense
    /// release, h for SignDS's dimensions.
    fn release_size(&self, dim: usize) -> usize;

    /// Per-release epsilon.
    fn epsilon(&self) -> f64;

    /// The delta at which its releases compose (0 for a pure mechanism).
    fn composed_delta(&self) -> f64;

    /// This mechanism with a client's own limits applied: never looser than the round's.
    fn tightened(&self, own: &ClientLimits) -> Self;

    /// The gradient rule local training must use.
    fn gradient_rule(&self) -> GradientRule;

    /// The release one upload records, as far as accounting goes (checked before training).
    fn accounted_release(&self) -> Result<Release, AccountingError>;

    /// Checks what `release` (of this kind, its epsilon within the round's) claims beyond its
    /// epsilon: its delta and that its noise gives what it claims. The server cannot see whether
    /// the noise was added: a client that adds less only exposes itself.
    fn admits(&self, release: &Release) -> Result<(), LocalPrivacyError>;

    /// What a release of this kind costs, as the ledger composes it.
    fn cost(release: &Release) -> ReleaseCost;

    /// Protects the FedAvg update `u`, trained under the round's `config`, with noise from
    /// `rng`: the output and its release.
    fn protect_update<R: Rng + CryptoRng>(
        &self,
        u: Vec<f32>,
        config: &LocalConfig,
        rng: &mut R,
    ) -> Result<(Output, Release), ProtectError>;

    /// Protects an inexact-ADMM primal iterate z_p computed with penalty `rho` over
    /// `total_examples` examples (refused unless [`ClientMechanism::PROTECTS_ADMM`]).
    fn protect_admm_step<R: Rng + CryptoRng>(
        &self,
        z: Vec<f32>,
        rho: f64,
        total_examples: u64,
        rng: &mut R,
    ) -> Result<(Vec<f32>, Release), ProtectError>;
}

local_mechanisms! {
    /// Gaussian local DP: the update clipped to L2 norm C, plus Gaussian noise calibrated to
    /// (epsilon, delta) at sensitivity 2C.
    "ldp-gaussian" => Gaussian(GaussianLdp),
    /// Laplace output perturbation (APPFL): S local SGD steps on per-example gradients clipped
    /// in L1 to C, plus Laplace noise.
    "ldp-laplace" => Laplace(LaplaceLdp),
    /// SignDS: a sign and h dimensions chosen by EM-MDS instead of the update.
    "signds" => SignDs(SignDsLdp),
}

impl std::str::FromStr for LocalKind {
    type Err = String;

    /// The kind [`LocalKind::name`] names.
    fn from_str(s: &str) -> Result<Self, String> {
        let found = Self::ALL.iter().find(|k| k.name() == s);
        found.copied().ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
            format!("unknown local mechanism `{s}` ({})", names.join(", "))
        })
    }
}

impl std::fmt::Display for LocalKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests;
