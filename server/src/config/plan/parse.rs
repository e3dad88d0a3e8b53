//! Parsing: `RunConfig::plan` reads the privacy mode and the sections it uses into a
//! [`PrivacyPlan`], refusing an invalid combination with the keys it involves.

use super::{
    Aggregation, CentralAccounting, CentralNoise, ClipRule, IadmmPlan, LedgerTerms,
    LocalAccounting, LocalPlan, LocalRule, PrivacyPlan, QuantileClip, SecureNoise, SecurePlan,
    VerifiedPlan,
};
use crate::config::{
    Algorithm, ClipMode, ConfigError, PrivacyMode, RunConfig, SecAggNoise, ServerOptimizerKind,
    VerifiedNoise,
};
use fl_privacy::{
    AccountantKind, GaussianRound, LocalKind, LocalSettings, Neighbours, PrivacyEvent,
    ReleaseAggregation, Sampling, UnsampledGaussian, max_rounds,
};

impl RunConfig {
    /// Parses the privacy mode with the sections it uses into the run's [`PrivacyPlan`],
    /// refusing a combination that does not make sense, naming the settings.
    pub fn plan(&self) -> Result<PrivacyPlan, ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let mode = self.privacy.mode;
        let iadmm = self.train.algorithm == Algorithm::Iadmm;
        let local = (mode.local()).map(|k| self.local.settings(k)).transpose()?;
        let each_update = match &local {
            Some(settings) => settings.aggregation() == ReleaseAggregation::Mean,
            None => mode == PrivacyMode::None,
        };
        self.robust.validate_for(mode, each_update, !iadmm)?;
        self.eval.validate_for(mode, !iadmm)?;
        // Only the built-in trainer clips every example's gradient in L1 inside training, and it
        // cannot train a model it does not know; that clipped SGD is left as its sensitivity
        // analysis states it, without augmentation.
        let built_in = (mode.local()).is_some_and(LocalKind::needs_built_in_trainer);
        let needs = |what: &str| {
            let of = match (iadmm, built_in) {
                (true, _) => "train.algorithm = \"iadmm\"".to_string(),
                (false, _) => format!("privacy.mode = \"{}\"", mode.name()),
            };
            Err(ConfigError::Invalid(format!("{of} {what}")))
        };
        if self.model.is_external() && (iadmm || built_in) {
            return needs(
                "needs the built-in trainer (per-example clipping inside training), which \
                 cannot train model.kind = \"external\"",
            );
        }
        if self.train.random_shift > 0 && (iadmm || built_in) {
            return needs(
                "trains without augmentation: train.random_shift applies to plain local SGD only",
            );
        }
        self.train
            .validate_server_optimizer()
            .map_err(ConfigError::Invalid)?;
        if iadmm && self.train.server_optimizer != ServerOptimizerKind::FedAvg {
            return bad(
                "train.server_optimizer works with FedAvg's rounds, not with iadmm (whose \
                 server step is the dual update)"
                    .into(),
            );
        }
        if iadmm {
            self.admm.validate()?;
            let protected = match (mode, local) {
                (PrivacyMode::None, _) => None,
                (PrivacyMode::Local(kind), Some(settings)) if kind.protects_admm() => {
                    Some(LocalAccounting { settings })
                }
                (other, _) => {
                    let names = (LocalKind::ALL.iter().filter(|k| k.protects_admm()))
                        .map(|k| format!("\"{k}\""));
                    let names: Vec<String> =
                        std::iter::once("\"none\"".into()).chain(names).collect();
                    return bad(format!(
                        "train.algorithm = \"iadmm\" works with privacy.mode {}, not \"{}\"",
                        names.join(" or "),
                        other.name()
                    ));
                }
            };
            let admm = self.admm.clone();
            return Ok(PrivacyPlan::Iadmm(IadmmPlan { admm, protected }));
        }
        Ok(match mode {
            PrivacyMode::None => PrivacyPlan::None(self.aggregation()),
            PrivacyMode::Central => {
                PrivacyPlan::Central(self.central_noise(CentralAccounting::Sampled)?)
            }
            PrivacyMode::Local(kind) => self.local_plan(match local {
                Some(settings) => settings,
                None => self.local.settings(kind)?,
            }),
            PrivacyMode::SecAgg => PrivacyPlan::Secure(self.secure()?),
            PrivacyMode::DpFtrl => PrivacyPlan::Ftrl(self.ftrl()?),
            PrivacyMode::Verified => PrivacyPlan::Verified(self.verified()?),
        })
    }

    /// Verified secure rounds and their noise.
    fn verified(&self) -> Result<VerifiedPlan, ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.into()));
        let p = &self.privacy;
        self.verified.validate()?;
        if p.clip != ClipMode::Fixed {
            return bad(
                "privacy.mode = \"verified\" needs privacy.clip = \"fixed\": the bound is \
                 proved by every client, and the server never sees an update norm",
            );
        }
        let noise = match self.verified.noise {
            VerifiedNoise::None => None,
            // As for secure aggregation's central noise: whether a round releases depends on
            // how many valid uploads came, which must not vary with one client's presence.
            VerifiedNoise::Aggregators if p.sampling != Sampling::Fixed => {
                return bad(
                    "verified.noise = \"aggregators\" needs privacy.sampling = \"fixed\": under \
                     Poisson sampling whether a round releases depends on how many clients took \
                     part, which the epsilon does not cover",
                );
            }
            VerifiedNoise::Aggregators => Some(self.central_noise(CentralAccounting::Sampled)?),
        };
        Ok(VerifiedPlan {
            settings: self.verified.clone(),
            clip: p.clip_bound,
            noise,
        })
    }

    /// The aggregation of updates the server sees.
    fn aggregation(&self) -> Aggregation {
        let r = &self.robust;
        Aggregation {
            rule: r.aggregator.clone(),
            norm_bound: r.max_update_norm.map(|b| (b, r.norm_action)),
        }
    }

    /// A client-side mode: its mechanism's settings and the server's rule for its releases.
    fn local_plan(&self, settings: LocalSettings) -> PrivacyPlan {
        let rule = match settings.aggregation() {
            ReleaseAggregation::Mean => LocalRule::FedAvg(self.aggregation()),
            ReleaseAggregation::SignStep { learning_rate } => LocalRule::SignStep { learning_rate },
        };
        let accounting = LocalAccounting { settings };
        PrivacyPlan::Local(LocalPlan { accounting, rule })
    }

    /// Secure aggregation and its noise.
    fn secure(&self) -> Result<SecurePlan, ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.into()));
        let p = &self.privacy;
        self.secagg.validate()?;
        if p.clip != ClipMode::Fixed {
            return bad(
                "secure aggregation needs privacy.clip = \"fixed\": the server never sees the \
                 update norms a median or quantile would need",
            );
        }
        let noise = match self.secagg.noise {
            SecAggNoise::None => SecureNoise::None,
            // Whether a round aborts (survivors below the minimum) depends on how many took
            // part; under Poisson sampling one client's presence changes that count, and the
            // ledger does not account the abort. A fixed number of participants does not vary.
            SecAggNoise::Central if p.sampling != Sampling::Fixed => {
                return bad(
                    "secure aggregation with central noise needs privacy.sampling = \"fixed\": \
                     under Poisson sampling whether a round aborts depends on how many clients \
                     took part, which the epsilon does not cover",
                );
            }
            SecAggNoise::Central => SecureNoise::Central(self.central_noise(
                // Every round's participants are fixed by the plan, not by the data: zero-out
                // neighbours need no sampling to be secret.
                match self.secagg.neighbours {
                    Neighbours::ReplaceOne => CentralAccounting::Sampled,
                    zero_out => CentralAccounting::Unsampled(zero_out),
                },
            )?),
            SecAggNoise::Distributed if p.sampling != Sampling::Fixed => {
                return bad(
                    "distributed noise is calibrated for a fixed number of participants: set \
                     privacy.sampling = \"fixed\"",
                );
            }
            SecAggNoise::Distributed => {
                self.check_noise()?;
                // A budget already spent by the first round is refused now. The distributed
                // discrete Gaussian is checked as a Gaussian round without sampling (q = 1) at
                // z over the neighbours' sensitivity factor (z/2 for replace-one), which its RDP
                // approaches for wide noise, and for the up-front charge of the fewest survivors
                // (z sqrt(f / f_c)); the ledger enforces the exact bound.
                let factor = self.secagg.neighbours.sensitivity(1.0);
                let fewest = (self.secagg.min_survivors / self.secagg.calibrate_for()).sqrt();
                let first = GaussianRound {
                    q: 1.0,
                    noise_multiplier: p.noise_multiplier.at(1, self.server.rounds) * fewest
                        / factor,
                    sampling: Sampling::Poisson,
                };
                let ledger = self.ledger_terms(false)?;
                self.check_first_round(first, &ledger)?;
                SecureNoise::Distributed {
                    noise_multiplier: p.noise_multiplier.clone(),
                    ledger,
                }
            }
        };
        Ok(SecurePlan {
            settings: self.secagg.clone(),
            clip: p.clip_bound,
            noise,
        })
    }

    /// Central noise accounted as `accounting` says: its clip rule, its ledger, and a first
    /// round the budget allows.
    fn central_noise(&self, accounting: CentralAccounting) -> Result<CentralNoise, ConfigError> {
        let p = &self.privacy;
        self.check_noise()?;
        let clip = match p.clip {
            ClipMode::Fixed => ClipRule::Fixed(p.clip_bound),
            ClipMode::Median => ClipRule::Median,
            ClipMode::Quantile => ClipRule::Quantile(self.quantile_clip()?),
        };
        let unsampled = match accounting {
            CentralAccounting::Sampled => false,
            CentralAccounting::Unsampled(_) => true,
        };
        let ledger = self.ledger_terms(p.sampling == Sampling::Poisson || unsampled)?;
        let noise_multiplier = p.noise_multiplier.at(1, self.server.rounds);
        let first = match accounting {
            CentralAccounting::Sampled => GaussianRound {
                q: self.clients_at(1) as f64 / self.server.clients as f64,
                noise_multiplier,
                sampling: p.sampling,
            },
            CentralAccounting::Unsampled(neighbours) => UnsampledGaussian {
                noise_multiplier,
                neighbours,
            }
            .as_round(),
        };
        self.check_first_round(first, &ledger)?;
        Ok(CentralNoise {
            sampling: p.sampling,
            accounting,
            noise_multiplier: p.noise_multiplier.clone(),
            clip,
            ledger,
        })
    }

    /// The noise multiplier, the clip bound and the budget of a run that keeps a ledger.
    pub(super) fn check_noise(&self) -> Result<(), ConfigError> {
        let p = &self.privacy;
        p.noise_multiplier
            .check(
                "privacy.noise_multiplier",
                |z| z > 0.0 && z.is_finite(),
                "positive (sigma > 0)",
            )
            .map_err(ConfigError::Invalid)?;
        if !(p.clip_bound > 0.0 && p.clip_bound.is_finite()) {
            return Err(ConfigError::Invalid(format!(
                "privacy.clip_bound S = {} must be positive",
                p.clip_bound
            )));
        }
        Ok(p.budget().check()?)
    }

    /// The ledger's terms: `privacy.accountant`, or by default PLD (tighter) when it accounts
    /// every round of the run (Poisson-subsampled Gaussian rounds, tree aggregation) and RDP
    /// otherwise.
    pub(super) fn ledger_terms(&self, pld_accounts: bool) -> Result<LedgerTerms, ConfigError> {
        let p = &self.privacy;
        let default = match pld_accounts {
            true => AccountantKind::Pld,
            false => AccountantKind::Rdp,
        };
        let accountant = p.accountant.unwrap_or(default);
        if accountant == AccountantKind::Pld && !pld_accounts {
            return Err(ConfigError::Invalid(format!(
                "privacy.accountant = \"{accountant}\" accounts Poisson-subsampled Gaussian \
                 rounds, rounds without sampling (DP-FTRL, secure aggregation's central noise \
                 under secagg.neighbours = \"zero-out\") only: use \"rdp\" with fixed-size \
                 sampling or distributed noise"
            )));
        }
        Ok(LedgerTerms {
            budget: p.budget(),
            accountant,
            clip_mode: p.clip,
            clip_bound_leaks: p.clip == ClipMode::Median,
            sampling_seeded: self.server.seed.is_some(),
        })
    }

    /// The adaptive clip rule (Andrew et al. 2021), with sigma_b for the first round's m.
    fn quantile_clip(&self) -> Result<QuantileClip, ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let p = &self.privacy;
        let m = &self.server.clients_per_round;
        let m_min = m.values().into_iter().fold(f64::INFINITY, f64::min);
        let sigma_b = p.count_noise(m_min);
        let z_max = (p.noise_multiplier.values().into_iter()).fold(0.0, f64::max);
        if !(p.target_quantile > 0.0 && p.target_quantile < 1.0) {
            return bad("privacy.target_quantile must be in (0, 1)".into());
        }
        if !(p.clip_learning_rate > 0.0 && p.clip_learning_rate.is_finite()) {
            return bad("privacy.clip_learning_rate must be positive".into());
        }
        if !(sigma_b > 0.0 && z_max < 2.0 * sigma_b) {
            return bad(format!(
                "privacy.clip_count_noise sigma_b = {sigma_b} must exceed z/2 = {} so that the \
                 sum keeps finite noise (Andrew et al. 2021)",
                z_max / 2.0
            ));
        }
        Ok(QuantileClip {
            bound: p.clip_bound,
            target: p.target_quantile,
            learning_rate: p.clip_learning_rate,
            count_noise: p.count_noise(self.clients_at(1) as f64),
        })
    }

    /// A budget already spent by the first round is refused now, not discovered later.
    pub(super) fn check_first_round(
        &self,
        first: GaussianRound,
        ledger: &LedgerTerms,
    ) -> Result<(), ConfigError> {
        let first = GaussianRound::new(first.q, first.noise_multiplier, first.sampling)?;
        let event = PrivacyEvent::from(first);
        let allowed = max_rounds(ledger.accountant, &event, &ledger.budget, 1)?;
        if allowed == 0 {
            return Err(ConfigError::Invalid(format!(
                "privacy budget {:?} is already spent by round 1 (q = {:.4}, sigma = {}): raise \
                 the noise multiplier or lower clients_per_round",
                ledger.budget, first.q, first.noise_multiplier
            )));
        }
        Ok(())
    }
}
