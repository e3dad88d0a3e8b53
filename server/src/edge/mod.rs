//! The edge: the only layer that knows `flp.v1`, `tonic` and the streams. It serves `Join`,
//! `AssignPartition` and `Session` ([`service`], [`session`], [`framer`], [`wire`],
//! [`outbox`]), keeps who is connected ([`registry`], [`shared`], [`join_gate`]), runs the gRPC
//! server ([`transport`], [`accept`]), and offers the round its one port to the clients
//! ([`clients`]), in the domain crates' and [`crate::round`] types. The aggregator tier is here
//! too: a coordinator's `Tier` service and its registry of aggregators ([`tier`], [`groups`]),
//! and an aggregator's stream to its coordinator ([`upstream`]).
//!
//! May import `identity`, `config`, `error`, `records` and `round`.

pub(crate) mod accept;
pub(crate) mod clients;
pub(crate) mod framer;
pub(crate) mod groups;
pub(crate) mod helper;
pub(crate) mod join_gate;
pub(crate) mod outbox;
pub(crate) mod registry;
pub(crate) mod service;
pub(crate) mod session;
pub(crate) mod shared;
pub(crate) mod tier;
pub(crate) mod transport;
pub(crate) mod upstream;
pub(crate) mod wire;
