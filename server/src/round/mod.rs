//! A round's vocabulary and rules, without I/O: what arrives from a client ([`events`]), why a
//! client's part in a round ends ([`rejection`]), who was sent which model in asynchronous mode
//! ([`buffer`]), whom a round samples and what it costs
//! ([`policy`]), and how uploads become the released model ([`strategy`]).
//!
//! May import `identity`, `config`, `error` and `records`; nothing of the wire format, the
//! transport or the edge.

pub(crate) mod buffer;
pub(crate) mod events;
pub(crate) mod policy;
pub(crate) mod rejection;
pub(crate) mod strategy;
