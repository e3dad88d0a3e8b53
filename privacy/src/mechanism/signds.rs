//! SignDS (Jiang, Zhou, Grossklags 2022): instead of its update, a client releases a sign s and
//! h dimensions J chosen by EM-MDS around its top-k set ([`crate::signds`]): eps-LDP for the
//! client's whole update. The server steps along the mean sparse sign update.

use super::protect::{Output, ProtectError};
use super::release::{ClientLimits, LocalPrivacyError, Release, ReleaseCost, tighter};
use super::{ClientMechanism, Listed, ReleaseAggregation};
use crate::sampled_gaussian::AccountingError;
use crate::signds::SignDs;
use fl_model::{GradientRule, LocalConfig};
use rand::{CryptoRng, Rng};
use serde::{Deserialize, Serialize};

/// A round's SignDS mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignDsLdp {
    /// Per-release epsilon.
    pub epsilon: f64,
    /// k: the top-k set's size.
    pub k: usize,
    /// h: dimensions released.
    pub h: usize,
}

/// `[local]` under `privacy.mode = "signds"`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct SignDsSettings {
    /// epsilon of each upload (a client's loss composes over the rounds it takes part in).
    pub epsilon: f64,
    /// k as a fraction of d: the top-k set's size.
    pub top_k: f64,
    /// h: dimensions released; 0 takes the largest h with E\[nu\]/h >= `ratio`.
    pub output_dimensions: usize,
    /// The E\[nu\]/h ratio that picks h when `output_dimensions` is 0.
    pub ratio: f64,
    /// eta_g: the server's step along the mean sparse sign update.
    pub global_learning_rate: f64,
}

impl Default for SignDsSettings {
    fn default() -> Self {
        Self {
            epsilon: 1.0,
            top_k: 0.01,
            output_dimensions: 0,
            ratio: 0.6,
            global_learning_rate: 0.05,
        }
    }
}

impl ClientMechanism for SignDsLdp {
    type Settings = SignDsSettings;
    const NEEDS_BUILT_IN_TRAINER: bool = false;
    const PROTECTS_ADMM: bool = false;

    fn validate(s: &SignDsSettings) -> Result<(), LocalPrivacyError> {
        super::release::check_epsilon(s.epsilon)?;
        let ok = s.top_k > 0.0
            && s.top_k < 1.0
            && s.ratio > 0.0
            && s.ratio <= 1.0
            && s.global_learning_rate > 0.0
            && s.global_learning_rate.is_finite();
        if ok {
            Ok(())
        } else {
            Err(LocalPrivacyError::Settings(
                "SignDS needs top_k in (0, 1), ratio in (0, 1] and global_learning_rate > 0",
            ))
        }
    }

    /// k = top_k d (at least 1); h as given, or picked by the ratio.
    fn resolve(s: &SignDsSettings, dim: usize) -> Result<Self, LocalPrivacyError> {
        Self::validate(s)?;
        let k = ((s.top_k * dim as f64).round() as usize).max(1);
        let signds = match s.output_dimensions {
            0 => SignDs::with_ratio(dim, k, s.epsilon, s.ratio),
            h => SignDs::new(dim, k, h, s.epsilon),
        }?;
        let mechanism = Self {
            epsilon: s.epsilon,
            k: signds.k,
            h: signds.h,
        };
        mechanism.check(dim)?;
        Ok(mechanism)
    }

    fn aggregation(s: &SignDsSettings) -> ReleaseAggregation {
        ReleaseAggregation::SignStep {
            learning_rate: s.global_learning_rate,
        }
    }

    fn check(&self, dim: usize) -> Result<(), LocalPrivacyError> {
        super::release::check_epsilon(self.epsilon)?;
        let (k, h) = (self.k, self.h);
        if h == 0 || h > k || k >= dim {
            return Err(LocalPrivacyError::SignDsSizes { k, h, d: dim });
        }
        Ok(())
    }

    fn release_size(&self, _dim: usize) -> usize {
        self.h
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
            ..*self
        }
    }

    fn gradient_rule(&self) -> GradientRule {
        GradientRule::Mean
    }

    fn accounted_release(&self) -> Result<Release, AccountingError> {
        Ok(Release {
            kind: Self::KIND,
            epsilon: self.epsilon,
            delta: 0.0,
            noise: 0.0,
            sensitivity: 0.0,
        })
    }

    /// EM-MDS is eps-LDP by construction: nothing beyond the epsilon to check.
    fn admits(&self, _release: &Release) -> Result<(), LocalPrivacyError> {
        Ok(())
    }

    fn cost(release: &Release) -> ReleaseCost {
        ReleaseCost::Pure {
            epsilon: release.epsilon,
        }
    }

    fn protect_update<R: Rng + CryptoRng>(
        &self,
        u: Vec<f32>,
        _config: &LocalConfig,
        rng: &mut R,
    ) -> Result<(Output, Release), ProtectError> {
        let mechanism = SignDs::new(u.len(), self.k, self.h, self.epsilon)?;
        let (sign, indices) = mechanism.release(&u, rng);
        Ok((Output::Sign { sign, indices }, self.accounted_release()?))
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
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn a_release_is_a_sign_and_h_dimensions() {
        let signds = LocalMechanism::SignDs(SignDsLdp {
            epsilon: 2.0,
            k: 1,
            h: 2,
        });
        let config = LocalConfig {
            epochs: 1,
            batch_size: 1,
            learning_rate: 0.1,
            random_shift: 0,
        };
        let u = vec![3.0f32, -4.0, 0.0, 1.0];
        let out = signds
            .protect_update(u, &config, &mut StdRng::seed_from_u64(3))
            .unwrap();
        assert_eq!(out.release().epsilon, 2.0);
        assert!(
            matches!(out.into_released(), crate::Released::Sign { indices, .. } if indices.len() == 2)
        );
        let bad = SignDsLdp {
            epsilon: 1.0,
            k: 10,
            h: 11,
        };
        assert!(matches!(
            bad.check(100),
            Err(LocalPrivacyError::SignDsSizes { .. })
        ));
    }

    #[test]
    fn settings_resolve_to_sizes_for_the_model() {
        let settings = SignDsSettings {
            output_dimensions: 3,
            ..SignDsSettings::default()
        };
        let m = SignDsLdp::resolve(&settings, 1000).unwrap();
        assert_eq!((m.k, m.h), (10, 3));
        let bad = SignDsSettings {
            top_k: 1.5,
            ..settings
        };
        assert!(matches!(
            SignDsLdp::resolve(&bad, 1000),
            Err(LocalPrivacyError::Settings(_))
        ));
    }
}
