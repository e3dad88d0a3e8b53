//! The transport at the edge: the gRPC server (TLS, keep-alive, a tracing span per RPC, the
//! guarded accept loop) on a TCP socket, or its service handed to clients in the same process,
//! and its bounded drain at the end of a run.

use crate::config::{ConfigError, ServerSection, is_loopback};
use crate::edge::accept;
use crate::edge::service::FederationService;
use crate::edge::session::Routes;
use crate::edge::shared::Shared;
use crate::edge::tier::TierService;
use crate::error::ServerError;
use fl_proto::MAX_MESSAGE_BYTES;
use fl_proto::v1::federation_server::FederationServer;
use fl_proto::v1::tier_server::TierServer;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tracing::Instrument;

/// How long a keep-alive ping may go unanswered before the connection is closed.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long connections get to close after training ends.
const DRAIN: Duration = Duration::from_secs(5);

/// Where the server's connections come from.
#[derive(Debug)]
pub enum Listener {
    /// A TCP socket: every deployment, and the tests of the transport.
    Tcp(TcpListener),
    /// Clients in the same process (`fl sim`): the server sends its [`InProcessService`] here
    /// once it serves, and they call it directly. The same methods, messages and codec as over
    /// a socket, without HTTP/2 and its flow control, which carried every model and update
    /// through pipes at 15% of a simulated private round's CPU time (2-core AMD EPYC, 2026-11-27).
    InProcess(oneshot::Sender<InProcessService>),
}

impl From<TcpListener> for Listener {
    fn from(listener: TcpListener) -> Self {
        Self::Tcp(listener)
    }
}

/// Resolves once `done` becomes true (or its sender is gone).
pub(crate) async fn signalled(mut done: watch::Receiver<bool>) {
    let _ = done.wait_for(|d| *d).await;
}

/// Serves the federation on `listener` until `done`.
pub(crate) fn spawn_grpc(
    s: &ServerSection,
    listener: Listener,
    shared: Arc<Shared>,
    done: impl Future<Output = ()> + Send + 'static,
) -> Result<JoinHandle<Result<(), tonic::transport::Error>>, ServerError> {
    let generated = FederationServer::new(FederationService::new(shared.clone()))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    // The aggregator tier's service, on a coordinator of aggregators only.
    let tier = (s.aggregators > 0).then(|| {
        TierServer::new(TierService::new(shared.clone()))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    });
    let service = Routes::new(generated, shared);
    let tcp = match listener {
        Listener::Tcp(tcp) => tcp,
        Listener::InProcess(clients) => return Ok(serve_in_process(s, service, clients, done)),
    };
    let handshake = Duration::from_secs_f64(s.handshake_timeout_secs);
    let router = server_builder(s)?
        .http2_keepalive_interval(Some(fl_proto::KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        // An upload waiting for its place (`service::UPLOADS_AT_ONCE`) holds one window.
        .max_concurrent_streams(fl_proto::MAX_STREAMS_PER_CONNECTION)
        .initial_stream_window_size(fl_proto::STREAM_WINDOW)
        .initial_connection_window_size(fl_proto::CONNECTION_WINDOW)
        .trace_fn(rpc_span)
        .add_service(service)
        .add_optional_service(tier);
    let accepted = accept::guarded(tcp, handshake);
    Ok(tokio::spawn(
        router.serve_with_incoming_shutdown(accepted, done),
    ))
}

/// A span per RPC: every line logged while handling it names the method.
fn rpc_span<B>(request: &http::Request<B>) -> tracing::Span {
    tracing::info_span!("rpc", method = %request.uri().path())
}

/// The federation's service as clients in this process call it (`fl sim`): `Routes` with a
/// span per RPC, refusing calls as `UNAVAILABLE` once the run is over, as a closed socket would.
#[derive(Clone)]
pub struct InProcessService {
    routes: Routes<FederationServer<FederationService>>,
    closed: watch::Receiver<bool>,
}

impl std::fmt::Debug for InProcessService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InProcessService")
    }
}

impl Service<http::Request<Body>> for InProcessService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.routes.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if *self.closed.borrow() {
            let refused = Status::unavailable("the server has stopped").into_http();
            return Box::pin(std::future::ready(Ok(refused)));
        }
        let span = rpc_span(&request);
        Box::pin(self.routes.call(request).instrument(span))
    }
}

/// Hands `service` to the clients of this process and closes it once `done`. A deployment's TLS
/// settings are left unused: the calls never leave the process.
fn serve_in_process(
    s: &ServerSection,
    routes: Routes<FederationServer<FederationService>>,
    clients: oneshot::Sender<InProcessService>,
    done: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<Result<(), tonic::transport::Error>> {
    if s.tls_cert.is_some() {
        tracing::info!("TLS settings unused: the simulated clients call the server in-process");
    }
    let (close, closed) = watch::channel(false);
    // Clients that are gone (their simulation failed to start) make nothing to serve.
    let _ = clients.send(InProcessService { routes, closed });
    tokio::spawn(async move {
        done.await;
        let _ = close.send(true);
        Ok(())
    })
}

/// Waits at most the drain period for the transport to close its connections.
pub(crate) async fn drain(serving: JoinHandle<Result<(), tonic::transport::Error>>) {
    match tokio::time::timeout(DRAIN, serving).await {
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "transport ended with an error"),
        Err(_) => tracing::warn!("connections still open after the drain period; closing"),
        _ => {}
    }
}

/// A transport builder with TLS (and client certificates) when the configuration asks for it.
pub(crate) fn server_builder(s: &ServerSection) -> Result<Server, ServerError> {
    if let Some(open) = crate::config::open_door(s) {
        tracing::error!("OPEN TO ANYONE: {open}");
    }
    let (Some(cert), Some(key)) = (&s.tls_cert, &s.tls_key) else {
        if !is_loopback(&s.listen) {
            tracing::warn!("TLS is off: updates and models travel in clear text");
        }
        return Ok(Server::builder());
    };
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| {
            ServerError::Config(ConfigError::Invalid(format!(
                "reading {}: {e}",
                p.display()
            )))
        })
    };
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(read(cert)?, read(key)?));
    if let Some(ca) = &s.tls_client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read(ca)?));
    }
    Ok(Server::builder().tls_config(tls)?)
}
