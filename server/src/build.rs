//! The one place that reads the privacy mode and the algorithm: it turns a validated
//! configuration into the run's [`Pipeline`], i.e. the strategy stack, the collection, the
//! privacy ledger and the release rule. ARCHITECTURE.md lists every
//! mode as its stack. The coordinator and the collections never branch on the mode.

use crate::ServerError;
use crate::collection::{Collection, PlainCollection, SecureCollection};
use crate::config::{
    Aggregator, Algorithm, ClipMode, PrivacyMode, RobustSection, RunConfig, SecAggNoise,
};
use crate::ledger::Ledger;
use crate::local_accounts::LocalAccounts;
use crate::strategy::{
    CentralDp, ClipRule, Divisor, FedAvg, Iadmm, Layer, LocalDp, NormBound, QuantileClip,
    ResidualBalancing, SecureSum, SignDsAvg, Strategy, SumStrategy, TrimmedMean,
};
use fl_common::privacy::{Budget, LocalMechanism};
use fl_common::secagg::PlainInputs;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::sync::Arc;
use std::time::Duration;

/// When a round's aggregate may replace the global model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseRule {
    /// Whatever the number of results (central DP: the noised sum over the expected count is
    /// released however many answered; an exact count deciding the release would not be
    /// accounted, and under Poisson sampling the count itself is private).
    Always,
    /// Only when at least this many results were absorbed.
    MinResults(usize),
}

impl ReleaseRule {
    /// Whether a round with `results` absorbed results may release its aggregate.
    pub fn allows(self, results: usize) -> bool {
        match self {
            ReleaseRule::Always => true,
            ReleaseRule::MinResults(min) => results >= min,
        }
    }
}

/// Everything of a run that depends on its privacy mode and algorithm.
pub struct Pipeline {
    /// The strategy stack.
    pub strategy: Box<dyn Strategy>,
    /// How results come in.
    pub collection: Collection,
    /// The central privacy ledger, when the run keeps one.
    pub ledger: Option<Ledger>,
    /// When an aggregate is released.
    pub release: ReleaseRule,
}

/// Builds the pipeline of `config` over `dim` parameters; `open_ledger` creates (or reopens) the
/// ledger of a private run, `oracle` (simulation only) checks secure sums.
pub fn pipeline(
    config: &RunConfig,
    dim: usize,
    oracle: Option<Arc<PlainInputs>>,
    open_ledger: impl FnOnce(Budget) -> std::io::Result<Ledger>,
) -> Result<Pipeline, ServerError> {
    let local_mechanism = config.local_mechanism(dim)?;
    let ledger = match config.is_private() {
        true => Some(open_ledger(config.privacy.budget())?),
        false => None,
    };
    let plain = Collection::Plain(PlainCollection {
        round_timeout: Duration::from_secs_f64(config.server.round_timeout_secs),
        reconnect_grace: Duration::from_secs_f64(config.server.reconnect_grace_secs),
        update_moments: config.train.algorithm == Algorithm::FedAvg,
    });
    let min_results = ReleaseRule::MinResults(config.server.min_clients);
    let (strategy, collection, release) = match config.privacy.mode {
        _ if config.train.algorithm == Algorithm::Iadmm => (iadmm(config, dim), plain, min_results),
        PrivacyMode::None | PrivacyMode::LdpGaussian | PrivacyMode::LdpLaplace => {
            (plain_fedavg(&config.robust, dim), plain, min_results)
        }
        PrivacyMode::SignDs => (
            signds(config, dim, local_mechanism.as_ref())?,
            plain,
            min_results,
        ),
        PrivacyMode::Central => {
            let dp = central_dp(config, FedAvg::new(dim), dim);
            (dp, plain, ReleaseRule::Always)
        }
        PrivacyMode::SecAgg => {
            let secure = Collection::Secure(SecureCollection {
                settings: config.secagg.clone(),
                round_timeout: Duration::from_secs_f64(config.server.round_timeout_secs),
                clip: config.privacy.clip_bound,
                dim,
                distributed_noise: config.secagg.noise == SecAggNoise::Distributed,
                oracle,
            });
            let strategy: Box<dyn Strategy> = match config.secagg.noise {
                SecAggNoise::None => Box::new(SecureSum::new(Divisor::Survivors)),
                SecAggNoise::Distributed => Box::new(SecureSum::new(Divisor::Expected)),
                SecAggNoise::Central => central_dp(config, SecureSum::new(Divisor::Survivors), dim),
            };
            (strategy, secure, min_results)
        }
    };
    // Under a client-side mechanism every upload is a release the stack checks and accounts.
    let strategy = match local_mechanism {
        Some(m) => {
            Box::new(LocalDp::new(LocalAccounts::new(m, config.local.delta)).around(strategy))
        }
        None => strategy,
    };
    Ok(Pipeline {
        strategy,
        collection,
        ledger,
        release,
    })
}

/// Inexact ADMM, under any local mechanism the clients apply.
fn iadmm(config: &RunConfig, dim: usize) -> Box<dyn Strategy> {
    let a = &config.admm;
    let balancing = a.balance.then_some(ResidualBalancing {
        mu: a.balance_mu,
        tau: a.balance_tau,
    });
    let total = a.total_examples.unwrap_or(0);
    Box::new(Iadmm::new(dim, a.rho, balancing, total))
}

/// SignDS's aggregation of (s, J) uploads.
fn signds(
    config: &RunConfig,
    dim: usize,
    mechanism: Option<&LocalMechanism>,
) -> Result<Box<dyn Strategy>, ServerError> {
    let Some(&LocalMechanism::SignDs { k, h, epsilon }) = mechanism else {
        return Err(ServerError::Internal(
            "a signds run without its SignDS mechanism".into(),
        ));
    };
    tracing::info!(
        d = dim,
        k,
        h,
        epsilon,
        "SignDS: each upload is a sign and h indices"
    );
    let lr = config.signds.global_learning_rate as f32;
    Ok(Box::new(SignDsAvg::new(dim, h, lr)))
}

/// Central DP around `inner`, with the configured clip rule; its noise always comes from a
/// generator seeded by the OS, even in seeded runs.
fn central_dp<S: SumStrategy + 'static>(
    config: &RunConfig,
    inner: S,
    dim: usize,
) -> Box<dyn Strategy> {
    let p = &config.privacy;
    let rule = match p.clip {
        ClipMode::Fixed => ClipRule::Fixed(p.clip_bound),
        ClipMode::Median => {
            tracing::warn!(
                "clip = median: S is the median of the clients' update norms, which is NOT \
                 private; the reported epsilon does not cover it"
            );
            ClipRule::Median
        }
        ClipMode::Quantile => ClipRule::Quantile(QuantileClip {
            bound: p.clip_bound,
            target: p.target_quantile,
            learning_rate: p.clip_learning_rate,
            count_noise: p.count_noise(config.clients_at(1) as f64),
        }),
    };
    Box::new(CentralDp::new(dim, rule, StdRng::from_os_rng()).around(inner))
}

/// FedAvg over updates the server sees (non-private, or local releases) as `[robust]` asks: the
/// weighted or the trimmed mean, behind the update-norm bound if there is one.
fn plain_fedavg(robust: &RobustSection, dim: usize) -> Box<dyn Strategy> {
    fn bounded<S: Strategy + 'static>(inner: S, robust: &RobustSection) -> Box<dyn Strategy> {
        match robust.max_update_norm {
            Some(bound) => Box::new(NormBound::new(bound, robust.norm_action).around(inner)),
            None => Box::new(inner),
        }
    }
    match robust.aggregator {
        Aggregator::Mean => bounded(FedAvg::new(dim), robust),
        Aggregator::TrimmedMean => bounded(TrimmedMean::new(dim, robust.trim_fraction), robust),
    }
}
