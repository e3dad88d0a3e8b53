//! Why a run failed.

use crate::config::ConfigError;

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The run folder could not be written.
    #[error("writing the run folder: {0}")]
    Io(#[from] std::io::Error),
    /// A listener could not bind its address.
    #[error("the {what} cannot listen on {addr}: {source}")]
    Bind {
        /// Which listener: "metrics endpoint", "live run page", "gRPC server".
        what: &'static str,
        /// The address asked for.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// Fewer than K clients connected in time.
    #[error("only {connected} of {expected} expected clients connected before the join timeout")]
    NotEnoughClients {
        /// Clients connected.
        connected: usize,
        /// K.
        expected: usize,
    },
    /// The operator stopped the server before the first round.
    #[error("interrupted before training started")]
    Interrupted,
    /// The gRPC transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The helper of verified rounds cannot be reached or served.
    #[error("the helper: {0}")]
    Helper(String),
    /// A secure round's code or noise cannot be calibrated (e.g. noise beyond the exact
    /// sampler's range).
    #[error("secure aggregation: {0}")]
    Calibration(#[from] fl_secagg::CalibrationError),
    /// The checkpoint's strategy state does not fit the run's strategy.
    #[error("resuming from the checkpoint: {0}")]
    Restore(RestoreError),
    /// An aggregator's stream to its coordinator failed (the aggregator reconnects).
    #[error("the coordinator at {url}: {reason}")]
    Upstream {
        /// The coordinator's address.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// A bug or a lost background task.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Why a checkpoint's strategy state cannot be restored: what it lacks, or holds unusable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the checkpoint has no usable {0}")]
pub struct RestoreError(pub &'static str);
