//! Conversions between wire messages and the domain crates' types.

mod model;
mod secure;
mod task;
#[cfg(test)]
mod tests;
mod verified;

pub use secure::{
    advertised_keys, client_stage, endorsement, ring_elements, ring_words, server_stage,
    server_stage_body,
};

pub use verified::{received_upload, verified_upload};

/// A wire message whose fields cannot be what the protocol says.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed message: {0}")]
pub struct WireError(pub String);

pub(super) fn bytes32(bytes: &[u8], what: &str) -> Result<[u8; 32], WireError> {
    bytes
        .try_into()
        .map_err(|_| WireError(format!("{what} must be 32 bytes, not {}", bytes.len())))
}

pub(super) fn bytes64(bytes: &[u8], what: &str) -> Result<[u8; 64], WireError> {
    bytes
        .try_into()
        .map_err(|_| WireError(format!("{what} must be 64 bytes, not {}", bytes.len())))
}
