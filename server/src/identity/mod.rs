//! Who a client is: the ids the server hands out ([`ids`]) and how a client proves it may join
//! ([`credentials`]: anonymous, a shared token, or an enrollment file of tokens or certificates),
//! with every token kept as a digest ([`secret`]).
//!
//! The bottom layer: it imports nothing of this crate.

pub mod credentials;
pub(crate) mod ids;
pub(crate) mod secret;
