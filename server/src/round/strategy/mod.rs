//! The aggregation interface (after Flower's `Strategy`): configure a round, absorb one upload at
//! a time (a dense update, a SignDS upload, or under secure aggregation the round's sum), finish
//! the round. Every call gets the round's [`RoundContext`]: a strategy keeps aggregation state
//! between calls, never the round's plan.
//!
//! Aggregation rules: [`FedAvg`], [`TrimmedMean`], [`SecureSum`], [`SignDsAvg`], [`Iadmm`].
//! Decorators around an inner rule, each a [`Layer`] that [`Decorated`] stacks on its inner
//! strategy (one forwarding mechanism: no decorator can drop its inner strategy's state):
//! [`CentralDp`] (clip, Gaussian noise, divide by the expected count; wraps only a
//! [`SumStrategy`]), [`LocalDp`] (checks each upload's local release and keeps the clients' local
//! ledgers), [`NormBound`] (an operator's bound on update norms) and [`ServerOptimizer`]
//! (FedAvgM, FedAdagrad, FedAdam, FedYogi on the released aggregate), and [`IterateAverage`] (the
//! model evaluated and written is a moving average of the released iterates).
//! `crate::run::build` is the one place that stacks them for a run.

mod central_dp;
mod fedavg;
mod group_sum;
mod iadmm;
mod iterate_average;
mod layer;
mod local_dp;
mod norm_bound;
mod secure_sum;
mod server_optimizer;
mod signds_avg;
mod trimmed_mean;
mod views;

pub(crate) use central_dp::CentralDp;
pub(crate) use fedavg::FedAvg;
pub(crate) use group_sum::{GroupRule, GroupSummer, SecureRule};
pub(crate) use iadmm::{Iadmm, ResidualBalancing};
pub(crate) use iterate_average::IterateAverage;
pub(crate) use layer::Layer;
pub(crate) use local_dp::LocalDp;
pub(crate) use norm_bound::NormBound;
pub(crate) use secure_sum::{Divisor, SecureSum};
pub(crate) use server_optimizer::ServerOptimizer;
pub(crate) use signds_avg::SignDsAvg;
pub(crate) use trimmed_mean::TrimmedMean;
pub(crate) use views::{ClientTensors, Views};

pub(crate) use crate::error::RestoreError;
use crate::identity::ids::ClientId;
pub(crate) use crate::records::checkpoint::StrategyState;
use fl_model::{CheckedUpdate, UpdateError};
use fl_privacy::signds::SignDsError;
use fl_privacy::{LocalMechanism, Release};
use fl_secagg::task::AdmmStep;

/// What every call of a round is told: the round and what the coordinator fixed before it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RoundContext {
    /// t.
    pub round: u64,
    /// Expected number of participants: m_t for fixed-size sampling, q_t K under Poisson
    /// sampling (public, so dividing by it leaks nothing).
    pub expected_clients: f64,
    /// z_t: noise multiplier of the round (private runs).
    pub noise_multiplier: Option<f64>,
    /// DP-FTRL: the round's step in the policy's correlated-noise stream, from 1 (a tree's step
    /// in its tree; a banded stream's step since the server started).
    pub stream_step: Option<u64>,
}

/// One client's dense result.
#[derive(Debug, Clone)]
pub(crate) struct ClientUpdate {
    /// Who sent it.
    pub client: ClientId,
    /// n_k: examples it trained on (its weight; 1 for a local release).
    pub num_examples: u64,
    /// u_k = w_k - w_t (IADMM: the primal iterate z_k), checked finite and measured where it
    /// entered the server.
    pub values: CheckedUpdate,
    /// The local release the client declares it applied, if any.
    pub release: Option<Release>,
    /// a_k: the discount of an update trained on a model s server steps old, 1/sqrt(1 + s) in
    /// asynchronous mode (`crate::round::buffer::staleness_weight`); 1 in synchronous rounds.
    /// Applied after any clipping, and at most 1, so it never raises a contribution's norm.
    pub staleness_weight: f64,
}

/// One SignDS upload (s, J); a vote, not discounted by staleness.
#[derive(Debug, Clone)]
pub(crate) struct SignUpload {
    /// Who sent it.
    pub client: ClientId,
    /// The local release it declares.
    pub release: Option<Release>,
    /// s in {-1, +1}.
    pub sign: i64,
    /// J: the selected coordinates.
    pub indices: Vec<u64>,
}

/// The unmasked sum of a secure-aggregation round, decoded to floats.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SumInput {
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

/// A group's partial aggregate of a round (the aggregator tier): what an aggregator summed of
/// its clients' results.
#[derive(Debug, Clone)]
pub(crate) struct GroupSum {
    /// sum_k w_k u_k over the group's results, checked finite where it entered the server.
    pub sum: CheckedUpdate,
    /// sum_k w_k: the example counts (FedAvg without privacy), or 1 each.
    pub weight: f64,
    /// The results summed.
    pub contributors: usize,
    /// S, when each update was clipped to it before it was summed.
    pub clip_bound: Option<f64>,
}

/// What a strategy is given to absorb.
#[derive(Debug, Clone)]
pub(crate) enum Upload {
    /// A client's dense update.
    Dense(ClientUpdate),
    /// A client's SignDS upload.
    Sign(SignUpload),
    /// A secure-aggregation round's sum.
    Sum(SumInput),
    /// A group's partial aggregate, from an aggregator.
    Group(GroupSum),
    /// A client's verified upload, before its proof is checked (only a verified round's
    /// collection takes it; every strategy refuses it).
    Verified(VerifiedUpload),
}

/// A client's verified upload: shares of its update and the proof of its norm bound.
#[derive(Debug, Clone)]
pub(crate) struct VerifiedUpload {
    /// Who sent it.
    pub client: ClientId,
    /// The shares and the proof.
    pub report: Box<fl_secagg::verified::Report>,
}

impl From<ClientUpdate> for Upload {
    fn from(update: ClientUpdate) -> Self {
        Upload::Dense(update)
    }
}

impl Upload {
    /// The dense update, or why a strategy of dense updates refuses this upload.
    pub(crate) fn dense(self) -> Result<ClientUpdate, StrategyError> {
        match self {
            Upload::Dense(u) if u.release.is_some() => Err(StrategyError::UnexpectedRelease),
            Upload::Dense(u) => Ok(u),
            Upload::Sign(_) => Err(StrategyError::NotSign),
            Upload::Verified(_) => Err(StrategyError::NotVerified),
            Upload::Sum(_) | Upload::Group(_) => Err(StrategyError::NeedsUpdates),
        }
    }

    /// Takes the declared release and the sender out of an individual upload.
    fn take_release(&mut self) -> Option<(ClientId, Option<Release>)> {
        match self {
            Upload::Dense(u) => Some((u.client, u.release.take())),
            Upload::Sign(u) => Some((u.client, u.release.take())),
            Upload::Sum(_) | Upload::Group(_) | Upload::Verified(_) => None,
        }
    }
}

/// What the sampled clients are told beyond the training settings.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct RoundInstructions {
    /// The round's inexact-ADMM step, if the strategy runs one.
    pub admm: Option<AdmmStep>,
    /// The local mechanism every upload must be protected with, under a local mode.
    pub local: Option<LocalMechanism>,
}

/// What a round produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RoundOutcome {
    /// The next global model, or `None` to keep the current one.
    pub model: Option<Vec<f32>>,
    /// Why there is no next model when the reason is not a lack of results (a tree step out of
    /// order); said in the round's metrics line.
    pub withheld: Option<String>,
    /// Clip bound S used this round.
    pub clip_bound: Option<f64>,
    /// Standard deviation of the Gaussian noise added to each coordinate of the sum.
    pub noise_std: Option<f64>,
    /// rho for the next round (IADMM).
    pub rho: Option<f64>,
}

/// Why a strategy refused an upload.
#[derive(Debug, thiserror::Error)]
pub enum StrategyError {
    /// The update itself is unusable.
    #[error(transparent)]
    Update(#[from] UpdateError),
    /// Under secure aggregation only the round's sum is accepted.
    #[error("this round uses secure aggregation: individual updates are not accepted")]
    NeedsSum,
    /// Another upload in a verified round.
    #[error("this round is verified: send a VerifiedUploadHeader with the proof of the bound")]
    NeedsVerified,
    /// A verified upload in a round that is not verified.
    #[error("this round is not verified: send the update the task asks for")]
    NotVerified,
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
    /// The upload's local protection is not the round's mechanism.
    #[error("{0}")]
    Release(String),
    /// A local release in a round without a local mechanism.
    #[error("this round uses no local mechanism: send the update without a release")]
    UnexpectedRelease,
    /// A group's sum was not clipped to the round's bound.
    #[error("a group's sum was clipped to {got:?}, not to the round's bound S = {want}")]
    GroupClip {
        /// The bound the aggregator says it clipped to.
        got: Option<f64>,
        /// The round's S.
        want: f64,
    },
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
pub(crate) trait Strategy: Send {
    /// What the clients sampled in the round are told beyond the training settings.
    fn configure_round(&mut self, _ctx: &RoundContext) -> RoundInstructions {
        RoundInstructions::default()
    }
    /// Takes one upload into the round's aggregate; a refused upload changes nothing.
    fn absorb(&mut self, ctx: &RoundContext, upload: Upload) -> Result<(), StrategyError>;
    /// What must survive a restart, taken between rounds.
    fn state(&self) -> StrategyState {
        StrategyState::default()
    }
    /// Restores what [`Strategy::state`] returned.
    fn restore(&mut self, _state: StrategyState) -> Result<(), RestoreError> {
        Ok(())
    }
    /// What the strategy shows beyond its aggregate ([`Views`]): none by default.
    fn views(&self) -> Views<'_> {
        Views::default()
    }
    /// Ends the round, starting from the global model `global`.
    fn finish_round(&mut self, ctx: &RoundContext, global: &[f32]) -> RoundOutcome;
    /// Whether the coordinator released the model [`Strategy::finish_round`] proposed (it may
    /// refuse: too few results, a model that fails its check); called before the checkpoint.
    fn released(&mut self, _applied: bool) {}
}

impl Strategy for Box<dyn Strategy> {
    fn configure_round(&mut self, ctx: &RoundContext) -> RoundInstructions {
        (**self).configure_round(ctx)
    }
    fn absorb(&mut self, ctx: &RoundContext, upload: Upload) -> Result<(), StrategyError> {
        (**self).absorb(ctx, upload)
    }
    fn state(&self) -> StrategyState {
        (**self).state()
    }
    fn restore(&mut self, state: StrategyState) -> Result<(), RestoreError> {
        (**self).restore(state)
    }
    fn views(&self) -> Views<'_> {
        (**self).views()
    }
    fn finish_round(&mut self, ctx: &RoundContext, global: &[f32]) -> RoundOutcome {
        (**self).finish_round(ctx, global)
    }
    fn released(&mut self, applied: bool) {
        (**self).released(applied)
    }
}

/// The round's plain sum of what a [`SumStrategy`] absorbed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RoundSum {
    /// sum_k u_k.
    pub values: Vec<f32>,
    /// The L2 sensitivity of the sum to one contributor, when the strategy knows one beyond
    /// the clip bound (the decoded secure sum's S + sqrt(d)/gamma).
    pub sensitivity: Option<f64>,
}

/// A strategy whose aggregate is the plain, unweighted sum of what it absorbed: the only kind
/// [`CentralDp`] may wrap, since its noise is calibrated to one contribution to a sum.
pub(crate) trait SumStrategy: Strategy {
    /// Takes the round's sum (absorbed with weight 1 each) and starts the next round empty. An
    /// empty round of individual updates sums to zero (central DP releases its noise whatever
    /// the number of participants); `None` means the round has no sum (a secure round that
    /// aborted).
    fn take_sum(&mut self) -> Option<RoundSum>;
}

/// Moves `global` by `delta`: the next model of an aggregate.
fn moved(global: &[f32], delta: &[f32]) -> Vec<f32> {
    let mut next = global.to_vec();
    fl_model::apply_update(&mut next, delta);
    next
}

#[cfg(test)]
pub(crate) mod testing {
    //! Shared fixtures of the strategy tests.
    use super::{CheckedUpdate, ClientUpdate, RoundContext};

    /// Round `round` expecting `expected` clients at noise multiplier `z`.
    pub(crate) fn ctx(round: u64, expected: f64, z: Option<f64>) -> RoundContext {
        RoundContext {
            round,
            expected_clients: expected,
            noise_multiplier: z,
            stream_step: None,
        }
    }

    /// Client `client`'s update `values` over `n` examples; the values must be finite.
    pub(crate) fn update(client: u64, n: u64, values: Vec<f32>) -> ClientUpdate {
        ClientUpdate {
            client,
            num_examples: n,
            values: CheckedUpdate::new(values).expect("a test update of finite values"),
            release: None,
            staleness_weight: 1.0,
        }
    }
}
