//! What a run writes and reads back: the privacy ledger ([`ledger`]), the clients' local privacy
//! accounts ([`local_accounts`]), the checkpoint ([`checkpoint`]), the run folder's files
//! ([`output`], [`model_file`], [`file_digest`]) and which folder a run may write ([`run_dir`]).
//!
//! May import `identity`, `config` and `error`; nothing of the round, the edge or the operator's
//! surfaces.

pub mod checkpoint;
pub(crate) mod file_digest;
pub mod ledger;
pub(crate) mod local_accounts;
pub mod model_file;
pub mod output;
pub mod run_dir;

#[cfg(test)]
mod reference;
