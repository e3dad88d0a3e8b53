//! What the coordinator reports: a round's metrics line and the run's summary.

use super::{Coordinator, RoundCounts, RunTotals};
use crate::error::ServerError;
use crate::records::ledger::Ledger;
use crate::records::local_accounts::LocalAccounts;
use crate::records::output::{RoundMetrics, StoppedBy, Summary};
use crate::round::strategy::{RoundContext, RoundOutcome};
use crate::run::collection::Tally;
use fl_model::Evaluation;

impl Coordinator {
    /// The round's metrics line, its evaluation still to be filled in.
    pub(super) fn metrics(
        &self,
        ctx: &RoundContext,
        counts: RoundCounts,
        tally: &Tally,
        (outcome, skipped): (&RoundOutcome, Option<String>),
    ) -> RoundMetrics {
        let (round, sampled, bytes_down) = (ctx.round, counts.sampled, counts.bytes_down);
        let t0 = counts.started;
        let (epsilon, delta) = self.pipeline.ledger.as_ref().map(Ledger::spent).unzip();
        let (v_c, u_s) = tally.moments.v_c_and_u_s().unzip();
        RoundMetrics {
            secagg: tally.secagg.clone(),
            verified: tally.verified.clone(),
            round,
            connected: counts.connected,
            sampled,
            completed: tally.completed,
            dropped: counts.dropped,
            refused: counts.refused,
            applied: skipped.is_none(),
            skipped,
            clip_bound: outcome.clip_bound,
            noise_std: outcome.noise_std,
            rho: outcome.rho,
            local_epsilon: (self.pipeline.strategy.views().local_accounts)
                .map(LocalAccounts::max_epsilon),
            epsilon,
            delta,
            test_accuracy: None,
            test_loss: None,
            train_loss: (tally.losses > 0).then(|| tally.train_loss_sum / tally.losses as f64),
            v_c,
            u_s,
            bytes_up: tally.bytes_up,
            bytes_down,
            seconds: t0.elapsed().as_secs_f64(),
            federated_eval: tally.federated_eval,
            buffer: None,
            groups: tally.groups.clone(),
        }
    }

    /// The run's summary.
    pub(super) fn summary(
        &self,
        totals: &RunTotals,
        eval: Option<&Evaluation>,
        stopped_by: StoppedBy,
        wall_seconds: f64,
    ) -> Result<Summary, ServerError> {
        let ledger = self.pipeline.ledger.as_ref();
        let terms = ledger.map(Ledger::terms);
        let (epsilon, delta) = ledger.map(Ledger::spent).unzip();
        Ok(Summary {
            rounds_completed: totals.rounds_completed,
            test_accuracy: eval.map(|e| e.accuracy),
            test_loss: eval.map(|e| e.loss),
            epsilon,
            delta,
            accountant: ledger.map(|l| l.accountant_name().to_string()),
            sampling: self.pipeline.steps.sampling(),
            clip_mode: terms.map(|t| t.clip_mode.to_string()),
            clip_bound_leaks: terms.is_some_and(|t| t.clip_bound_leaks),
            sampling_seeded: terms.is_some_and(|t| t.sampling_seeded),
            stopped_by,
            client_updates: totals.client_updates,
            bytes_up: totals.bytes_up,
            bytes_down: totals.bytes_down,
            wall_seconds,
            model: self.model.to_string(),
            config: serde_json::to_value(&self.config)
                .map_err(|e| ServerError::Internal(e.to_string()))?,
            secagg: totals.secagg.clone(),
            local_privacy: (self.pipeline.strategy.views().local_accounts)
                .map(LocalAccounts::summary),
        })
    }
}
