//! The `flp.v1` wire protocol: the code generated from `fl.proto`, the conversion between flat
//! `f32` tensors and the chunks that carry them, and between wire messages and the domain crates'
//! types.
//!
//! **Architecture invariant:** this crate and the `server`/`client` crates are the only ones that
//! know the wire format; the domain crates work on plain vectors.

#![deny(missing_docs)]

mod chunk;
pub mod codec;
mod convert;
mod framing;
pub mod retry;

pub use chunk::{
    ChunkError, MAX_CHUNK_BYTES, MAX_MESSAGE_BYTES, TensorAssembler, chunk_count, encode_chunks,
    encode_word_chunks, into_chunks,
};
pub use convert::{
    WireError, advertised_keys, client_stage, endorsement, received_upload, ring_elements,
    ring_words, server_stage, server_stage_body, verified_upload,
};
pub use framing::{Deframer, Frame, FrameError, PREFIX_BYTES};

/// Interval of HTTP/2 pings on both ends of an idle connection: clients that are not sampled for
/// many rounds keep a live stream through NATs and proxies, and dead peers are noticed.
pub const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

/// Most streams on one HTTP/2 connection (hyper's default server limit, which the clients'
/// connection sharing counts on).
pub const MAX_STREAMS_PER_CONNECTION: u32 = 200;

/// What either end lets its peer send on one stream before reading it: gRPC's usual initial
/// window (64 KiB). It bounds what a server holds for each stream it sends the model to (the
/// client's window) and for each upload waiting for its turn (the server's). Over a long path it
/// also bounds a stream's rate, to 64 KiB per round trip.
pub const STREAM_WINDOW: u32 = 64 * 1024;

/// What a connection may have unread: every stream's window and one more, so that streams held
/// back never fill it and the stream being read always moves.
pub const CONNECTION_WINDOW: u32 = (MAX_STREAMS_PER_CONNECTION + 1) * STREAM_WINDOW;

/// Generated protobuf messages and gRPC stubs of package `flp.v1`.
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    tonic::include_proto!("flp.v1");
}
