//! The federated-learning client: joins the server, keeps one Session stream open, and for each
//! round it is sampled into, receives the global model w_t, trains locally (E epochs of SGD with
//! batch size B) and uploads its update u = w_local - w_t.

#![deny(missing_docs)]

mod connection;
mod local_round;
mod secure;
mod session;
mod task;
mod upload;

pub use connection::{CLIENTS_PER_CONNECTION, ClientTls, assigned_partition, shared_connections};
pub use session::run_client;

use fl_common::data::Dataset;

use fl_common::privacy::{ClientLimits, ReleaseKind};
use fl_common::secagg::PlainInputs;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tonic::Code;
use tonic::transport::Channel;

/// Largest gRPC message accepted or sent ([`fl_proto::MAX_MESSAGE_BYTES`]).
pub(crate) const MAX_MESSAGE_BYTES: usize = fl_proto::MAX_MESSAGE_BYTES;

/// Why a client stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Could not reach the server.
    #[error("connecting to {endpoint}: {source}")]
    Connect {
        /// The server address.
        endpoint: String,
        /// The cause.
        source: tonic::transport::Error,
    },
    /// The server answered with an error status (e.g. refused token, refused update).
    #[error("server said: {}: {}", .0.code(), .0.message())]
    Status(#[from] tonic::Status),
    /// The server broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// This client has no examples.
    #[error("this client has no training examples")]
    NoData,
    /// The session ended without a Shutdown (the server went away).
    #[error("the server closed the session without Shutdown")]
    SessionLost,
}

impl ClientError {
    /// Whether the server went away (crashed, restarted, lost the connection) rather than
    /// refused this client: the client then joins again.
    pub fn is_lost_server(&self) -> bool {
        match self {
            Self::SessionLost => true,
            Self::Status(s) => matches!(
                s.code(),
                Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal
            ),
            _ => false,
        }
    }
}

/// The examples a client trains on: a shared dataset and the indices that are this client's.
#[derive(Debug, Clone)]
pub struct LocalData {
    /// The dataset (shared between simulated clients).
    pub data: Arc<Dataset>,
    /// This client's examples.
    pub indices: Vec<usize>,
}

/// How a client reaches and identifies itself to the server.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Server URL, e.g. `http://127.0.0.1:50051`.
    pub endpoint: String,
    /// Enrollment token.
    pub token: String,
    /// Name for the server's logs.
    pub name: String,
    /// Seed for local shuffling (reproducible experiments only).
    pub seed: Option<u64>,
    /// How long to keep retrying the first connection (the server may still be starting).
    pub connect_timeout: Duration,
    /// Limits how many clients of this process train at once (one per core is best).
    pub training_slots: Arc<Semaphore>,
    /// Simulation only: where to record plain secure-aggregation inputs (never sent).
    pub oracle: Option<Arc<PlainInputs>>,
    /// The protection this client insists on, whatever the server asks.
    pub privacy: ClientPrivacy,
    /// TLS settings (with an `https://` endpoint).
    pub tls: Option<ClientTls>,
    /// A connection shared with other clients of this process (see [`shared_connections`]);
    /// `None`: this client opens its own.
    pub connection: Option<Channel>,
}

/// A client's own privacy requirements.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClientPrivacy {
    /// The only local mechanism it uploads with (`None`: whatever the round asks).
    pub require: Option<ReleaseKind>,
    /// Limits that tighten the round's mechanism.
    pub limits: ClientLimits,
}

/// What a client did before the server shut the session down.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientReport {
    /// Rounds this client trained in.
    pub rounds_trained: u64,
    /// The server's reason for ending.
    pub shutdown_reason: String,
    /// Local releases made (uploads protected by a local mechanism).
    pub local_releases: u64,
    /// Their composed epsilon (at the releases' delta; 0 when there were none).
    pub local_epsilon: f64,
}
