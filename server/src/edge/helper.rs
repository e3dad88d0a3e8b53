//! The helper of verified rounds (`fl-server --role helper`): the second aggregator, run by
//! another party than the server. It serves one RPC, `Helper.Verify`, to the leader that presents
//! its token, answering with `fl_secagg::verified::Helper` (which answers each round once, adds
//! its noise and refuses batches below its floor); and the leader's side of that call.

use crate::config::VerifiedSection;
use crate::error::ServerError;
use crate::identity::secret::Digest;
use fl_proto::v1::helper_client::HelperClient;
use fl_proto::v1::helper_server::{Helper as HelperRpc, HelperServer};
use fl_proto::v1::{VerifyReply, VerifyRequest};
use fl_secagg::verified::{Batch, Helper, Reply};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Server};
use tonic::{Request, Response, Status};

/// Largest message between the leader and the helper: a round's prep shares, or the helper's
/// share of the sum (8 bytes per coordinate; 4.3 MB at d = 535,818), with room to spare.
pub(crate) const MAX_HELPER_MESSAGE_BYTES: usize = 256 << 20;

/// The metadata key the leader's token travels in.
const TOKEN_KEY: &str = "authorization";

/// The helper's service: its state and the digest of the leader's token.
struct HelperService {
    helper: Arc<Mutex<Helper>>,
    token: Digest,
}

#[tonic::async_trait]
impl HelperRpc for HelperService {
    async fn verify(
        &self,
        request: Request<VerifyRequest>,
    ) -> Result<Response<VerifyReply>, Status> {
        let presented = (request.metadata().get(TOKEN_KEY))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|t| Digest::of(t.as_bytes()));
        if !presented.is_some_and(|p| p.matches(&self.token)) {
            return Err(Status::unauthenticated("unknown leader token"));
        }
        let batch = Batch::try_from(request.get_ref())
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let helper = self.helper.clone();
        let round = batch.tag.round;
        let answered = tokio::task::spawn_blocking(move || {
            let mut helper = helper.lock().unwrap_or_else(|e| e.into_inner());
            helper.answer(&batch)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?;
        match answered {
            Ok(reply) => {
                let accepted = reply.accepted.iter().filter(|&&a| a).count();
                tracing::info!(
                    round,
                    accepted,
                    uploads = reply.accepted.len(),
                    "round verified"
                );
                Ok(Response::new(VerifyReply::from(&reply)))
            }
            Err(refusal) => {
                tracing::warn!(round, %refusal, "round refused");
                Err(Status::failed_precondition(refusal.to_string()))
            }
        }
    }
}

/// Serves `helper` on `listener` (with `builder`'s TLS) to the leader presenting `token`, until
/// `done`.
pub(crate) async fn serve_helper(
    builder: Server,
    listener: tokio::net::TcpListener,
    (helper, token): (Helper, &str),
    done: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let service = HelperService {
        helper: Arc::new(Mutex::new(helper)),
        token: Digest::of(token.as_bytes()),
    };
    let server = HelperServer::new(service)
        .max_decoding_message_size(MAX_HELPER_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_HELPER_MESSAGE_BYTES);
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let mut builder = builder;
    (builder.add_service(server))
        .serve_with_incoming_shutdown(incoming, done)
        .await
        .map_err(|e| ServerError::Helper(e.to_string()))
}

/// The leader's connection to its helper.
#[derive(Debug, Clone)]
pub(crate) struct HelperLink {
    client: HelperClient<Channel>,
    token: String,
}

impl HelperLink {
    /// The link `[verified]` describes (the helper's address, the CA of its certificate, the
    /// file of the token it knows the leader by), connecting on first use.
    pub(crate) fn new(settings: &VerifiedSection) -> Result<Self, ServerError> {
        let read = |p: &std::path::Path| {
            std::fs::read(p)
                .map_err(|e| ServerError::Helper(format!("reading {}: {e}", p.display())))
        };
        let url = settings.helper.clone();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(ServerError::Helper(
                "privacy.mode = \"verified\" needs verified.helper, the helper's http:// or \
                 https:// address"
                    .into(),
            ));
        }
        let file = (settings.helper_token_file.as_deref()).ok_or_else(|| {
            ServerError::Helper(
                "privacy.mode = \"verified\" needs verified.helper_token_file, the file holding \
                 the token the helper knows this server by"
                    .into(),
            )
        })?;
        let token = String::from_utf8_lossy(&read(file)?).trim().to_string();
        let bad = |e: tonic::transport::Error| ServerError::Helper(e.to_string());
        let mut endpoint = Endpoint::from_shared(url.clone()).map_err(bad)?;
        if url.starts_with("https://") {
            let mut tls = ClientTlsConfig::new().with_enabled_roots();
            if let Some(ca) = &settings.helper_ca {
                tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
            }
            endpoint = endpoint.tls_config(tls).map_err(bad)?;
        }
        let client = HelperClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_HELPER_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_HELPER_MESSAGE_BYTES);
        Ok(Self { client, token })
    }

    /// The helper's answer about `batch`, within `timeout`.
    pub(crate) async fn verify(&self, batch: &Batch, timeout: Duration) -> Result<Reply, String> {
        let mut request = Request::new(VerifyRequest::from(batch));
        request.set_timeout(timeout);
        let bearer = format!("Bearer {}", self.token);
        let value = bearer
            .parse()
            .map_err(|_| "the helper token is not ASCII".to_string())?;
        request.metadata_mut().insert(TOKEN_KEY, value);
        let mut client = self.client.clone();
        let reply = client
            .verify(request)
            .await
            .map_err(|s| s.message().to_string())?;
        Reply::try_from(reply.get_ref()).map_err(|e| e.to_string())
    }
}
