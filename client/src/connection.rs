//! Reaching the server: endpoints (TLS, keep-alive), connections shared between simulated
//! clients, retries with jittered back-off, and opening a Session (Join, then Hello; Hello alone
//! when the client holds an identity).

use crate::tls_probe::speaks_tls;
use crate::wire::send;
use crate::{ClientError, ClientOptions, MAX_MESSAGE_BYTES};
use fl_proto::v1::federation_client::FederationClient;
use fl_proto::v1::{
    ClientMessage, Hello, JoinRequest, PartitionRequest, ServerMessage, client_message,
};
use rand::Rng;
use std::path::Path;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Streaming};
use tower::ServiceExt;
use tower::util::BoxCloneSyncService;

/// Simulated clients per shared connection: each holds one long-lived Session stream, and a
/// server accepts 200 concurrent HTTP/2 streams per connection by default (hyper's limit).
pub const CLIENTS_PER_CONNECTION: usize = 100;

/// Lazily connected channels for `clients` clients of one process, [`CLIENTS_PER_CONNECTION`]
/// to a connection (HTTP/2 streams multiplexed on it): 10,000 simulated clients then need 100
/// sockets instead of 10,000, within the usual open-file limits. A channel reconnects by itself
/// when its connection is lost.
pub fn shared_connections(
    opts: &ClientOptions,
    clients: usize,
) -> Result<Vec<Connection>, ClientError> {
    let ep = endpoint(opts)?;
    Ok(one_per_connection(clients, || ep.connect_lazy()))
}

/// The connections of `clients` clients, [`CLIENTS_PER_CONNECTION`] to each, made by `connect`.
fn one_per_connection(clients: usize, mut connect: impl FnMut() -> Channel) -> Vec<Connection> {
    (0..clients.div_ceil(CLIENTS_PER_CONNECTION))
        .map(|_| Connection::network(connect()))
        .collect()
}

/// What a client's gRPC calls go through: a network channel, or the server's own service in the
/// same process.
type Transport = BoxCloneSyncService<http::Request<Body>, http::Response<Body>, tower::BoxError>;

/// A connection to the server that clients of one process share (HTTP/2 streams multiplexed on
/// it; it reconnects by itself when lost), or the server's service called in-process.
#[derive(Clone)]
pub struct Connection(Transport);

impl Connection {
    /// Calls `service`, a server in this process (`fl sim`, `fl_server::Listener::InProcess`),
    /// directly: the same methods, messages and codec as over the network, without HTTP/2
    /// framing, flow control or a socket to carry them.
    pub fn in_process<S>(service: S) -> Self
    where
        S: Service<http::Request<Body>, Response = http::Response<Body>>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Error: Into<tower::BoxError>,
        S::Future: Send + 'static,
    {
        Self(BoxCloneSyncService::new(service.map_err(Into::into)))
    }

    /// A channel over the network (it reconnects by itself when its connection is lost).
    fn network(channel: Channel) -> Self {
        Self(BoxCloneSyncService::new(channel.map_err(Into::into)))
    }
}

/// The generated client runs on `Connection` itself rather than on the boxed service: with the
/// box as its transport, rustc cannot prove the clients' futures `Send` (a higher-ranked
/// lifetime error in `fl-client --simulate`'s spawn).
impl Service<http::Request<Body>> for Connection {
    type Response = http::Response<Body>;
    type Error = tower::BoxError;
    type Future = <Transport as Service<http::Request<Body>>>::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        self.0.call(request)
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connection")
    }
}

/// The endpoint of `opts.endpoint` with keep-alive and TLS settings.
fn endpoint(opts: &ClientOptions) -> Result<Endpoint, ClientError> {
    check_scheme(&opts.endpoint, opts.tls.is_some())?;
    let connect_error = |source| ClientError::Connect {
        endpoint: opts.endpoint.clone(),
        source,
    };
    let mut ep = Endpoint::from_shared(opts.endpoint.clone())
        .map_err(connect_error)?
        .http2_keep_alive_interval(fl_proto::KEEPALIVE_INTERVAL)
        .keep_alive_while_idle(true)
        // The server holds at most this window for each client it sends the model to.
        .initial_stream_window_size(fl_proto::STREAM_WINDOW)
        .initial_connection_window_size(fl_proto::CONNECTION_WINDOW);
    if let Some(tls) = &opts.tls {
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca));
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &tls.domain {
            config = config.domain_name(domain.clone());
        }
        ep = ep.tls_config(config).map_err(connect_error)?;
    }
    Ok(ep)
}

/// Refuses a server address that cannot work: one without `http://` or `https://`, or
/// `https://` without TLS settings.
fn check_scheme(url: &str, tls: bool) -> Result<(), ClientError> {
    let wrong = |fix: String| Err(ClientError::Endpoint(fix));
    match url.split_once("://") {
        None => wrong(format!(
            "the server address {url:?} has no scheme: write http://{url}, or https://{url} with \
             the CA certificate (--ca) for a server with TLS"
        )),
        Some(("https", _)) if !tls => wrong(format!(
            "{url} is a TLS address, and this client has no CA certificate to check the server \
             with: add --ca FILE (the CA that signed the server's certificate)"
        )),
        Some(("http" | "https", _)) => Ok(()),
        Some((scheme, _)) => wrong(format!(
            "the server address {url:?} has the scheme {scheme}://: use http:// or https://"
        )),
    }
}

/// `e`, a failed attempt to reach the server at `url`, in a person's words when its cause is
/// a common mistake: nothing listening (retried: the server may be starting), or plain HTTP/2
/// to a TLS server (not retried), which [`speaks_tls`] tells from a server that is restarting.
async fn in_words(e: ClientError, url: &str) -> ClientError {
    let cause = match &e {
        ClientError::Connect { .. } => fl_common::error_chain(&e),
        ClientError::Status(s) if fl_proto::retry::retry_after(s).is_none() => {
            fl_common::error_chain(&e)
        }
        _ => return e,
    };
    let refused = [
        "Connection refused",
        "ConnectionRefused",
        "os error 111",
        "code: 111",
    ];
    if refused.iter().any(|r| cause.contains(r)) {
        return ClientError::Unreachable(format!(
            "no server answers at {url} (connection refused): start the server, or check the \
             address and port"
        ));
    }
    if url.starts_with("http://") && broke_the_connection(&e) && speaks_tls(url).await {
        return ClientError::Endpoint(format!(
            "the server at {url} speaks TLS: write https:// and give the CA certificate (--ca)"
        ));
    }
    e
}

/// True for the errors that plain HTTP/2 to a TLS server ends in (which one depends on timing):
/// a failed connection, or a call that was cancelled, unavailable, or broke on an HTTP/2
/// protocol error.
fn broke_the_connection(e: &ClientError) -> bool {
    match e {
        ClientError::Connect { .. } => true,
        ClientError::Status(s) => matches!(
            s.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal
        ),
        _ => false,
    }
}

/// How a client checks the server and proves itself over TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM certificate of the CA that signed the server's certificate.
    pub ca: Vec<u8>,
    /// PEM certificate and key of this client, for servers that require client certificates.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name the server's certificate must carry, when not the endpoint's host.
    pub domain: Option<String>,
}

impl ClientTls {
    /// The settings from PEM files: the CA's certificate, and this client's certificate and key
    /// when the server requires them. An unreadable file is named in the error.
    pub fn from_files(
        ca: &Path,
        identity: Option<(&Path, &Path)>,
        domain: Option<String>,
    ) -> std::io::Result<Self> {
        let read = |p: &Path| {
            std::fs::read(p)
                .map_err(|e| std::io::Error::new(e.kind(), format!("reading {}: {e}", p.display())))
        };
        let identity = match identity {
            Some((cert, key)) => Some((read(cert)?, read(key)?)),
            None => None,
        };
        Ok(Self {
            ca: read(ca)?,
            identity,
            domain,
        })
    }
}

/// The gRPC client of `opts.endpoint`, connected, retrying with jittered back-off until
/// `opts.connect_timeout` passes: the server may still be starting (or restarting), or a burst of
/// clients may overflow its accept queue (the kernel then resets connections it had half-opened,
/// seen as transport errors or cancellations). `then` runs on the connected client and is retried
/// with it on transient errors; a refusal (bad token, invalid request) is final.
async fn with_server<T, F, Fut>(opts: &ClientOptions, mut then: F) -> Result<T, ClientError>
where
    F: FnMut(FederationClient<Connection>) -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let deadline = tokio::time::Instant::now() + opts.connect_timeout;
    let connect_error = |source| ClientError::Connect {
        endpoint: opts.endpoint.clone(),
        source,
    };
    let ep = endpoint(opts)?;
    let mut failures = 0u32;
    if opts.connection.is_none() {
        tracing::info!(server = %opts.endpoint, "connecting");
    }
    let started = tokio::time::Instant::now();
    // Retries are summarised: the first said, then one every RETRY_SAY_EVERY, then the outcome.
    let mut said_at: Option<tokio::time::Instant> = None;
    loop {
        let attempt = async {
            let connection = match &opts.connection {
                Some(shared) => shared.clone(),
                None => Connection::network(ep.connect().await.map_err(connect_error)?),
            };
            let grpc = FederationClient::new(connection)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
            then(grpc).await
        };
        let attempt = match attempt.await {
            Ok(done) => Ok(done),
            Err(e) => Err(in_words(e, &opts.endpoint).await),
        };
        match attempt {
            Ok(done) => {
                if failures > 0 {
                    let seconds = format!("{:.1}", started.elapsed().as_secs_f64());
                    tracing::info!(attempts = failures + 1, seconds, "connected");
                }
                return Ok(done);
            }
            Err(e) if is_transient(&e) && tokio::time::Instant::now() < deadline => {
                failures += 1;
                let asked = match &e {
                    ClientError::Status(s) => fl_proto::retry::retry_after(s),
                    _ => None,
                };
                // Never past the deadline: the last try is at it, then the client gives up.
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let pause = retry_pause(failures, asked).min(left);
                let now = tokio::time::Instant::now();
                if said_at.is_none_or(|at| now - at >= RETRY_SAY_EVERY) {
                    said_at = Some(now);
                    tracing::info!(
                        server = %opts.endpoint,
                        attempt = failures,
                        reason = %fl_common::error_chain(&e),
                        "not connected yet: retrying until it answers (said again every 30 s)"
                    );
                }
                tokio::time::sleep(pause).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// How often a client that keeps retrying says so again.
const RETRY_SAY_EVERY: Duration = Duration::from_secs(30);

/// What a client holds of its identity between sessions: the id and session key of its last
/// Join, which reopen a Session without joining again.
#[derive(Clone)]
pub(crate) struct Held {
    client_id: String,
    session_key: Vec<u8>,
}

/// A session: this client's id, its outgoing queue, the server's stream, and what reopens it.
pub(crate) type Opened = (
    u64,
    mpsc::Sender<ClientMessage>,
    Streaming<ServerMessage>,
    Held,
);

/// Opens the Session stream: first, when it holds an identity, with it (a reconnect keeps the
/// client's id and its place in a running round); when the server no longer knows it (it
/// restarted), by joining again. See [`with_server`] for the retries.
pub(crate) async fn open_session(
    opts: &ClientOptions,
    held: Option<&Held>,
) -> Result<Opened, ClientError> {
    with_server(opts, |mut grpc| async move {
        if let Some(held) = held {
            match hello(&mut grpc, held.clone()).await {
                Err(ClientError::Status(s)) if s.code() == Code::Unauthenticated => {
                    tracing::info!("the server does not know this session any more: joining again");
                }
                other => return other,
            }
        }
        let request = JoinRequest {
            token: opts.token.clone(),
            name: opts.name.clone(),
        };
        let joined = grpc.join(request).await?.into_inner();
        let held = Held {
            client_id: joined.client_id,
            session_key: joined.session_key,
        };
        hello(&mut grpc, held).await
    })
    .await
}

/// Opens a Session with Hello for the identity `held`.
async fn hello(grpc: &mut FederationClient<Connection>, held: Held) -> Result<Opened, ClientError> {
    let id: u64 = held.client_id.parse().map_err(|_| {
        ClientError::Protocol(format!(
            "server issued a non-numeric id {:?}",
            held.client_id
        ))
    })?;
    let (outbox, rx) = mpsc::channel(8);
    let body = client_message::Body::Hello(Hello {
        client_id: held.client_id.clone(),
        session_key: held.session_key.clone(),
    });
    send(&outbox, body).await?;
    let inbound = grpc.session(ReceiverStream::new(rx)).await?.into_inner();
    tracing::debug!(client = id, "session open");
    Ok((id, outbox, inbound, held))
}

/// Asks the server for `count` demo partition indices (for `--partition SCHEME:K:auto`);
/// returns the first.
pub async fn assigned_partition(opts: &ClientOptions, count: u64) -> Result<u64, ClientError> {
    with_server(opts, |mut grpc| async move {
        let request = PartitionRequest {
            token: opts.token.clone(),
            count,
        };
        Ok(grpc.assign_partition(request).await?.into_inner().first)
    })
    .await
}

/// The pause before retry number `failures`: jittered exponential back-off, uniform in
/// [c/4, c] with c = min(5 s, 100 ms x 2^failures), so that thousands of clients refused together
/// by the server's join limiter or its accept queue spread their retries instead of returning in
/// step; never shorter than the wait the server `asked` for.
fn retry_pause(failures: u32, asked: Option<Duration>) -> Duration {
    let ceiling = (100u64 << failures.min(6)).min(5_000);
    let backoff = Duration::from_millis(rand::rng().random_range(ceiling / 4..=ceiling));
    backoff.max(asked.unwrap_or_default())
}

/// Whether a failed connect or Join may succeed if tried again (including a join refused for
/// its rate).
fn is_transient(e: &ClientError) -> bool {
    match e {
        ClientError::Connect { .. } | ClientError::Unreachable(_) => true,
        ClientError::Status(s) => {
            matches!(
                s.code(),
                Code::Unavailable | Code::Unknown | Code::Cancelled | Code::ResourceExhausted
            )
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_honours_the_servers_wait_and_otherwise_backs_off_within_its_bounds() {
        for failures in 1..10 {
            let ceiling = Duration::from_millis((100u64 << failures.min(6)).min(5_000));
            let pause = retry_pause(failures, None);
            assert!(pause >= ceiling / 4 && pause <= ceiling, "{pause:?}");
            let asked = Duration::from_secs(7);
            assert_eq!(retry_pause(failures, Some(asked)), asked);
        }
    }

    /// With nothing listening, a client gives up at its --connect-timeout, not a back-off
    /// later: 2 s of retries end within 2.5 s (each refused connect takes microseconds).
    #[tokio::test]
    async fn a_client_gives_up_at_its_connect_timeout() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut opts = ClientOptions::new(&format!("http://127.0.0.1:{port}"));
        opts.connect_timeout = Duration::from_secs(2);
        let started = std::time::Instant::now();
        assert!(open_session(&opts, None).await.is_err());
        let took = started.elapsed();
        assert!(took >= Duration::from_secs(2), "{took:?}");
        assert!(took < Duration::from_millis(2500), "{took:?}");
    }
}
