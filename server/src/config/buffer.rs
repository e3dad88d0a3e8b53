//! `[buffer]`: asynchronous buffered aggregation (FedBuff: Nguyen et al., "Federated Learning
//! with Buffered Asynchronous Aggregation", AISTATS 2022), with `server.aggregation = "async"`.

use super::{Algorithm, ConfigError, PrivacyMode, RunConfig};
use serde::{Deserialize, Serialize};

/// When the server steps: after a round of sampled clients, or whenever M updates are buffered.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Cadence {
    /// Synchronous rounds: sample m_t clients, wait for them, step.
    #[default]
    Sync,
    /// Asynchronous buffered aggregation: at most P clients train at once, each on the model
    /// current when it was sent; the server steps each time M updates are buffered.
    Async,
}

/// `[buffer]`: asynchronous buffered aggregation (with `server.aggregation = "async"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BufferSection {
    /// P: most clients training at once; each free client is sent the current model.
    pub concurrency: usize,
    /// M: updates buffered before each server step (at most P).
    pub size: usize,
    /// Most server steps between the model an update was trained from and the step it would
    /// enter; an older update is refused. Each update enters with weight 1/sqrt(1 + s), s its
    /// staleness.
    pub max_staleness: u64,
}

impl Default for BufferSection {
    fn default() -> Self {
        Self {
            concurrency: 20,
            size: 10,
            max_staleness: 10,
        }
    }
}

impl BufferSection {
    /// Checks `[buffer]` against the rest of an asynchronous run's configuration.
    pub(super) fn validate(&self, config: &RunConfig) -> Result<(), ConfigError> {
        if config.server.aggregation == Cadence::Sync {
            return Ok(());
        }
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let clients = config.server.clients;
        if self.size < 1 || self.size > self.concurrency || self.concurrency > clients {
            return bad(format!(
                "buffer.size (M = {}) must be at least 1 and at most buffer.concurrency (P = {}), \
                 itself at most server.clients ({clients})",
                self.size, self.concurrency
            ));
        }
        if let Some(refused) = refused_mode(config.privacy.mode) {
            return bad(format!(
                "server.aggregation = \"async\" does not take privacy.mode = {refused}"
            ));
        }
        if config.train.algorithm != Algorithm::FedAvg
            || config.robust.aggregator.holds_each_update()
        {
            return bad(
                "server.aggregation = \"async\" needs train.algorithm = \"fedavg\" and \
                 robust.aggregator = \"mean\": a buffered step sums staleness-weighted updates"
                    .into(),
            );
        }
        Ok(())
    }
}

/// Why a privacy mode cannot run asynchronously, if it cannot.
fn refused_mode(mode: PrivacyMode) -> Option<&'static str> {
    match mode {
        PrivacyMode::Central => Some(
            "\"central\": its accounting amplifies by sampling clients, and asynchronous clients \
             choose when they arrive; use \"dp-ftrl\", whose tree noise needs no sampling",
        ),
        PrivacyMode::SecAgg => Some(
            "\"secagg\": secure aggregation masks a round's fixed set of clients against each \
             other, and a buffer fills with clients that trained on different models at \
             different times",
        ),
        PrivacyMode::Verified => Some(
            "\"verified\": the helper answers each round once, over a round's fixed set of \
             uploads",
        ),
        PrivacyMode::None | PrivacyMode::DpFtrl | PrivacyMode::Local(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PrivacyPlan;
    use fl_privacy::{AnyStream, BandedSettings, StreamSettings, TreeSettings, TreeStream};

    /// An asynchronous run of 100 clients, P = 20, M = 10, in `mode`.
    fn in_mode(mode: PrivacyMode) -> RunConfig {
        let mut c = RunConfig::default();
        c.server.aggregation = Cadence::Async;
        c.privacy.mode = mode;
        c
    }

    fn refused(c: &RunConfig) -> String {
        c.validate().unwrap_err().to_string()
    }

    /// Central DP (sampling amplification) and secure aggregation (a round's fixed clients) are
    /// refused with their reason; the local modes and DP-FTRL run.
    #[test]
    fn modes_that_need_rounds_are_refused_with_their_reason() {
        assert!(refused(&in_mode(PrivacyMode::Central)).contains("amplifies by sampling"));
        assert!(refused(&in_mode(PrivacyMode::SecAgg)).contains("secure aggregation"));
        for mode in [
            PrivacyMode::None,
            PrivacyMode::Local(fl_privacy::LocalKind::Gaussian),
            PrivacyMode::Local(fl_privacy::LocalKind::SignDs),
        ] {
            in_mode(mode).validate().unwrap();
        }
        let mut iadmm = in_mode(PrivacyMode::None);
        iadmm.train.algorithm = Algorithm::Iadmm;
        assert!(refused(&iadmm).contains("fedavg"));
    }

    /// M between 1 and P, P at most the clients.
    #[test]
    fn the_buffer_fits_its_concurrency_and_the_clients() {
        for (concurrency, size) in [(20, 0), (20, 21), (101, 10)] {
            let mut c = in_mode(PrivacyMode::None);
            c.buffer.concurrency = concurrency;
            c.buffer.size = size;
            assert!(
                refused(&c).contains("buffer.size"),
                "P {concurrency}, M {size}"
            );
        }
    }

    /// DP-FTRL's trees default to one pass of distinct clients, M per step, and neither a tree
    /// nor a banded stream's separation may ask for more distinct clients than there are.
    #[test]
    fn dp_ftrl_trees_are_one_pass_of_distinct_clients() {
        let tree = |c: &RunConfig| match c.plan().unwrap() {
            PrivacyPlan::Ftrl(f) => f.stream,
            other => panic!("{other:?}"),
        };
        let mut c = in_mode(PrivacyMode::DpFtrl);
        c.privacy.noise_multiplier = 5.0.into();
        let one_pass = AnyStream::Tree(TreeStream::new(5.0, 10));
        assert_eq!(tree(&c), one_pass, "100 clients / M = 10");
        let mut banded = c.clone();
        c.privacy.noise = StreamSettings::Tree(TreeSettings { rounds: Some(11) });
        assert!(refused(&c).contains("[privacy.noise.tree] rounds (11) times the buffer's size"));
        banded.privacy.noise = StreamSettings::Banded(BandedSettings {
            min_separation: Some(11),
            ..Default::default()
        });
        let why = refused(&banded);
        assert!(why.contains("[privacy.noise.banded] min_separation (11) times the buffer's"));
    }
}
