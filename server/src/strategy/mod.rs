//! The aggregation interface (after Flower's `Strategy`): configure a round, absorb one client's
//! result at a time (or, under secure aggregation, the round's sum), finish the round.
//! [`FedAvg`], [`TrimmedMean`], [`DpFedAvg`], [`SecureSum`], [`SignDsAvg`] and [`Iadmm`]
//! implement it; [`NormBound`] puts an update-norm bound in front of one.

mod dp_fedavg;
mod fedavg;
mod iadmm;
mod norm_bound;
mod secure_sum;
mod signds_avg;
mod trimmed_mean;

pub use dp_fedavg::{ClipRule, DpFedAvg, QuantileClip};
pub use fedavg::FedAvg;
pub use iadmm::{Iadmm, ResidualBalancing};
pub use norm_bound::NormBound;
pub use secure_sum::{SecureSum, SumNoise};
pub use signds_avg::SignDsAvg;
pub use trimmed_mean::TrimmedMean;

use crate::registry::ClientId;
use fl_common::model::{LocalConfig, UpdateError};
use fl_common::signds::SignDsError;

/// One client's validated-for-shape result.
#[derive(Debug, Clone)]
pub struct ClientUpdate {
    /// Who sent it.
    pub client: ClientId,
    /// n_k: examples it trained on (its weight).
    pub num_examples: u64,
    /// u_k = w_k - w_t.
    pub values: Vec<f32>,
}

/// What the round loop decided about a round before it starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundPlan {
    /// Expected number of participants: m_t for fixed-size sampling, q_t K under Poisson
    /// sampling (public, so dividing by it leaks nothing).
    pub expected_clients: f64,
    /// z_t: noise multiplier of the round (private runs).
    pub noise_multiplier: Option<f64>,
    /// I: examples the connected clients declared at Join.
    pub total_examples: u64,
}

/// What a strategy carries from one round to the next, for checkpoints.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StrategyState {
    /// Small values (an adaptive clip bound, rho).
    pub scalars: serde_json::Value,
    /// Named tensors (IADMM's per-client primals and duals).
    pub tensors: Vec<(String, Vec<f32>)>,
}

/// The inexact-ADMM step of a round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdmmRound {
    /// rho^t.
    pub rho: f64,
    /// I.
    pub total_examples: u64,
}

/// What a round produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoundOutcome {
    /// The next global model, or `None` to keep the current one.
    pub model: Option<Vec<f32>>,
    /// Clip bound S used this round.
    pub clip_bound: Option<f64>,
    /// Standard deviation of the Gaussian noise added to each coordinate of the sum.
    pub noise_std: Option<f64>,
    /// rho for the next round (IADMM).
    pub rho: Option<f64>,
}

/// The unmasked sum of a secure-aggregation round, decoded to floats.
#[derive(Debug, Clone, PartialEq)]
pub struct SumInput {
    /// sum_{u in U3} x_u / gamma.
    pub sum: Vec<f32>,
    /// |U3|.
    pub contributors: usize,
    /// S: the clients' clip bound.
    pub clip_bound: f64,
    /// The decoded sum's L2 sensitivity, S + sqrt(d)/gamma.
    pub sensitivity: f64,
    /// Standard deviation of the distributed noise already in the sum, in model units.
    pub noise_std: Option<f64>,
}

/// Why a strategy refused a client's update.
#[derive(Debug, thiserror::Error)]
pub enum StrategyError {
    /// The update itself is unusable.
    #[error(transparent)]
    Update(#[from] UpdateError),
    /// Under secure aggregation only the round's sum is accepted.
    #[error("this round uses secure aggregation: individual updates are not accepted")]
    NeedsSum,
    /// This strategy needs individual updates.
    #[error("this strategy aggregates individual updates, not a secure sum")]
    NeedsUpdates,
    /// This round takes SignDS uploads only.
    #[error("this round uses SignDS: send a SignDsUpload, not the update")]
    NeedsSign,
    /// This round takes no SignDS uploads.
    #[error("this round does not use SignDS: send the update")]
    NotSign,
    /// A SignDS upload is malformed.
    #[error(transparent)]
    Sign(#[from] SignDsError),
    /// The update's L2 norm is beyond the operator's bound.
    #[error("update norm {norm:e} exceeds robust.max_update_norm = {bound}")]
    NormTooLarge {
        /// ||u||_2.
        norm: f64,
        /// The bound.
        bound: f64,
    },
}

/// A server-side aggregation rule.
pub trait Strategy: Send {
    /// Instructions for the clients sampled in `round`.
    fn configure_round(&mut self, round: u64, plan: &RoundPlan) -> LocalConfig;
    /// Takes one client's update into the round's aggregate; a refused update changes nothing.
    fn absorb(&mut self, round: u64, update: ClientUpdate) -> Result<(), StrategyError>;
    /// Takes a secure-aggregation round's sum; strategies that need each update refuse it.
    fn absorb_sum(&mut self, _round: u64, _input: SumInput) -> Result<(), StrategyError> {
        Err(StrategyError::NeedsUpdates)
    }
    /// Takes one SignDS upload (s, J); other strategies refuse it.
    fn absorb_sign(
        &mut self,
        _round: u64,
        _sign: i64,
        _indices: &[u64],
    ) -> Result<(), StrategyError> {
        Err(StrategyError::NotSign)
    }
    /// What `client` is sent at the start of a round instead of the global model, if anything
    /// (IADMM: its anchor and point).
    fn client_tensor(&self, _client: ClientId, _global: &[f32]) -> Option<Vec<f32>> {
        None
    }
    /// The round's inexact-ADMM step, if the strategy runs one.
    fn admm_round(&self) -> Option<AdmmRound> {
        None
    }
    /// What must survive a restart, taken between rounds.
    fn state(&self) -> StrategyState {
        StrategyState::default()
    }
    /// Restores what [`Strategy::state`] returned.
    fn restore(&mut self, _state: StrategyState) -> Result<(), String> {
        Ok(())
    }
    /// Ends the round, starting from the global model `global`.
    fn finish_round(&mut self, round: u64, global: &[f32]) -> RoundOutcome;
}
