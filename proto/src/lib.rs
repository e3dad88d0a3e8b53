//! The `flp.v1` wire protocol: the code generated from `fl.proto`, the conversion between flat
//! `f32` tensors and the chunks that carry them, and between wire messages and `fl-common` types.
//!
//! **Architecture invariant:** this crate and the `server`/`client` crates are the only ones that
//! know the wire format; `fl-common` works on plain vectors.

#![deny(missing_docs)]

mod chunk;
pub mod codec;
mod convert;
pub mod retry;

pub use chunk::{
    ChunkError, MAX_CHUNK_BYTES, MAX_MESSAGE_BYTES, TensorAssembler, chunk_count, encode_chunks,
    encode_word_chunks,
};
pub use convert::{WireError, ring_elements, ring_words};

/// Interval of HTTP/2 pings on both ends of an idle connection: clients that are not sampled for
/// many rounds keep a live stream through NATs and proxies, and dead peers are noticed.
pub const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

/// Generated protobuf messages and gRPC stubs of package `flp.v1`.
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    tonic::include_proto!("flp.v1");
}
