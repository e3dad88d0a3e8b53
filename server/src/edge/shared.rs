//! The state the gRPC handlers share with the round loop: the registry, the credentials, the
//! queue of events towards the round loop and the places for uploads.

use crate::edge::groups::Groups;
use crate::edge::join_gate::JoinGate;
use crate::edge::registry::Registry;
use crate::identity::credentials::{Credentials, Digest, EnrollmentList};
use crate::round::events::{Arrival, Event};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};
use tonic::Status;

/// State shared by the gRPC handlers and the round loop.
#[derive(Debug)]
pub(crate) struct Shared {
    /// Joined clients.
    pub registry: Mutex<Registry>,
    /// Who may join.
    pub credentials: Mutex<Credentials>,
    /// Length of the model's parameter vector: the only update size accepted.
    pub num_params: usize,
    /// Towards the round loop.
    pub events: mpsc::Sender<Arrival>,
    /// Places for uploads being assembled or queued for the round loop: see [`Arrival`].
    pub uploads: Arc<Semaphore>,
    /// The next demo partition index to hand out.
    pub next_partition: std::sync::atomic::AtomicU64,
    /// Joins per address (a token bucket each), and the count of refusals.
    pub joins: JoinGate,
    /// How long a client may pause in the middle of sending a tensor before it is dropped.
    pub upload_stall: Duration,
    /// Most clients without a live stream the registry holds; Join is refused beyond it.
    pub max_idle: usize,
    /// How long a client without a live stream is remembered.
    pub forget_after: Duration,
    /// The aggregators of a coordinator (the aggregator tier).
    pub groups: Mutex<Groups>,
    /// The digest of the token aggregators present; none admits no aggregator.
    pub aggregator_token: Option<Digest>,
    /// The aggregators' enrollment (each its own token, for its own name), which takes the
    /// place of `aggregator_token`.
    pub aggregator_enrollment: Option<EnrollmentList>,
    /// Whether this server coordinates aggregators: its clients join them, not it.
    pub coordinates: bool,
}

impl Shared {
    /// The registry, recovering it if a panicking thread poisoned the lock (its data stay
    /// consistent: every mutation is a single insert or replace).
    pub(crate) fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The registry of aggregators (recovering a poisoned lock: it holds plain data).
    pub(crate) fn groups(&self) -> std::sync::MutexGuard<'_, Groups> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether an aggregator named `name` presenting `token` is admitted (digests compared in
    /// constant time): under an enrollment, by the token enrolled for that name and not revoked;
    /// else by the shared token; with neither, none is (fail-closed).
    pub(crate) fn admits_aggregator(&self, name: &str, token: &str) -> bool {
        let presented = Digest::of(token.as_bytes());
        match (&self.aggregator_enrollment, &self.aggregator_token) {
            (Some(list), _) => (list.clients.iter()).any(|a| {
                a.name == name
                    && !a.revoked
                    && a.token.as_ref().is_some_and(|d| d.matches(&presented))
            }),
            (None, Some(shared)) => shared.matches(&presented),
            (None, None) => false,
        }
    }

    /// The admission rule (recovering a poisoned lock: it holds plain data).
    pub(crate) fn credentials(&self) -> std::sync::MutexGuard<'_, Credentials> {
        self.credentials.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the enrollment list again and, if it changed, revokes the clients it no longer
    /// admits: their streams end with PERMISSION_DENIED and the round loop hears they left.
    pub(crate) fn enforce_enrollment(&self) {
        let revoked = {
            let mut credentials = self.credentials();
            if !credentials.refresh() {
                return;
            }
            self.registry()
                .revoke_inactive(|name| credentials.is_active(name))
        };
        for (id, outbox) in revoked {
            tracing::warn!(client = id, "client revoked: its session ends");
            let events = self.events.clone();
            tokio::spawn(async move {
                if let Some(outbox) = outbox {
                    let _ = outbox
                        .send(Err(Box::new(Status::permission_denied(
                            "this client is revoked",
                        ))))
                        .await;
                }
                let _ = events.send(Event::Disconnected(id).into()).await;
            });
        }
    }
}
