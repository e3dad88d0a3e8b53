//! Client-side privacy as a protocol sees it: the mechanism a round asks for
//! ([`LocalMechanism`]), what one upload spent ([`Release`]); `local_ledger.rs` composes a client's
//! releases over the rounds it took part in.
//!
//! - Gaussian local DP (W_p = W + G): the update is clipped to L2 norm C; replacing all of a
//!   client's data moves it by at most 2C, and sigma is the analytic Gaussian calibration for
//!   (eps, delta) at that sensitivity. This protects the client's whole contribution.
//! - Laplace output perturbation (APPFL): eps-DP for one example of the client (per-example
//!   gradients clipped in L1); Delta depends on the training algorithm.
//! - SignDS: eps-LDP for the client's whole update (EM-MDS).
//!
//! Composition over a client's releases: a Gaussian release has RDP alpha Delta^2 / (2 sigma^2)
//! (Mironov 2017, Prop. 7); an eps-DP release has RDP at most eps at every order (Mironov 2017,
//! Prop. 3); RDP adds up (Prop. 1) and converts as the central accountant does. Pure releases alone
//! compose to the sum of their epsilons (Dwork and Roth 2014, Thm 3.16).

use super::analytic_gaussian::{analytic_gaussian_sigma, gaussian_delta};
use super::sampled_gaussian::AccountingError;

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
    #[error("the ldp-laplace mechanism needs at least one local step")]
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

fn check_epsilon(epsilon: f64) -> Result<(), LocalPrivacyError> {
    if epsilon > 0.0 && epsilon.is_finite() {
        Ok(())
    } else {
        Err(LocalPrivacyError::Epsilon(epsilon))
    }
}

fn check_clip(clip: f64) -> Result<(), LocalPrivacyError> {
    if clip > 0.0 && clip.is_finite() {
        Ok(())
    } else {
        Err(LocalPrivacyError::Clip(clip))
    }
}

/// The mechanism a round asks clients to apply, with its per-release parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LocalMechanism {
    /// Clip the update to L2 norm `clip`, add N(0, sigma^2) with sigma calibrated for
    /// (`epsilon`, `delta`) at sensitivity 2C.
    Gaussian {
        /// Per-release epsilon.
        epsilon: f64,
        /// Per-release delta.
        delta: f64,
        /// C (L2).
        clip: f64,
    },
    /// Clip per-example gradients to L1 norm `clip`, run exactly `steps` SGD steps on batches
    /// of the round's B, add Laplace(Delta / epsilon) to the output, Delta from these public
    /// numbers alone (never from the client's example count).
    Laplace {
        /// Per-release epsilon.
        epsilon: f64,
        /// C (L1, per example).
        clip: f64,
        /// S: local SGD steps.
        steps: u64,
    },
    /// SignDS: release h of d dimensions chosen by EM-MDS around the top-k set.
    SignDs {
        /// Per-release epsilon.
        epsilon: f64,
        /// k.
        k: usize,
        /// h.
        h: usize,
    },
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
        if let Some(d) = self.delta
            && !(d > 0.0 && d < 1.0)
        {
            return Err(LocalPrivacyError::Delta(d));
        }
        if let Some(c) = self.clip {
            check_clip(c)?;
        }
        Ok(())
    }
}

impl LocalMechanism {
    /// The mode's name in configurations.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// The kind of the releases it makes.
    pub fn kind(&self) -> ReleaseKind {
        match self {
            Self::Gaussian { .. } => ReleaseKind::Gaussian,
            Self::Laplace { .. } => ReleaseKind::Laplace,
            Self::SignDs { .. } => ReleaseKind::SignDs,
        }
    }

    /// Per-release epsilon.
    pub fn epsilon(&self) -> f64 {
        match *self {
            Self::Gaussian { epsilon, .. }
            | Self::Laplace { epsilon, .. }
            | Self::SignDs { epsilon, .. } => epsilon,
        }
    }

    /// The delta at which this mechanism's releases compose: `composition_delta` for the
    /// Gaussian mechanism, 0 for the pure (Laplace, SignDS) ones.
    pub fn composed_delta(&self, composition_delta: f64) -> f64 {
        match self {
            Self::Gaussian { .. } => composition_delta,
            Self::Laplace { .. } | Self::SignDs { .. } => 0.0,
        }
    }

    /// Checks the parameters for a model of `dim` parameters.
    pub fn check(&self, dim: usize) -> Result<(), LocalPrivacyError> {
        check_epsilon(self.epsilon())?;
        match *self {
            Self::Gaussian { delta, clip, .. } => {
                if !(delta > 0.0 && delta < 1.0) {
                    return Err(LocalPrivacyError::Delta(delta));
                }
                check_clip(clip)
            }
            Self::Laplace { steps: 0, .. } => Err(LocalPrivacyError::Steps),
            Self::Laplace { clip, .. } => check_clip(clip),
            Self::SignDs { k, h, .. } => {
                if h == 0 || h > k || k >= dim {
                    return Err(LocalPrivacyError::SignDsSizes { k, h, d: dim });
                }
                Ok(())
            }
        }
    }

    /// This mechanism with the client's own limits applied: epsilon and delta are the smaller of
    /// the two, the clip bound the client's when it has one.
    pub fn tightened(&self, own: &ClientLimits) -> Self {
        let min = |a: f64, b: Option<f64>| b.map_or(a, |b| a.min(b));
        match *self {
            Self::Gaussian {
                epsilon,
                delta,
                clip,
            } => Self::Gaussian {
                epsilon: min(epsilon, own.epsilon),
                delta: min(delta, own.delta),
                clip: own.clip.unwrap_or(clip),
            },
            Self::Laplace {
                epsilon,
                clip,
                steps,
            } => Self::Laplace {
                epsilon: min(epsilon, own.epsilon),
                clip: own.clip.unwrap_or(clip),
                steps,
            },
            Self::SignDs { epsilon, k, h } => Self::SignDs {
                epsilon: min(epsilon, own.epsilon),
                k,
                h,
            },
        }
    }

    /// The release one upload under this mechanism records, as far as accounting goes (a
    /// client checks its total before it trains): the Gaussian one exactly; the Laplace one
    /// with sensitivity 1, since a pure release composes by its epsilon alone.
    pub fn accounted_release(&self) -> Result<Release, AccountingError> {
        Ok(match *self {
            Self::Gaussian {
                epsilon,
                delta,
                clip,
            } => Release::gaussian(epsilon, delta, clip)?,
            Self::Laplace { epsilon, .. } => Release::laplace(epsilon, 1.0),
            Self::SignDs { epsilon, .. } => Release::signds(epsilon),
        })
    }

    /// Checks that `release` is of this kind, claims no more than this round allows, and that
    /// its noise gives what it claims. The server cannot see whether the noise was really added:
    /// a client that adds less only exposes itself.
    pub fn admits(&self, release: &Release) -> Result<(), LocalPrivacyError> {
        let expected = self.name();
        if self.kind() != release.kind {
            return Err(LocalPrivacyError::Mismatch {
                expected,
                got: release.kind.name(),
            });
        }
        check_epsilon(release.epsilon)?;
        let allowed = self.epsilon();
        if release.epsilon > allowed * (1.0 + CLAIM_SLACK) {
            return Err(LocalPrivacyError::Looser {
                what: "epsilon",
                got: release.epsilon,
                allowed,
            });
        }
        let too_little = || LocalPrivacyError::TooLittleNoise {
            noise: release.noise,
            sensitivity: release.sensitivity,
        };
        let positive = |x: f64| x > 0.0 && x.is_finite();
        match *self {
            Self::Gaussian { delta, .. } => {
                if !(release.delta > 0.0 && release.delta <= delta * (1.0 + CLAIM_SLACK)) {
                    return Err(LocalPrivacyError::Looser {
                        what: "delta",
                        got: release.delta,
                        allowed: delta,
                    });
                }
                let achieved = gaussian_delta(release.noise, release.sensitivity, release.epsilon);
                if !(positive(release.noise) && positive(release.sensitivity))
                    || achieved > release.delta * (1.0 + 1e-6)
                {
                    return Err(too_little());
                }
            }
            Self::Laplace { .. } => {
                // b >= Delta / eps (Dwork and Roth 2014, Thm 3.6).
                if !(positive(release.noise) && positive(release.sensitivity))
                    || release.noise * release.epsilon < release.sensitivity * (1.0 - CLAIM_SLACK)
                {
                    return Err(too_little());
                }
            }
            Self::SignDs { .. } => {}
        }
        Ok(())
    }
}

/// Defines [`ReleaseKind`] and its one list, [`ReleaseKind::ALL`], from one list of variants with
/// their configuration names and descriptions: the names, the parser and the command line's
/// choices all come from it.
macro_rules! release_kinds {
    ($($(#[$doc:meta])* $variant:ident => $name:literal, $description:literal;)*) => {
        /// The kind of a local release.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum ReleaseKind {
            $($(#[$doc])* $variant,)*
        }

        impl ReleaseKind {
            /// Every kind, once.
            pub const ALL: &'static [ReleaseKind] = &[$(Self::$variant),*];

            /// The mode's name in configurations.
            pub fn name(&self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                }
            }

            /// What it is, in a few words.
            pub fn description(&self) -> &'static str {
                match self {
                    $(Self::$variant => $description,)*
                }
            }
        }
    };
}

release_kinds! {
    /// Gaussian local DP.
    Gaussian => "ldp-gaussian", "Gaussian local DP";
    /// Laplace output perturbation.
    Laplace => "ldp-laplace", "Laplace output perturbation";
    /// SignDS.
    SignDs => "signds", "SignDS";
}

impl std::str::FromStr for ReleaseKind {
    type Err = String;

    /// The kind [`ReleaseKind::name`] names.
    fn from_str(s: &str) -> Result<Self, String> {
        let found = Self::ALL.iter().find(|k| k.name() == s);
        found.copied().ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
            format!("unknown local mechanism `{s}` ({})", names.join(", "))
        })
    }
}

/// What one upload spent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Release {
    /// The mechanism.
    pub kind: ReleaseKind,
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
    /// A Gaussian release of an update clipped to L2 norm `clip`: sigma is the analytic
    /// calibration (Balle and Wang 2018) for (eps, delta) at sensitivity 2C.
    pub fn gaussian(epsilon: f64, delta: f64, clip: f64) -> Result<Self, AccountingError> {
        let sensitivity = 2.0 * clip;
        Ok(Self {
            kind: ReleaseKind::Gaussian,
            epsilon,
            delta,
            noise: analytic_gaussian_sigma(sensitivity, epsilon, delta)?,
            sensitivity,
        })
    }

    /// A Laplace release of L1 sensitivity Delta: b = Delta / eps (Dwork and Roth 2014, Thm 3.6).
    pub fn laplace(epsilon: f64, sensitivity: f64) -> Self {
        Self {
            kind: ReleaseKind::Laplace,
            epsilon,
            delta: 0.0,
            noise: sensitivity / epsilon,
            sensitivity,
        }
    }

    /// A SignDS release (eps-LDP by EM-MDS).
    pub fn signds(epsilon: f64) -> Self {
        Self {
            kind: ReleaseKind::SignDs,
            epsilon,
            delta: 0.0,
            noise: 0.0,
            sensitivity: 0.0,
        }
    }

    /// An upper bound on the release's RDP at order alpha.
    pub(super) fn rdp(&self, alpha: f64) -> f64 {
        match self.kind {
            // Mironov 2017, Prop. 7: alpha Delta^2 / (2 sigma^2).
            ReleaseKind::Gaussian => alpha * self.sensitivity.powi(2) / (2.0 * self.noise.powi(2)),
            // Mironov 2017, Prop. 3: eps-DP is (alpha, eps)-RDP.
            ReleaseKind::Laplace | ReleaseKind::SignDs => self.epsilon,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaussian() -> LocalMechanism {
        LocalMechanism::Gaussian {
            epsilon: 2.0,
            delta: 1e-5,
            clip: 1.0,
        }
    }

    #[test]
    fn parameters_are_checked() {
        gaussian().check(100).unwrap();
        let bad = LocalMechanism::Laplace {
            epsilon: 0.0,
            clip: 1.0,
            steps: 1,
        };
        assert_eq!(bad.check(100), Err(LocalPrivacyError::Epsilon(0.0)));
        let bad = LocalMechanism::Laplace {
            epsilon: 1.0,
            clip: -1.0,
            steps: 1,
        };
        assert_eq!(bad.check(100), Err(LocalPrivacyError::Clip(-1.0)));
        let bad = LocalMechanism::SignDs {
            epsilon: 1.0,
            k: 10,
            h: 11,
        };
        assert!(matches!(
            bad.check(100),
            Err(LocalPrivacyError::SignDsSizes { .. })
        ));
        let limits = ClientLimits {
            epsilon: Some(f64::NAN),
            ..ClientLimits::default()
        };
        assert!(limits.check().is_err());
    }

    #[test]
    fn a_client_only_tightens_the_round() {
        let own = ClientLimits {
            epsilon: Some(0.5),
            delta: Some(1e-3),
            clip: Some(0.2),
        };
        assert_eq!(
            gaussian().tightened(&own),
            LocalMechanism::Gaussian {
                epsilon: 0.5,
                delta: 1e-5,
                clip: 0.2
            }
        );
        let loose = ClientLimits {
            epsilon: Some(50.0),
            ..ClientLimits::default()
        };
        assert_eq!(gaussian().tightened(&loose), gaussian());
    }

    #[test]
    fn the_server_admits_only_matching_and_consistent_claims() {
        let round = gaussian();
        let honest = Release::gaussian(2.0, 1e-5, 1.0).unwrap();
        round.admits(&honest).unwrap();
        // A stricter client is fine.
        round
            .admits(&Release::gaussian(1.0, 1e-6, 3.0).unwrap())
            .unwrap();
        let looser = Release::gaussian(3.0, 1e-5, 1.0).unwrap();
        assert!(matches!(
            round.admits(&looser),
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
            round.admits(&thin),
            Err(LocalPrivacyError::TooLittleNoise { .. })
        ));
        assert!(matches!(
            round.admits(&Release::signds(1.0)),
            Err(LocalPrivacyError::Mismatch { .. })
        ));
        let laplace = LocalMechanism::Laplace {
            epsilon: 1.0,
            clip: 1.0,
            steps: 1,
        };
        laplace.admits(&Release::laplace(1.0, 0.01)).unwrap();
        let thin = Release {
            noise: 0.005,
            ..Release::laplace(1.0, 0.01)
        };
        assert!(laplace.admits(&thin).is_err());
    }
}
