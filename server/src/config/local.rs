//! `[local]` and `[signds]`: the client-side mechanisms.

use super::{ConfigError, PrivacyMode};
use serde::{Deserialize, Serialize};

/// `[local]`: the per-round parameters of the client-side mechanisms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LocalSection {
    /// epsilon of each upload (a client's loss composes over the rounds it takes part in).
    pub epsilon: f64,
    /// delta of each upload (`ldp-gaussian`).
    pub delta: f64,
    /// S: the L2 bound of the update (`ldp-gaussian`), or R: the L1 bound of each per-example
    /// gradient (`ldp-laplace`).
    pub clip_bound: f64,
    /// J: the local SGD steps each client runs under `ldp-laplace`, each on a batch of
    /// `train.batch_size` examples (fewer when a client has fewer), whatever its number of
    /// examples: the sensitivity 2 R eta (1/B + J - 1) is then public.
    pub steps: u64,
}

impl Default for LocalSection {
    fn default() -> Self {
        Self {
            epsilon: 1.0,
            delta: 1e-5,
            clip_bound: 1.0,
            steps: 1,
        }
    }
}

impl LocalSection {
    pub(super) fn validate(&self, mode: PrivacyMode) -> Result<(), ConfigError> {
        let ok = self.epsilon > 0.0
            && self.epsilon.is_finite()
            && (mode != PrivacyMode::LdpGaussian || (self.delta > 0.0 && self.delta < 1.0))
            && (mode == PrivacyMode::SignDs
                || (self.clip_bound > 0.0 && self.clip_bound.is_finite()))
            && self.steps > 0;
        if ok {
            Ok(())
        } else {
            Err(ConfigError::Invalid(format!(
                "[local] needs epsilon > 0, delta in (0, 1), clip_bound C > 0 and steps >= 1 (got \
                 epsilon = {}, delta = {}, clip_bound = {}, steps = {})",
                self.epsilon, self.delta, self.clip_bound, self.steps
            )))
        }
    }
}

/// `[signds]`: SignDS's sizes and the server's step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SignDsSection {
    /// k as a fraction of d: the top-k set's size.
    pub top_k: f64,
    /// h: dimensions released; 0 takes the largest h with E\[nu\]/h >= `ratio`.
    pub output_dimensions: usize,
    /// The E\[nu\]/h ratio that picks h when `output_dimensions` is 0.
    pub ratio: f64,
    /// eta_g: the server's step along the mean sparse sign update.
    pub global_learning_rate: f64,
}

impl Default for SignDsSection {
    fn default() -> Self {
        Self {
            top_k: 0.01,
            output_dimensions: 0,
            ratio: 0.6,
            global_learning_rate: 0.05,
        }
    }
}

impl SignDsSection {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let ok = self.top_k > 0.0
            && self.top_k < 1.0
            && self.ratio > 0.0
            && self.ratio <= 1.0
            && self.global_learning_rate > 0.0
            && self.global_learning_rate.is_finite();
        if ok {
            Ok(())
        } else {
            Err(ConfigError::Invalid(
                "[signds] needs top_k in (0, 1), ratio in (0, 1] and global_learning_rate > 0"
                    .into(),
            ))
        }
    }
}
