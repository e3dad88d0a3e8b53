//! `[verified]`: verified secure rounds (with `privacy.mode = "verified"`): where the helper is,
//! how the leader reaches it, and the noise the two aggregators add.

use super::ConfigError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Whether the aggregators noise a verified sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum VerifiedNoise {
    /// No noise: the updates are hidden and bounded, the sum is not differentially private.
    None,
    /// Each aggregator adds Gaussian noise of `privacy.noise_multiplier` times S to its share of
    /// the sum (the helper discrete Gaussian noise in the field, at least its own floor; the
    /// server Gaussian noise to the decoded sum), so that the sum neither sees holds the noise
    /// of the other; the ledger charges one of them, as `central` does. Needs
    /// `privacy.sampling = "fixed"`.
    Aggregators,
}

/// `[verified]`: the helper of verified rounds and their noise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct VerifiedSection {
    /// The helper's address (`fl-server --role helper`, run by another party), `http://` or
    /// `https://`.
    pub helper: String,
    /// PEM CA certificate that signed the helper's (an `https://` address).
    pub helper_ca: Option<PathBuf>,
    /// A file holding the token the helper knows this server by (the helper's
    /// `--leader-token`); the token itself is never written to the run folder.
    pub helper_token_file: Option<PathBuf>,
    /// Noise on the sum: `none` or `aggregators`.
    pub noise: VerifiedNoise,
    /// The fewest valid uploads a round releases a sum of; the task tells the clients, and the
    /// helper keeps a floor of its own.
    pub min_clients: usize,
    /// Seconds the server waits for the helper's answer about a round.
    pub helper_timeout_secs: f64,
}

impl Default for VerifiedSection {
    fn default() -> Self {
        Self {
            helper: String::new(),
            helper_ca: None,
            helper_token_file: None,
            noise: VerifiedNoise::None,
            min_clients: 2,
            helper_timeout_secs: 120.0,
        }
    }
}

impl VerifiedSection {
    /// Refuses settings that cannot run: a non-positive timeout, no valid upload to sum. (The
    /// helper's address and token are checked when the server starts: `fl sim` runs a helper of
    /// its own and fills them in.)
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.into()));
        if !(self.helper_timeout_secs > 0.0 && self.helper_timeout_secs.is_finite()) {
            return bad("verified.helper_timeout_secs must be a positive number of seconds");
        }
        if self.min_clients == 0 {
            return bad("verified.min_clients must be at least 1");
        }
        Ok(())
    }
}
