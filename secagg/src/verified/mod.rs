//! Verified inputs: a client proves, in zero knowledge over shares of its update, that the
//! update's L2 norm is within the round's bound (PINE, on `prio`'s fully linear proofs), so that
//! the aggregators can refuse a poisoned contribution without seeing any one update.

mod circuit;
mod encode;

pub use circuit::{F, NormCircuit};
pub use encode::{EncodeError, fixed_point};

#[cfg(test)]
mod tests;
