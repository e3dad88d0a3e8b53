//! The privacy plan: `[privacy]`, `[train]`, `[local]`, `[admm]`, `[secagg]` and
//! `[robust]` parsed into one tagged value in which every mode holds exactly the settings it
//! uses, so that an invalid combination cannot be written down (parse, don't validate).
//! `crate::run::build` turns the plan into the run's pipeline and round policy; nothing else reads
//! the mode.

use super::{
    AdmmSection, Aggregator, ClipMode, ConfigError, NormAction, SecAggSection, VerifiedSection,
};
use fl_common::schedule::Schedule;
use fl_privacy::{AccountantKind, Budget, LocalMechanism, LocalSettings, Neighbours, Sampling};

mod ftrl;
mod parse;

pub use ftrl::FtrlPlan;
#[cfg(test)]
mod tests;

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
    /// DP-FTRL: the trusted curator clips and adds correlated noise (Kairouz et al. 2021).
    Ftrl(FtrlPlan),
    /// Verified secure rounds: the server and a helper sum shares of updates proved within S.
    Verified(VerifiedPlan),
}

/// Verified secure rounds and their noise.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifiedPlan {
    /// `[verified]`.
    pub settings: VerifiedSection,
    /// S: the bound every contribution is proved within, the sum's sensitivity.
    pub clip: f64,
    /// The aggregators' noise, accounted as central noise on a fixed-size sample; `None`
    /// without noise.
    pub noise: Option<CentralNoise>,
}

/// How the server combines the updates it sees.
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregation {
    /// The rule, with its own settings.
    pub rule: Aggregator,
    /// The operator's bound on update norms, and what it does (non-private FedAvg only).
    pub norm_bound: Option<(f64, NormAction)>,
}

/// Central Gaussian noise on the clipped sum, and its accounting.
#[derive(Debug, Clone, PartialEq)]
pub struct CentralNoise {
    /// How participants are drawn.
    pub sampling: Sampling,
    /// How a round is accounted.
    pub accounting: CentralAccounting,
    /// z_t.
    pub noise_multiplier: Schedule,
    /// How S is chosen.
    pub clip: ClipRule,
    /// What the ledger records and enforces.
    pub ledger: LedgerTerms,
}

/// How a round of central noise is accounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CentralAccounting {
    /// As sampled: Poisson's add/remove-one neighbours with amplification at q = m/K, or
    /// fixed-size sampling's replace-one neighbours (sensitivity 2S) at q = m/K.
    Sampled,
    /// Without amplification, the participants public (secure aggregation with fixed
    /// participation), under this relation: a zero-out round moves the sum by at most S.
    Unsampled(Neighbours),
}

/// A client-side mechanism as configured (its `[local]` table, read and checked); its sizes
/// (SignDS's k and h) depend on the model, so it is resolved for one.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalAccounting {
    /// The mechanism's settings.
    pub settings: LocalSettings,
}

impl LocalAccounting {
    /// The mechanism for a model of `dim` parameters.
    pub fn resolve(&self, dim: usize) -> Result<LocalMechanism, ConfigError> {
        Ok(self.settings.resolve(dim)?)
    }
}

/// How the server aggregates the releases of a client-side mechanism.
#[derive(Debug, Clone, PartialEq)]
pub enum LocalRule {
    /// FedAvg over the released dense updates.
    FedAvg(Aggregation),
    /// A step of `learning_rate` along the mean sparse sign update (SignDS).
    SignStep {
        /// eta_g.
        learning_rate: f64,
    },
}

/// A client-side mode.
#[derive(Debug, Clone, PartialEq)]
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
    /// The client-side mechanism that protects each primal step, if any.
    pub protected: Option<LocalAccounting>,
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

impl PrivacyPlan {
    /// DP-FTRL's noise stream, before its first step.
    pub fn stream(&self) -> Option<&fl_privacy::AnyStream> {
        match self {
            PrivacyPlan::Ftrl(f) => Some(&f.stream),
            PrivacyPlan::None(_)
            | PrivacyPlan::Central(_)
            | PrivacyPlan::Local(_)
            | PrivacyPlan::Iadmm(_)
            | PrivacyPlan::Secure(_)
            | PrivacyPlan::Verified(_) => None,
        }
    }

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
            PrivacyPlan::Verified(VerifiedPlan { noise: Some(c), .. }) => Some(&c.ledger),
            PrivacyPlan::None(_)
            | PrivacyPlan::Local(_)
            | PrivacyPlan::Iadmm(_)
            | PrivacyPlan::Secure(_)
            | PrivacyPlan::Verified(_) => None,
        }
    }

    /// The client-side mechanism every upload is protected with, if any.
    pub fn local(&self) -> Option<&LocalAccounting> {
        match self {
            PrivacyPlan::Local(l) => Some(&l.accounting),
            PrivacyPlan::Iadmm(i) => i.protected.as_ref(),
            PrivacyPlan::None(_)
            | PrivacyPlan::Central(_)
            | PrivacyPlan::Secure(_)
            | PrivacyPlan::Verified(_)
            | PrivacyPlan::Ftrl(_) => None,
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
