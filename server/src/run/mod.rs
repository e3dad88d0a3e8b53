//! Running a federation: the one place that acts on the privacy plan ([`build`]), the run's model
//! and test set ([`model_setup`]), how a round's results come in over the edge's port
//! ([`collection`]), the round loop ([`coordinator`]) and the start-up that wires them to the
//! endpoints ([`start`]).
//!
//! The top layer: it may import every other. Of the edge it uses only [`crate::edge::clients`]
//! (the round's port to the clients) and, to start it, the transport and the shared state.

pub(crate) mod build;
pub(crate) mod collection;
pub(crate) mod coordinator;
pub(crate) mod model_setup;
pub(crate) mod start;
