//! The domain of the federated-learning system: datasets and partitions, models and their
//! training, and the aggregation math.
//!
//! **Architecture invariant:** this crate knows nothing of tonic, prost or tokio. Every formula
//! lives here as a plain function or a small struct and is tested without a network; the server
//! and client crates only move bytes and call into it.

#![deny(missing_docs)]

pub mod admm;
pub mod allocator;
pub mod authority;
pub mod cores;
pub mod data;
pub mod generated_docs;
pub mod model;
pub mod pace;
pub mod policy;
pub mod privacy;
pub mod report;
pub mod rng;
pub mod schedule;
pub mod secagg;
pub mod signds;
pub mod task;

pub use report::error_chain;
