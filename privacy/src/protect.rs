//! The release boundary of the local modes: under a client-side mechanism the server is the
//! adversary, and what a client may send is a [`Protected`] value, built here from the
//! mechanism's output alone (no loss, no example count). The mechanisms:
//!
//! - Gaussian: u clipped to L2 norm C, plus N(0, sigma^2) with sigma the analytic Gaussian
//!   calibration for (eps, delta) at sensitivity 2C (Balle and Wang 2018).
//! - Laplace: S SGD steps on per-example gradients clipped in L1 to C, each divided by the
//!   round's B, plus Laplace(Delta / eps) with Delta = 2 C eta (1/B + S - 1)
//!   ([`sgd_l1_sensitivity`]): public numbers only, so neither the noise nor the release's
//!   header says anything of the client's example count.
//! - SignDS: the update's sign s and h dimensions J (EM-MDS) instead of the update.
//! - Inexact ADMM's primal step: Laplace only, at Delta = 2C/(rho I) (seed 004, Example 2;
//!   [`LocalMechanism::protect_admm_step`]).

use super::{
    LocalMechanism, Release, add_gaussian_noise, add_laplace_noise, clip_l2, sgd_l1_sensitivity,
};
use crate::AccountingError;
use crate::admm::laplace_sensitivity;
use crate::signds::{SignDs, SignDsError};
use fl_model::{GradientRule, LocalConfig};
use rand::{CryptoRng, Rng};

/// Why a local mechanism cannot protect a round's result: its parameters, not the result, are
/// at fault, so the reason says nothing of the client's examples.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum ProtectError {
    /// The Gaussian mechanism's (epsilon, delta) cannot be calibrated.
    #[error(transparent)]
    Calibration(#[from] AccountingError),
    /// SignDS's k, h or epsilon do not fit the model.
    #[error(transparent)]
    SignDs(#[from] SignDsError),
    /// An inexact-ADMM step asked of a mechanism other than Laplace (named).
    #[error("IADMM rounds support ldp-laplace only, not {0}")]
    AdmmNeedsLaplace(&'static str),
}

/// What a local mechanism released: the only thing a client under a local mode sends. Its
/// contents are private: only the mechanisms of this module build one, so holding a `Protected`
/// means the mechanism ran.
#[derive(Debug, Clone, PartialEq)]
pub struct Protected(Released);

/// The contents of a [`Protected`] value, for encoding it (a `Released` cannot be turned back
/// into a `Protected`).
#[derive(Debug, Clone, PartialEq)]
pub enum Released {
    /// A dense release.
    Dense {
        /// The protected values.
        values: Vec<f32>,
        /// The mechanism and its parameters.
        release: Release,
    },
    /// A SignDS release.
    Sign {
        /// s.
        sign: i8,
        /// J, sorted.
        indices: Vec<u32>,
        /// Its epsilon.
        release: Release,
    },
}

impl Protected {
    /// The privacy loss of the release.
    pub fn release(&self) -> &Release {
        match &self.0 {
            Released::Dense { release, .. } | Released::Sign { release, .. } => release,
        }
    }

    /// The released values, for encoding.
    pub fn into_released(self) -> Released {
        self.0
    }

    /// The dense values, if the release is dense.
    pub fn values(&self) -> Option<&[f32]> {
        match &self.0 {
            Released::Dense { values, .. } => Some(values),
            Released::Sign { .. } => None,
        }
    }
}

impl LocalMechanism {
    /// The gradient rule local training must use under this mechanism.
    pub fn gradient_rule(&self) -> GradientRule {
        match *self {
            LocalMechanism::Laplace { clip, steps, .. } => GradientRule::ClippedL1 { clip, steps },
            LocalMechanism::Gaussian { .. } | LocalMechanism::SignDs { .. } => GradientRule::Mean,
        }
    }

    /// Protects the FedAvg update `u`, trained under the round's `config` (B and eta), with noise
    /// from `rng`.
    pub fn protect_update<R: Rng + CryptoRng>(
        &self,
        mut u: Vec<f32>,
        config: &LocalConfig,
        rng: &mut R,
    ) -> Result<Protected, ProtectError> {
        let release = match *self {
            LocalMechanism::Gaussian {
                epsilon,
                delta,
                clip,
            } => {
                clip_l2(&mut u, clip);
                let release = Release::gaussian(epsilon, delta, clip)?;
                add_gaussian_noise(&mut u, release.noise, rng);
                release
            }
            LocalMechanism::Laplace {
                epsilon,
                clip,
                steps,
            } => {
                let (eta, batch) = (config.learning_rate, config.batch_size as usize);
                let delta = sgd_l1_sensitivity(clip, f64::from(eta), batch, steps);
                let release = Release::laplace(epsilon, delta);
                add_laplace_noise(&mut u, release.noise, rng);
                release
            }
            LocalMechanism::SignDs { epsilon, k, h } => {
                let mechanism = SignDs::new(u.len(), k, h, epsilon)?;
                let (sign, indices) = mechanism.release(&u, rng);
                let release = Release::signds(epsilon);
                return Ok(Protected(Released::Sign {
                    sign,
                    indices,
                    release,
                }));
            }
        };
        Ok(Protected(Released::Dense { values: u, release }))
    }

    /// The L1 clip bound C of the per-example gradients an inexact-ADMM primal step under this
    /// mechanism must use; only the Laplace mechanism protects one.
    pub fn admm_clip(&self) -> Result<f64, ProtectError> {
        match *self {
            LocalMechanism::Laplace { clip, .. } => Ok(clip),
            LocalMechanism::Gaussian { .. } | LocalMechanism::SignDs { .. } => {
                Err(ProtectError::AdmmNeedsLaplace(self.name()))
            }
        }
    }

    /// Protects an inexact-ADMM primal iterate z_p, computed from per-example gradients clipped
    /// in L1 to [`LocalMechanism::admm_clip`] with penalty `rho` over `total_examples` examples:
    /// z_p + Laplace(Delta / eps), Delta = 2C/(rho I) (seed 004, Example 2).
    pub fn protect_admm_step<R: Rng + CryptoRng>(
        &self,
        mut z: Vec<f32>,
        rho: f64,
        total_examples: u64,
        rng: &mut R,
    ) -> Result<Protected, ProtectError> {
        let clip = self.admm_clip()?;
        let LocalMechanism::Laplace { epsilon, .. } = *self else {
            unreachable!("admm_clip accepts the Laplace mechanism only");
        };
        let release = Release::laplace(epsilon, laplace_sensitivity(clip, rho, total_examples));
        add_laplace_noise(&mut z, release.noise, rng);
        Ok(Protected(Released::Dense { values: z, release }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let laplace = LocalMechanism::Laplace {
            epsilon: 2.0,
            clip: 1.5,
            steps: 6,
        };
        let out = laplace
            .protect_update(vec![0.0; 4], &CONFIG, &mut StdRng::seed_from_u64(1))
            .unwrap();
        let expected = sgd_l1_sensitivity(1.5, f64::from(0.1f32), 20, 6);
        assert_eq!(out.release().sensitivity, expected);
        assert_eq!(out.release().noise, expected / 2.0);
    }

    #[test]
    fn each_mechanism_releases_only_its_output() {
        let mut rng = StdRng::seed_from_u64(3);
        let u = vec![3.0f32, -4.0, 0.0, 1.0];
        let gaussian = LocalMechanism::Gaussian {
            epsilon: 1.0,
            delta: 1e-5,
            clip: 1.0,
        };
        let Released::Dense { values, release } = gaussian
            .protect_update(u.clone(), &CONFIG, &mut rng)
            .unwrap()
            .into_released()
        else {
            panic!("the Gaussian mechanism releases a dense update");
        };
        assert_eq!((values.len(), release.epsilon), (4, 1.0));
        let signds = LocalMechanism::SignDs {
            epsilon: 2.0,
            k: 1,
            h: 2,
        };
        let out = signds.protect_update(u, &CONFIG, &mut rng).unwrap();
        assert_eq!(out.release().epsilon, 2.0);
        assert!(
            matches!(out.into_released(), Released::Sign { indices, .. } if indices.len() == 2)
        );
        assert!(gaussian.admm_clip().is_err());
        assert_eq!(gaussian.gradient_rule(), GradientRule::Mean);
    }
}
