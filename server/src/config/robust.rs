//! `[robust]`: defences against hostile clients.

use super::{ConfigError, PrivacyMode};
use serde::{Deserialize, Serialize};

fl_common::named_tables! {
    /// How FedAvg combines the round's updates where the server sees each: a rule's name, its
    /// settings at their defaults, or its table (`[robust.aggregator.trimmed-mean]`). Each rule
    /// is its settings here and its strategy in `round::strategy` (`strategy::aggregation_rule`
    /// builds it).
    pub enum Aggregator, schema(all()) {
        /// The example-weighted mean (McMahan et al. 2017).
        "mean" => Mean(MeanSettings),
        /// The coordinate-wise trimmed mean (Yin et al. 2018): unweighted, robust to a fraction
        /// `trim_fraction` of arbitrary updates; holds the round's updates in memory.
        "trimmed-mean" => TrimmedMean(TrimmedMeanSettings),
    }
}

/// `[robust.aggregator.mean]`: nothing to set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MeanSettings {}

/// `[robust.aggregator.trimmed-mean]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TrimmedMeanSettings {
    /// beta in [0, 0.5): floor(beta m) values are dropped at each end of every coordinate.
    pub trim_fraction: f64,
}

impl Default for TrimmedMeanSettings {
    fn default() -> Self {
        Self { trim_fraction: 0.1 }
    }
}

impl Aggregator {
    /// Whether the rule needs each of the round's updates at the server (not a running sum).
    pub fn holds_each_update(&self) -> bool {
        match self {
            Self::Mean(MeanSettings {}) => false,
            Self::TrimmedMean(_) => true,
        }
    }

    /// Checks the rule's settings; the refusal names the key.
    fn check(&self) -> Result<(), String> {
        match self {
            Self::Mean(MeanSettings {}) => Ok(()),
            Self::TrimmedMean(TrimmedMeanSettings { trim_fraction }) => {
                match (0.0..0.5).contains(trim_fraction) {
                    true => Ok(()),
                    false => Err("trim_fraction must be in [0, 0.5)".into()),
                }
            }
        }
    }
}

/// `[robust]`: defences against hostile clients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RobustSection {
    /// Largest |w_j| a released model may hold; a round whose aggregate has a larger or a
    /// non-finite parameter is skipped, with the reason in `metrics.jsonl` (every mode).
    pub max_parameter_abs: f64,
    /// Bound on each update's L2 norm (`privacy.mode = "none"`, FedAvg only; off when absent).
    pub max_update_norm: Option<f64>,
    /// What happens to an update beyond `max_update_norm`.
    pub norm_action: NormAction,
    /// `mean` or `trimmed-mean` (or its table), for FedAvg with `privacy.mode` `none`,
    /// `ldp-gaussian` or `ldp-laplace` (the trimmed mean of local releases is post-processing).
    /// In plain FedAvg a client's weight is its own example count: with hostile clients use
    /// `trimmed-mean`, which ignores it, or `max_update_norm`.
    pub aggregator: Aggregator,
}

impl Default for RobustSection {
    fn default() -> Self {
        Self {
            max_parameter_abs: 1e6,
            max_update_norm: None,
            norm_action: NormAction::Refuse,
            aggregator: Aggregator::default(),
        }
    }
}

impl RobustSection {
    /// Checks the ranges, and that the update-norm bound and the trimmed mean go only where the
    /// server sees each update: privacy `mode` (whose updates are each seen, `each_update`, or
    /// not) with FedAvg (`fedavg`) or not.
    pub(super) fn validate_for(
        &self,
        mode: PrivacyMode,
        each_update: bool,
        fedavg: bool,
    ) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.into()));
        if !(self.max_parameter_abs > 0.0 && self.max_parameter_abs <= f64::from(f32::MAX)) {
            return bad("robust.max_parameter_abs must be positive and at most 3.4e38");
        }
        if self
            .max_update_norm
            .is_some_and(|b| !(b > 0.0 && b.is_finite()))
        {
            return bad("robust.max_update_norm must be positive");
        }
        if let Err(why) = self.aggregator.check() {
            let name = self.aggregator.name();
            return Err(ConfigError::Invalid(format!(
                "[robust.aggregator.{name}] {why}"
            )));
        }
        if self.max_update_norm.is_some() && !(fedavg && mode == PrivacyMode::None) {
            return bad(
                "robust.max_update_norm applies to privacy.mode = \"none\" with FedAvg only: \
                 private modes bound updates by their own clipping",
            );
        }
        if self.aggregator.holds_each_update() && !(fedavg && each_update) {
            return Err(ConfigError::Invalid(format!(
                "robust.aggregator = \"{}\" applies to FedAvg with privacy.mode \"none\" or a \
                 client-side mechanism that releases dense updates, not \"{}\": the server must \
                 see each (released) update",
                self.aggregator.name(),
                mode.name()
            )));
        }
        Ok(())
    }
}

/// What the server does with an update whose L2 norm exceeds `robust.max_update_norm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NormAction {
    /// Refuse it (the client gets INVALID_ARGUMENT and is dropped from the round).
    Refuse,
    /// Scale it down to the bound: u * min(1, bound / ||u||).
    Clip,
}
