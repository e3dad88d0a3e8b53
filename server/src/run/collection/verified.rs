//! The collection of a verified round: the sampled clients' verified uploads come in as
//! individual uploads do (the [`PlainCollection`]'s waiting, admission and reconnects), into a
//! buffer instead of the strategy; then the server, as the leader, checks each upload's proof with
//! the helper (`fl_secagg::verified::LeaderRound`, over `crate::edge::helper`), and hands the
//! strategy only the sum of the valid ones. The round's metrics count the uploads excluded, by
//! reason. A helper that refuses the round, cannot be reached, or answers otherwise than the
//! leader's own checks leaves the round without a sum.

use super::{PlainCollection, Prepared, RoundWork, Tally};
use crate::edge::clients::Clients;
use crate::edge::helper::HelperLink;
use crate::error::ServerError;
use crate::records::output::VerifiedRoundMetrics;
use crate::round::strategy::{
    RoundContext, RoundOutcome, Strategy, StrategyError, SumInput, Upload,
};
use fl_secagg::RoundTag;
use fl_secagg::task::VerifiedTask;
use fl_secagg::verified::{LeaderRound, Report, Shape, Verified};
use std::time::{Duration, Instant};

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct VerifiedCollection {
    /// How uploads are waited for.
    pub plain: PlainCollection,
    /// The helper.
    pub helper: HelperLink,
    /// How long the helper may take to answer.
    pub helper_timeout: Duration,
    /// What every round's task carries.
    pub task: VerifiedTask,
    /// d.
    pub dim: usize,
}

/// The round's uploads, as the buffer strategy took them.
#[derive(Debug, Default)]
struct Uploads(Vec<(u64, Report)>);

impl Strategy for Uploads {
    fn absorb(&mut self, _ctx: &RoundContext, upload: Upload) -> Result<(), StrategyError> {
        match upload {
            Upload::Verified(u) => {
                self.0.push((u.client, *u.report));
                Ok(())
            }
            Upload::Dense(_) | Upload::Sign(_) | Upload::Sum(_) | Upload::Group(_) => {
                Err(StrategyError::NeedsVerified)
            }
        }
    }

    fn finish_round(&mut self, _ctx: &RoundContext, _global: &[f32]) -> RoundOutcome {
        RoundOutcome::default()
    }
}

impl VerifiedCollection {
    /// The task's verified part.
    pub(crate) fn prepare(&self) -> Prepared {
        Prepared {
            federation: self.task.federation.clone(),
            run: self.task.run,
            verified: Some(self.task.clone()),
            ..Prepared::default()
        }
    }

    /// Collects the uploads, verifies them with the helper, and hands `work.strategy` the sum of
    /// the valid ones.
    pub(crate) async fn collect(
        &self,
        clients: &mut Clients,
        work: RoundWork<'_>,
    ) -> Result<Tally, ServerError> {
        let RoundWork {
            ctx,
            strategy,
            task_digest,
            ..
        } = work;
        let mut uploads = Uploads::default();
        let buffered = RoundWork {
            strategy: &mut uploads,
            ..work
        };
        let mut tally = self.plain.collect(clients, buffered).await?;
        let digest = task_digest.ok_or_else(|| {
            ServerError::Internal("a verified round without its task digest".into())
        })?;
        let started = Instant::now();
        let tag = RoundTag {
            round: ctx.round,
            digest,
        };
        let received = uploads.0.len();
        let verified = self.verify(tag, uploads.0, ctx.noise_multiplier).await;
        let mut metrics = VerifiedRoundMetrics {
            uploads: received,
            ..VerifiedRoundMetrics::default()
        };
        tally.completed = 0;
        match verified {
            Ok(verified) => {
                for (client, why) in &verified.excluded {
                    tracing::warn!(round = ctx.round, client, %why, "verified upload excluded");
                    *metrics.excluded.entry(why.kind().into()).or_default() += 1;
                }
                metrics.accepted = verified.accepted;
                tally.completed = verified.accepted;
                if verified.accepted > 0 {
                    let input = SumInput {
                        sum: verified.sum.iter().map(|&v| v as f32).collect(),
                        contributors: verified.accepted,
                        clip_bound: self.task.clip,
                        sensitivity: self.task.clip,
                        noise_std: None,
                    };
                    (strategy.absorb(&ctx, Upload::Sum(input)))
                        .map_err(|e| ServerError::Internal(e.to_string()))?;
                }
            }
            Err(reason) => {
                tracing::error!(round = ctx.round, %reason, "verified round aborted: no sum");
                metrics.aborted = Some(reason);
            }
        }
        metrics.verify_seconds = started.elapsed().as_secs_f64();
        tally.verified = Some(metrics);
        Ok(tally)
    }

    /// The leader's checks and the helper's, off the async threads for the field arithmetic.
    async fn verify(
        &self,
        tag: RoundTag,
        uploads: Vec<(u64, Report)>,
        noise_multiplier: Option<f64>,
    ) -> Result<Verified, String> {
        let shape = Shape::new(self.dim, self.task.clip).map_err(|e| e.to_string())?;
        let z = noise_multiplier.unwrap_or(0.0);
        let (leader, batch) =
            tokio::task::spawn_blocking(move || LeaderRound::start(tag, shape, uploads, z))
                .await
                .map_err(|e| e.to_string())?;
        let reply = self.helper.verify(&batch, self.helper_timeout).await?;
        tokio::task::spawn_blocking(move || leader.finish(reply))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|fault| fault.to_string())
    }
}
