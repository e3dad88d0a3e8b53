//! DP-FTRL's plan: one noise multiplier, a fixed clip bound, and the noise stream
//! (`privacy.noise`) planned for the run, which answers for its own participation rule, noise
//! and accounting (`fl_privacy::NoiseStream`).

use super::LedgerTerms;
use crate::config::{Cadence, ClipMode, ConfigError, RunConfig, ServerOptimizerKind};
use fl_common::schedule::Schedule;
use fl_privacy::{AnyStream, LedgerEvent, NoiseStream, StreamRun};

/// DP-FTRL's correlated noise on the clipped sum, and its accounting.
#[derive(Debug, Clone, PartialEq)]
pub struct FtrlPlan {
    /// z: the multiplier of the stream's noise; one for the run.
    pub noise_multiplier: f64,
    /// S, fixed.
    pub clip_bound: f64,
    /// The stream, before its first step: its noise and its participation rule.
    pub stream: AnyStream,
    /// What the ledger records and enforces.
    pub ledger: LedgerTerms,
}

impl RunConfig {
    /// DP-FTRL: one z, a fixed S (a median or an adaptive bound would be released every round,
    /// outside the stream's accounting), and the configured stream.
    pub(super) fn ftrl(&self) -> Result<FtrlPlan, ConfigError> {
        let p = &self.privacy;
        self.check_noise()?;
        let Schedule::Constant(z) = p.noise_multiplier else {
            return bad(
                "privacy.mode = \"dp-ftrl\" needs one privacy.noise_multiplier (a number): \
                 the steps of a stream share it",
            );
        };
        if p.clip != ClipMode::Fixed {
            return bad(
                "privacy.mode = \"dp-ftrl\" needs privacy.clip = \"fixed\": a median or \
                 adaptive bound would be released every round, outside the stream's accounting",
            );
        }
        let ledger = self.ledger_terms(true)?;
        let stream = AnyStream::plan(&p.noise, &self.stream_run(z, &ledger))
            .map_err(|e| ConfigError::Invalid(format!("[privacy.noise.{}] {e}", p.noise.name())))?;
        let mut first = stream.clone();
        first.advance();
        let first = first.event().as_gaussian().flatten();
        self.check_first_round(first.expect("a stream's first step costs"), &ledger)?;
        Ok(FtrlPlan {
            noise_multiplier: z,
            clip_bound: p.clip_bound,
            stream,
            ledger,
        })
    }

    /// What a stream is planned from: z, one pass over the clients (K / m_1, or K / M
    /// asynchronously, whose steps must fill), the rounds, the server's momentum and the
    /// budget.
    fn stream_run(&self, z: f64, ledger: &LedgerTerms) -> StreamRun {
        let per_step = match self.server.aggregation {
            Cadence::Sync => self.clients_at(1).max(1),
            Cadence::Async => self.buffer.size.max(1),
        } as u64;
        let clients = self.server.clients as u64;
        let momentum = match self.train.server_optimizer {
            ServerOptimizerKind::FedAvgM => self.train.server_momentum,
            // A banded factorization is optimised for plain or momentum SGD steps; an adaptive
            // server step is not a linear operator on the noise, so it is optimised as plain.
            ServerOptimizerKind::FedAvg
            | ServerOptimizerKind::FedAdagrad
            | ServerOptimizerKind::FedAdam
            | ServerOptimizerKind::FedYogi => 0.0,
        };
        StreamRun {
            noise_multiplier: z,
            one_pass: Some((clients / per_step).max(1)),
            buffer: (self.server.aggregation == Cadence::Async).then_some((per_step, clients)),
            rounds: self.server.rounds,
            momentum,
            ledger: Some((ledger.accountant, ledger.budget)),
        }
    }
}

/// A refusal naming the keys.
fn bad<T>(message: &str) -> Result<T, ConfigError> {
    Err(ConfigError::Invalid(message.into()))
}
