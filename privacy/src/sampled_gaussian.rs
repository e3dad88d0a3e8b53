//! One round of the sampled Gaussian mechanism as the accountants see it: the sampling rate q,
//! the noise multiplier z and how participants were drawn, checked when built.

use super::rdp::{poisson_curve, without_replacement_curve};
use serde::{Deserialize, Serialize};

/// How a round's participants are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Sampling {
    /// Each client independently with probability q (add/remove-one neighbours; exact RDP).
    Poisson,
    /// Exactly m = qK of the K clients, without replacement (replace-one neighbours; bounded by
    /// WBK19 Thm 27 at sigma/2, several times costlier than Poisson).
    Fixed,
}

impl std::fmt::Display for Sampling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Sampling::Poisson => "poisson",
            Sampling::Fixed => "fixed",
        })
    }
}

/// One round of the sampled Gaussian mechanism, as the accountant sees it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct GaussianRound {
    /// q: sampling rate (m/K for fixed-size sampling).
    pub q: f64,
    /// z: noise standard deviation divided by the clip bound S (the noise multiplier of the
    /// add/remove-one sensitivity S).
    pub noise_multiplier: f64,
    /// How participants were drawn.
    pub sampling: Sampling,
}

/// Why accounting inputs are refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AccountingError {
    /// q outside (0, 1].
    #[error("sampling rate q = {0} must be in (0, 1]")]
    BadRate(f64),
    /// sigma not a positive number.
    #[error("noise multiplier sigma = {0} must be a positive number")]
    BadSigma(f64),
    /// delta outside (0, 1).
    #[error("delta = {0} must be in (0, 1)")]
    BadDelta(f64),
    /// epsilon not a positive number.
    #[error("epsilon = {0} must be a positive number")]
    BadEpsilon(f64),
}

impl GaussianRound {
    /// The Gaussian mechanism without sampling (q = 1) of multiplier `noise_multiplier`, which
    /// an unsampled round, a tree node or a banded stream's charge is; accounted as Poisson
    /// sampling at q = 1, which is no sampling at all.
    pub fn unsampled(noise_multiplier: f64) -> Self {
        Self {
            q: 1.0,
            noise_multiplier,
            sampling: Sampling::Poisson,
        }
    }

    /// Validates q in (0, 1] and sigma > 0.
    pub fn new(q: f64, noise_multiplier: f64, sampling: Sampling) -> Result<Self, AccountingError> {
        if !(q > 0.0 && q <= 1.0) {
            return Err(AccountingError::BadRate(q));
        }
        if !(noise_multiplier > 0.0 && noise_multiplier.is_finite()) {
            return Err(AccountingError::BadSigma(noise_multiplier));
        }
        Ok(Self {
            q,
            noise_multiplier,
            sampling,
        })
    }

    /// RDP of this round at each of `orders`.
    pub fn rdp_curve(&self, orders: &[f64]) -> Vec<f64> {
        let (q, z) = (self.q, self.noise_multiplier);
        match self.sampling {
            Sampling::Poisson => poisson_curve(q, z, orders),
            // Replace-one moves the clipped sum by up to 2S: multiplier z/2 on sensitivity 2S.
            Sampling::Fixed => without_replacement_curve(q, z / 2.0, orders),
        }
    }
}
