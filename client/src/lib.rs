//! The federated-learning client as a library: joins the server, keeps one Session stream open,
//! and for each round it is sampled into, receives the global model w_t, has its [`Trainer`]
//! train locally, and sends its update u = w_k - w_t under the round's protection (the trusted
//! curator's plain upload, a local mechanism's release, or secure aggregation's masked input).
//! [`run`] takes any trainer; [`run_client`] the built-in [`SgdTrainer`]. The protocol and the
//! privacy are the library's: a trainer only trains.

#![deny(missing_docs)]

mod admission;
mod attack;
mod connection;
mod engine;
mod logging;
mod refusal;
mod round;
mod round_log;
mod secure;
mod session;
mod slots;
mod state;
mod tls_probe;
mod trainer;
mod verified;
mod wire;

pub use attack::Attack;
pub use connection::{
    CLIENTS_PER_CONNECTION, ClientTls, Connection, assigned_partition, shared_connections,
};
pub use logging::init_logging;
pub use round_log::RoundLog;
pub use session::{run, run_client};
pub use slots::TrainingSlots;
pub use state::{StateError, state_file};
pub use trainer::{Evaluation, SgdTrainer, TrainRequest, Trained, Trainer};
pub use verified::helper_key;

pub use fl_common::pace::Pace;
use fl_datasets::Dataset;

use fl_authority::policy::FederationPolicy;
use fl_privacy::{ClientLimits, LocalKind};
use fl_secagg::{Credentials, PlainInputs};
use std::sync::Arc;
use std::time::Duration;
use tonic::Code;

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
    /// The server answered with an error status (e.g. refused token, refused update): said
    /// once, its code's words and the server's message (the status is not also a cause, which
    /// would print them again).
    #[error("server said: {}: {}", .0.code(), .0.message())]
    Status(tonic::Status),
    /// The server broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// This client has no examples.
    #[error("this client has no training examples")]
    NoData,
    /// This client's state file cannot be read or is of another federation.
    #[error(transparent)]
    State(#[from] StateError),
    /// The session ended without a Shutdown (the server went away).
    #[error("the server closed the session without Shutdown")]
    SessionLost,
    /// The server address cannot work as given (no scheme, or `https://` without TLS
    /// settings, or plain HTTP to a TLS server): said with its fix, never retried.
    #[error("{0}")]
    Endpoint(String),
    /// Nothing answers at the server's address yet: said with its fix, retried.
    #[error("{0}")]
    Unreachable(String),
    /// The server stopped to be resumed from its checkpoint (its Shutdown's reason).
    #[error("{0}")]
    ServerResuming(String),
}

impl From<tonic::Status> for ClientError {
    fn from(status: tonic::Status) -> Self {
        Self::Status(status)
    }
}

impl ClientError {
    /// Whether the server went away (crashed, restarted, lost the connection, stopped to be
    /// resumed) rather than refused this client: the client then joins again.
    pub fn is_lost_server(&self) -> bool {
        match self {
            Self::SessionLost | Self::ServerResuming(_) | Self::Unreachable(_) => true,
            Self::Status(s) => matches!(
                s.code(),
                Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal
            ),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal is said once: the server's message appears one time on the error line.
    #[test]
    fn a_server_refusal_is_said_once() {
        let refused = ClientError::from(tonic::Status::permission_denied(
            "client hospital-1 is revoked",
        ));
        let line = fl_common::error_chain(&refused);
        assert_eq!(
            line.matches("client hospital-1 is revoked").count(),
            1,
            "{line}"
        );
        assert!(line.starts_with("server said: "), "{line}");
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
    pub training_slots: TrainingSlots,
    /// Simulation only: where to record plain secure-aggregation inputs (never sent).
    pub oracle: Option<Arc<PlainInputs>>,
    /// The protection this client insists on, whatever the server asks.
    pub privacy: ClientPrivacy,
    /// The identity this client signs secure rounds with, certified by the federation
    /// authority: with it the client takes part only in signed rounds (the malicious-server
    /// variant, docs/src/explanation/threat-model.md), and without it only in unsigned ones.
    pub credentials: Option<Arc<Credentials>>,
    /// The federation policy the authority signed (checked against it when loaded): the client
    /// refuses any task outside it, whatever the server asks.
    pub policy: Option<Arc<FederationPolicy>>,
    /// The file where this client remembers what it spent and which secure rounds it took part
    /// in, across restarts (`None`: memory only).
    pub state: Option<std::path::PathBuf>,
    /// TLS settings (with an `https://` endpoint).
    pub tls: Option<ClientTls>,
    /// A connection shared with other clients of this process (see [`shared_connections`]);
    /// `None`: this client opens its own.
    pub connection: Option<Connection>,
    /// Simulation only: how much slower than this machine the client is (it waits after
    /// training before it answers); [`Pace::Natural`] for a real client.
    pub pace: Pace,
    /// A process of many clients: where each says the rounds it trained, for one line per round
    /// naming them (`None`: the client says each round itself).
    pub round_log: Option<RoundLog>,
    /// Simulation only: the client is compromised and attacks secure and verified rounds
    /// ([`Attack`]); `None` for every real client.
    pub attack: Option<Attack>,
}

impl ClientOptions {
    /// A client of the server at `endpoint` (e.g. `http://127.0.0.1:50051`) with no token, its
    /// own connection and one training slot, following the rounds' privacy, retrying its first
    /// connection for 240 s.
    pub fn new(endpoint: &str) -> Self {
        Self {
            endpoint: endpoint.into(),
            token: String::new(),
            name: "client".into(),
            seed: None,
            connect_timeout: Duration::from_secs(240),
            training_slots: TrainingSlots::new(1),
            oracle: None,
            privacy: ClientPrivacy::default(),
            credentials: None,
            policy: None,
            state: None,
            tls: None,
            connection: None,
            pace: Pace::Natural,
            round_log: None,
            attack: None,
        }
    }
}

/// A client's own privacy requirements.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClientPrivacy {
    /// The only local mechanism it uploads with (`None`: whatever the round asks).
    pub require: Option<LocalKind>,
    /// Limits that tighten the round's mechanism.
    pub limits: ClientLimits,
    /// The largest composed epsilon of all its local releases (with the policy's, the smaller).
    pub max_total_epsilon: Option<f64>,
    /// The helper's public key (X25519, 32 bytes) that verified uploads are sealed to: the
    /// second aggregator this client trusts not to collude with the server.
    pub helper_key: Option<[u8; 32]>,
}

impl ClientPrivacy {
    /// Checks that every limit is usable: the per-release ones ([`ClientLimits::check`]) and
    /// the total cap, a positive finite epsilon.
    pub fn check(&self) -> Result<(), String> {
        self.limits.check().map_err(|e| e.to_string())?;
        match self.max_total_epsilon {
            Some(total) if !(total > 0.0 && total.is_finite()) => {
                Err(format!("max_total_epsilon = {total}: a positive number"))
            }
            Some(_) | None => Ok(()),
        }
    }
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
    /// Tasks this client refused (its data, its privacy requirements or its trainer did not fit
    /// the round), and the last refusal's reason.
    pub tasks_refused: u64,
    /// The reason of the last refusal.
    pub last_refusal: Option<String>,
}
