//! Laplace output perturbation (APPFL): eps-DP for one example of the client. Local training
//! runs exactly S SGD steps on per-example gradients clipped in L1 to C, each batch divided by
//! the round's B, and adds Laplace(Delta / eps) with Delta = 2 C eta (1/B + S - 1)
//! ([`sgd_l1_sensitivity`]): public numbers only, so neither the noise nor the release says
//! anything of the client's example count. It also protects inexact ADMM's primal step, at
//! Delta = 2C/(rho I) (APPFL, IADMM, Example 2).

use super::protect::{Output, ProtectError};
use super::release::{
    ClientLimits, LocalPrivacyError, Release, ReleaseCost, check_clip, check_epsilon, positive,
    tighter,
};
use super::{ClientMechanism, Listed, ReleaseAggregation};
use crate::admm::laplace_sensitivity;
use crate::sampled_gaussian::AccountingError;
use crate::{add_laplace_noise, sgd_l1_sensitivity};
use fl_model::{GradientRule, LocalConfig};
use rand::{CryptoRng, Rng};
use serde::{Deserialize, Serialize};

/// Relative slack on b >= Delta / eps (floating-point round-trips only).
const SLACK: f64 = 1e-9;

/// A round's Laplace mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaplaceLdp {
    /// Per-release epsilon.
    pub epsilon: f64,
    /// C (L1, per example).
    pub clip_bound: f64,
    /// S: local SGD steps.
    pub steps: u64,
}

/// `[local]` under `privacy.mode = "ldp-laplace"`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct LaplaceSettings {
    /// epsilon of each upload, for one example of the client (a client's loss composes over
    /// the rounds it takes part in).
    pub epsilon: f64,
    /// C: the L1 bound of each per-example gradient.
    pub clip_bound: f64,
    /// S: the local SGD steps each client runs, each on a batch of `train.batch_size` examples
    /// (fewer when a client has fewer), whatever its number of examples: the sensitivity
    /// 2 C eta (1/B + S - 1) is then public.
    pub steps: u64,
}

impl Default for LaplaceSettings {
    fn default() -> Self {
        Self {
            epsilon: 1.0,
            clip_bound: 1.0,
            steps: 1,
        }
    }
}

impl LaplaceLdp {
    /// A release of L1 sensitivity Delta: b = Delta / eps (Dwork and Roth 2014, Thm 3.6).
    fn release(&self, sensitivity: f64) -> Release {
        Release {
            kind: Self::KIND,
            epsilon: self.epsilon,
            delta: 0.0,
            noise: sensitivity / self.epsilon,
            sensitivity,
        }
    }
}

impl ClientMechanism for LaplaceLdp {
    type Settings = LaplaceSettings;
    const NEEDS_BUILT_IN_TRAINER: bool = true;
    const PROTECTS_ADMM: bool = true;

    fn validate(settings: &Self::Settings) -> Result<(), LocalPrivacyError> {
        Self::resolve(settings, 0).map(drop)
    }

    fn resolve(s: &LaplaceSettings, dim: usize) -> Result<Self, LocalPrivacyError> {
        let mechanism = Self {
            epsilon: s.epsilon,
            clip_bound: s.clip_bound,
            steps: s.steps,
        };
        mechanism.check(dim)?;
        Ok(mechanism)
    }

    fn aggregation(_: &LaplaceSettings) -> ReleaseAggregation {
        ReleaseAggregation::Mean
    }

    fn check(&self, _dim: usize) -> Result<(), LocalPrivacyError> {
        check_epsilon(self.epsilon)?;
        if self.steps == 0 {
            return Err(LocalPrivacyError::Steps);
        }
        check_clip(self.clip_bound)
    }

    fn release_size(&self, dim: usize) -> usize {
        dim
    }

    fn epsilon(&self) -> f64 {
        self.epsilon
    }

    fn composed_delta(&self) -> f64 {
        0.0
    }

    fn tightened(&self, own: &ClientLimits) -> Self {
        Self {
            epsilon: tighter(self.epsilon, own.epsilon),
            clip_bound: own.clip.unwrap_or(self.clip_bound),
            steps: self.steps,
        }
    }

    fn gradient_rule(&self) -> GradientRule {
        GradientRule::ClippedL1 {
            clip: self.clip_bound,
            steps: self.steps,
        }
    }

    /// With sensitivity 1: a pure release composes by its epsilon alone.
    fn accounted_release(&self) -> Result<Release, AccountingError> {
        Ok(self.release(1.0))
    }

    fn admits(&self, release: &Release) -> Result<(), LocalPrivacyError> {
        // b >= Delta / eps (Dwork and Roth 2014, Thm 3.6).
        if !(positive(release.noise) && positive(release.sensitivity))
            || release.noise * release.epsilon < release.sensitivity * (1.0 - SLACK)
        {
            return Err(release.too_little_noise());
        }
        Ok(())
    }

    fn cost(release: &Release) -> ReleaseCost {
        ReleaseCost::Pure {
            epsilon: release.epsilon,
        }
    }

    fn protect_update<R: Rng + CryptoRng>(
        &self,
        mut u: Vec<f32>,
        config: &LocalConfig,
        rng: &mut R,
    ) -> Result<(Output, Release), ProtectError> {
        let (eta, batch) = (config.learning_rate, config.batch_size as usize);
        let release = self.release(sgd_l1_sensitivity(
            self.clip_bound,
            f64::from(eta),
            batch,
            self.steps,
        ));
        add_laplace_noise(&mut u, release.noise, rng);
        Ok((Output::Dense(u), release))
    }

    /// z_p + Laplace(Delta / eps), Delta = 2C/(rho I) (APPFL, IADMM, Example 2), z_p from
    /// per-example gradients clipped in L1 to C.
    fn protect_admm_step<R: Rng + CryptoRng>(
        &self,
        mut z: Vec<f32>,
        rho: f64,
        total_examples: u64,
        rng: &mut R,
    ) -> Result<(Vec<f32>, Release), ProtectError> {
        let release = self.release(laplace_sensitivity(self.clip_bound, rho, total_examples));
        add_laplace_noise(&mut z, release.noise, rng);
        Ok((z, release))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalMechanism;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const CONFIG: LocalConfig = LocalConfig {
        epochs: 2,
        batch_size: 20,
        learning_rate: 0.1,
        random_shift: 0,
    };

    /// The Laplace release's sensitivity and noise come from C, eta, B and S alone.
    #[test]
    fn the_laplace_sensitivity_uses_only_public_numbers() {
        let laplace = LaplaceLdp {
            epsilon: 2.0,
            clip_bound: 1.5,
            steps: 6,
        };
        let (_, release) = laplace
            .protect_update(vec![0.0; 4], &CONFIG, &mut StdRng::seed_from_u64(1))
            .unwrap();
        let expected = sgd_l1_sensitivity(1.5, f64::from(0.1f32), 20, 6);
        assert_eq!(release.sensitivity, expected);
        assert_eq!(release.noise, expected / 2.0);
    }

    #[test]
    fn parameters_and_claims_are_checked() {
        let bad = LaplaceLdp {
            epsilon: 0.0,
            clip_bound: 1.0,
            steps: 1,
        };
        assert_eq!(bad.check(100), Err(LocalPrivacyError::Epsilon(0.0)));
        let bad = LaplaceLdp {
            epsilon: 1.0,
            clip_bound: -1.0,
            steps: 1,
        };
        assert_eq!(bad.check(100), Err(LocalPrivacyError::Clip(-1.0)));
        let round = LaplaceLdp {
            epsilon: 1.0,
            clip_bound: 1.0,
            steps: 1,
        };
        let mechanism = LocalMechanism::Laplace(round);
        mechanism.admits(&round.release(0.01)).unwrap();
        let thin = Release {
            noise: 0.005,
            ..round.release(0.01)
        };
        assert!(mechanism.admits(&thin).is_err());
    }
}
