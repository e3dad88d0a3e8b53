//! The gRPC face of the server: Join admits clients, Session binds a stream to a joined client
//! and turns what it sends into [`Event`]s for the round loop.
//!
//! Framing errors (a chunk without a header, chunks out of order, a header announcing a tensor of
//! the wrong size, garbage) are caught here, answered with a gRPC status and end the stream; what
//! an update means (its round, whether the client was sampled, its values) is judged by the round
//! loop.

use crate::credentials::{Admission, Credentials, Refusal};
use crate::registry::{AttachError, ClientId, Outbox, Registry};
use crate::rejection::Rejection;
use crate::session::{Inbound, Outgoing};
use fl_common::privacy::Release;
use fl_common::secagg::{AdvertisedKeys, RevealedShare, SealedShares};
use fl_proto::retry::exhausted_retry_after;
use fl_proto::v1::federation_server::Federation;
use fl_proto::v1::{
    ClientMessage, JoinReply, JoinRequest, LocalRelease, MaskedInputHeader, PartitionReply,
    PartitionRequest, client_message,
};
use fl_proto::v1::{PeerKeys, TensorChunk};
use fl_proto::{ChunkError, Frame, TensorAssembler, WireError};
use prost::Message;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tonic::{Request, Response, Status};
use tracing::Instrument;

/// Most partition indices one request may take.
const MAX_PARTITIONS_PER_REQUEST: u64 = 100_000;
/// How long a new stream may take to send its Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest client name a Join may give (it only appears in logs).
pub const MAX_NAME_BYTES: usize = 256;

/// Longest reason a `TaskFailed` may give.
pub const MAX_REASON_BYTES: usize = 4096;

/// At most the first 256 bytes of a client-supplied string, for logs.
pub fn for_log(text: &str) -> &str {
    let mut end = text.len().min(256);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

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
        header: UploadHeader,
        /// The update's values.
        values: Vec<f32>,
        /// Encoded size of the header and chunks.
        bytes: u64,
    },
    /// A SignDS upload (its indices are checked by the round loop).
    Sign {
        /// Sender.
        client: ClientId,
        /// The round it is for.
        round: u64,
        /// s.
        sign: i64,
        /// J.
        indices: Vec<u64>,
        /// Its declared release.
        release: Declared,
        /// Encoded size.
        bytes: u64,
    },
    /// A secure-aggregation stage message (fields checked, protocol meaning not yet).
    SecAgg {
        /// Sender.
        client: ClientId,
        /// The round it claims.
        round: u64,
        /// The message.
        message: SecAggMessage,
        /// Encoded size.
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

/// Most uploads (dense updates, masked inputs) assembled at once or waiting for the round loop.
///
/// A stream whose next message opens a tensor waits for a place before it reads on, and the
/// place is freed when the round loop takes the upload, which it folds into the aggregate at
/// once: the server holds at most this many uploads plus the one being folded, however many
/// clients answer (about 34 MB for the default MLP), and HTTP/2 flow control holds the other
/// clients' chunks back on their side.
pub const UPLOADS_AT_ONCE: usize = 16;

/// An event on its way to the round loop, with the upload place it holds (freed when the round
/// loop takes it).
#[derive(Debug)]
pub struct Arrival {
    /// The event.
    pub event: Event,
    /// The place of the upload it carries.
    _place: Option<OwnedSemaphorePermit>,
}

impl From<Event> for Arrival {
    fn from(event: Event) -> Self {
        Self {
            event,
            _place: None,
        }
    }
}

/// A client's secure-aggregation stage message, in `fl-common`'s types.
#[derive(Debug)]
pub enum SecAggMessage {
    /// Stage 0: its public keys.
    Keys(AdvertisedKeys),
    /// Stage 1: its sealed shares.
    Shares(Vec<SealedShares>),
    /// The check: the neighbours whose shares it could not open.
    Check(Vec<u64>),
    /// Stage 2: its masked input, as 32-bit words.
    Masked(Vec<u32>),
    /// Stage 3: its revealed shares.
    Reveal(Vec<RevealedShare>),
}

/// State shared by the gRPC handlers and the round loop.
#[derive(Debug)]
pub struct Shared {
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
}

/// Rate limits of Join and AssignPartition, per remote address.
type JoinLimiter = governor::DefaultKeyedRateLimiter<std::net::IpAddr>;

/// A limiter allowing `per_second` joins per address after a burst of `burst`.
fn join_limiter(per_second: f64, burst: u32) -> JoinLimiter {
    let period = Duration::from_secs_f64(1.0 / per_second);
    let burst = std::num::NonZeroU32::new(burst.max(1)).expect("at least 1");
    let quota = governor::Quota::with_period(period)
        .unwrap_or_else(|| governor::Quota::per_second(std::num::NonZeroU32::MIN))
        .allow_burst(burst);
    governor::RateLimiter::keyed(quota)
}

/// The join limiter and the log of what it refused: thousands of clients refused together (a
/// simulation starting, or a flood) make one warning a second with their count, not a line each.
#[derive(Debug)]
pub struct JoinGate {
    limiter: JoinLimiter,
    /// Refusals since the last warning, and when that was.
    refused: Mutex<(u64, Option<std::time::Instant>)>,
}

impl JoinGate {
    /// `per_second` joins per address after a burst of `burst`.
    pub fn new(per_second: f64, burst: u32) -> Self {
        Self {
            limiter: join_limiter(per_second, burst),
            refused: Mutex::new((0, None)),
        }
    }

    /// Whether `address` may join now; if not, how long until it may, and whether a warning
    /// about the refusals since the last one is due (at most one a second).
    pub fn check(&self, address: std::net::IpAddr) -> Result<(), Refused> {
        let Err(not_until) = self.limiter.check_key(&address) else {
            return Ok(());
        };
        let wait = not_until.wait_time_from(governor::clock::Clock::now(self.limiter.clock()));
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        refused.0 += 1;
        let now = std::time::Instant::now();
        let report = match refused.1 {
            Some(last) if now.duration_since(last) < Duration::from_secs(1) => None,
            _ => {
                refused.1 = Some(now);
                Some(std::mem::take(&mut refused.0))
            }
        };
        Err(Refused { wait, report })
    }
}

/// A join the limiter refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// How long until the address has a join again.
    pub wait: Duration,
    /// The refusals since the last warning, when a warning is due.
    pub report: Option<u64>,
}

impl Shared {
    /// The registry, recovering it if a panicking thread poisoned the lock (its data stay
    /// consistent: every mutation is a single insert or replace).
    pub fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The admission rule (recovering a poisoned lock: it holds plain data).
    pub fn credentials(&self) -> std::sync::MutexGuard<'_, Credentials> {
        self.credentials.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the enrollment list again and, if it changed, revokes the clients it no longer
    /// admits: their streams end with PERMISSION_DENIED and the round loop hears they left.
    pub fn enforce_enrollment(&self) {
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
        tracing::info!(
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

/// Opens a `Session` (`crate::session` serves it): reads the Hello, binds the stream to the
/// client it names and starts reading what the client sends; returns the queue of what the
/// client is sent.
pub async fn open_session(
    shared: Arc<Shared>,
    mut inbound: Inbound,
) -> Result<mpsc::Receiver<Outgoing>, Status> {
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
    shared.enforce_enrollment();
    let (generation, superseded) = shared
        .registry()
        .attach(id, &hello.session_key, outbox.clone())
        .map_err(|e| match e {
            AttachError::Revoked(_) => Status::permission_denied(e.to_string()),
            _ => Status::unauthenticated(e.to_string()),
        })?;
    if let Some(old) = superseded {
        // One stream per client: the earlier one ends now, saying why.
        let _ = old.try_send(Err(Box::new(Status::aborted(
            "superseded by a newer Session for this client",
        ))));
    }
    tracing::info!(client = id, "session open");
    let _ = shared.events.send(Event::Connected(id).into()).await;
    let span = tracing::info_span!("session", client = id);
    let reader = async move {
        if let Err(status) = read_stream(&shared, id, generation, &mut inbound, &outbox).await {
            tracing::warn!(client = id, error = %status.message(), "dropping client");
            let _ = outbox.send(Err(Box::new(status))).await;
        }
        let was_live = shared.registry().detach(id, generation);
        if was_live {
            let _ = shared.events.send(Event::Disconnected(id).into()).await;
        }
        tracing::info!(client = id, "session closed");
    };
    tokio::spawn(reader.instrument(span));
    Ok(rx)
}

/// A local release as an upload declares it: absent, read, or why it does not read (which the
/// round refuses).
pub type Declared = Option<Result<Release, String>>;

/// The header of a dense upload: what may travel with the values depends on who sees them.
#[derive(Debug, Clone, PartialEq)]
pub enum UploadHeader {
    /// No client-side mechanism: the trusted curator gets the example count and the loss.
    Plain {
        /// The round it is for.
        round: u64,
        /// n_k.
        num_examples: u64,
        /// The mean training loss.
        train_loss: f32,
    },
    /// A local mechanism's output: the release's public parameters and nothing else.
    Released {
        /// The round it is for.
        round: u64,
        /// The declared release.
        release: Declared,
    },
}

impl UploadHeader {
    /// The round it is for.
    pub fn round(&self) -> u64 {
        match self {
            Self::Plain { round, .. } | Self::Released { round, .. } => *round,
        }
    }
}

/// Reads a declared release off the wire.
fn declared(release: Option<&LocalRelease>) -> Declared {
    release.map(|r| Release::try_from(r).map_err(|e| e.to_string()))
}

/// What the chunks being received will make.
#[derive(Debug)]
enum Expecting {
    /// A dense update.
    Update(UploadHeader),
    /// A masked input of a secure-aggregation round.
    Masked {
        /// Its round.
        round: u64,
    },
}

/// A tensor being received: what it is and the chunks so far.
#[derive(Debug)]
struct Pending {
    expecting: Expecting,
    assembler: TensorAssembler,
    bytes: u64,
}

fn wire_status(e: WireError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// Adds a chunk to the tensor in progress; once complete, turns it into its event.
fn push_chunk(
    pending: &mut Option<Pending>,
    id: ClientId,
    chunk: TensorChunk,
    size: u64,
) -> Result<Option<Event>, Status> {
    let Some(p) = pending.as_mut() else {
        return Err(Status::invalid_argument(
            "update chunk without an UpdateHeader or MaskedInputHeader",
        ));
    };
    p.bytes += size;
    let Some(words) = p.assembler.push_words(chunk).map_err(chunk_status)? else {
        return Ok(None);
    };
    let p = pending.take().expect("checked above");
    Ok(Some(match p.expecting {
        Expecting::Update(header) => Event::Update {
            client: id,
            header,
            values: words.into_iter().map(f32::from_bits).collect(),
            bytes: p.bytes,
        },
        Expecting::Masked { round } => Event::SecAgg {
            client: id,
            round,
            message: SecAggMessage::Masked(words),
            bytes: p.bytes,
        },
    }))
}

/// Turns a secure-aggregation stage message into its event (the tensor-carrying stage goes
/// through [`push_chunk`]).
fn secagg_event(id: ClientId, body: client_message::Body, bytes: u64) -> Result<Event, Status> {
    let (round, message) = match body {
        client_message::Body::SecaggKeys(k) => {
            let keys = AdvertisedKeys::try_from(&PeerKeys {
                client_id: id,
                cipher_public: k.cipher_public,
                mask_public: k.mask_public,
            })
            .map_err(wire_status)?;
            (k.round, SecAggMessage::Keys(keys))
        }
        client_message::Body::SecaggShares(s) => {
            let shares = s
                .shares
                .iter()
                .map(SealedShares::try_from)
                .collect::<Result<_, _>>()
                .map_err(wire_status)?;
            (s.round, SecAggMessage::Shares(shares))
        }
        client_message::Body::SecaggCheck(c) => (c.round, SecAggMessage::Check(c.refused)),
        client_message::Body::SecaggReveal(r) => {
            let reveals = r
                .shares
                .iter()
                .map(RevealedShare::try_from)
                .collect::<Result<_, _>>()
                .map_err(wire_status)?;
            (r.round, SecAggMessage::Reveal(reveals))
        }
        _ => unreachable!("only called with secure-aggregation bodies"),
    };
    Ok(Event::SecAgg {
        client: id,
        round,
        message,
        bytes,
    })
}

/// Reads one client's stream until it ends, or until a newer stream of the client, a refusal or
/// a revocation unbinds it; returns the status to send it on a framing error or a stalled upload.
async fn read_stream(
    shared: &Shared,
    id: ClientId,
    generation: u64,
    inbound: &mut Inbound,
    outbox: &Outbox,
) -> Result<(), Status> {
    let mut framer = Framer::new(id, shared.num_params);
    // The upload place of the tensor being read.
    let mut held = None;
    loop {
        // Between tensors a client may be silent as long as it likes (it trains, or waits to be
        // sampled); inside one it must keep sending. Once the response stream is gone (ended
        // with a status: superseded, refused, or training over) there is nothing left to read.
        let stall = if framer.in_tensor() {
            shared.upload_stall
        } else {
            Duration::MAX
        };
        let next = tokio::select! {
            next = tokio::time::timeout(stall, inbound.message()) => next.map_err(|_| {
                Status::deadline_exceeded(format!(
                    "upload stalled: no chunk for {:.0} s",
                    shared.upload_stall.as_secs_f64()
                ))
            })?,
            () = outbox.closed() => return Ok(()),
        };
        if !shared.registry().is_current(id, generation) {
            return Ok(());
        }
        let message = match next {
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
        if Framer::opens_tensor(&message) {
            let places = shared.uploads.clone();
            tokio::select! {
                place = places.acquire_owned() => held = place.ok(),
                () = outbox.closed() => return Ok(()),
            }
        }
        if let Some(event) = framer.accept(message)? {
            let _place = held.take();
            let _ = shared.events.send(Arrival { event, _place }).await;
        }
    }
}

/// The framing of one client's stream, without I/O: turns the messages after Hello into
/// [`Event`]s, assembling tensors from their header and chunks, and refuses what breaks the
/// framing. The fuzz target `fuzz/fuzz_targets/session.rs` drives it with arbitrary bytes.
#[derive(Debug)]
pub struct Framer {
    id: ClientId,
    num_params: usize,
    pending: Option<Pending>,
}

impl Framer {
    /// The framing of client `id`'s stream, for a model of `num_params` parameters.
    pub fn new(id: ClientId, num_params: usize) -> Self {
        Self {
            id,
            num_params,
            pending: None,
        }
    }

    /// Whether `message` opens a tensor, whose chunks follow.
    pub fn opens_tensor(message: &ClientMessage) -> bool {
        matches!(
            message.body,
            Some(
                client_message::Body::UpdateHeader(_)
                    | client_message::Body::ReleaseHeader(_)
                    | client_message::Body::MaskedInputHeader(_)
            )
        )
    }

    /// Whether a tensor is half received.
    pub fn in_tensor(&self) -> bool {
        self.pending.is_some()
    }

    /// Starts receiving a dense upload's chunks: `values` in `chunks`.
    fn start_upload(
        &mut self,
        header: UploadHeader,
        (values, chunks): (u64, u32),
        size: u64,
    ) -> Result<(), Status> {
        let round = header.round();
        if values != self.num_params as u64 {
            return Err(Status::invalid_argument(format!(
                "update has {values} values, the model has {} parameters",
                self.num_params
            )));
        }
        let assembler = TensorAssembler::new(round, values, chunks).map_err(chunk_status)?;
        self.pending = Some(Pending {
            expecting: Expecting::Update(header),
            assembler,
            bytes: size,
        });
        Ok(())
    }

    /// Starts receiving a masked input's chunks: one or two words per parameter (32- or 64-bit
    /// ring; the round checks which).
    fn start_masked(&mut self, header: &MaskedInputHeader, size: u64) -> Result<(), Status> {
        let n = self.num_params as u64;
        if header.num_words != n && header.num_words != 2 * n {
            return Err(Status::invalid_argument(format!(
                "masked input has {} words, the model has {n} parameters",
                header.num_words
            )));
        }
        let assembler = TensorAssembler::new(header.round, header.num_words, header.num_chunks)
            .map_err(chunk_status)?;
        self.pending = Some(Pending {
            expecting: Expecting::Masked {
                round: header.round,
            },
            assembler,
            bytes: size,
        });
        Ok(())
    }

    /// Takes the next message: `Ok(Some(event))` when it completes one, `Ok(None)` when more
    /// must follow, `Err` when it breaks the framing (the stream then ends).
    pub fn accept(&mut self, message: ClientMessage) -> Result<Option<Event>, Status> {
        let size = message.encoded_len() as u64;
        let id = self.id;
        let body = message
            .body
            .ok_or_else(|| Status::invalid_argument("empty ClientMessage"))?;
        if self.pending.is_some() && !matches!(body, client_message::Body::UpdateChunk(_)) {
            return Err(Status::invalid_argument(
                "a message other than a chunk before the previous tensor's chunks were complete",
            ));
        }
        let event = match body {
            client_message::Body::UpdateHeader(h) => {
                let header = UploadHeader::Plain {
                    round: h.round,
                    num_examples: h.num_examples,
                    train_loss: h.train_loss,
                };
                self.start_upload(header, (h.num_values, h.num_chunks), size)?;
                None
            }
            client_message::Body::ReleaseHeader(h) => {
                let header = UploadHeader::Released {
                    round: h.round,
                    release: declared(h.release.as_ref()),
                };
                self.start_upload(header, (h.num_values, h.num_chunks), size)?;
                None
            }
            client_message::Body::MaskedInputHeader(header) => {
                self.start_masked(&header, size)?;
                None
            }
            client_message::Body::UpdateChunk(chunk) => {
                push_chunk(&mut self.pending, id, chunk, size)?
            }
            body @ (client_message::Body::SecaggKeys(_)
            | client_message::Body::SecaggShares(_)
            | client_message::Body::SecaggCheck(_)
            | client_message::Body::SecaggReveal(_)) => Some(secagg_event(id, body, size)?),
            client_message::Body::SigndsUpload(upload) => Some(Event::Sign {
                client: id,
                round: upload.round,
                sign: i64::from(upload.sign),
                release: declared(upload.release.as_ref()),
                indices: upload.indices,
                bytes: size,
            }),
            client_message::Body::TaskFailed(f) if f.reason.len() > MAX_REASON_BYTES => {
                return Err(Status::invalid_argument(format!(
                    "TaskFailed reason longer than {MAX_REASON_BYTES} bytes"
                )));
            }
            client_message::Body::TaskFailed(f) => Some(Event::Failed {
                client: id,
                round: f.round,
                reason: f.reason,
            }),
            client_message::Body::Hello(_) => {
                return Err(Status::invalid_argument("Hello sent twice on one Session"));
            }
        };
        Ok(event)
    }
}

fn chunk_status(e: ChunkError) -> Status {
    Status::invalid_argument(format!("malformed update: {e}"))
}

/// Sends `messages` to a client in order without blocking the caller (a slow client only delays
/// itself); returns at once.
pub fn send_all(outbox: Outbox, messages: Vec<Frame>) {
    tokio::spawn(async move {
        for m in messages {
            if outbox.send(Ok(m)).await.is_err() {
                break;
            }
        }
    });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logged_strings_are_cut_at_a_character_boundary() {
        let euros = "€".repeat(300);
        assert_eq!(for_log(&euros).len(), 255);
        assert_eq!(for_log("short"), "short");
    }

    #[test]
    fn refused_joins_are_reported_once_a_second_with_their_count() {
        let gate = JoinGate::new(0.001, 1);
        let ip = "127.0.0.1".parse().unwrap();
        let report = |r: Result<(), Refused>| r.map_err(|refused| refused.report);
        assert_eq!(report(gate.check(ip)), Ok(()));
        assert_eq!(report(gate.check(ip)), Err(Some(1)));
        for _ in 0..5 {
            assert_eq!(report(gate.check(ip)), Err(None));
        }
        // Two seconds later the quiet refusals are reported with the new one.
        {
            let mut refused = gate.refused.lock().unwrap();
            refused.1 = refused
                .1
                .and_then(|t| t.checked_sub(Duration::from_secs(2)));
        }
        assert_eq!(report(gate.check(ip)), Err(Some(6)));
        let other = "127.0.0.2".parse().unwrap();
        assert_eq!(gate.check(other), Ok(()), "each address has its own bucket");
    }

    #[test]
    fn a_refused_join_is_told_when_the_next_token_comes() {
        // 10 joins a second after a burst of 1: the next one comes within 100 ms.
        let gate = JoinGate::new(10.0, 1);
        let ip = "127.0.0.1".parse().unwrap();
        assert_eq!(gate.check(ip), Ok(()));
        let wait = gate.check(ip).unwrap_err().wait;
        assert!(
            !wait.is_zero() && wait <= Duration::from_millis(100),
            "{wait:?}"
        );
    }
}
