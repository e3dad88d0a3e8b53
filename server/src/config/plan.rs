//! The privacy plan: `[privacy]`, `[train]`, `[local]`, `[signds]`, `[admm]`, `[secagg]` and
//! `[robust]` parsed into one tagged value in which every mode holds exactly the settings it
//! uses, so that an invalid combination cannot be written down (parse, don't validate).
//! `crate::run::build` turns the plan into the run's pipeline and round policy; nothing else reads
//! the mode.

use super::{
    AdmmSection, Aggregator, Algorithm, ClipMode, ConfigError, NormAction, PrivacyMode, RunConfig,
    SecAggNoise, SecAggSection, ServerOptimizerKind, SignDsSection,
};
use fl_common::privacy::{
    AccountantKind, Budget, GaussianRound, LocalMechanism, PrivacyEvent, Sampling, TreeRound,
    max_rounds,
};
use fl_common::schedule::Schedule;
use fl_common::signds::SignDs;

/// What a run protects and how.
#[derive(Debug, Clone, PartialEq)]
pub enum PrivacyPlan {
    /// No privacy: the trusted server sees each update.
    None(Aggregation),
    /// Client-level central DP: the trusted curator clips, noises and accounts (Geyer et al.).
    Central(CentralNoise),
    /// A client-side mechanism protects every upload: the server is the adversary.
    Local(LocalPlan),
    /// Inexact ADMM (APPFL), without protection or under Laplace local DP.
    Iadmm(IadmmPlan),
    /// Secure aggregation: the server sees only the sum of clipped, quantised updates.
    Secure(SecurePlan),
    /// DP-FTRL: the trusted curator clips and adds tree-aggregation noise (Kairouz et al. 2021).
    Ftrl(FtrlPlan),
}

/// How the server combines the updates it sees.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Aggregation {
    /// The mean or the trimmed mean.
    pub rule: Aggregator,
    /// beta, for the trimmed mean.
    pub trim_fraction: f64,
    /// The operator's bound on update norms, and what it does (non-private FedAvg only).
    pub norm_bound: Option<(f64, NormAction)>,
}

/// Central Gaussian noise on the clipped sum, and its accounting.
#[derive(Debug, Clone, PartialEq)]
pub struct CentralNoise {
    /// How participants are drawn.
    pub sampling: Sampling,
    /// z_t.
    pub noise_multiplier: Schedule,
    /// How S is chosen.
    pub clip: ClipRule,
    /// What the ledger records and enforces.
    pub ledger: LedgerTerms,
}

/// DP-FTRL's tree noise on the clipped sum, and its accounting.
#[derive(Debug, Clone, PartialEq)]
pub struct FtrlPlan {
    /// z: each tree node's multiplier (one for the run).
    pub noise_multiplier: f64,
    /// S, fixed.
    pub clip_bound: f64,
    /// Rounds per tree.
    pub tree_rounds: u64,
    /// What the ledger records and enforces.
    pub ledger: LedgerTerms,
}

/// A client-side mechanism as configured; its sizes (SignDS's k and h) depend on the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MechanismSpec {
    /// Gaussian local DP on the clipped update.
    Gaussian {
        /// epsilon per upload.
        epsilon: f64,
        /// delta per upload.
        delta: f64,
        /// C, in L2.
        clip: f64,
    },
    /// Laplace noise on the output of L1-clipped local SGD (or of an IADMM step).
    Laplace {
        /// epsilon per upload.
        epsilon: f64,
        /// C, in L1 per example.
        clip: f64,
        /// S: local SGD steps.
        steps: u64,
    },
    /// SignDS: a sign and h dimensions.
    SignDs {
        /// epsilon per upload.
        epsilon: f64,
        /// k as a fraction of d, h or the ratio that picks it.
        sizes: SignDsSection,
    },
}

impl MechanismSpec {
    /// The mechanism for a model of `dim` parameters.
    pub fn resolve(&self, dim: usize) -> Result<LocalMechanism, ConfigError> {
        let mechanism = match *self {
            MechanismSpec::Gaussian {
                epsilon,
                delta,
                clip,
            } => LocalMechanism::Gaussian {
                epsilon,
                delta,
                clip,
            },
            MechanismSpec::Laplace {
                epsilon,
                clip,
                steps,
            } => LocalMechanism::Laplace {
                epsilon,
                clip,
                steps,
            },
            MechanismSpec::SignDs { epsilon, sizes } => {
                let k = ((sizes.top_k * dim as f64).round() as usize).max(1);
                let signds = match sizes.output_dimensions {
                    0 => SignDs::with_ratio(dim, k, epsilon, sizes.ratio),
                    h => SignDs::new(dim, k, h, epsilon),
                }
                .map_err(|e| ConfigError::Invalid(e.to_string()))?;
                LocalMechanism::SignDs {
                    epsilon,
                    k: signds.k,
                    h: signds.h,
                }
            }
        };
        mechanism
            .check(dim)
            .map_err(|e| ConfigError::Invalid(format!("[local]: {e}")))?;
        Ok(mechanism)
    }
}

/// A client-side mechanism and the delta its per-client accounts are stated at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalAccounting {
    /// The mechanism.
    pub mechanism: MechanismSpec,
    /// delta of the clients' composed losses.
    pub delta: f64,
}

/// How the server aggregates the releases of a client-side mechanism.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LocalRule {
    /// FedAvg over the released dense updates.
    FedAvg(Aggregation),
    /// SignDS's step of `learning_rate` along the mean sparse sign update.
    SignDs {
        /// eta_g.
        learning_rate: f64,
    },
}

/// A client-side mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalPlan {
    /// The mechanism and its accounts.
    pub accounting: LocalAccounting,
    /// The server's rule.
    pub rule: LocalRule,
}

/// Inexact ADMM.
#[derive(Debug, Clone, PartialEq)]
pub struct IadmmPlan {
    /// rho and residual balancing.
    pub admm: AdmmSection,
    /// Laplace local DP on each primal step, if any.
    pub laplace: Option<LocalAccounting>,
}

/// Secure aggregation.
#[derive(Debug, Clone, PartialEq)]
pub struct SecurePlan {
    /// `[secagg]`.
    pub settings: SecAggSection,
    /// S: the clients clip to it before quantising.
    pub clip: f64,
    /// Noise on the sum, if any.
    pub noise: SecureNoise,
}

/// Where a secure sum's noise comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum SecureNoise {
    /// None: the updates are hidden, the sum is not differentially private.
    None,
    /// The server noises the unmasked sum.
    Central(CentralNoise),
    /// The clients add discrete Gaussian noise before masking (Kairouz et al. 2021).
    Distributed {
        /// z_t.
        noise_multiplier: Schedule,
        /// What the ledger records and enforces.
        ledger: LedgerTerms,
    },
}

impl RunConfig {
    /// Parses the privacy mode with the sections it uses into the run's [`PrivacyPlan`],
    /// refusing a combination that does not make sense, naming the settings.
    pub fn plan(&self) -> Result<PrivacyPlan, ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let mode = self.privacy.mode;
        let iadmm = self.train.algorithm == Algorithm::Iadmm;
        self.robust.validate_for(mode, !iadmm)?;
        self.eval.validate_for(mode, !iadmm)?;
        // Only the built-in trainer clips every example's gradient in L1 inside training, and it
        // cannot train a model it does not know.
        if self.model.is_external() && (iadmm || mode == PrivacyMode::LdpLaplace) {
            return bad(
                "train.algorithm = \"iadmm\" and privacy.mode = \"ldp-laplace\" need the \
                 built-in trainer, which cannot train model.kind = \"external\""
                    .into(),
            );
        }
        // The per-example clipped SGD of both is left as its sensitivity analysis states it.
        if self.train.random_shift > 0 && (iadmm || mode == PrivacyMode::LdpLaplace) {
            return bad(
                "train.random_shift augments plain local SGD: train.algorithm = \"iadmm\" and \
                 privacy.mode = \"ldp-laplace\" train without it"
                    .into(),
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
            let laplace = match mode {
                PrivacyMode::None => None,
                PrivacyMode::LdpLaplace => Some(self.local_accounting()?),
                other => {
                    return bad(format!(
                        "train.algorithm = \"iadmm\" works with privacy.mode \"none\" or \
                         \"ldp-laplace\", not {other:?}"
                    ));
                }
            };
            let admm = self.admm.clone();
            return Ok(PrivacyPlan::Iadmm(IadmmPlan { admm, laplace }));
        }
        Ok(match mode {
            PrivacyMode::None => PrivacyPlan::None(self.aggregation()),
            PrivacyMode::Central => PrivacyPlan::Central(self.central_noise()?),
            PrivacyMode::LdpGaussian | PrivacyMode::LdpLaplace => PrivacyPlan::Local(LocalPlan {
                accounting: self.local_accounting()?,
                rule: LocalRule::FedAvg(self.aggregation()),
            }),
            PrivacyMode::SignDs => {
                self.signds.validate()?;
                PrivacyPlan::Local(LocalPlan {
                    accounting: self.local_accounting()?,
                    rule: LocalRule::SignDs {
                        learning_rate: self.signds.global_learning_rate,
                    },
                })
            }
            PrivacyMode::SecAgg => PrivacyPlan::Secure(self.secure()?),
            PrivacyMode::DpFtrl => PrivacyPlan::Ftrl(self.ftrl()?),
        })
    }

    /// The aggregation of updates the server sees.
    fn aggregation(&self) -> Aggregation {
        let r = &self.robust;
        Aggregation {
            rule: r.aggregator,
            trim_fraction: r.trim_fraction,
            norm_bound: r.max_update_norm.map(|b| (b, r.norm_action)),
        }
    }

    /// `[local]`'s mechanism for the run's client-side mode.
    fn local_accounting(&self) -> Result<LocalAccounting, ConfigError> {
        let (mode, l) = (self.privacy.mode, &self.local);
        l.validate(mode)?;
        let mechanism = match mode {
            PrivacyMode::LdpGaussian => MechanismSpec::Gaussian {
                epsilon: l.epsilon,
                delta: l.delta,
                clip: l.clip_bound,
            },
            PrivacyMode::LdpLaplace => MechanismSpec::Laplace {
                epsilon: l.epsilon,
                clip: l.clip_bound,
                steps: l.steps,
            },
            _ => MechanismSpec::SignDs {
                epsilon: l.epsilon,
                sizes: self.signds,
            },
        };
        Ok(LocalAccounting {
            mechanism,
            delta: l.delta,
        })
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
            SecAggNoise::Central => SecureNoise::Central(self.central_noise()?),
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

    /// Central noise: its clip rule, its ledger, and a first round the budget allows.
    fn central_noise(&self) -> Result<CentralNoise, ConfigError> {
        let p = &self.privacy;
        self.check_noise()?;
        let clip = match p.clip {
            ClipMode::Fixed => ClipRule::Fixed(p.clip_bound),
            ClipMode::Median => ClipRule::Median,
            ClipMode::Quantile => ClipRule::Quantile(self.quantile_clip()?),
        };
        let ledger = self.ledger_terms(p.sampling == Sampling::Poisson)?;
        let first = GaussianRound {
            q: self.clients_at(1) as f64 / self.server.clients as f64,
            noise_multiplier: p.noise_multiplier.at(1, self.server.rounds),
            sampling: p.sampling,
        };
        self.check_first_round(first, &ledger)?;
        Ok(CentralNoise {
            sampling: p.sampling,
            noise_multiplier: p.noise_multiplier.clone(),
            clip,
            ledger,
        })
    }

    /// DP-FTRL: one z for every node, a fixed S (a median or an adaptive bound would be released
    /// every round outside the tree), K / m_1 rounds per tree unless set.
    fn ftrl(&self) -> Result<FtrlPlan, ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.into()));
        let p = &self.privacy;
        self.check_noise()?;
        let Schedule::Constant(z) = p.noise_multiplier else {
            return bad(
                "privacy.mode = \"dp-ftrl\" needs one privacy.noise_multiplier (a number): the \
                 nodes of a tree share it",
            );
        };
        if p.clip != ClipMode::Fixed {
            return bad(
                "privacy.mode = \"dp-ftrl\" needs privacy.clip = \"fixed\": a median or adaptive \
                 bound would be released every round, outside the tree's accounting",
            );
        }
        let one_pass = (self.server.clients / self.clients_at(1).max(1)).max(1) as u64;
        let tree_rounds = p.tree_rounds.unwrap_or(one_pass);
        if tree_rounds == 0 {
            return bad("privacy.tree_rounds must be at least 1");
        }
        let ledger = self.ledger_terms(true)?;
        let first = TreeRound::zero_out(z, 1);
        self.check_first_round(first.node().expect("step 1 adds a node"), &ledger)?;
        Ok(FtrlPlan {
            noise_multiplier: z,
            clip_bound: p.clip_bound,
            tree_rounds,
            ledger,
        })
    }

    /// The noise multiplier, the clip bound and the budget of a run that keeps a ledger.
    fn check_noise(&self) -> Result<(), ConfigError> {
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
        p.budget()
            .check()
            .map_err(|e| ConfigError::Invalid(format!("privacy budget: {e}")))
    }

    /// The ledger's terms: `privacy.accountant`, or by default PLD (tighter) when it accounts
    /// every round of the run (Poisson-subsampled Gaussian rounds, tree aggregation) and RDP
    /// otherwise.
    fn ledger_terms(&self, pld_accounts: bool) -> Result<LedgerTerms, ConfigError> {
        let p = &self.privacy;
        let default = match pld_accounts {
            true => AccountantKind::Pld,
            false => AccountantKind::Rdp,
        };
        let accountant = p.accountant.unwrap_or(default);
        if accountant == AccountantKind::Pld && !pld_accounts {
            return Err(ConfigError::Invalid(format!(
                "privacy.accountant = \"{accountant}\" accounts Poisson-subsampled Gaussian \
                 rounds and DP-FTRL only: use \"rdp\" with fixed-size sampling or distributed \
                 noise"
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
    fn check_first_round(
        &self,
        first: GaussianRound,
        ledger: &LedgerTerms,
    ) -> Result<(), ConfigError> {
        let first = GaussianRound::new(first.q, first.noise_multiplier, first.sampling)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let event = PrivacyEvent::from(first);
        let allowed = max_rounds(ledger.accountant, &event, &ledger.budget, 1)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
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

impl PrivacyPlan {
    /// The terms of the run's central ledger, when it keeps one (local mechanisms are
    /// accounted per client instead).
    pub fn ledger(&self) -> Option<&LedgerTerms> {
        match self {
            PrivacyPlan::Central(c)
            | PrivacyPlan::Secure(SecurePlan {
                noise: SecureNoise::Central(c),
                ..
            }) => Some(&c.ledger),
            PrivacyPlan::Secure(SecurePlan {
                noise: SecureNoise::Distributed { ledger, .. },
                ..
            }) => Some(ledger),
            PrivacyPlan::Ftrl(f) => Some(&f.ledger),
            PrivacyPlan::None(_)
            | PrivacyPlan::Local(_)
            | PrivacyPlan::Iadmm(_)
            | PrivacyPlan::Secure(_) => None,
        }
    }

    /// The client-side mechanism every upload is protected with, if any.
    pub fn local(&self) -> Option<&LocalAccounting> {
        match self {
            PrivacyPlan::Local(l) => Some(&l.accounting),
            PrivacyPlan::Iadmm(i) => i.laplace.as_ref(),
            _ => None,
        }
    }
}

/// What a run's ledger records beside each round's event, and the budget it enforces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LedgerTerms {
    /// The budget.
    pub budget: Budget,
    /// The accountant that reads the ledger.
    pub accountant: AccountantKind,
    /// How S is chosen.
    pub clip_mode: ClipMode,
    /// Whether S itself leaks (the non-private median).
    pub clip_bound_leaks: bool,
    /// Whether participants are drawn from a seeded generator.
    pub sampling_seeded: bool,
}

/// Adaptive clipping state (Andrew et al. 2021, Alg. 1 with the geometric update).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuantileClip {
    /// Current bound S_t.
    pub bound: f64,
    /// gamma: the quantile of update norms S should track.
    pub target: f64,
    /// eta_C: step of the geometric update S <- S exp(-eta_C (b - gamma)).
    pub learning_rate: f64,
    /// sigma_b: standard deviation of the noise on the count of unclipped updates.
    pub count_noise: f64,
}

impl QuantileClip {
    /// The multiplier z_sum for the sum so that the sum and the noised count together cost one
    /// Gaussian round of multiplier z (Andrew et al. 2021, Thm 1; the count has sensitivity 1/2
    /// after centring): z = (z_sum^-2 + (2 sigma_b)^-2)^(-1/2), so
    /// z_sum = (z^-2 - (2 sigma_b)^-2)^(-1/2). Requires z < 2 sigma_b (checked at start-up).
    pub fn sum_multiplier(&self, z: f64) -> f64 {
        (z.powi(-2) - (2.0 * self.count_noise).powi(-2)).powf(-0.5)
    }
}

/// How S is chosen each round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ClipRule {
    /// A constant S.
    Fixed(f64),
    /// S = median of the round's update norms (Geyer et al.): not private.
    Median,
    /// S adapted towards a quantile of the norms, privately.
    Quantile(QuantileClip),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Aggregator, ClipMode};
    use fl_common::schedule::Schedule;

    fn private() -> RunConfig {
        let mut c = RunConfig::default();
        c.privacy.mode = PrivacyMode::Central;
        c
    }

    /// The accountant of `c`'s ledger.
    fn accountant(c: &RunConfig) -> AccountantKind {
        c.plan().unwrap().ledger().unwrap().accountant
    }

    /// The client-side mechanism of `c` for a model of `dim` parameters.
    fn mechanism(c: &RunConfig, dim: usize) -> Result<LocalMechanism, ConfigError> {
        c.plan()?
            .local()
            .expect("a local mode")
            .mechanism
            .resolve(dim)
    }

    /// The noise of a secure plan.
    fn secure_noise(plan: &PrivacyPlan) -> &SecureNoise {
        match plan {
            PrivacyPlan::Secure(s) => &s.noise,
            other => panic!("not a secure plan: {other:?}"),
        }
    }

    fn refused(c: &RunConfig) -> String {
        c.validate().unwrap_err().to_string()
    }

    #[test]
    fn private_runs_refuse_bad_privacy_settings_at_start_up() {
        private().validate().unwrap();
        let mut c = private();
        c.privacy.noise_multiplier = 0.0.into();
        assert!(refused(&c).contains("sigma > 0"));
        let mut c = private();
        c.privacy.noise_multiplier = (-1.0).into();
        assert!(refused(&c).contains("noise_multiplier"));
        let mut c = private();
        c.privacy.delta = 1.0;
        assert!(refused(&c).contains("delta"));
        let mut c = private();
        c.privacy.delta = 0.0;
        assert!(refused(&c).contains("delta"));
        let mut c = private();
        c.privacy.epsilon = -2.0;
        assert!(refused(&c).contains("epsilon"));
        // q = m / K > 1.
        let mut c = private();
        c.server.clients_per_round = 150.0.into();
        assert!(refused(&c).contains("clients_per_round"));
        let mut c = private();
        c.privacy.clip_bound = 0.0;
        assert!(refused(&c).contains("clip_bound"));
    }

    #[test]
    fn a_budget_spent_by_the_first_round_is_refused() {
        let mut c = private();
        c.privacy.noise_multiplier = 0.1.into();
        c.privacy.epsilon = 0.5;
        assert!(
            refused(&c).contains("already spent by round 1"),
            "{}",
            refused(&c)
        );
    }

    #[test]
    fn the_accountant_defaults_to_pld_for_poisson_and_pld_refuses_fixed_sampling() {
        let mut c = private();
        c.privacy.sampling = Sampling::Poisson;
        assert_eq!(accountant(&c), AccountantKind::Pld);
        c.privacy.sampling = Sampling::Fixed;
        assert_eq!(accountant(&c), AccountantKind::Rdp);
        c.privacy.accountant = Some(AccountantKind::Pld);
        assert!(refused(&c).contains("Poisson"), "{}", refused(&c));
    }

    #[test]
    fn inconsistent_schedules_are_refused() {
        let mut c = private();
        c.privacy.noise_multiplier = Schedule::Steps {
            steps: vec![(3, 1.0)],
        };
        assert!(refused(&c).contains("round 1"));
        let mut c = private();
        c.server.clients_per_round = Schedule::Steps {
            steps: vec![(1, 10.0), (20, 10.0), (10, 30.0)],
        };
        assert!(refused(&c).contains("strictly"));
        let mut c = private();
        c.privacy.clip = ClipMode::Quantile;
        c.privacy.clip_count_noise = Some(0.2);
        assert!(refused(&c).contains("sigma_b"));
    }

    #[test]
    fn secure_aggregation_settings_are_checked() {
        let mut c = RunConfig::default();
        c.privacy.mode = PrivacyMode::SecAgg;
        c.validate().unwrap();
        assert!(c.plan().unwrap().ledger().is_none());
        c.secagg.noise = SecAggNoise::Distributed;
        assert!(refused(&c).contains("a fixed number of participants"));
        c.privacy.sampling = Sampling::Fixed;
        // Accounted at z/2: z = 1 spends the default budget in one round, z = 4 does not.
        assert!(refused(&c).contains("already spent by round 1"));
        c.privacy.noise_multiplier = 4.0.into();
        c.validate().unwrap();
        // Calibrated for more survivors than the fewest: charged up front for the fewest, so
        // the first round is checked at z sqrt(f / f_c) (4 sqrt(0.05) / 2 = 0.45 spends it).
        let mut expected = c.clone();
        expected.secagg.calibrate_for = Some(1.0);
        expected.validate().unwrap();
        expected.secagg.min_survivors = 0.05;
        assert!(refused(&expected).contains("already spent by round 1"));
        expected.secagg.calibrate_for = Some(0.04);
        assert!(refused(&expected).contains("calibrate_for"));
        let plan = c.plan().unwrap();
        assert!(
            plan.ledger().is_some()
                && matches!(secure_noise(&plan), SecureNoise::Distributed { .. })
        );
        c.secagg.noise = SecAggNoise::Central;
        let mut poisson = c.clone();
        poisson.privacy.sampling = Sampling::Poisson;
        assert!(refused(&poisson).contains("needs privacy.sampling = \"fixed\""));
        let mut central = c.clone();
        central.secagg.calibrate_for = Some(1.0);
        assert!(refused(&central).contains("calibrate_for"));
        assert!(matches!(
            secure_noise(&c.plan().unwrap()),
            SecureNoise::Central(_)
        ));
        let mut bad = c.clone();
        bad.secagg.bits = 16;
        assert!(refused(&bad).contains("bits"));
        let mut bad = c.clone();
        bad.secagg.threshold = 0.5;
        assert!(refused(&bad).contains("threshold"));
        let mut bad = c.clone();
        bad.privacy.clip = ClipMode::Median;
        assert!(refused(&bad).contains("fixed"));
        let mut bad = c;
        bad.secagg.sim_dropout = 1.0;
        assert!(refused(&bad).contains("sim_dropout"));
    }

    /// DP-FTRL: one z, a fixed S, trees of K/m rounds unless set, PLD by default; a first node
    /// that spends the budget is refused.
    #[test]
    fn dp_ftrl_settings_are_checked() {
        let mut c = RunConfig::default();
        c.privacy.mode = PrivacyMode::DpFtrl;
        c.server.clients = 100;
        c.server.clients_per_round = 30.0.into();
        c.privacy.noise_multiplier = 3.0.into();
        let PrivacyPlan::Ftrl(plan) = c.plan().unwrap() else {
            panic!("a DP-FTRL plan")
        };
        assert_eq!((plan.tree_rounds, plan.noise_multiplier), (3, 3.0));
        assert_eq!(plan.ledger.accountant, AccountantKind::Pld);
        // A server needs stable identities; a simulation enrolls its own clients.
        let without = c.validate_for_server().unwrap_err().to_string();
        assert!(without.contains("needs server.enrollment"), "{without}");
        let mut enrolled = c.clone();
        enrolled.server.enrollment = Some("clients.toml".into());
        enrolled.validate_for_server().unwrap();
        let mut bad = c.clone();
        bad.privacy.noise_multiplier = Schedule::Linear { linear: (3.0, 4.0) };
        assert!(refused(&bad).contains("one privacy.noise_multiplier"));
        let mut bad = c.clone();
        bad.privacy.clip = ClipMode::Quantile;
        assert!(refused(&bad).contains("clip = \"fixed\""));
        let mut bad = c.clone();
        bad.privacy.tree_rounds = Some(0);
        assert!(refused(&bad).contains("tree_rounds"));
        let mut bad = c.clone();
        bad.privacy.noise_multiplier = 0.2.into();
        assert!(refused(&bad).contains("already spent by round 1"));
        c.eval.federated = true;
        assert!(refused(&c).contains("federated"));
    }

    #[test]
    fn robust_options_go_only_where_the_server_sees_updates() {
        let with = |mode, norm: Option<f64>, aggregator| {
            let mut c = RunConfig::default();
            c.privacy.mode = mode;
            c.robust.max_update_norm = norm;
            c.robust.aggregator = aggregator;
            c.validate()
        };
        let trimmed = Aggregator::TrimmedMean;
        assert!(with(PrivacyMode::None, Some(10.0), trimmed).is_ok());
        assert!(with(PrivacyMode::LdpGaussian, None, trimmed).is_ok());
        assert!(with(PrivacyMode::LdpGaussian, Some(10.0), Aggregator::Mean).is_err());
        assert!(with(PrivacyMode::Central, None, trimmed).is_err());
        assert!(with(PrivacyMode::SecAgg, None, trimmed).is_err());
        assert!(with(PrivacyMode::None, Some(-1.0), Aggregator::Mean).is_err());
        let mut c = RunConfig::default();
        c.robust.trim_fraction = 0.5;
        assert!(c.validate().is_err());
    }

    #[test]
    fn client_side_settings_are_checked() {
        let mut c = RunConfig::default();
        c.privacy.mode = PrivacyMode::LdpGaussian;
        c.validate().unwrap();
        assert!(c.plan().unwrap().ledger().is_none());
        assert!(matches!(
            mechanism(&c, 100).unwrap(),
            LocalMechanism::Gaussian { .. }
        ));
        let mut bad = c.clone();
        bad.local.epsilon = 0.0;
        assert!(refused(&bad).contains("epsilon > 0"));
        let mut bad = c.clone();
        bad.local.clip_bound = -1.0;
        assert!(refused(&bad).contains("clip_bound C > 0"));
        let mut bad = c.clone();
        bad.local.delta = 1.0;
        assert!(refused(&bad).contains("delta in (0, 1)"));
        // IADMM works without noise or with Laplace noise only.
        let mut bad = c.clone();
        bad.train.algorithm = Algorithm::Iadmm;
        assert!(refused(&bad).contains("iadmm"));
        bad.privacy.mode = PrivacyMode::LdpLaplace;
        bad.validate().unwrap();
        bad.admm.rho = 0.0;
        assert!(refused(&bad).contains("rho > 0"));
        let mut signds = c;
        signds.privacy.mode = PrivacyMode::SignDs;
        signds.local.clip_bound = 0.0; // SignDS does not clip.
        signds.signds.output_dimensions = 5;
        signds.validate().unwrap();
        assert_eq!(
            mechanism(&signds, 1000).unwrap(),
            LocalMechanism::SignDs {
                epsilon: 1.0,
                k: 10,
                h: 5
            }
        );
        // h above k.
        signds.signds.output_dimensions = 11;
        assert!(mechanism(&signds, 1000).is_err());
        signds.signds.top_k = 1.5;
        assert!(refused(&signds).contains("top_k"));
    }
}
