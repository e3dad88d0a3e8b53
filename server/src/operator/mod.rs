//! The operator's surfaces: the HTTP endpoint both are served on ([`endpoint`]), the Prometheus
//! metrics ([`telemetry`]) and the live run page ([`live_page`]).
//!
//! May import `identity`, `config`, `error`, `records`, `round` and the edge's shared state.

pub(crate) mod endpoint;
pub(crate) mod live_page;
pub(crate) mod telemetry;
