//! The gRPC face of the server: Join admits clients, Session binds a stream to a joined client
//! and turns what it sends into [`Event`]s for the round loop.
//!
//! Framing errors (a chunk without a header, chunks out of order, a header announcing a tensor of
//! the wrong size, garbage) are caught here, answered with a gRPC status and end the stream; what
//! an update means (its round, whether the client was sampled, its values) is judged by the round
//! loop.

use crate::registry::{ClientId, Outbox, Registry, constant_time_eq};
use fl_proto::v1::federation_server::Federation;
use fl_proto::v1::{
    ClientMessage, JoinReply, JoinRequest, ServerMessage, UpdateHeader, client_message,
};
use fl_proto::{ChunkError, TensorAssembler};
use prost::Message;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// How long a new stream may take to send its Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// Messages queued towards one client before the sender waits.
const OUTBOX_DEPTH: usize = 8;

/// What a client's stream produced, for the round loop.
#[derive(Debug)]
pub enum Event {
    /// A client's stream is live.
    Connected(ClientId),
    /// A client's stream ended.
    Disconnected(ClientId),
    /// A complete update arrived (framing checked, content not yet).
    Update {
        /// Sender.
        client: ClientId,
        /// Its header.
        header: UpdateHeader,
        /// The update's values.
        values: Vec<f32>,
        /// Encoded size of the header and chunks.
        bytes: u64,
    },
    /// The client reports it could not do its task.
    Failed {
        /// Sender.
        client: ClientId,
        /// Round it failed.
        round: u64,
        /// Its reason.
        reason: String,
    },
}

/// State shared by the gRPC handlers and the round loop.
#[derive(Debug)]
pub struct Shared {
    /// Joined clients.
    pub registry: Mutex<Registry>,
    /// Enrollment token, if required.
    pub token: Option<String>,
    /// Length of the model's parameter vector: the only update size accepted.
    pub num_params: usize,
    /// Towards the round loop.
    pub events: mpsc::Sender<Event>,
}

impl Shared {
    /// The registry, recovering it if a panicking thread poisoned the lock (its data stay
    /// consistent: every mutation is a single insert or replace).
    pub fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The `flp.v1.Federation` service.
#[derive(Debug, Clone)]
pub struct FederationService {
    shared: Arc<Shared>,
}

impl FederationService {
    /// A service over the shared state.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

#[tonic::async_trait]
impl Federation for FederationService {
    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinReply>, Status> {
        let req = request.into_inner();
        if let Some(token) = &self.shared.token
            && !constant_time_eq(token.as_bytes(), req.token.as_bytes())
        {
            tracing::warn!(name = %req.name, "join refused: bad enrollment token");
            return Err(Status::unauthenticated("enrollment token refused"));
        }
        if req.num_examples == 0 {
            return Err(Status::invalid_argument(
                "num_examples must be positive: a client without data cannot train",
            ));
        }
        let (id, key) = self.shared.registry().join(req.num_examples);
        tracing::info!(client = id, name = %req.name, examples = req.num_examples, "joined");
        Ok(Response::new(JoinReply {
            client_id: id.to_string(),
            session_key: key.to_vec(),
        }))
    }

    type SessionStream = ReceiverStream<Result<ServerMessage, Status>>;

    async fn session(
        &self,
        request: Request<Streaming<ClientMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no Hello within 30 s"))??;
        let hello = match first.and_then(|m| m.body) {
            Some(client_message::Body::Hello(h)) => h,
            _ => return Err(Status::invalid_argument("a Session must open with Hello")),
        };
        let id: ClientId = hello
            .client_id
            .parse()
            .map_err(|_| Status::invalid_argument("client_id is not one the server issued"))?;
        let (outbox, rx) = mpsc::channel(OUTBOX_DEPTH);
        let generation = self
            .shared
            .registry()
            .attach(id, &hello.session_key, outbox.clone())
            .map_err(|e| Status::unauthenticated(e.to_string()))?;
        tracing::info!(client = id, "session open");
        let _ = self.shared.events.send(Event::Connected(id)).await;
        let shared = self.shared.clone();
        tokio::spawn(async move {
            if let Err(status) = read_stream(&shared, id, &mut inbound).await {
                tracing::warn!(client = id, error = %status.message(), "dropping client");
                let _ = outbox.send(Err(status)).await;
            }
            let was_live = shared.registry().detach(id, generation);
            if was_live {
                let _ = shared.events.send(Event::Disconnected(id)).await;
            }
            tracing::info!(client = id, "session closed");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// An update being received: its header and the chunks so far.
struct Pending {
    header: UpdateHeader,
    assembler: TensorAssembler,
    bytes: u64,
}

/// Reads one client's stream until it ends; returns the status to send it on a framing error.
async fn read_stream(
    shared: &Shared,
    id: ClientId,
    inbound: &mut Streaming<ClientMessage>,
) -> Result<(), Status> {
    let mut pending: Option<Pending> = None;
    loop {
        let message = match inbound.message().await {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(()),
            // Undecodable bytes, an oversized message, or a broken transport; if the client is
            // still there it learns why.
            Err(e) => {
                return Err(Status::invalid_argument(format!(
                    "unreadable message: {}",
                    e.message()
                )));
            }
        };
        let size = message.encoded_len() as u64;
        match message.body {
            Some(client_message::Body::UpdateHeader(header)) => {
                if pending.is_some() {
                    return Err(Status::invalid_argument(
                        "new UpdateHeader before the previous update's chunks were complete",
                    ));
                }
                if header.num_values != shared.num_params as u64 {
                    return Err(Status::invalid_argument(format!(
                        "update has {} values, the model has {} parameters",
                        header.num_values, shared.num_params
                    )));
                }
                let assembler =
                    TensorAssembler::new(header.round, header.num_values, header.num_chunks)
                        .map_err(chunk_status)?;
                pending = Some(Pending {
                    header,
                    assembler,
                    bytes: size,
                });
            }
            Some(client_message::Body::UpdateChunk(chunk)) => {
                let Some(p) = pending.as_mut() else {
                    return Err(Status::invalid_argument(
                        "update chunk without an UpdateHeader",
                    ));
                };
                p.bytes += size;
                if let Some(values) = p.assembler.push(chunk).map_err(chunk_status)? {
                    let p = pending.take().expect("checked above");
                    let _ = shared
                        .events
                        .send(Event::Update {
                            client: id,
                            header: p.header,
                            values,
                            bytes: p.bytes,
                        })
                        .await;
                }
            }
            Some(client_message::Body::TaskFailed(f)) => {
                let _ = shared
                    .events
                    .send(Event::Failed {
                        client: id,
                        round: f.round,
                        reason: f.reason,
                    })
                    .await;
            }
            Some(client_message::Body::Hello(_)) => {
                return Err(Status::invalid_argument("Hello sent twice on one Session"));
            }
            None => return Err(Status::invalid_argument("empty ClientMessage")),
        }
    }
}

fn chunk_status(e: ChunkError) -> Status {
    Status::invalid_argument(format!("malformed update: {e}"))
}

/// Sends `messages` to a client in order without blocking the caller (a slow client only delays
/// itself); returns at once.
pub fn send_all(outbox: Outbox, messages: Vec<ServerMessage>) {
    tokio::spawn(async move {
        for m in messages {
            if outbox.send(Ok(m)).await.is_err() {
                break;
            }
        }
    });
}
