//! The federation policy: the rules a federation's authority signs and every client enforces,
//! whatever the server asks. The server picks each round's size, graph, threshold, noise and
//! privacy parameters; a client that holds the policy refuses a round outside it (naming the
//! rule), so that the bounds of docs/src/explanation/threat-model.md are ones a client checks,
//! not ones the server is trusted to respect.
//!
//! The authority signs the policy with the key it certifies identities with
//! ([`crate`]). Signed payload (big-endian; docs/src/reference/protocol.md,
//! "Signed payloads"): `"flp.v1 federation policy"`, u16 length and UTF-8 bytes of the
//! federation id, u64 serial, u64 min_clients, u64 min_degree (u64::MAX for the complete
//! graph), then the bits (f64) of min_threshold, min_noise_multiplier, max_release_epsilon,
//! max_total_epsilon, max_delta and max_model_magnitude as u64 each, then u16 the number of
//! allowed modes and each mode's name (u16 length, UTF-8), in [`PolicyMode`]'s order.

use crate::{Authority, AuthorityError, AuthorityKey, MAX_NAME_BYTES};
use fl_privacy::LocalKind;
use std::collections::BTreeSet;

/// Domain string of a policy's signed payload.
const POLICY_DOMAIN: &[u8] = b"flp.v1 federation policy";

/// The largest absolute value of a received model's parameters a client accepts when no policy
/// says otherwise: far above any trained network's weights, far below what overflows f32
/// arithmetic in a forward pass.
pub const DEFAULT_MAX_MODEL_MAGNITUDE: f64 = 1e4;

/// The smallest neighbour count of a secure round a policy allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinDegree {
    /// Every admitted client is every other's neighbour (k = |U1| - 1).
    Complete,
    /// k >= this.
    AtLeast(u64),
}

/// A kind of round a policy may allow; a client under a policy refuses every other kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyMode {
    /// The raw update, example count and loss to a trusted curator (privacy modes `none` and
    /// `central`): nothing protects them from the server.
    Plain,
    /// The releases of one client-side mechanism (named as the mechanism is).
    Local(LocalKind),
    /// Secure aggregation (its input noised to the policy's floor).
    SecAgg,
    /// Inexact ADMM's step instead of FedAvg's local SGD (under a protection also allowed).
    Iadmm,
    /// Verified uploads: shares for two aggregators with a proof of the norm bound.
    Verified,
}

impl PolicyMode {
    /// Every mode, in the payload's order.
    pub fn all() -> Vec<PolicyMode> {
        let local = LocalKind::ALL.iter().map(|&k| Self::Local(k));
        (std::iter::once(Self::Plain).chain(local))
            .chain([Self::SecAgg, Self::Iadmm, Self::Verified])
            .collect()
    }

    /// The mode's name in a policy file and in `fl authority policy --allow`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Local(kind) => kind.name(),
            Self::SecAgg => "secagg",
            Self::Verified => "verified",
            Self::Iadmm => "iadmm",
        }
    }
}

impl std::str::FromStr for PolicyMode {
    type Err = PolicyError;

    /// The mode [`PolicyMode::name`] names.
    fn from_str(s: &str) -> Result<Self, PolicyError> {
        (Self::all().into_iter().find(|m| m.name() == s))
            .ok_or_else(|| PolicyError::UnknownMode { name: s.into() })
    }
}

/// The modes' names, for messages.
fn mode_names() -> String {
    let names: Vec<&str> = PolicyMode::all()
        .into_iter()
        .map(PolicyMode::name)
        .collect();
    names.join(", ")
}

impl std::fmt::Display for PolicyMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The rules of one federation; see the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct FederationPolicy {
    /// The federation's id, bound into every secure round's task digest.
    pub federation: String,
    /// The policy's version: a client remembers the highest it has seen for its federation and
    /// refuses an older one.
    pub serial: u64,
    /// The kinds of round a client takes part in; every other is refused.
    pub modes: BTreeSet<PolicyMode>,
    /// The fewest admitted clients |U1| of a secure round.
    pub min_clients: u64,
    /// The fewest neighbours k of a client in a secure round.
    pub min_degree: MinDegree,
    /// The smallest threshold as a fraction of k: tau >= ceil(min_threshold k); above 2/3.
    pub min_threshold: f64,
    /// Distributed noise: each client's discrete Gaussian standard deviation is at least this
    /// many times the round's clip bound S (in levels: sigma_i^2 >= (z S gamma)^2); 0 for none.
    pub min_noise_multiplier: f64,
    /// The largest epsilon of one release (a local mechanism's, or a secure round's charge).
    pub max_release_epsilon: f64,
    /// The largest composed epsilon of one client's releases (local and secure) over the
    /// federation's life.
    pub max_total_epsilon: f64,
    /// The largest delta of one release; a client composes its total at this delta.
    pub max_delta: f64,
    /// The largest absolute value of a received model's parameters.
    pub max_model_magnitude: f64,
}

/// A policy with the authority's signature over it.
#[derive(Debug, Clone, PartialEq)]
pub struct SignedPolicy {
    /// The rules.
    pub policy: FederationPolicy,
    /// The authority's Ed25519 signature over [`FederationPolicy::payload`].
    pub signature: [u8; 64],
}

/// The rule of the federation's policy that a secure round breaks, as one client sees the
/// round ([`FederationPolicy::check_round`]); each names the federation and the round's figure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OutsidePolicy {
    /// |U1| below `min_clients`.
    #[error(
        "federation {federation:?} policy: a secure round admits at least {min} clients, this \
         one {members}"
    )]
    TooFewMembers {
        /// The federation id.
        federation: String,
        /// The policy's `min_clients`.
        min: u64,
        /// |U1|.
        members: usize,
    },
    /// A sparse graph where the policy asks for the complete one.
    #[error(
        "federation {federation:?} policy: the graph must be complete ({needed} neighbours), \
         this client has {k}"
    )]
    IncompleteGraph {
        /// The federation id.
        federation: String,
        /// |U1| - 1.
        needed: usize,
        /// The client's neighbours.
        k: usize,
    },
    /// Fewer neighbours than `min_degree`.
    #[error("federation {federation:?} policy: at least {min} neighbours, this client has {k}")]
    TooFewNeighbours {
        /// The federation id.
        federation: String,
        /// The policy's `min_degree`.
        min: u64,
        /// The client's neighbours.
        k: usize,
    },
    /// A Shamir threshold tau below `min_threshold` of the client's k neighbours.
    #[error(
        "federation {federation:?} policy: threshold at least {fraction} of the {k} neighbours \
         (t >= {min_t}), this round's is {t}"
    )]
    ThresholdTooLow {
        /// The federation id.
        federation: String,
        /// The policy's `min_threshold`.
        fraction: f64,
        /// The client's neighbours.
        k: usize,
        /// The smallest t the policy allows for k.
        min_t: usize,
        /// The round's t.
        t: usize,
    },
}

/// Why a federation policy cannot protect anyone: the rule named, with the value given.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// A federation id that is empty or too long (its length).
    #[error("the federation id must have 1 to {MAX_NAME_BYTES} bytes (got {0})")]
    FederationId(usize),
    /// Fewer than 3 clients per round.
    #[error("min_clients = {0} (at least 3)")]
    MinClients(u64),
    /// Fewer than 2 neighbours.
    #[error("min_degree = {0} (at least 2, or \"complete\")")]
    MinDegree(u64),
    /// A threshold fraction not in (2/3, 1].
    #[error("min_threshold = {0} (a fraction of k above 2/3, at most 1)")]
    MinThreshold(f64),
    /// A negative or infinite noise multiplier.
    #[error("min_noise_multiplier = {0} (0 or more)")]
    MinNoiseMultiplier(f64),
    /// A delta outside (0, 1).
    #[error("max_delta = {0} (above 0, below 1)")]
    MaxDelta(f64),
    /// Serial 0.
    #[error("serial = 0 (policies are numbered from 1)")]
    Serial,
    /// No mode allowed: every task would be refused.
    #[error("no mode allowed (give at least one of {})", mode_names())]
    NoModes,
    /// A mode name that is not one.
    #[error("unknown mode {name:?} (one of {})", mode_names())]
    UnknownMode {
        /// The name given.
        name: String,
    },
    /// The signature does not verify under the authority's key.
    #[error(transparent)]
    Signature(AuthorityError),
    /// A limit (named) that is not positive and finite.
    #[error("{name} = {value} (a positive number)")]
    NotPositive {
        /// The limit.
        name: &'static str,
        /// Its value.
        value: f64,
    },
}

impl FederationPolicy {
    /// Refuses a policy that cannot protect anyone: an empty or long federation id, fewer than
    /// 3 clients or 2 neighbours, a threshold fraction not in (2/3, 1], a negative noise
    /// multiplier, a delta outside (0, 1), serial 0, no mode, or limits that are not positive
    /// and finite.
    pub fn check(&self) -> Result<(), PolicyError> {
        let len = self.federation.len();
        if len == 0 || len > crate::MAX_NAME_BYTES {
            return Err(PolicyError::FederationId(len));
        }
        if self.min_clients < 3 {
            return Err(PolicyError::MinClients(self.min_clients));
        }
        if let MinDegree::AtLeast(k) = self.min_degree
            && k < 2
        {
            return Err(PolicyError::MinDegree(k));
        }
        // tau > 2k/3 keeps both secrets of a client hidden from fewer than 2 tau - k colluders
        // (Bonawitz et al. 2017, Sec. 6).
        if !(self.min_threshold > 2.0 / 3.0 && self.min_threshold <= 1.0) {
            return Err(PolicyError::MinThreshold(self.min_threshold));
        }
        if !(self.min_noise_multiplier >= 0.0 && self.min_noise_multiplier.is_finite()) {
            return Err(PolicyError::MinNoiseMultiplier(self.min_noise_multiplier));
        }
        if !(self.max_delta > 0.0 && self.max_delta < 1.0) {
            return Err(PolicyError::MaxDelta(self.max_delta));
        }
        if self.serial == 0 {
            return Err(PolicyError::Serial);
        }
        if self.modes.is_empty() {
            return Err(PolicyError::NoModes);
        }
        for (name, value) in [
            ("max_release_epsilon", self.max_release_epsilon),
            ("max_total_epsilon", self.max_total_epsilon),
            ("max_model_magnitude", self.max_model_magnitude),
        ] {
            if !(value > 0.0 && value.is_finite()) {
                return Err(PolicyError::NotPositive { name, value });
            }
        }
        Ok(())
    }

    /// The bytes the authority signs (see the module documentation).
    pub fn payload(&self) -> Vec<u8> {
        let mut out = POLICY_DOMAIN.to_vec();
        out.extend_from_slice(&(self.federation.len() as u16).to_be_bytes());
        out.extend_from_slice(self.federation.as_bytes());
        out.extend_from_slice(&self.serial.to_be_bytes());
        out.extend_from_slice(&self.min_clients.to_be_bytes());
        let degree = match self.min_degree {
            MinDegree::Complete => u64::MAX,
            MinDegree::AtLeast(k) => k,
        };
        out.extend_from_slice(&degree.to_be_bytes());
        for v in [
            self.min_threshold,
            self.min_noise_multiplier,
            self.max_release_epsilon,
            self.max_total_epsilon,
            self.max_delta,
            self.max_model_magnitude,
        ] {
            out.extend_from_slice(&v.to_bits().to_be_bytes());
        }
        out.extend_from_slice(&(self.modes.len() as u16).to_be_bytes());
        for mode in &self.modes {
            out.extend_from_slice(&(mode.name().len() as u16).to_be_bytes());
            out.extend_from_slice(mode.name().as_bytes());
        }
        out
    }

    /// Whether a client under this policy takes part in rounds of `mode`.
    pub fn allows(&self, mode: PolicyMode) -> bool {
        self.modes.contains(&mode)
    }

    /// The smallest threshold tau a client with `k` neighbours accepts under this policy.
    pub fn min_threshold_for(&self, k: usize) -> usize {
        (self.min_threshold * k as f64 - 1e-9).ceil().max(0.0) as usize
    }

    /// Checks a secure round's shape as one client sees it: |U1| = `members`, its `k`
    /// neighbours and threshold `t`. The error names the rule.
    pub fn check_round(&self, members: usize, k: usize, t: usize) -> Result<(), OutsidePolicy> {
        let federation = || self.federation.clone();
        if (members as u64) < self.min_clients {
            return Err(OutsidePolicy::TooFewMembers {
                federation: federation(),
                min: self.min_clients,
                members,
            });
        }
        match self.min_degree {
            MinDegree::Complete if k + 1 != members => {
                return Err(OutsidePolicy::IncompleteGraph {
                    federation: federation(),
                    needed: members - 1,
                    k,
                });
            }
            MinDegree::AtLeast(min) if (k as u64) < min => {
                return Err(OutsidePolicy::TooFewNeighbours {
                    federation: federation(),
                    min,
                    k,
                });
            }
            MinDegree::Complete | MinDegree::AtLeast(_) => {}
        }
        let min_t = self.min_threshold_for(k);
        if t < min_t {
            return Err(OutsidePolicy::ThresholdTooLow {
                federation: federation(),
                fraction: self.min_threshold,
                k,
                min_t,
                t,
            });
        }
        Ok(())
    }

    /// The smallest discrete Gaussian variance (in levels) a client adds to its code for a
    /// round of clip bound `clip` and scale `gamma`: (z S gamma)^2, rounded up.
    pub fn min_noise_variance(&self, clip: f64, gamma: f64) -> u64 {
        let sd = self.min_noise_multiplier * clip * gamma;
        (sd * sd).ceil().min(u64::MAX as f64) as u64
    }

    /// The most clients the server may control with both secrets of every honest client's
    /// still hidden, whatever graph the server draws: |C| < 2 tau_min - k_min, with k_min the
    /// policy's fewest neighbours and tau_min its threshold at k_min (threat-model.md).
    pub fn tolerated_compromised(&self) -> u64 {
        let k = match self.min_degree {
            MinDegree::Complete => self.min_clients - 1,
            MinDegree::AtLeast(k) => k,
        };
        let t = self.min_threshold_for(k as usize) as u64;
        (2 * t).saturating_sub(k).saturating_sub(1)
    }
}

impl Authority {
    /// Signs `policy`, refusing one that fails [`FederationPolicy::check`].
    pub fn sign_policy(&self, policy: FederationPolicy) -> Result<SignedPolicy, PolicyError> {
        policy.check()?;
        let signature = self.sign_payload(&policy.payload());
        Ok(SignedPolicy { policy, signature })
    }
}

impl SignedPolicy {
    /// The policy, once its signature verifies under `authority` and its rules pass
    /// [`FederationPolicy::check`].
    pub fn verified(self, authority: &AuthorityKey) -> Result<FederationPolicy, PolicyError> {
        let payload = self.policy.payload();
        (authority.verify_payload(&payload, &self.signature, "the federation policy"))
            .map_err(PolicyError::Signature)?;
        self.policy.check()?;
        Ok(self.policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A policy for tests: at least 4 clients, 3 neighbours, t >= 0.7 k.
    fn policy() -> FederationPolicy {
        FederationPolicy {
            federation: "hospitals".into(),
            serial: 1,
            modes: PolicyMode::all().into_iter().collect(),
            min_clients: 4,
            min_degree: MinDegree::AtLeast(3),
            min_threshold: 0.7,
            min_noise_multiplier: 0.5,
            max_release_epsilon: 4.0,
            max_total_epsilon: 10.0,
            max_delta: 1e-5,
            max_model_magnitude: 100.0,
        }
    }

    /// A signed policy reads back from its file and verifies under its authority only, and not
    /// once any rule is changed.
    #[test]
    fn a_policy_is_signed_whole_by_its_authority() {
        let authority = Authority::generate().unwrap();
        let signed = authority.sign_policy(policy()).unwrap();
        let read = SignedPolicy::from_toml(&signed.to_toml()).unwrap();
        assert_eq!(read, signed);
        assert_eq!(
            read.clone().verified(&authority.public()).unwrap(),
            policy()
        );
        let other = Authority::generate().unwrap();
        assert!(read.clone().verified(&other.public()).is_err());
        let mut looser = read.clone();
        looser.policy.min_clients = 3;
        assert!(looser.verified(&authority.public()).is_err());
        let mut looser = read.clone();
        looser.policy.max_total_epsilon = 11.0;
        assert!(looser.verified(&authority.public()).is_err());
        let mut looser = read.clone();
        looser.policy.max_delta = 1e-3;
        assert!(looser.verified(&authority.public()).is_err());
        let mut older = read.clone();
        older.policy.serial = 2;
        assert!(older.verified(&authority.public()).is_err());
        let mut wider = read;
        wider.policy.modes.remove(&PolicyMode::Plain);
        assert!(wider.verified(&authority.public()).is_err());
        let complete = FederationPolicy {
            min_degree: MinDegree::Complete,
            ..policy()
        };
        let signed = authority.sign_policy(complete.clone()).unwrap();
        let read = SignedPolicy::from_toml(&signed.to_toml()).unwrap();
        assert_eq!(read.verified(&authority.public()).unwrap(), complete);
    }

    /// An unusable policy is refused before it is signed.
    #[test]
    fn an_unusable_policy_is_not_signed() {
        let authority = Authority::generate().unwrap();
        for broken in [
            FederationPolicy {
                min_threshold: 2.0 / 3.0,
                ..policy()
            },
            FederationPolicy {
                min_clients: 2,
                ..policy()
            },
            FederationPolicy {
                max_release_epsilon: f64::INFINITY,
                ..policy()
            },
            FederationPolicy {
                federation: String::new(),
                ..policy()
            },
            FederationPolicy {
                serial: 0,
                ..policy()
            },
            FederationPolicy {
                modes: BTreeSet::new(),
                ..policy()
            },
            FederationPolicy {
                max_delta: 1.0,
                ..policy()
            },
        ] {
            assert!(authority.sign_policy(broken).is_err());
        }
    }

    /// The round's shape: each rule refuses with its name, and the bound on compromised
    /// clients is 2 tau_min - k_min - 1.
    #[test]
    fn a_round_outside_the_policy_names_the_rule() {
        let p = policy();
        p.check_round(4, 3, 3).unwrap();
        let members = p.check_round(3, 2, 2).unwrap_err();
        assert!(matches!(
            members,
            OutsidePolicy::TooFewMembers {
                min: 4,
                members: 3,
                ..
            }
        ));
        assert!(members.to_string().contains("at least 4 clients"));
        let degree = p.check_round(5, 2, 2).unwrap_err();
        assert!(matches!(
            degree,
            OutsidePolicy::TooFewNeighbours { min: 3, k: 2, .. }
        ));
        assert!(degree.to_string().contains("at least 3 neighbours"));
        // 0.7 * 3 = 2.1: t >= 3.
        let threshold = p.check_round(5, 3, 2).unwrap_err();
        assert!(matches!(
            threshold,
            OutsidePolicy::ThresholdTooLow { min_t: 3, t: 2, .. }
        ));
        assert!(threshold.to_string().contains("t >= 3"));
        let complete = FederationPolicy {
            min_degree: MinDegree::Complete,
            ..p.clone()
        };
        let graph = complete.check_round(6, 4, 4).unwrap_err();
        assert!(matches!(
            graph,
            OutsidePolicy::IncompleteGraph {
                needed: 5,
                k: 4,
                ..
            }
        ));
        assert!(graph.to_string().contains("complete"));
        complete.check_round(5, 4, 3).unwrap();
        // k = 24, tau_min = ceil(0.7 * 24) = 17: |C| <= 9.
        let wide = FederationPolicy {
            min_degree: MinDegree::AtLeast(24),
            ..p
        };
        assert_eq!(wide.tolerated_compromised(), 9);
        assert_eq!(wide.min_noise_variance(1.0, 10.0), 25);
    }
}
