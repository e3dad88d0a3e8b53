//! The gRPC service's unary methods: Join admits clients (rate limit per address, credentials,
//! the bound on idle clients), AssignPartition hands out demo partition indices; and the one map
//! from the round's rejections to gRPC statuses. `Session` is served by `crate::edge::session`.

use crate::edge::shared::Shared;
use crate::identity::credentials::{Admission, Refusal};
use crate::round::events::for_log;
use crate::round::rejection::Rejection;
use fl_proto::retry::exhausted_retry_after;
use fl_proto::v1::federation_server::Federation;
use fl_proto::v1::{JoinReply, JoinRequest, PartitionReply, PartitionRequest};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// Most partition indices one request may take.
const MAX_PARTITIONS_PER_REQUEST: u64 = 100_000;
/// Longest client name a Join may give (it only appears in logs).
pub(crate) const MAX_NAME_BYTES: usize = 256;

/// The `flp.v1.Federation` service.
#[derive(Debug, Clone)]
pub(crate) struct FederationService {
    shared: Arc<Shared>,
}

impl FederationService {
    /// A service over the shared state.
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Refuses a request beyond its address's rate.
    fn check_rate<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let Some(addr) = request.remote_addr() else {
            return Ok(());
        };
        self.shared.joins.check(addr.ip()).map_err(|refused| {
            if let Some(count) = refused.report {
                tracing::warn!(address = %addr.ip(), refused = count, "join rate exceeded");
            }
            exhausted_retry_after("too many joins from this address", refused.wait)
        })
    }

    /// Admits a request by its enrollment token, or its client certificate when the enrollment
    /// list names certificates; reads the list again first.
    fn admit<T>(&self, request: &Request<T>, token: &str, who: &str) -> Result<Admission, Status> {
        self.shared.enforce_enrollment();
        let certs = request.peer_certs();
        let certificate = certs.as_ref().and_then(|c| c.first()).map(|c| c.as_ref());
        self.shared
            .credentials()
            .admit(token, certificate)
            .map_err(|refusal| {
                tracing::warn!(name = %for_log(who), reason = %refusal, "join refused");
                match refusal {
                    Refusal::Unknown => Status::unauthenticated(refusal.to_string()),
                    Refusal::Revoked(_) => Status::permission_denied(refusal.to_string()),
                    Refusal::Unreadable => Status::unavailable(refusal.to_string()),
                }
            })
    }
}

#[tonic::async_trait]
impl Federation for FederationService {
    async fn assign_partition(
        &self,
        request: Request<PartitionRequest>,
    ) -> Result<Response<PartitionReply>, Status> {
        self.check_rate(&request)?;
        self.admit(&request, &request.get_ref().token, "partition request")?;
        let req = request.into_inner();
        if req.count == 0 || req.count > MAX_PARTITIONS_PER_REQUEST {
            return Err(Status::invalid_argument(format!(
                "count must be between 1 and {MAX_PARTITIONS_PER_REQUEST}"
            )));
        }
        let first = self
            .shared
            .next_partition
            .fetch_add(req.count, std::sync::atomic::Ordering::Relaxed);
        Ok(Response::new(PartitionReply { first }))
    }

    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinReply>, Status> {
        self.check_rate(&request)?;
        if self.shared.coordinates {
            return Err(Status::failed_precondition(
                "this server coordinates aggregators: connect to one of them",
            ));
        }
        if request.get_ref().name.len() > MAX_NAME_BYTES {
            return Err(Status::invalid_argument(format!(
                "client name longer than {MAX_NAME_BYTES} bytes"
            )));
        }
        let admission = self.admit(&request, &request.get_ref().token, &request.get_ref().name)?;
        let idle = self.shared.registry().idle_count();
        if idle >= self.shared.max_idle {
            let message = format!("{idle} joined clients have no session open");
            return Err(exhausted_retry_after(&message, self.shared.forget_after));
        }
        let req = request.into_inner();
        let identity = match &admission {
            Admission::Enrolled(name) => Some(name.as_str()),
            Admission::Anonymous => None,
        };
        let (id, key) = self.shared.registry().join(identity);
        tracing::debug!(
            client = id,
            name = %for_log(&req.name),
            enrolled = identity.unwrap_or("-"),
            "joined"
        );
        Ok(Response::new(JoinReply {
            client_id: id.to_string(),
            session_key: key.to_vec(),
        }))
    }
}

/// The one map from the coordinator's rejections to gRPC statuses: out-of-turn messages are
/// FAILED_PRECONDITION, malformed ones INVALID_ARGUMENT.
impl From<Rejection> for Status {
    fn from(rejection: Rejection) -> Self {
        match rejection.is_out_of_turn() {
            true => Status::failed_precondition(rejection.to_string()),
            false => Status::invalid_argument(rejection.to_string()),
        }
    }
}
