//! DP-FTRL's plan: one noise multiplier, a fixed clip bound, and the correlated noise with the
//! participation rule its accounting assumes (`privacy.noise`).

use super::LedgerTerms;
use crate::config::{
    Cadence, ClipMode, ConfigError, FtrlNoiseKind, RunConfig, ServerOptimizerKind,
};
use fl_common::schedule::Schedule;
use fl_privacy::{
    BandedFactorization, BandedRound, Neighbours, PrivacyEvent, TreeRound, max_rounds,
};

/// DP-FTRL's correlated noise on the clipped sum, and its accounting.
#[derive(Debug, Clone, PartialEq)]
pub struct FtrlPlan {
    /// z: the multiplier of every node (tree) or of Z (banded); one for the run.
    pub noise_multiplier: f64,
    /// S, fixed.
    pub clip_bound: f64,
    /// The noise and its participation rule.
    pub stream: NoiseStream,
    /// What the ledger records and enforces.
    pub ledger: LedgerTerms,
}

/// DP-FTRL's correlated noise and the participation rule its accounting assumes.
#[derive(Debug, Clone, PartialEq)]
pub enum NoiseStream {
    /// Tree aggregation: each client at most once per tree of `tree_rounds` steps.
    Tree {
        /// Steps per tree.
        tree_rounds: u64,
    },
    /// A banded matrix factorization: each client at most once every `min_separation` steps,
    /// at most `max_participations` times.
    Banded {
        /// C, optimised for the run's steps and server momentum.
        factorization: BandedFactorization,
        /// b.
        min_separation: u64,
        /// k.
        max_participations: Option<u64>,
    },
}

impl NoiseStream {
    /// The event of a stream's first step at multiplier `z` (it always costs something).
    fn first_event(&self, z: f64) -> PrivacyEvent {
        match self {
            NoiseStream::Tree { .. } => TreeRound::zero_out(z, 1).into(),
            NoiseStream::Banded {
                factorization,
                min_separation,
                max_participations,
            } => BandedRound {
                noise_multiplier: z,
                step: 1,
                bands: factorization.bands() as u64,
                min_separation: *min_separation,
                max_participations: *max_participations,
                neighbours: Neighbours::ZeroOut,
            }
            .into(),
        }
    }
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
        let stream = match p.noise {
            FtrlNoiseKind::Tree => self.tree_stream()?,
            FtrlNoiseKind::Banded => self.banded_stream(z, &ledger)?,
        };
        let first = stream.first_event(z).as_gaussian().flatten();
        self.check_first_round(first.expect("a stream's first step costs"), &ledger)?;
        Ok(FtrlPlan {
            noise_multiplier: z,
            clip_bound: p.clip_bound,
            stream,
            ledger,
        })
    }

    /// (clients per step, K / clients per step): a step's size and one pass over the clients.
    fn ftrl_pass(&self) -> (u64, u64) {
        let per_step = match self.server.aggregation {
            Cadence::Sync => self.clients_at(1).max(1),
            Cadence::Async => self.buffer.size.max(1),
        } as u64;
        (per_step, (self.server.clients as u64 / per_step).max(1))
    }

    /// Trees of `tree_rounds` steps, K / m_1 unless set.
    fn tree_stream(&self) -> Result<NoiseStream, ConfigError> {
        let p = &self.privacy;
        if p.min_separation.is_some() || p.bands.is_some() || p.max_participations.is_some() {
            return bad(
                "privacy.min_separation, privacy.bands and privacy.max_participations \
                 are for privacy.noise = \"banded\"",
            );
        }
        let (per_step, one_pass) = self.ftrl_pass();
        let tree_rounds = p.tree_rounds.unwrap_or(one_pass);
        if tree_rounds == 0 {
            return bad("privacy.tree_rounds must be at least 1");
        }
        self.check_async_fills("privacy.tree_rounds", tree_rounds, per_step)?;
        Ok(NoiseStream::Tree { tree_rounds })
    }

    /// A banded factorization of p <= b bands, b = K / m_1 unless set, optimised for the steps
    /// the run can take (its rounds, or fewer when the budget ends it first) and its server
    /// momentum.
    fn banded_stream(&self, z: f64, ledger: &LedgerTerms) -> Result<NoiseStream, ConfigError> {
        let p = &self.privacy;
        if p.tree_rounds.is_some() {
            return bad("privacy.tree_rounds is for privacy.noise = \"tree\"");
        }
        let (per_step, one_pass) = self.ftrl_pass();
        let b = p.min_separation.unwrap_or(one_pass);
        let bands = p.bands.unwrap_or(b);
        if b == 0 || bands == 0 || bands > b {
            return bad(&format!(
                "privacy.bands ({bands}) must be between 1 and privacy.min_separation ({b}): \
                 the accounting needs a client's contributions in distinct bands"
            ));
        }
        if p.max_participations == Some(0) {
            return bad("privacy.max_participations must be at least 1");
        }
        self.check_async_fills("privacy.min_separation", b, per_step)?;
        let charge = BandedRound {
            noise_multiplier: z,
            step: 1,
            bands,
            min_separation: b,
            max_participations: None,
            neighbours: Neighbours::ZeroOut,
        };
        let rounds = self.server.rounds;
        let charges = max_rounds(ledger.accountant, &charge.into(), &ledger.budget, rounds)?;
        let stream = BandedRound {
            max_participations: p.max_participations,
            ..charge
        };
        let steps = stream.steps_covered(charges, rounds);
        let momentum = match self.train.server_optimizer {
            ServerOptimizerKind::FedAvgM => self.train.server_momentum,
            // The factorization is optimised for plain or momentum SGD steps; an adaptive
            // server step is not a linear operator on the noise, so it is optimised as plain.
            ServerOptimizerKind::FedAvg
            | ServerOptimizerKind::FedAdagrad
            | ServerOptimizerKind::FedAdam
            | ServerOptimizerKind::FedYogi => 0.0,
        };
        Ok(NoiseStream::Banded {
            factorization: BandedFactorization::optimised(bands as usize, steps, momentum),
            min_separation: b,
            max_participations: p.max_participations,
        })
    }

    /// Asynchronously, a step takes only identities the rule allows: `span` steps of
    /// `per_step` distinct ones must fit in K, or the buffer could never fill.
    fn check_async_fills(&self, key: &str, span: u64, per_step: u64) -> Result<(), ConfigError> {
        let clients = self.server.clients as u64;
        if self.server.aggregation == Cadence::Async && span * per_step > clients {
            return bad(&format!(
                "{key} ({span}) times buffer.size ({per_step}) exceeds server.clients \
                 ({clients}): an identity returns only after that many steps"
            ));
        }
        Ok(())
    }
}

/// A refusal naming the keys.
fn bad<T>(message: &str) -> Result<T, ConfigError> {
    Err(ConfigError::Invalid(message.into()))
}
