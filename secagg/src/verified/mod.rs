//! Verified inputs: a client proves, in zero knowledge over shares of its update, that the
//! update's L2 norm is within the round's bound (PINE, on `prio`'s fully linear proofs), so that
//! two non-colluding aggregators can refuse a poisoned contribution without either seeing any one
//! update.
//!
//! - [`shape`]: the round's public parameters and the binder of one upload;
//! - [`report`]: the client's shares and proof ([`shard`]);
//! - [`mod@prepare`]: the aggregators' checks ([`prepare()`], [`decide`]);
//! - [`seal`]: the helper's share, sealed to it with HPKE;
//! - [`batch`]: one round between the leader and the helper.

pub mod batch;
mod circuit;
mod derive;
mod encode;
pub mod prepare;
pub mod report;
pub mod seal;
pub mod shape;

pub use batch::{
    Batch, BatchRefusal, BatchUpload, Helper, HelperFault, LeaderRound, Reply, Verified,
};
pub use circuit::{F, NormCircuit, field_bytes, field_values};
pub use encode::{EncodeError, fixed_point};
pub use prepare::{Exclusion, InputShare, Pending, PrepShare, Role, decide, prepare, sum_shares};
pub use report::{
    Encoder, HelperShare, LeaderShare, Parts, Report, ShardError, shard, shard_unclipped, split,
};
pub use seal::{HelperKey, HelperPublicKey, SealError, Sealed};
pub use shape::{Binder, Shape, ShapeError};

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod flow_tests;
#[cfg(test)]
mod tests;
