//! `[secagg]`: secure aggregation.

use super::ConfigError;
use fl_authority::policy::{FederationPolicy, MinDegree, SignedPolicy};
use fl_privacy::Neighbours;
use fl_secagg::{GraphKind, Stage, Verifier, auto_degree};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Where the noise of a secure-aggregation run comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SecAggNoise {
    /// No noise: updates are hidden, the sum is not differentially private.
    None,
    /// The server adds Gaussian noise to the unmasked sum (trusted to add it, not to see
    /// updates); accounted like `central`. Needs `privacy.sampling = "fixed"`: under Poisson
    /// sampling whether a round aborts would depend on how many took part, which the epsilon
    /// does not cover.
    Central,
    /// Each client adds discrete Gaussian noise; the server never sees a noiseless sum (Kairouz,
    /// Liu, Steinke 2021). Needs `privacy.sampling = "fixed"`.
    Distributed,
}

/// The neighbour graph of a secure-aggregation round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SecAggGraph {
    /// Every pair masks (Bonawitz et al. 2017).
    Complete,
    /// A k-regular graph (SecAgg+, Bell et al. 2020) whose cyclic order each client derives
    /// from the round, H(task) and the clients' names or ids; k = `degree`, or O(log n) when 0.
    Regular,
}

impl SecAggSection {
    /// f_c: the fraction of m_t the distributed noise is calibrated for.
    pub fn calibrate_for(&self) -> f64 {
        self.calibrate_for.unwrap_or(self.min_survivors)
    }

    /// The federation authority's checks, when rounds are signed (`secagg.authority`): its
    /// public key and revocation list read from their files.
    pub fn verifier(&self) -> Result<Option<Verifier>, ConfigError> {
        let Some(authority) = &self.authority else {
            return Ok(None);
        };
        let verifier = Verifier::from_files(authority, self.revocations.as_deref())?;
        Ok(Some(verifier))
    }

    /// The federation policy, verified under `secagg.authority`, when `secagg.policy` is set.
    pub fn policy(&self) -> Result<Option<FederationPolicy>, ConfigError> {
        let (Some(policy), Some(authority)) = (&self.policy, &self.authority) else {
            return Ok(None);
        };
        Ok(Some(SignedPolicy::read_verified(policy, authority)?))
    }

    /// Refuses a configuration whose rounds `policy`'s clients would refuse: a threshold
    /// fraction below its minimum, a graph sparser than its fewest neighbours, or fewer
    /// admitted clients than its minimum when only `min_survivors` of the `m` sampled remain.
    pub fn check_policy(&self, policy: &FederationPolicy, m: usize) -> Result<(), ConfigError> {
        let id = &policy.federation;
        let refuse = |what: String| {
            Err(ConfigError::Invalid(format!(
                "federation {id:?} policy: {what}"
            )))
        };
        if self.threshold < policy.min_threshold {
            return refuse(format!(
                "secagg.threshold = {} is below the policy's min_threshold = {}",
                self.threshold, policy.min_threshold
            ));
        }
        let fewest = (self.min_survivors * m as f64).ceil() as u64;
        if fewest < policy.min_clients {
            return refuse(format!(
                "a round may go on with {fewest} clients (secagg.min_survivors of {m}), the \
                 policy's min_clients is {}: raise secagg.min_survivors or the clients per round",
                policy.min_clients
            ));
        }
        let k = match self.settings_graph(m) {
            GraphKind::Complete => None,
            GraphKind::Regular(k) => Some(k as u64),
        };
        match (policy.min_degree, k) {
            (MinDegree::Complete, Some(k)) => refuse(format!(
                "the policy asks for the complete graph, secagg.graph is regular (k = {k})"
            )),
            (MinDegree::AtLeast(min), Some(k)) if k < min => refuse(format!(
                "secagg.degree gives k = {k}, the policy's min_degree is {min}"
            )),
            _ => Ok(()),
        }
    }

    /// The graph of a round of `m` clients.
    fn settings_graph(&self, m: usize) -> GraphKind {
        match self.graph {
            SecAggGraph::Complete => GraphKind::Complete,
            SecAggGraph::Regular if self.degree == 0 => GraphKind::Regular(auto_degree(m)),
            SecAggGraph::Regular => GraphKind::Regular(self.degree),
        }
    }

    /// The settings the secure collection runs its rounds by.
    pub fn settings(&self) -> Result<SecureSettings, ConfigError> {
        Ok(SecureSettings {
            bits: self.bits,
            threshold: self.threshold,
            min_survivors: self.min_survivors,
            degree: match self.graph {
                SecAggGraph::Complete => None,
                SecAggGraph::Regular => Some(self.degree),
            },
            stage_timeout: Duration::from_secs_f64(self.stage_timeout_secs),
            dropout: (self.sim_dropout, self.sim_dropout_stage),
            verifier: self.verifier()?.map(Arc::new),
            policy: self.policy()?.map(Arc::new),
        })
    }
}

/// `[secagg]`: secure aggregation settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SecAggSection {
    /// `none`, `central` or `distributed`.
    pub noise: SecAggNoise,
    /// b: ring bit width, 32 or 64.
    pub bits: u32,
    /// Shamir threshold as a fraction of a client's neighbours (tau = ceil(fraction * |N|), and
    /// always more than half; more than two thirds in signed rounds).
    pub threshold: f64,
    /// Fewest survivors of each stage, as a fraction of the expected m_t (at least 3); below it
    /// the round aborts. Distributed noise is charged up front for this many survivors.
    pub min_survivors: f64,
    /// Distributed noise: the fraction of m_t whose noise together reaches z (at least
    /// `min_survivors`, its default). Above `min_survivors` each client adds less noise; every
    /// round is charged for `min_survivors` before it runs and settled for the survivors it had,
    /// so a round that fell short of this fraction is charged for the noise actually present.
    pub calibrate_for: Option<f64>,
    /// `complete` or `regular`.
    pub graph: SecAggGraph,
    /// k for the regular graph; 0 picks the smallest even k >= 3 log2 n.
    pub degree: usize,
    /// Seconds each stage after the first waits for answers (the first shares the round's
    /// deadline with local training).
    pub stage_timeout_secs: f64,
    /// The neighbouring relation the rounds' noise is accounted under: `replace-one` (one
    /// client's data replaced: sensitivity 2 Delta_2) or `zero-out` (its contribution replaced
    /// by zero while it still takes part: Delta_2, half the noise for the same epsilon, as
    /// TFF's DP-FTRL and DDGauss deployments account). Zero-out protects a client's data, not
    /// the fact that it took part: use it when participation is public. With central noise
    /// (`privacy.sampling = "fixed"`), zero-out rounds are accounted without sampling
    /// amplification (`fl privacy sigma --unsampled zero-out` plans them); replace-one rounds
    /// as fixed-size samples of q = m/K.
    pub neighbours: Neighbours,
    /// `fl sim` only: fraction of each round's clients the dropout injector drops.
    pub sim_dropout: f64,
    /// `fl sim` only: the stage at which they drop.
    pub sim_dropout_stage: DropoutStage,
    /// The federation authority's public key file (`fl authority init` writes it): rounds are
    /// then signed, the malicious-server variant of the threat model
    /// (docs/src/explanation/threat-model.md). Clients must be configured with the same
    /// authority; t is raised above 2/3 of a client's neighbours.
    pub authority: Option<PathBuf>,
    /// The authority's signed revocation list (`fl authority revoke`), with `authority`.
    pub revocations: Option<PathBuf>,
    /// The federation policy the authority signed (`fl authority policy`), with `authority`:
    /// checked at start-up against this configuration (threshold, graph, fewest admitted
    /// clients) and each round against its distributed noise; its federation id goes into every
    /// task. Clients hold the same file and refuse rounds outside it.
    pub policy: Option<PathBuf>,
    /// `fl sim` only: sign the rounds with an authority made for the simulation (its public key
    /// in `RUN/sim-authority.pub`, its secret never written), each simulated client certified.
    pub sim_signed: bool,
}

impl Default for SecAggSection {
    fn default() -> Self {
        Self {
            noise: SecAggNoise::None,
            bits: 32,
            threshold: 0.6,
            min_survivors: 0.5,
            calibrate_for: None,
            graph: SecAggGraph::Complete,
            degree: 0,
            stage_timeout_secs: 60.0,
            neighbours: Neighbours::ReplaceOne,
            sim_dropout: 0.0,
            sim_dropout_stage: DropoutStage::AfterShares,
            authority: None,
            revocations: None,
            policy: None,
            sim_signed: false,
        }
    }
}

impl SecAggSection {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let checks = [
            (
                self.bits == 32 || self.bits == 64,
                "secagg.bits must be 32 or 64",
            ),
            (
                self.threshold > 0.5 && self.threshold <= 1.0,
                "secagg.threshold must be in (0.5, 1]: a minority must never hold tau shares",
            ),
            (
                self.min_survivors > 0.0 && self.min_survivors <= 1.0,
                "secagg.min_survivors must be in (0, 1]",
            ),
            (
                self.stage_timeout_secs > 0.0 && self.stage_timeout_secs.is_finite(),
                "secagg.stage_timeout_secs must be positive",
            ),
            (
                (0.0..1.0).contains(&self.sim_dropout),
                "secagg.sim_dropout must be in [0, 1)",
            ),
            (
                self.graph == SecAggGraph::Complete || self.degree == 0 || self.degree >= 2,
                "secagg.degree must be 0 (automatic) or at least 2",
            ),
            (
                (self.calibrate_for).is_none_or(|f| {
                    f >= self.min_survivors && f <= 1.0 && self.noise == SecAggNoise::Distributed
                }),
                "secagg.calibrate_for must be in [secagg.min_survivors, 1], with secagg.noise = \
                 \"distributed\"",
            ),
            (
                self.revocations.is_none() || self.authority.is_some(),
                "secagg.revocations is the authority's list: set it with secagg.authority",
            ),
            (
                self.policy.is_none() || self.authority.is_some(),
                "secagg.policy is signed by the authority: set it with secagg.authority",
            ),
            (
                self.neighbours == Neighbours::ReplaceOne || self.noise != SecAggNoise::None,
                "secagg.neighbours is the accounting of the rounds' noise: set it only with \
                 secagg.noise = \"central\" or \"distributed\"",
            ),
        ];
        match checks.into_iter().find(|(ok, _)| !ok) {
            Some((_, message)) => Err(ConfigError::Invalid(message.into())),
            None => Ok(()),
        }
    }
}

/// When the simulation's dropout injector drops clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum DropoutStage {
    /// After advertising keys, before sharing them.
    BeforeShares,
    /// After sharing keys, before the masked input (their masks must be recovered).
    AfterShares,
    /// After the masked input, before unmasking.
    AfterMasked,
}

impl DropoutStage {
    /// The stage whose message the injector's clients do not receive.
    pub fn withheld(self) -> Stage {
        match self {
            DropoutStage::BeforeShares => Stage::ShareKeys,
            DropoutStage::AfterShares => Stage::CheckShares,
            DropoutStage::AfterMasked => Stage::Unmasking,
        }
    }
}

/// The settings of a run's secure rounds.
#[derive(Debug, Clone, PartialEq)]
pub struct SecureSettings {
    /// b: the ring's bit width.
    pub bits: u32,
    /// The Shamir threshold as a fraction of a client's neighbours.
    pub threshold: f64,
    /// Fewest survivors of each stage, as a fraction of m_t.
    pub min_survivors: f64,
    /// `None`: the complete graph (Bonawitz et al. 2017); `Some(k)`: a random k-regular graph
    /// (SecAgg+, Bell et al. 2020), O(log n) for k = 0.
    pub degree: Option<usize>,
    /// How long each stage after the first waits.
    pub stage_timeout: Duration,
    /// Simulation only: the fraction of each round's clients the dropout injector drops, and
    /// the stage at which they drop.
    pub dropout: (f64, DropoutStage),
    /// Signed rounds (the malicious-server variant): the federation authority's checks of the
    /// clients' certificates and signatures.
    pub verifier: Option<Arc<Verifier>>,
    /// The federation policy, when the authority signed one.
    pub policy: Option<Arc<FederationPolicy>>,
}

impl SecureSettings {
    /// The neighbour graph of a round of `sampled` clients.
    pub(crate) fn graph(&self, sampled: usize) -> GraphKind {
        match self.degree {
            None => GraphKind::Complete,
            Some(0) => GraphKind::Regular(auto_degree(sampled)),
            Some(k) => GraphKind::Regular(k),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{PrivacyMode, RunConfig};

    #[test]
    fn zero_out_neighbours_are_for_noised_rounds_only() {
        let mut c = RunConfig::default();
        c.privacy.mode = PrivacyMode::SecAgg;
        c.secagg.neighbours = Neighbours::ZeroOut;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("secagg.neighbours"), "{e}");
        c.privacy.sampling = fl_privacy::Sampling::Fixed;
        c.privacy.noise_multiplier = 3.0.into();
        for noise in [SecAggNoise::Distributed, SecAggNoise::Central] {
            c.secagg.noise = noise;
            c.validate().unwrap();
        }
    }

    /// A configuration whose rounds the policy's clients would refuse is refused at start-up,
    /// naming the rule.
    #[test]
    fn a_configuration_outside_the_policy_is_refused() {
        let policy = FederationPolicy {
            federation: "hospitals".into(),
            serial: 1,
            modes: [fl_authority::policy::PolicyMode::SecAgg].into(),
            min_clients: 10,
            min_degree: MinDegree::AtLeast(8),
            min_threshold: 0.75,
            min_noise_multiplier: 0.0,
            max_release_epsilon: 4.0,
            max_total_epsilon: 40.0,
            max_delta: 1e-5,
            max_model_magnitude: 1e4,
        };
        let s = SecAggSection {
            threshold: 0.8,
            min_survivors: 0.5,
            ..SecAggSection::default()
        };
        s.check_policy(&policy, 20).unwrap();
        let e = s.check_policy(&policy, 18).unwrap_err().to_string();
        assert!(e.contains("min_clients is 10"), "{e}");
        let low = SecAggSection {
            threshold: 0.7,
            ..s.clone()
        };
        let e = low.check_policy(&policy, 20).unwrap_err().to_string();
        assert!(e.contains("min_threshold"), "{e}");
        let sparse = SecAggSection {
            graph: SecAggGraph::Regular,
            degree: 6,
            ..s.clone()
        };
        let e = sparse.check_policy(&policy, 20).unwrap_err().to_string();
        assert!(e.contains("min_degree is 8"), "{e}");
    }
}
