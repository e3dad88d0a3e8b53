//! What one upload spent ([`Release`]) and what that costs ([`ReleaseCost`]), a client's own
//! limits ([`ClientLimits`]), and why a mechanism's parameters or a release are refused;
//! `local_ledger.rs` composes a client's releases over the rounds it took part in.
//!
//! Composition over a client's releases: a Gaussian release has RDP alpha Delta^2 / (2 sigma^2)
//! (Mironov 2017, Prop. 7); an eps-DP release has RDP at most eps at every order (Mironov 2017,
//! Prop. 3); RDP adds up (Prop. 1) and converts as the central accountant does. Pure releases alone
//! compose to the sum of their epsilons (Dwork and Roth 2014, Thm 3.16).

use super::LocalKind;
use crate::signds::SignDsError;

/// Relative slack when comparing a client's claim with the round's limits (floating-point
/// round-trips only; far below any meaningful privacy difference).
const CLAIM_SLACK: f64 = 1e-9;

/// Why local-privacy parameters or a release are refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LocalPrivacyError {
    /// epsilon not a positive number.
    #[error("local epsilon = {0} must be a positive number")]
    Epsilon(f64),
    /// delta not in (0, 1).
    #[error("local delta = {0} must be in (0, 1)")]
    Delta(f64),
    /// C not a positive number.
    #[error("clip bound C = {0} must be a positive number")]
    Clip(f64),
    /// A Laplace round of no local steps.
    #[error("the mechanism needs at least one local step")]
    Steps,
    /// SignDS sizes out of range.
    #[error("SignDS needs 1 <= h <= k < d (k = {k}, h = {h}, d = {d})")]
    SignDsSizes {
        /// Top-k size.
        k: usize,
        /// Output dimensions.
        h: usize,
        /// Model dimension.
        d: usize,
    },
    /// SignDS's sizes do not fit the model.
    #[error(transparent)]
    SignDs(#[from] SignDsError),
    /// Settings out of range (what, in words).
    #[error("{0}")]
    Settings(&'static str),
    /// The upload used another mechanism than the round's.
    #[error("this round's uploads must be protected with {expected}, not {got}")]
    Mismatch {
        /// The round's mechanism.
        expected: &'static str,
        /// The upload's.
        got: &'static str,
    },
    /// The upload claims more privacy loss than the round allows.
    #[error("the upload claims {what} = {got}, above the round's {allowed}")]
    Looser {
        /// `epsilon` or `delta`.
        what: &'static str,
        /// Claimed.
        got: f64,
        /// Allowed.
        allowed: f64,
    },
    /// The claimed noise does not give the claimed (epsilon, delta).
    #[error(
        "the upload's noise {noise} with sensitivity {sensitivity} does not give the \
         (epsilon, delta) it claims"
    )]
    TooLittleNoise {
        /// sigma or b.
        noise: f64,
        /// Delta.
        sensitivity: f64,
    },
}

pub(crate) fn check_epsilon(epsilon: f64) -> Result<(), LocalPrivacyError> {
    if epsilon > 0.0 && epsilon.is_finite() {
        Ok(())
    } else {
        Err(LocalPrivacyError::Epsilon(epsilon))
    }
}

pub(crate) fn check_clip(clip: f64) -> Result<(), LocalPrivacyError> {
    if clip > 0.0 && clip.is_finite() {
        Ok(())
    } else {
        Err(LocalPrivacyError::Clip(clip))
    }
}

/// A client's own limits, applied over what a round asks (never loosening it).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClientLimits {
    /// Largest per-release epsilon the client accepts.
    pub epsilon: Option<f64>,
    /// Largest per-release delta the client accepts.
    pub delta: Option<f64>,
    /// The client's own clip bound C (the noise is calibrated to it).
    pub clip: Option<f64>,
}

impl ClientLimits {
    /// Checks that every given limit is usable.
    pub fn check(&self) -> Result<(), LocalPrivacyError> {
        if let Some(e) = self.epsilon {
            check_epsilon(e)?;
        }
        if let Some(d) = self.delta {
            check_delta(d)?;
        }
        if let Some(c) = self.clip {
            check_clip(c)?;
        }
        Ok(())
    }
}

/// What one upload spent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Release {
    /// The mechanism.
    pub kind: LocalKind,
    /// Per-release epsilon.
    pub epsilon: f64,
    /// Per-release delta (0 for pure mechanisms).
    pub delta: f64,
    /// Gaussian: sigma; Laplace: b; SignDS: 0.
    pub noise: f64,
    /// Gaussian: L2 sensitivity 2C; Laplace: L1 sensitivity Delta; SignDS: 0.
    pub sensitivity: f64,
}

impl Release {
    /// Checks that the release is of `kind` and claims a usable epsilon no larger than
    /// `epsilon`.
    pub(crate) fn within(&self, kind: LocalKind, epsilon: f64) -> Result<(), LocalPrivacyError> {
        if self.kind != kind {
            return Err(LocalPrivacyError::Mismatch {
                expected: kind.name(),
                got: self.kind.name(),
            });
        }
        check_epsilon(self.epsilon)?;
        if self.epsilon > epsilon * (1.0 + CLAIM_SLACK) {
            return Err(LocalPrivacyError::Looser {
                what: "epsilon",
                got: self.epsilon,
                allowed: epsilon,
            });
        }
        Ok(())
    }

    /// Checks that the release claims a delta in (0, `delta`].
    pub(crate) fn delta_within(&self, delta: f64) -> Result<(), LocalPrivacyError> {
        if self.delta > 0.0 && self.delta <= delta * (1.0 + CLAIM_SLACK) {
            return Ok(());
        }
        Err(LocalPrivacyError::Looser {
            what: "delta",
            got: self.delta,
            allowed: delta,
        })
    }

    /// The refusal of a release whose noise does not give what it claims.
    pub(crate) fn too_little_noise(&self) -> LocalPrivacyError {
        LocalPrivacyError::TooLittleNoise {
            noise: self.noise,
            sensitivity: self.sensitivity,
        }
    }

    /// What it costs, as its mechanism says.
    pub(crate) fn cost(&self) -> ReleaseCost {
        self.kind.cost(self)
    }
}

/// What one release costs, as one of the two kinds of loss the local ledger composes: every
/// mechanism reduces to one of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReleaseCost {
    /// A Gaussian release of L2 sensitivity Delta and noise sigma.
    Gaussian {
        /// Delta.
        sensitivity: f64,
        /// sigma.
        sigma: f64,
    },
    /// An eps-DP release.
    Pure {
        /// epsilon.
        epsilon: f64,
    },
}

impl ReleaseCost {
    /// An upper bound on the release's RDP at order alpha.
    pub(crate) fn rdp(self, alpha: f64) -> f64 {
        match self {
            // Mironov 2017, Prop. 7: alpha Delta^2 / (2 sigma^2).
            Self::Gaussian { sensitivity, sigma } => {
                alpha * sensitivity.powi(2) / (2.0 * sigma.powi(2))
            }
            // Mironov 2017, Prop. 3: eps-DP is (alpha, eps)-RDP.
            Self::Pure { epsilon } => epsilon,
        }
    }
}

/// The smaller of a round's `value` and a client's own `limit`, if it has one.
pub(crate) fn tighter(value: f64, limit: Option<f64>) -> f64 {
    limit.map_or(value, |limit| value.min(limit))
}

/// Whether `x` is a positive finite number.
pub(crate) fn positive(x: f64) -> bool {
    x > 0.0 && x.is_finite()
}

/// Checks a delta in (0, 1).
pub(crate) fn check_delta(delta: f64) -> Result<(), LocalPrivacyError> {
    if delta > 0.0 && delta < 1.0 {
        Ok(())
    } else {
        Err(LocalPrivacyError::Delta(delta))
    }
}
