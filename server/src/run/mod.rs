//! Running a federation: the one place that acts on the privacy plan ([`build`]), the run's model
//! and test set ([`model_setup`]), how a round's results come in over the edge's port
//! ([`collection`]), the round loop ([`coordinator`]) and the start-up that wires them to the
//! endpoints ([`start`]); and an aggregator of the aggregator tier ([`aggregator`]), which
//! collects its group's part of each round for a coordinator.
//!
//! The top layer: it may import every other. Of the edge it uses only [`crate::edge::clients`]
//! (the round's port to the clients) and, to start it, the transport and the shared state; an
//! aggregator also its stream to the coordinator, `crate::edge::upstream`.

pub(crate) mod aggregator;
pub(crate) mod build;
pub(crate) mod collection;
pub(crate) mod coordinator;
pub(crate) mod helper;
pub(crate) mod model_setup;
pub(crate) mod start;
