//! Gaussian local DP (W_p = W + G): the update is clipped to L2 norm C; replacing all of a
//! client's data moves it by at most 2C, and sigma is the analytic Gaussian calibration for
//! (eps, delta) at that sensitivity (Balle and Wang 2018). This protects the client's whole
//! contribution.

use super::protect::{Output, ProtectError};
use super::release::{
    ClientLimits, LocalPrivacyError, Release, ReleaseCost, check_clip, check_delta, positive,
    tighter,
};
use super::{ClientMechanism, Listed, ReleaseAggregation};
use crate::analytic_gaussian::{analytic_gaussian_sigma, gaussian_delta};
use crate::sampled_gaussian::AccountingError;
use crate::{add_gaussian_noise, clip_l2};
use fl_model::{GradientRule, LocalConfig};
use rand::{CryptoRng, Rng};
use serde::{Deserialize, Serialize};

/// A round's Gaussian mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GaussianLdp {
    /// Per-release epsilon.
    pub epsilon: f64,
    /// Per-release delta.
    pub delta: f64,
    /// C (L2).
    pub clip_bound: f64,
}

/// `[local]` under `privacy.mode = "ldp-gaussian"`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct GaussianSettings {
    /// epsilon of each upload (a client's loss composes over the rounds it takes part in).
    pub epsilon: f64,
    /// delta of each upload.
    pub delta: f64,
    /// C: the L2 bound of the update.
    pub clip_bound: f64,
}

impl Default for GaussianSettings {
    fn default() -> Self {
        Self {
            epsilon: 1.0,
            delta: 1e-5,
            clip_bound: 1.0,
        }
    }
}

impl GaussianLdp {
    /// The release of an update clipped to L2 norm C: sigma for (eps, delta) at sensitivity 2C.
    fn release(&self) -> Result<Release, AccountingError> {
        let sensitivity = 2.0 * self.clip_bound;
        Ok(Release {
            kind: Self::KIND,
            epsilon: self.epsilon,
            delta: self.delta,
            noise: analytic_gaussian_sigma(sensitivity, self.epsilon, self.delta)?,
            sensitivity,
        })
    }
}

impl ClientMechanism for GaussianLdp {
    type Settings = GaussianSettings;
    const NEEDS_BUILT_IN_TRAINER: bool = false;
    const PROTECTS_ADMM: bool = false;

    fn validate(settings: &Self::Settings) -> Result<(), LocalPrivacyError> {
        Self::resolve(settings, 0).map(drop)
    }

    fn resolve(s: &GaussianSettings, dim: usize) -> Result<Self, LocalPrivacyError> {
        let mechanism = Self {
            epsilon: s.epsilon,
            delta: s.delta,
            clip_bound: s.clip_bound,
        };
        mechanism.check(dim)?;
        Ok(mechanism)
    }

    fn aggregation(_: &GaussianSettings) -> ReleaseAggregation {
        ReleaseAggregation::Mean
    }

    fn check(&self, _dim: usize) -> Result<(), LocalPrivacyError> {
        super::release::check_epsilon(self.epsilon)?;
        check_delta(self.delta)?;
        check_clip(self.clip_bound)
    }

    fn release_size(&self, dim: usize) -> usize {
        dim
    }

    fn epsilon(&self) -> f64 {
        self.epsilon
    }

    fn composed_delta(&self) -> f64 {
        self.delta
    }

    fn tightened(&self, own: &ClientLimits) -> Self {
        Self {
            epsilon: tighter(self.epsilon, own.epsilon),
            delta: tighter(self.delta, own.delta),
            clip_bound: own.clip.unwrap_or(self.clip_bound),
        }
    }

    fn gradient_rule(&self) -> GradientRule {
        GradientRule::Mean
    }

    fn accounted_release(&self) -> Result<Release, AccountingError> {
        self.release()
    }

    fn admits(&self, release: &Release) -> Result<(), LocalPrivacyError> {
        release.delta_within(self.delta)?;
        let achieved = gaussian_delta(release.noise, release.sensitivity, release.epsilon);
        if !(positive(release.noise) && positive(release.sensitivity))
            || achieved > release.delta * (1.0 + 1e-6)
        {
            return Err(release.too_little_noise());
        }
        Ok(())
    }

    fn cost(release: &Release) -> ReleaseCost {
        ReleaseCost::Gaussian {
            sensitivity: release.sensitivity,
            sigma: release.noise,
        }
    }

    fn protect_update<R: Rng + CryptoRng>(
        &self,
        mut u: Vec<f32>,
        _config: &LocalConfig,
        rng: &mut R,
    ) -> Result<(Output, Release), ProtectError> {
        clip_l2(&mut u, self.clip_bound);
        let release = self.release()?;
        add_gaussian_noise(&mut u, release.noise, rng);
        Ok((Output::Dense(u), release))
    }

    fn protect_admm_step<R: Rng + CryptoRng>(
        &self,
        _z: Vec<f32>,
        _rho: f64,
        _total_examples: u64,
        _rng: &mut R,
    ) -> Result<(Vec<f32>, Release), ProtectError> {
        Err(ProtectError::NoAdmmStep(Self::KIND.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalMechanism;

    fn round() -> GaussianLdp {
        GaussianLdp {
            epsilon: 2.0,
            delta: 1e-5,
            clip_bound: 1.0,
        }
    }

    #[test]
    fn a_client_only_tightens_the_round() {
        let own = ClientLimits {
            epsilon: Some(0.5),
            delta: Some(1e-3),
            clip: Some(0.2),
        };
        let expected = GaussianLdp {
            epsilon: 0.5,
            delta: 1e-5,
            clip_bound: 0.2,
        };
        assert_eq!(round().tightened(&own), expected);
        let loose = ClientLimits {
            epsilon: Some(50.0),
            ..ClientLimits::default()
        };
        assert_eq!(round().tightened(&loose), round());
    }

    #[test]
    fn the_server_admits_only_consistent_claims() {
        let mechanism = LocalMechanism::Gaussian(round());
        let honest = round().release().unwrap();
        mechanism.admits(&honest).unwrap();
        // A stricter client is fine.
        let strict = GaussianLdp {
            epsilon: 1.0,
            delta: 1e-6,
            clip_bound: 3.0,
        };
        mechanism.admits(&strict.release().unwrap()).unwrap();
        let looser = GaussianLdp {
            epsilon: 3.0,
            ..round()
        };
        assert!(matches!(
            mechanism.admits(&looser.release().unwrap()),
            Err(LocalPrivacyError::Looser {
                what: "epsilon",
                ..
            })
        ));
        let thin = Release {
            noise: honest.noise * 0.9,
            ..honest
        };
        assert!(matches!(
            mechanism.admits(&thin),
            Err(LocalPrivacyError::TooLittleNoise { .. })
        ));
        let bad = GaussianLdp {
            delta: 1.5,
            ..round()
        };
        assert_eq!(bad.check(10), Err(LocalPrivacyError::Delta(1.5)));
    }
}
