//! What every part of the federated-learning system shares and no concept owns: one budget of
//! the machine's cores, the process allocator, the rule for seeds, per-round schedules, simulated
//! device speeds, an error's wording, crash-safe files, and the check that keeps generated pages current.
//!
//! **Owns** nothing of the domain; **imports** no crate of the workspace: every other crate may
//! use it.
//!
//! **Architecture invariant:** no crate of the domain (fl-common, fl-datasets, fl-model,
//! fl-privacy, fl-authority, fl-secagg) knows tonic, prost or tokio. Every formula lives in them as
//! a plain function or a small struct, tested without a network; the server and client crates
//! only move bytes and call into them.

#![deny(missing_docs)]

pub mod allocator;
pub mod cores;
pub mod durable;
pub mod generated_docs;
mod named_tables;
pub mod pace;
pub mod report;
pub mod rng;
pub mod schedule;

pub use report::error_chain;
