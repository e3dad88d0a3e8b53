//! `[admm]`: inexact ADMM.

use super::ConfigError;
use serde::{Deserialize, Serialize};

/// `[admm]`: the penalty of inexact ADMM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AdmmSection {
    /// rho: the penalty (the step of the linearised primal update is 1/rho; with P clients the
    /// global step is about 1/(rho P)).
    pub rho: f64,
    /// Residual balancing (Boyd et al. 2011, Sec. 3.4.1): rho times tau when the primal residual
    /// exceeds mu times the dual one, divided by tau in the other case.
    pub balance: bool,
    /// mu: how far apart the residuals may be before rho changes.
    pub balance_mu: f64,
    /// tau: the factor rho changes by.
    pub balance_tau: f64,
    /// I: the examples of all clients, public: `fl-server` requires it for IADMM (clients send
    /// no counts); `fl sim` fills it in from its partition.
    pub total_examples: Option<u64>,
}

impl Default for AdmmSection {
    fn default() -> Self {
        Self {
            rho: 1.0,
            balance: false,
            balance_mu: 10.0,
            balance_tau: 2.0,
            total_examples: None,
        }
    }
}

impl AdmmSection {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let ok = self.rho > 0.0
            && self.rho.is_finite()
            && self.balance_mu > 1.0
            && self.balance_tau > 1.0
            && self.balance_mu.is_finite()
            && self.balance_tau.is_finite();
        if ok {
            Ok(())
        } else {
            Err(ConfigError::Invalid(
                "[admm] needs rho > 0, balance_mu > 1 and balance_tau > 1".into(),
            ))
        }
    }
}
