//! How a round's results come in: the [`PlainCollection`] of individual uploads (dense and
//! SignDS) for the curator and the local modes, the [`SecureCollection`] of a
//! secure-aggregation round, which hands the strategy only the survivors' sum, or the
//! [`TieredCollection`] of a coordinator of aggregators, which hands it the groups' sums. `crate::run::build`
//! picks one per run; the coordinator only calls [`Collection::prepare`],
//! [`Collection::dispatch`] and [`Collection::collect`].

mod group_intake;
mod intake;
mod plain;
mod secure;
mod tiered;
mod verified;

pub(crate) use intake::Received;

pub(crate) use plain::PlainCollection;
pub(crate) use secure::SecureCollection;
pub(crate) use tiered::TieredCollection;
pub(crate) use verified::VerifiedCollection;

use crate::edge::clients::Clients;
use crate::error::ServerError;
use crate::identity::ids::ClientId;
use crate::records::output::{
    FederatedEval, GroupMetrics, SecAggRoundMetrics, SecAggSummary, VerifiedRoundMetrics,
};
use crate::round::policy::RoundPlan;
use crate::round::strategy::{RoundContext, Strategy};
use fl_privacy::UpdateMoments;
use fl_secagg::Calibration;
use fl_secagg::task::{TaskDigest, VerifiedTask};
use rand::rngs::StdRng;
use std::collections::BTreeSet;
use std::time::Instant;

/// Counters of one round's collection.
#[derive(Debug)]
pub(crate) struct Tally {
    /// Results the strategy absorbed.
    pub completed: usize,
    /// Plain updates that reported a training loss, and the sum of those losses.
    pub losses: usize,
    /// Sum of the reported training losses.
    pub train_loss_sum: f64,
    /// Bytes received.
    pub bytes_up: u64,
    /// Moments of the raw updates, for the paper's V_c and U_s.
    pub moments: UpdateMoments,
    /// The secure-aggregation figures of the round.
    pub secagg: Option<SecAggRoundMetrics>,
    /// The verified round's figures.
    pub verified: Option<VerifiedRoundMetrics>,
    /// Bytes sent beyond the tasks (tasks sent again, secure-aggregation stage messages).
    pub stage_bytes_down: u64,
    /// The clients' figures on their own examples (federated evaluation), of absorbed results.
    pub federated_eval: Option<FederatedEval>,
    /// Each aggregator's part of the round (the aggregator tier).
    pub groups: Vec<GroupMetrics>,
}

impl Tally {
    /// An empty tally over updates of `num_params` values.
    pub(crate) fn new(num_params: usize) -> Self {
        Self {
            completed: 0,
            losses: 0,
            train_loss_sum: 0.0,
            bytes_up: 0,
            moments: UpdateMoments::new(num_params),
            secagg: None,
            verified: None,
            stage_bytes_down: 0,
            federated_eval: None,
            groups: Vec::new(),
        }
    }
}

/// What a collection works on during a round.
pub(crate) struct RoundWork<'a> {
    /// The round's context, as every strategy call gets it.
    pub ctx: RoundContext,
    /// Z_t: the sampled clients.
    pub sampled: &'a BTreeSet<ClientId>,
    /// When the round started (its deadline counts from here).
    pub started: Instant,
    /// The strategy stack that absorbs the results.
    pub strategy: &'a mut dyn Strategy,
    /// w_t.
    pub global: &'a [f32],
    /// Whether the round's clients were asked to evaluate w_t (federated evaluation).
    pub evaluate: bool,
    /// H(task) of a secure round: the digest of the task and model its clients were sent.
    pub task_digest: Option<TaskDigest>,
}

/// What a collection fixes before the round's tasks go out.
#[derive(Debug, Default)]
pub(crate) struct Prepared {
    /// The secure round's code and noise, which its task carries.
    pub calibration: Option<Calibration>,
    /// The secure round is signed (the malicious-server variant).
    pub signed: bool,
    /// The federation id its task carries (its policy's; empty without one).
    pub federation: String,
    /// This server process's run id, which its task carries.
    pub run: u64,
    /// The verified round's part of the task, for a verified collection.
    pub verified: Option<VerifiedTask>,
}

/// One of the two ways results come in.
pub(crate) enum Collection {
    /// Individual uploads.
    Plain(PlainCollection),
    /// The stages of secure aggregation, then the sum.
    Secure(SecureCollection),
    /// The groups' partial aggregates, from aggregators.
    Tiered(TieredCollection),
    /// Verified uploads, checked with the helper, then their sum.
    Verified(VerifiedCollection),
}

impl Collection {
    /// Fixes what the round its policy planned needs before its tasks go out.
    pub(crate) fn prepare(&self, plan: &RoundPlan) -> Result<Prepared, ServerError> {
        match self {
            Collection::Plain(_) => Ok(Prepared::default()),
            Collection::Secure(s) => s.prepare(plan),
            Collection::Tiered(t) => t.prepare(plan),
            Collection::Verified(v) => Ok(v.prepare()),
        }
    }

    /// Sends what the round's tasks do not carry: each aggregator's part of the round over
    /// `global` (the aggregator tier), prepared as `prepared`; returns the bytes sent.
    pub(crate) fn dispatch(
        &mut self,
        clients: &Clients,
        (sampled, global): (&BTreeSet<ClientId>, &[f32]),
        prepared: &Prepared,
    ) -> u64 {
        match self {
            Collection::Tiered(t) => {
                t.dispatch(clients, (sampled, global), prepared.calibration.as_ref())
            }
            Collection::Plain(_) | Collection::Secure(_) | Collection::Verified(_) => 0,
        }
    }

    /// Collects the round's results into `work.strategy`.
    pub(crate) async fn collect(
        &mut self,
        clients: &mut Clients,
        work: RoundWork<'_>,
        prepared: Prepared,
        rng: &mut StdRng,
    ) -> Result<Tally, ServerError> {
        match self {
            Collection::Plain(p) => p.collect(clients, work).await,
            Collection::Secure(s) => s.collect(clients, work, prepared, rng).await,
            Collection::Tiered(t) => t.collect(clients, work, prepared).await,
            Collection::Verified(v) => v.collect(clients, work).await,
        }
    }

    /// An empty run summary of secure rounds, for a secure collection.
    pub(crate) fn secure_summary(&self) -> Option<SecAggSummary> {
        let signed = match self {
            Collection::Plain(_) | Collection::Verified(_) => None,
            Collection::Secure(s) => Some(s.signed()),
            Collection::Tiered(t) => t.secure_signed(),
        };
        signed.map(|signed| SecAggSummary {
            signed,
            ..SecAggSummary::default()
        })
    }
}
