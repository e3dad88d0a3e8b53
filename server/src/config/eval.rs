//! `[eval]`: federated evaluation, the global model evaluated on the clients' own data.

use super::{ConfigError, PrivacyMode};
use serde::{Deserialize, Serialize};

/// `[eval]`: federated evaluation. Every `every` rounds the round's sampled clients evaluate the
/// global model they receive (the model of the round before) on their own examples, before
/// training, and send (loss, accuracy, n) with their update; the server writes the n-weighted
/// means to `metrics.jsonl` beside its own test evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EvalSection {
    /// Whether clients evaluate: the round's sampled clients evaluate the model they receive on
    /// their own examples before training (`Trainer::evaluate`; the Python package's
    /// `evaluate`) and send (loss, accuracy, n) with their update; `metrics.jsonl` gets
    /// `federated_eval`. Refused at start-up under every privacy mode but `none`, since the
    /// figures are released through no mechanism, and for algorithms other than FedAvg.
    pub federated: bool,
    /// Every how many rounds (rounds 1, 1 + every, 1 + 2 every, ...).
    pub every: u64,
}

impl Default for EvalSection {
    fn default() -> Self {
        Self {
            federated: false,
            every: 1,
        }
    }
}

impl EvalSection {
    /// Whether round `round`'s clients evaluate.
    pub fn federated_at(&self, round: u64) -> bool {
        self.federated && round.saturating_sub(1).is_multiple_of(self.every)
    }

    /// Checks the period, and that evaluation reports are only asked for where the server may
    /// see them: a client's figures on its own data are released in `metrics.jsonl` through no
    /// mechanism and no ledger, so every privacy mode but `none` refuses them. Only FedAvg
    /// (`fedavg`) sends clients the global model to evaluate.
    pub(super) fn validate_for(&self, mode: PrivacyMode, fedavg: bool) -> Result<(), ConfigError> {
        if self.every == 0 {
            return Err(ConfigError::Invalid("eval.every must be at least 1".into()));
        }
        if self.federated && mode != PrivacyMode::None {
            return Err(ConfigError::Invalid(format!(
                "eval.federated = true releases the clients' figures on their own data, which \
                 no mechanism protects and no ledger accounts: it works only with privacy.mode \
                 = \"none\", not {mode:?}"
            )));
        }
        if self.federated && !fedavg {
            return Err(ConfigError::Invalid(
                "eval.federated = true needs train.algorithm = \"fedavg\" (IADMM clients do not \
                 receive the global model)"
                    .into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RunConfig;

    #[test]
    fn federated_evaluation_is_periodic_and_refused_under_every_privacy_mode() {
        let eval = EvalSection {
            federated: true,
            every: 3,
        };
        let rounds: Vec<u64> = (1..=8).filter(|&t| eval.federated_at(t)).collect();
        assert_eq!(rounds, [1, 4, 7]);
        assert!(!EvalSection::default().federated_at(1));
        for mode in ["central", "secagg", "ldp-gaussian", "ldp-laplace", "signds"] {
            let text = format!("[eval]\nfederated = true\n[privacy]\nmode = \"{mode}\"\n");
            let c: RunConfig = toml::from_str(&text).unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("eval.federated"), "{mode}: {e}");
        }
        let c: RunConfig = toml::from_str("[eval]\nfederated = true\nevery = 2\n").unwrap();
        c.validate().unwrap();
        let c: RunConfig = toml::from_str("[eval]\nevery = 0\n").unwrap();
        assert!(c.validate().is_err());
    }
}
