//! The one place that turns the privacy plan into the run: it returns the run's [`Pipeline`],
//! i.e. the round policy, the strategy stack, the collection, the privacy ledger and the release
//! rule. ARCHITECTURE.md lists every mode as its stack. The coordinator, the policies and the
//! collections never branch on the mode.

use crate::config::plan::{
    Aggregation, CentralNoise, ClipRule, IadmmPlan, LedgerTerms, LocalAccounting, LocalPlan,
    LocalRule, SecureNoise, SecurePlan, VerifiedPlan,
};
use crate::config::{
    Aggregator, Cadence, MeanSettings, PrivacyPlan, RunConfig, SecureSettings, TrimmedMeanSettings,
};
use crate::edge::helper::HelperLink;
use crate::error::ServerError;
use crate::records::ledger::Ledger;
use crate::records::local_accounts::LocalAccounts;
use crate::round::policy::{
    BufferPolicy, Cohort, Correlated, DistributedNoise, Plain, RoundPolicy, SampledGaussian,
};
use crate::round::strategy::{
    CentralDp, Divisor, FedAvg, GroupRule, Iadmm, IterateAverage, Layer, LocalDp, NormBound,
    ResidualBalancing, SecureRule, SecureSum, ServerOptimizer, SignDsAvg, Strategy, SumStrategy,
    TrimmedMean,
};
use crate::run::collection::{
    Collection, PlainCollection, SecureCollection, TieredCollection, VerifiedCollection,
};
use fl_privacy::{AnyStream, LocalMechanism, NoiseStream};
use fl_secagg::task::VerifiedTask;
use fl_secagg::{PlainInputs, RoundShape};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::sync::Arc;
use std::time::Duration;

/// When a round's aggregate may replace the global model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseRule {
    /// Whatever the number of results (central DP: the noised sum over the expected count is
    /// released however many answered; an exact count deciding the release would not be
    /// accounted, and under Poisson sampling the count itself is private).
    Always,
    /// Only when at least this many results were absorbed.
    MinResults(usize),
}

impl ReleaseRule {
    /// Whether a round with `results` absorbed results may release its aggregate.
    pub(crate) fn allows(self, results: usize) -> bool {
        match self {
            ReleaseRule::Always => true,
            ReleaseRule::MinResults(min) => results >= min,
        }
    }
}

/// What paces a run's server steps.
pub(crate) enum Steps {
    /// Synchronous rounds: whom each round samples, its context and its privacy event.
    Rounds(Box<dyn RoundPolicy>),
    /// Asynchronous buffered aggregation: each step's context and privacy event.
    Buffered(BufferPolicy),
}

impl Steps {
    /// The round policy of a synchronous run.
    pub(crate) fn rounds(&mut self) -> Result<&mut dyn RoundPolicy, ServerError> {
        match self {
            Steps::Rounds(policy) => Ok(policy.as_mut()),
            Steps::Buffered(_) => Err(ServerError::Internal(
                "an asynchronous run has no rounds to plan".into(),
            )),
        }
    }

    /// How participants are chosen, as the run's summary states it.
    pub(crate) fn sampling(&self) -> String {
        match self {
            Steps::Rounds(policy) => policy.sampling().to_string(),
            Steps::Buffered(_) => "none (asynchronous: clients arrive when they can)".into(),
        }
    }
}

/// Everything of a run that depends on its privacy plan.
pub(crate) struct Pipeline {
    /// What paces the server steps.
    pub steps: Steps,
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
/// ledger of a run that keeps one, `oracle` (simulation only) checks secure sums.
pub(crate) fn pipeline(
    config: &RunConfig,
    dim: usize,
    oracle: Option<Arc<PlainInputs>>,
    open_ledger: impl FnOnce(LedgerTerms) -> std::io::Result<Ledger>,
) -> Result<Pipeline, ServerError> {
    let plan = config.plan()?;
    let tier = (config.server.aggregators > 0)
        .then(|| group_rule(&plan))
        .transpose()?;
    let ledger = plan.ledger().copied().map(open_ledger).transpose()?;
    let builder = Builder { config, dim };
    let stream = plan.stream().cloned();
    let (min_results, updates) = (builder.release_at_min_clients(), builder.collect_updates());
    let (policy, strategy, collection, release) = match plan {
        PrivacyPlan::None(aggregation) => {
            let strategy = plain_fedavg(aggregation, dim);
            (builder.plain(), strategy, updates, min_results)
        }
        PrivacyPlan::Central(noise) => {
            let strategy = builder.central_dp(noise.clip, FedAvg::new(dim));
            let policy = builder.sampled_gaussian(noise);
            (policy, strategy, updates, ReleaseRule::Always)
        }
        PrivacyPlan::Ftrl(ftrl) => {
            let layer = (builder.central_dp_layer(ClipRule::Fixed(ftrl.clip_bound)))
                .with_stream(ftrl.stream.noise(dim));
            let strategy: Box<dyn Strategy> = Box::new(layer.around(FedAvg::new(dim)));
            let policy: Box<dyn RoundPolicy> =
                Box::new(Correlated::new(builder.cohort(), ftrl.stream));
            (policy, strategy, updates, ReleaseRule::Always)
        }
        PrivacyPlan::Local(local) => {
            let strategy = builder.local(local)?;
            (builder.plain(), strategy, updates, min_results)
        }
        PrivacyPlan::Iadmm(iadmm) => {
            let strategy = builder.iadmm(iadmm)?;
            let collection = builder.collect_iterates();
            (builder.plain(), strategy, collection, min_results)
        }
        PrivacyPlan::Secure(secure) => {
            let (policy, strategy, collection) = builder.secure(secure, oracle)?;
            (policy, strategy, collection, min_results)
        }
        PrivacyPlan::Verified(verified) => {
            let (policy, strategy, collection) = builder.verified(verified)?;
            (policy, strategy, collection, min_results)
        }
    };
    // The optimizer acts on what the stack released: post-processing of any mechanism's output.
    let strategy = match config.train.server_optimizer(config.server.rounds) {
        Some(opt) => Box::new(ServerOptimizer::new(opt).around(strategy)),
        None => strategy,
    };
    // The average of the released iterates: post-processing too.
    let decay = config.train.average_decay;
    let strategy = match decay > 0.0 {
        true => Box::new(IterateAverage::new(decay).around(strategy)),
        false => strategy,
    };
    let collection = match tier {
        Some(rule) => tiered(config, rule, collection),
        None => collection,
    };
    let steps = match config.server.aggregation {
        Cadence::Sync => Steps::Rounds(policy),
        Cadence::Async => Steps::Buffered(builder.buffer(stream)),
    };
    Ok(Pipeline {
        steps,
        strategy,
        collection,
        ledger,
        release,
    })
}

/// Under an aggregator tier the groups sum, under `rule`, what the coordinator's stack would
/// have; a secure `collection` stays to calibrate their rounds.
fn tiered(config: &RunConfig, rule: GroupRule, collection: Collection) -> Collection {
    let secure = match collection {
        Collection::Secure(secure) => Some(secure),
        Collection::Plain(_) | Collection::Tiered(_) | Collection::Verified(_) => None,
    };
    let timeout = Duration::from_secs_f64(config.server.round_timeout_secs);
    Collection::Tiered(TieredCollection::new(timeout, rule, secure))
}

/// An aggregator's own secure-aggregation settings: the authority it checks the clients of
/// signed rounds under (each order sets the rest).
pub(crate) fn aggregator_secure_settings(
    config: &RunConfig,
) -> Result<SecureSettings, ServerError> {
    Ok(config.secagg.settings()?)
}

/// How an aggregator sums its group's updates so that the coordinator's stack can take the
/// group's sum for theirs: as FedAvg weights them, clipped to central DP's fixed S, or by secure
/// aggregation among the group (`RunConfig::validate_for_server` refuses the tier for the other
/// modes).
fn group_rule(plan: &PrivacyPlan) -> Result<GroupRule, ServerError> {
    match plan {
        PrivacyPlan::None(_) => Ok(GroupRule {
            clip_bound: None,
            weight_by_examples: true,
            secure: None,
        }),
        PrivacyPlan::Central(CentralNoise {
            clip: ClipRule::Fixed(s),
            ..
        }) => Ok(GroupRule {
            clip_bound: Some(*s),
            weight_by_examples: false,
            secure: None,
        }),
        PrivacyPlan::Secure(secure) => {
            let s = secure.settings.settings()?;
            Ok(GroupRule {
                clip_bound: None,
                weight_by_examples: false,
                secure: Some(SecureRule {
                    threshold: s.threshold,
                    min_survivor_fraction: s.min_survivors,
                    // Each round's calibration sets it (`TieredCollection::dispatch`).
                    min_survivors: 0,
                    degree: s.degree,
                    stage_timeout: s.stage_timeout,
                }),
            })
        }
        PrivacyPlan::Central(CentralNoise {
            clip: ClipRule::Median | ClipRule::Quantile(_),
            ..
        })
        | PrivacyPlan::Local(_)
        | PrivacyPlan::Iadmm(_)
        | PrivacyPlan::Ftrl(_)
        | PrivacyPlan::Verified(_) => Err(ServerError::Internal(
            "the aggregator tier under a mode it cannot run".into(),
        )),
    }
}

/// The run's settings beside its plan.
struct Builder<'a> {
    config: &'a RunConfig,
    dim: usize,
}

impl Builder<'_> {
    /// K, m_t and T.
    fn cohort(&self) -> Cohort {
        let s = &self.config.server;
        Cohort {
            clients: s.clients,
            per_round: s.clients_per_round.clone(),
            rounds: s.rounds,
        }
    }

    /// Rounds without central accounting.
    fn plain(&self) -> Box<dyn RoundPolicy> {
        Box::new(Plain {
            cohort: self.cohort(),
        })
    }

    /// Rounds of central noise.
    fn sampled_gaussian(&self, noise: CentralNoise) -> Box<dyn RoundPolicy> {
        Box::new(SampledGaussian {
            cohort: self.cohort(),
            sampling: noise.sampling,
            accounting: noise.accounting,
            noise_multiplier: noise.noise_multiplier,
        })
    }

    /// Asynchronous steps of `[buffer]`, each a step of DP-FTRL's `schedule` if given.
    fn buffer(&self, schedule: Option<AnyStream>) -> BufferPolicy {
        let b = &self.config.buffer;
        let policy = BufferPolicy::new(b.size, b.concurrency, b.max_staleness);
        match schedule {
            Some(schedule) => policy.with_schedule(schedule),
            None => policy,
        }
    }

    /// Release at `server.min_clients` results.
    fn release_at_min_clients(&self) -> ReleaseRule {
        ReleaseRule::MinResults(self.config.server.min_clients)
    }

    /// Individual updates u_k = w_k - w_t, whose moments are tallied for V_c and U_s.
    fn collect_updates(&self) -> Collection {
        self.collect_uploads(true)
    }

    /// Individual IADMM primal iterates, which are not updates: no moments.
    fn collect_iterates(&self) -> Collection {
        self.collect_uploads(false)
    }

    /// Individual uploads, their moments tallied or not.
    fn collect_uploads(&self, update_moments: bool) -> Collection {
        Collection::Plain(self.plain_collection(update_moments))
    }

    /// The waiting for individual uploads, under the run's timeouts.
    fn plain_collection(&self, update_moments: bool) -> PlainCollection {
        let s = &self.config.server;
        PlainCollection {
            round_timeout: Duration::from_secs_f64(s.round_timeout_secs),
            reconnect_grace: Duration::from_secs_f64(s.reconnect_grace_secs),
            update_moments,
        }
    }

    /// Central DP around `inner`, with the plan's clip rule.
    fn central_dp<S: SumStrategy + 'static>(&self, clip: ClipRule, inner: S) -> Box<dyn Strategy> {
        Box::new(self.central_dp_layer(clip).around(inner))
    }

    /// The central DP layer with the plan's clip rule; its noise always comes from a generator
    /// seeded by the OS, even in seeded runs (independent per round, or a DP-FTRL stream's when
    /// the round policy says the round's stream step).
    fn central_dp_layer(&self, clip: ClipRule) -> CentralDp {
        match clip {
            ClipRule::Median => tracing::warn!(
                "clip = median: S is the median of the clients' update norms, which is NOT \
                 private; the reported epsilon does not cover it"
            ),
            ClipRule::Fixed(_) | ClipRule::Quantile(_) => {}
        }
        CentralDp::new(self.dim, clip, StdRng::from_os_rng())
    }

    /// The mechanism of a client-side mode, for this model.
    fn mechanism(&self, local: &LocalAccounting) -> Result<LocalAccounts, ServerError> {
        Ok(LocalAccounts::new(local.resolve(self.dim)?))
    }

    /// A client-side mode: every upload is a release the stack checks and accounts.
    fn local(&self, local: LocalPlan) -> Result<Box<dyn Strategy>, ServerError> {
        let accounts = self.mechanism(&local.accounting)?;
        let rule = match local.rule {
            LocalRule::FedAvg(aggregation) => plain_fedavg(aggregation, self.dim),
            LocalRule::SignStep { learning_rate } => {
                sign_step(&accounts.mechanism(), self.dim, learning_rate)
            }
        };
        Ok(Box::new(LocalDp::new(accounts).around(rule)))
    }

    /// Inexact ADMM, under a client-side mechanism if the clients apply one.
    fn iadmm(&self, plan: IadmmPlan) -> Result<Box<dyn Strategy>, ServerError> {
        let a = &plan.admm;
        let balancing = a.balance.then_some(ResidualBalancing {
            mu: a.balance_mu,
            tau: a.balance_tau,
        });
        let total = a.total_examples.unwrap_or(0);
        let rule = Iadmm::new(self.dim, a.rho, balancing, total);
        Ok(match &plan.protected {
            Some(local) => Box::new(LocalDp::new(self.mechanism(local)?).around(rule)),
            None => Box::new(rule),
        })
    }

    /// Secure aggregation: its policy, strategy and collection ([`SecureParts`]).
    fn secure(
        &self,
        plan: SecurePlan,
        oracle: Option<Arc<PlainInputs>>,
    ) -> Result<SecureParts, ServerError> {
        let s = &plan.settings;
        let collection = Collection::Secure(SecureCollection {
            settings: s.settings()?,
            round_timeout: Duration::from_secs_f64(self.config.server.round_timeout_secs),
            clip: plan.clip,
            dim: self.dim,
            oracle,
            run: rand::Rng::random(&mut StdRng::from_os_rng()),
            grouped: self.config.server.aggregators > 0,
        });
        let (policy, strategy): (_, Box<dyn Strategy>) = match plan.noise {
            SecureNoise::None => (self.plain(), Box::new(SecureSum::new(Divisor::Survivors))),
            SecureNoise::Central(noise) => {
                let strategy = self.central_dp(noise.clip, SecureSum::new(Divisor::Survivors));
                (self.sampled_gaussian(noise), strategy)
            }
            SecureNoise::Distributed {
                noise_multiplier, ..
            } => {
                let policy = Box::new(DistributedNoise {
                    cohort: self.cohort(),
                    noise_multiplier,
                    shape: RoundShape {
                        ring_bits: s.bits,
                        clip: plan.clip,
                        dim: self.dim,
                        planned: 0,
                        sampled: 0,
                        min_survivor_fraction: s.min_survivors,
                        calibrate_for: s.calibrate_for(),
                        distributed_noise: None,
                        neighbours: s.neighbours,
                    },
                    grouped: self.config.server.aggregators > 0,
                });
                (
                    policy as Box<dyn RoundPolicy>,
                    Box::new(SecureSum::new(Divisor::Expected)),
                )
            }
        };
        Ok((policy, strategy, collection))
    }
}

impl Builder<'_> {
    /// Verified secure rounds: uploads checked with the helper, their sum noised by both
    /// aggregators when the plan has noise (the server's part as central noise on the sum, whose
    /// sensitivity is the proved bound S).
    fn verified(&self, plan: VerifiedPlan) -> Result<SecureParts, ServerError> {
        let s = &plan.settings;
        let federation = (self.config.secagg.policy()?).map_or_else(String::new, |p| p.federation);
        let collection = Collection::Verified(VerifiedCollection {
            // A verified upload carries no update whose moments could be taken.
            plain: self.plain_collection(false),
            helper: HelperLink::new(s)?,
            helper_timeout: Duration::from_secs_f64(s.helper_timeout_secs),
            task: VerifiedTask {
                clip: plan.clip,
                federation,
                run: rand::Rng::random(&mut StdRng::from_os_rng()),
                min_clients: s.min_clients as u64,
            },
            dim: self.dim,
        });
        let (policy, strategy): (_, Box<dyn Strategy>) = match plan.noise {
            None => (self.plain(), Box::new(SecureSum::new(Divisor::Survivors))),
            Some(noise) => {
                let strategy = self.central_dp(noise.clip, SecureSum::new(Divisor::Survivors));
                (self.sampled_gaussian(noise), strategy)
            }
        };
        Ok((policy, strategy, collection))
    }
}

/// A secure-aggregation run's policy, strategy and collection.
type SecureParts = (Box<dyn RoundPolicy>, Box<dyn Strategy>, Collection);

/// The step along the mean sparse sign update of (s, J) uploads of at most h dimensions.
fn sign_step(mechanism: &LocalMechanism, dim: usize, learning_rate: f64) -> Box<dyn Strategy> {
    let h = mechanism.release_size(dim);
    tracing::info!(
        d = dim,
        h,
        epsilon = mechanism.epsilon(),
        "{}: each upload is a sign and h indices",
        mechanism.name()
    );
    Box::new(SignDsAvg::new(dim, h, learning_rate as f32))
}

/// FedAvg over updates the server sees (non-private, or local releases) as the plan asks: the
/// weighted or the trimmed mean, behind the update-norm bound if there is one.
fn plain_fedavg(aggregation: Aggregation, dim: usize) -> Box<dyn Strategy> {
    let inner = aggregation_rule(&aggregation.rule, dim);
    match aggregation.norm_bound {
        Some((bound, action)) => Box::new(NormBound::new(bound, action).around(inner)),
        None => inner,
    }
}

/// The strategy of an aggregation rule (`robust.aggregator`) over models of `dim` parameters:
/// the one place a rule's settings become its strategy.
fn aggregation_rule(rule: &Aggregator, dim: usize) -> Box<dyn Strategy> {
    match rule {
        Aggregator::Mean(MeanSettings {}) => Box::new(FedAvg::new(dim)),
        Aggregator::TrimmedMean(TrimmedMeanSettings { trim_fraction }) => {
            Box::new(TrimmedMean::new(dim, *trim_fraction))
        }
    }
}
