//! The transport at the edge: the gRPC server (TLS, keep-alive, a tracing span per RPC, the
//! guarded accept loop) on a TCP socket or on in-process pipes, and its bounded drain at the end
//! of a run.

use crate::accept;
use crate::config::{ConfigError, ServerSection, is_loopback};
use crate::service::FederationService;
use crate::session::Routes;
use crate::shared::Shared;
use crate::{MAX_MESSAGE_BYTES, ServerError};
use fl_proto::v1::federation_server::FederationServer;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::DuplexStream;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

/// How long a keep-alive ping may go unanswered before the connection is closed.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long connections get to close after training ends.
const DRAIN: Duration = Duration::from_secs(5);

/// Where the server's connections come from.
#[derive(Debug)]
pub enum Listener {
    /// A TCP socket: every deployment, and the tests of the transport.
    Tcp(TcpListener),
    /// Connections made by clients in the same process (`fl sim`): each is one end of a
    /// `tokio::io::duplex` pipe, so HTTP/2 and gRPC run as over a socket but the bytes move
    /// between buffers of this process instead of through the kernel's loopback TCP (a fifth of
    /// a simulated round's CPU time for a model of 200,000 parameters). No accept guard: the
    /// peers are this process's own clients.
    InProcess(mpsc::Receiver<DuplexStream>),
}

impl From<TcpListener> for Listener {
    fn from(listener: TcpListener) -> Self {
        Self::Tcp(listener)
    }
}

/// Resolves once `done` becomes true (or its sender is gone).
pub async fn signalled(mut done: watch::Receiver<bool>) {
    let _ = done.wait_for(|d| *d).await;
}

/// Serves the federation on `listener` until `done`.
pub fn spawn_grpc(
    s: &ServerSection,
    listener: Listener,
    shared: Arc<Shared>,
    done: impl Future<Output = ()> + Send + 'static,
) -> Result<JoinHandle<Result<(), tonic::transport::Error>>, ServerError> {
    let generated = FederationServer::new(FederationService::new(shared.clone()))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let service = Routes::new(generated, shared);
    let handshake = Duration::from_secs_f64(s.handshake_timeout_secs);
    let router = server_builder(s, &listener)?
        .http2_keepalive_interval(Some(fl_proto::KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        // An upload waiting for its place (`service::UPLOADS_AT_ONCE`) holds one window.
        .max_concurrent_streams(fl_proto::MAX_STREAMS_PER_CONNECTION)
        .initial_stream_window_size(fl_proto::STREAM_WINDOW)
        .initial_connection_window_size(fl_proto::CONNECTION_WINDOW)
        // A span per RPC: every line logged while handling it names the method.
        .trace_fn(|request| tracing::info_span!("rpc", method = %request.uri().path()))
        .add_service(service);
    Ok(match listener {
        Listener::Tcp(tcp) => {
            let accepted = accept::guarded(tcp, handshake);
            tokio::spawn(router.serve_with_incoming_shutdown(accepted, done))
        }
        Listener::InProcess(pipes) => {
            let pipes = ReceiverStream::new(pipes).map(Ok::<_, std::io::Error>);
            tokio::spawn(router.serve_with_incoming_shutdown(pipes, done))
        }
    })
}

/// Waits at most the drain period for the transport to close its connections.
pub async fn drain(serving: JoinHandle<Result<(), tonic::transport::Error>>) {
    match tokio::time::timeout(DRAIN, serving).await {
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "transport ended with an error"),
        Err(_) => tracing::warn!("connections still open after the drain period; closing"),
        _ => {}
    }
}

/// A transport builder with TLS (and client certificates) when the configuration asks for it
/// and the connections come over the network. In-process pipes (`fl sim`) never leave the
/// process and its clients speak plain HTTP/2 to them: there TLS protects nothing, and a
/// deployment's TLS settings are left unused rather than failing the simulation.
fn server_builder(s: &ServerSection, listener: &Listener) -> Result<Server, ServerError> {
    if let Listener::InProcess(_) = listener {
        if s.tls_cert.is_some() {
            tracing::info!("TLS settings unused: the simulated clients connect in-process");
        }
        return Ok(Server::builder());
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
