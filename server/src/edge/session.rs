//! The `Session` RPC below tonic's codec: [`Routes`] serves `flp.v1.Federation/Session` itself
//! and hands every other method to the generated server; [`open_session`] binds a stream to the
//! client its Hello names and reads what the client sends, through the [`Framer`], into events
//! for the round loop.
//!
//! A session's messages are framed by `fl_proto`'s [`Deframer`] and [`Frame`] instead of tonic's
//! codec, which keeps two buffers per stream, each as large as the largest message it handled,
//! for the stream's life, and encodes the model again for every client it goes to. At 10,000
//! streams and rounds of 1,000 that was most of the server's heap (`heaptrack`; docs/src/results/speed.md, "Scale and memory"). Here
//! what a client is sent is a queue of [`Frame`]s, the model's chunks among them encoded once per
//! round and shared by every stream, and what a client sends is read with no buffer kept between
//! messages. The bytes on the wire are the same as the codec's, so clients use the generated
//! client unchanged.

use crate::edge::framer::Framer;
use crate::edge::outbox::{Outbox, Outgoing};
use crate::edge::registry::AttachError;
use crate::edge::shared::Shared;
use crate::identity::ids::ClientId;
use crate::round::events::{Arrival, Event};
use bytes::Bytes;
use fl_proto::v1::{ClientMessage, client_message};
use fl_proto::{Deframer, FrameError};
use http_body::Frame as BodyFrame;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;
use tracing::Instrument;

/// The path of the `Session` method.
pub(crate) const PATH: &str = "/flp.v1.Federation/Session";

/// The `flp.v1.Federation` service: `Session` served here, the other methods by `generated`.
#[derive(Clone)]
pub(crate) struct Routes<S> {
    generated: S,
    shared: Arc<Shared>,
}

impl<S> Routes<S> {
    /// `Session` over `shared`, the rest by `generated`.
    pub(crate) fn new(generated: S, shared: Arc<Shared>) -> Self {
        Self { generated, shared }
    }
}

impl<S: NamedService> NamedService for Routes<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Routes<S>
where
    S: Service<
            http::Request<Body>,
            Response = http::Response<Body>,
            Error = Infallible,
            Future = BoxFuture<http::Response<Body>, Infallible>,
        >,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.generated.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != PATH {
            return self.generated.call(request);
        }
        let shared = self.shared.clone();
        Box::pin(async move {
            let inbound = Inbound::new(request.into_body());
            Ok(match open_session(shared, inbound).await {
                Ok(queue) => respond(queue),
                Err(status) => status.into_http(),
            })
        })
    }
}

/// Messages queued towards one client before the sender waits.
const OUTBOX_DEPTH: usize = 8;

/// Most uploads (dense updates, masked inputs) assembled at once or waiting for the round loop.
///
/// A stream whose next message opens a tensor waits for a place before it reads on, and the
/// place is freed when the round loop takes the upload, which it folds into the aggregate at
/// once: the server holds at most this many uploads plus the one being folded, however many
/// clients answer (about 34 MB for the default MLP), and HTTP/2 flow control holds the other
/// clients' chunks back on their side.
pub(crate) const UPLOADS_AT_ONCE: usize = 16;

/// How long a new stream may take to send its Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens a `Session` (`crate::edge::session` serves it): reads the Hello, binds the stream to the
/// client it names and starts reading what the client sends; returns the queue of what the
/// client is sent.
async fn open_session(
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
    tracing::debug!(client = id, "session open");
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
        tracing::debug!(client = id, "session closed");
    };
    tokio::spawn(reader.instrument(span));
    Ok(rx)
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
        // A stream no longer bound to the client (training over, superseded, dropped) acts on
        // nothing more it reads, but is read on until its response stream ends: returning at once
        // dropped the request and reset the HTTP/2 stream, and a Shutdown still queued on it was
        // lost (the client then retried for minutes). Its client may hang up without ending the
        // stream: not an error of the client's.
        let bound = shared.registry().is_current(id, generation);
        let message = match next {
            Ok(Some(_)) if !bound => continue,
            Ok(Some(m)) => m,
            Ok(None) => return Ok(()),
            Err(_) if !bound => return Ok(()),
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
            let place = held.take();
            let _ = shared.events.send(Arrival::holding(event, place)).await;
        }
    }
}

/// The response of an open session: its messages as they are queued, then its status.
fn respond(queue: mpsc::Receiver<Outgoing>) -> http::Response<Body> {
    let mut response = http::Response::new(Body::new(Outbound {
        queue,
        ended: false,
    }));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// The messages a client sends on its session.
#[derive(Debug)]
pub(crate) struct Inbound {
    body: Body,
    deframer: Deframer,
}

impl Inbound {
    /// The messages in `body`.
    pub(crate) fn new(body: Body) -> Self {
        Self {
            body,
            deframer: Deframer::new(fl_proto::MAX_MESSAGE_BYTES),
        }
    }

    /// The next message, or `None` at the end of the stream. Reads the body only as far as the
    /// message, so HTTP/2 flow control holds back what the server is not ready for.
    pub(crate) async fn message(&mut self) -> Result<Option<ClientMessage>, Status> {
        loop {
            if let Some(message) = self.deframer.message().map_err(frame_status)? {
                return Ok(Some(message));
            }
            let frame = std::future::poll_fn(|cx| {
                http_body::Body::poll_frame(Pin::new(&mut self.body), cx)
            })
            .await;
            match frame {
                // Trailers carry nothing a client may say.
                Some(frame) => {
                    if let Ok(data) = frame?.into_data() {
                        self.deframer.push(&data);
                    }
                }
                None => {
                    self.deframer.finish().map_err(frame_status)?;
                    return Ok(None);
                }
            }
        }
    }
}

/// The status of bytes that do not read as messages: the sender's fault.
fn frame_status(e: FrameError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// A session's response body: the queued frames as data, then the status as trailers (OK once
/// every sender is gone).
struct Outbound {
    queue: mpsc::Receiver<Outgoing>,
    ended: bool,
}

impl http_body::Body for Outbound {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<BodyFrame<Bytes>, Status>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let status = match std::task::ready!(self.queue.poll_recv(cx)) {
            Some(Ok(frame)) => return Poll::Ready(Some(Ok(BodyFrame::data(frame.into_bytes())))),
            Some(Err(status)) => *status,
            None => Status::ok(""),
        };
        self.ended = true;
        self.queue.close();
        let mut trailers = http::HeaderMap::new();
        if let Err(unsendable) = status.add_header(&mut trailers) {
            trailers.clear();
            let _ = unsendable.add_header(&mut trailers);
        }
        Poll::Ready(Some(Ok(BodyFrame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fl_proto::Frame;
    use fl_proto::v1::{ServerMessage, Shutdown, server_message};

    fn shutdown(reason: &str) -> Frame {
        Frame::encode(&ServerMessage {
            body: Some(server_message::Body::Shutdown(Shutdown {
                round: 1,
                reason: reason.into(),
                ..Shutdown::default()
            })),
        })
    }

    async fn next(body: &mut Outbound) -> Option<BodyFrame<Bytes>> {
        std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut *body), cx))
            .await
            .map(Result::unwrap)
    }

    #[tokio::test]
    async fn queued_frames_go_out_as_they_are_then_the_status_as_trailers() {
        let (tx, queue) = mpsc::channel(4);
        let mut body = Outbound {
            queue,
            ended: false,
        };
        let frame = shutdown("done");
        tx.send(Ok(frame.clone())).await.unwrap();
        tx.send(Err(Box::new(Status::aborted("superseded"))))
            .await
            .unwrap();
        let data = next(&mut body).await.unwrap().into_data().unwrap();
        assert_eq!(data, frame.into_bytes());
        let trailers = next(&mut body).await.unwrap().into_trailers().unwrap();
        let status = Status::from_header_map(&trailers).unwrap();
        assert_eq!(status.code(), tonic::Code::Aborted);
        assert_eq!(status.message(), "superseded");
        assert!(next(&mut body).await.is_none());
        assert!(tx.send(Ok(shutdown("late"))).await.is_err());
    }

    #[tokio::test]
    async fn a_queue_whose_senders_are_gone_ends_with_ok() {
        let (tx, queue) = mpsc::channel(1);
        drop(tx);
        let mut body = Outbound {
            queue,
            ended: false,
        };
        let trailers = next(&mut body).await.unwrap().into_trailers().unwrap();
        let status = Status::from_header_map(&trailers).unwrap();
        assert_eq!(status.code(), tonic::Code::Ok);
    }

    #[tokio::test]
    async fn inbound_reads_messages_and_refuses_a_truncated_end() {
        use fl_proto::v1::{Hello, client_message};
        let hello = ClientMessage {
            body: Some(client_message::Body::Hello(Hello {
                client_id: "5".into(),
                session_key: vec![1; 32],
            })),
        };
        let bytes = Frame::encode(&hello).into_bytes();
        let mut whole = Inbound::new(Body::new(http_body_full(bytes.clone())));
        assert_eq!(whole.message().await.unwrap(), Some(hello));
        assert_eq!(whole.message().await.unwrap(), None);
        let mut cut = Inbound::new(Body::new(http_body_full(bytes.slice(..bytes.len() - 2))));
        let e = cut.message().await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    /// A body of one data frame.
    fn http_body_full(bytes: Bytes) -> Once {
        Once(Some(bytes))
    }

    struct Once(Option<Bytes>);

    impl http_body::Body for Once {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<BodyFrame<Bytes>, Status>>> {
            Poll::Ready(self.0.take().map(|b| Ok(BodyFrame::data(b))))
        }
    }
}
