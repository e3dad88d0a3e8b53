//! DP-FTRL's correlated-noise streams. A stream is one module that answers every privacy
//! question about itself through [`NoiseStream`]: its settings (its own table,
//! `[privacy.noise.NAME]`), its plan for a run, its participation rule, its noise, each step's
//! ledger event, and the charges `fl privacy` plans with. The closed types the configuration
//! and the server hold ([`StreamSettings`], [`AnyStream`]) are written from the list at the end
//! of this file by one `noise_streams!` invocation, so no dispatch is edited by hand.
//!
//! A new stream is its module here, its line in the list (with its `mod` line), its event's
//! line in `event.rs`, and its page in the book.

#[macro_use]
mod generate;
mod banded;
mod noise;
mod tree;

pub use banded::{BandedFactorization, BandedNoise, BandedRound, BandedSettings, BandedStream};
pub use noise::{CorrelatedNoise, StepMismatch};
pub use tree::{
    TreeNoise, TreeRound, TreeSettings, TreeStream, tree_depth, tree_nodes, tree_rounds_within,
};

use super::ledger_event::LedgerEvent;
use super::planning::Budget;
use super::sampled_gaussian::GaussianRound;
use super::{AccountantKind, PrivacyEvent};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt;

/// A DP-FTRL noise stream: the value one run's policy owns (its step and who contributed so
/// far), planned from its settings, and everything the privacy of its steps rests on.
pub trait NoiseStream: Clone + fmt::Debug + PartialEq + Send + Sized + 'static {
    /// Its table, `[privacy.noise.NAME]`: every key optional, unknown keys refused.
    type Settings: Clone + fmt::Debug + PartialEq + Default + Serialize + DeserializeOwned;
    /// The ledger event of its steps.
    type Event: LedgerEvent + Into<PrivacyEvent>;

    /// The stream `settings` give for `run`, before its first step, or why its accounting
    /// cannot cover them (the message names the settings' keys).
    fn plan(settings: &Self::Settings, run: &StreamRun) -> Result<Self, StreamError>;

    /// z: the multiplier of its noise (one per run).
    fn noise_multiplier(&self) -> f64;

    /// The current step, from 1 (0 before the first).
    fn step(&self) -> u64;

    /// Moves to the next step.
    fn advance(&mut self);

    /// The current step's ledger event, spent before its release.
    fn event(&self) -> Self::Event;

    /// Whether `identity` may contribute to the current step under the participation rule the
    /// accounting assumes.
    fn may_contribute(&self, identity: u64) -> bool;

    /// Records `identity`'s contribution to the current step; false (and nothing recorded) when
    /// it may not contribute.
    fn contributes(&mut self, identity: u64) -> bool;

    /// Its noise over `dim` coordinates, for the curator's sum. It lives in memory only.
    fn noise(&self, dim: usize) -> Box<dyn CorrelatedNoise>;

    /// What steps 1..=`steps` of one run compose as, for planning: `count` Gaussian mechanisms,
    /// each `charge` (the events of those steps compose to the same).
    fn charges(&self, steps: u64) -> Charges;

    /// The most steps, at most `cap`, whose charges are at most `count`.
    fn steps_within(&self, count: u64, cap: u64) -> u64;
}

/// What the steps of a stream compose as: `count` mechanisms, each `charge`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Charges {
    /// One Gaussian mechanism (no sampling: q = 1).
    pub charge: GaussianRound,
    /// How many.
    pub count: u64,
}

/// What a stream is planned from: the run's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamRun {
    /// z: the noise multiplier.
    pub noise_multiplier: f64,
    /// K / m_1 (K / M asynchronously): one pass over the clients, a period's default; `None`
    /// where it is not known (the settings must give the period).
    pub one_pass: Option<u64>,
    /// Asynchronous steps of M distinct identities among K, as (M, K): a period of steps must
    /// fit in K or a step could never fill. `None` for rounds, which take fewer.
    pub buffer: Option<(u64, u64)>,
    /// T: the run's rounds (steps).
    pub rounds: u64,
    /// beta: the server's momentum, 0 for plain steps.
    pub momentum: f64,
    /// The accountant and budget the ledger enforces, which may end the run before T; `None`
    /// when only T bounds the steps.
    pub ledger: Option<(AccountantKind, Budget)>,
}

impl StreamRun {
    /// The period `key` gives, or one pass by default; refused at 0.
    pub fn period(&self, key: &str, given: Option<u64>) -> Result<u64, StreamError> {
        let period = given.or(self.one_pass).ok_or_else(|| {
            StreamError(format!(
                "{key} is needed: there is no client count to default it from"
            ))
        })?;
        if period == 0 {
            return Err(StreamError(format!("{key} must be at least 1")));
        }
        Ok(period)
    }

    /// Asynchronously, a step takes only identities the rule allows: `span` steps of M
    /// distinct ones must fit in K, or the buffer could never fill.
    pub fn check_fills(&self, key: &str, span: u64) -> Result<(), StreamError> {
        match self.buffer {
            Some((size, clients)) if span.saturating_mul(size) > clients => {
                Err(StreamError(format!(
                    "{key} ({span}) times the buffer's size ({size}) exceeds the clients \
                     ({clients}): an identity returns only after that many steps"
                )))
            }
            Some(_) | None => Ok(()),
        }
    }
}

/// Why a stream's settings cannot be planned; the message names the keys of its table.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct StreamError(pub String);

noise_streams! {
    /// Tree aggregation (Kairouz et al. 2021): each client at most once per tree of `rounds`
    /// steps.
    "tree" => Tree(TreeStream),
    /// Banded matrix factorization (Choquette-Choo et al. 2023): each client at most once every
    /// `min_separation` steps and at most `max_participations` times; `bands` <=
    /// `min_separation`.
    "banded" => Banded(BandedStream),
}

#[cfg(test)]
mod tests;
