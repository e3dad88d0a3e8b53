//! Admission, without I/O: whether a round's task may be done at all, and with exactly which
//! protection. [`admit`] takes the whole task and what the client holds, and returns a
//! [`Protection`], the only permission anything later in the client acts on; everything not
//! explicitly permitted is a [`Refusal`] naming the rule.
//!
//! Default deny, by construction: the task (and its secure part, and the policy) are
//! destructured in full here, so a field added to any of them does not compile until this
//! module decides about it; no wildcard arm decides a privacy question. Under a federation
//! policy, a round of a kind the policy does not list (`modes`) is refused, whatever the task
//! leaves out: a plain round (raw update to a trusted curator, the privacy modes `none` and
//! `central`), a local mechanism not listed, secure aggregation, IADMM, and federated
//! evaluation (whose answers a policy never lets out).
//!
//! Every refusal here is decided by public inputs alone: the task, the received model, the
//! client's own settings, its policy and what it has spent; never by its examples
//! (docs/src/explanation/threat-model.md, "What a client refuses").

use crate::ClientPrivacy;
use crate::refusal::Refusal;
use crate::state::{Charge, ClientState};
use crate::trainer::Trainer;
use fl_authority::policy::{DEFAULT_MAX_MODEL_MAGNITUDE, FederationPolicy, PolicyMode};
use fl_model::{LocalConfig, Model};
use fl_privacy::{ClientLimits, DdgRound, LocalMechanism, Neighbours, ProtectError, Release};
use fl_secagg::task::{AdmmStep, SecureTask, Task, TaskDigest, VerifiedTask};
use fl_secagg::verified::Shape;
use fl_secagg::{Quantizer, check_combination};

/// What a client brings to a task's admission.
pub(crate) struct Ours<'a> {
    /// Its own requirements.
    pub(crate) privacy: &'a ClientPrivacy,
    /// The federation's rules, when the authority signed a policy.
    pub(crate) policy: Option<&'a FederationPolicy>,
    /// It holds a certified identity (and so takes part only in signed secure rounds).
    pub(crate) signing: bool,
    /// The model of the first task it admitted.
    pub(crate) pinned: Option<&'a Model>,
    /// Its trainer.
    pub(crate) trainer: &'a dyn Trainer,
    /// What it has spent and the attempts it took part in.
    pub(crate) state: &'a ClientState,
}

/// What may leave the client for an admitted task, and how it is protected. Each variant can
/// only be built by [`admit`], under the rules its documentation names.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Protection {
    /// The raw result (u, the loss and n_k) to a trusted curator, and with `evaluate` the
    /// received model's figures on this client's examples: only without a policy, or under
    /// one that allows `plain` (and then never with evaluation).
    Plain {
        /// Federated evaluation's figures go with the upload.
        evaluate: bool,
    },
    /// A local mechanism's release, its parameters tightened by the client's limits and the
    /// policy's (epsilon at most `max_release_epsilon`, delta at most `max_delta`).
    Local {
        /// The tightened mechanism.
        mechanism: LocalMechanism,
        /// What one release under it costs, checked against the client's cap.
        release: Release,
    },
    /// Secure aggregation's masked input.
    Secure {
        /// The fixed-point code (clip to S, scale by gamma).
        quantizer: Quantizer,
        /// H(task) of the task and model received, which binds every key and signature.
        digest: TaskDigest,
        /// sigma_i^2: the task's, raised to the policy's floor.
        noise_variance: u64,
        /// n_min: the fewest survivors the client lets the round admit and keep.
        min_survivors: u64,
        /// The round's charge at the policy's floor, when the policy has one (checked
        /// against the cap, and recorded with the attempt before the keys leave).
        charge: Option<Charge>,
    },
    /// A verified upload: the update clipped to S, split between the server and the helper,
    /// with a proof of its norm bound.
    Verified {
        /// d and S.
        shape: Shape,
        /// H(task) of the task and model received, which binds the upload.
        digest: TaskDigest,
        /// The helper's key the share is sealed to (the client's own).
        helper: [u8; 32],
    },
}

impl Protection {
    /// The local mechanism, if the result is its release.
    pub(crate) fn local(&self) -> Option<&LocalMechanism> {
        match self {
            Self::Local { mechanism, .. } => Some(mechanism),
            Self::Plain { .. } | Self::Secure { .. } | Self::Verified { .. } => None,
        }
    }

    /// Whether the server is the adversary (a local mechanism or secure aggregation): then
    /// nothing but the protected values leaves the client.
    pub(crate) fn against_the_server(&self) -> bool {
        match self {
            Self::Plain { .. } => false,
            Self::Local { .. } | Self::Secure { .. } | Self::Verified { .. } => true,
        }
    }
}

/// The task's protection, or the refusal naming the rule it breaks; see the module
/// documentation. `received` is the tensor the task carries.
pub(crate) fn admit(task: &Task, received: &[f32], ours: &Ours) -> Result<Protection, Refusal> {
    let Task {
        round: _,
        model,
        config,
        local,
        secure,
        verified,
        admm,
        evaluate,
    } = task;
    check_tensor(task, received, ours.policy)?;
    (ours.trainer.check(model)).map_err(Refusal::Trainer)?;
    if let Some(first) = ours.pinned.filter(|first| *first != model) {
        return Err(Refusal::ModelChanged {
            first: Box::new(first.clone()),
            now: Box::new(model.clone()),
        });
    }
    check_config(config)?;
    check_required(ours.privacy, local.as_ref())?;
    let protection = match (local, secure, admm) {
        (None, None, None) if let Some(verified) = verified => {
            verified_input(verified, task, received, ours)?
        }
        (Some(_) | None, None, _) if verified.is_some() => {
            let refused = check_combination(local.is_some(), admm.is_some()).err();
            return Err(Refusal::Combination(refused.unwrap_or_default()));
        }
        (None, None, _) => {
            allowed(ours.policy, PolicyMode::Plain)?;
            Protection::Plain {
                evaluate: *evaluate,
            }
        }
        (Some(mechanism), None, _) => local_release(mechanism, admm.as_ref(), model, ours)?,
        (None, Some(secure), None) => secure_input(secure, task, received, ours)?,
        (Some(_), Some(_), _) | (None, Some(_), Some(_)) => {
            let refused = check_combination(local.is_some(), admm.is_some()).err();
            return Err(Refusal::Combination(refused.unwrap_or_default()));
        }
    };
    if admm.is_some() {
        allowed(ours.policy, PolicyMode::Iadmm)?;
    }
    if let (true, Some(policy)) = (*evaluate, ours.policy) {
        return Err(Refusal::EvaluationUnderPolicy {
            federation: policy.federation.clone(),
        });
    }
    check_trainer_kind(ours.trainer, &protection, admm.as_ref())?;
    Ok(protection)
}

/// The received tensor's length is the task's, and every value is finite and within the
/// policy's `max_model_magnitude` (or [`DEFAULT_MAX_MODEL_MAGNITUDE`]): a model that makes
/// training fail on some examples only would tell the server about them.
fn check_tensor(
    task: &Task,
    received: &[f32],
    policy: Option<&FederationPolicy>,
) -> Result<(), Refusal> {
    if received.len() != task.tensor_len() {
        return Err(Refusal::TensorLength {
            model: task.model.clone(),
            params: task.model.num_params(),
            sent: received.len(),
        });
    }
    let bound = policy.map_or(DEFAULT_MAX_MODEL_MAGNITUDE, |p| p.max_model_magnitude);
    let within = |v: &f32| v.is_finite() && f64::from(v.abs()) <= bound;
    match received.iter().position(|v| !within(v)) {
        None => Ok(()),
        Some(index) => Err(Refusal::ValueOutOfBounds {
            index,
            value: received[index],
            bound,
        }),
    }
}

/// The task's local training settings are usable.
fn check_config(config: &LocalConfig) -> Result<(), Refusal> {
    (config.check()).map_err(|reason| Refusal::LocalConfig {
        config: *config,
        reason,
    })
}

/// A client that requires one local mechanism takes no round of another kind.
fn check_required(privacy: &ClientPrivacy, local: Option<&LocalMechanism>) -> Result<(), Refusal> {
    let asked = local.map_or("none", |m| m.name());
    match privacy.require {
        Some(required) if required.name() != asked => Err(Refusal::OtherMechanism {
            required: required.name(),
            asked,
        }),
        Some(_) | None => Ok(()),
    }
}

/// Refuses a round of `mode` that the policy does not allow (any round, without a policy).
fn allowed(policy: Option<&FederationPolicy>, mode: PolicyMode) -> Result<(), Refusal> {
    match policy {
        Some(p) if !p.allows(mode) => Err(Refusal::NotAllowed {
            federation: p.federation.clone(),
            mode,
            allowed: (p.modes.iter().map(|m| m.name()))
                .collect::<Vec<_>>()
                .join(", "),
        }),
        Some(_) | None => Ok(()),
    }
}

/// The client's limits tightened by the policy's: epsilon at most `max_release_epsilon`,
/// delta at most `max_delta`. The policy is destructured in full here, each rule with where a
/// client enforces it, so that a rule added to the policy does not compile until it is.
fn limits(own: ClientLimits, policy: Option<&FederationPolicy>) -> ClientLimits {
    let Some(FederationPolicy {
        max_release_epsilon,
        max_delta,
        // `allowed`, `secure_input` and `check_tensor` here:
        federation: _,
        modes: _,
        min_noise_multiplier: _,
        max_model_magnitude: _,
        // `fl_secagg::ClientRound::under`, at each stage of a secure round:
        min_clients: _,
        min_degree: _,
        min_threshold: _,
        // `ClientState::open` (the cap, composed at max_delta; the serial):
        max_total_epsilon: _,
        serial: _,
    }) = policy
    else {
        return own;
    };
    let min = |own: Option<f64>, policy: f64| Some(own.map_or(policy, |o| o.min(policy)));
    ClientLimits {
        epsilon: min(own.epsilon, *max_release_epsilon),
        delta: min(own.delta, *max_delta),
        clip: own.clip,
    }
}

/// A local mechanism's release: allowed by the policy, tightened, usable for the model, of
/// IADMM only with the Laplace mechanism, and within the client's cap.
fn local_release(
    mechanism: &LocalMechanism,
    admm: Option<&AdmmStep>,
    model: &Model,
    ours: &Ours,
) -> Result<Protection, Refusal> {
    allowed(ours.policy, PolicyMode::Local(mechanism.kind()))?;
    let mechanism = mechanism.tightened(&limits(ours.privacy.limits, ours.policy));
    mechanism.check(model.num_params())?;
    if admm.is_some() && !mechanism.kind().protects_admm() {
        return Err(ProtectError::NoAdmmStep(mechanism.name()).into());
    }
    let release = mechanism.accounted_release()?;
    ours.state.check(&Charge::Local(release))?;
    Ok(Protection::Local { mechanism, release })
}

/// Secure aggregation's input: allowed by the policy, of the policy's federation, signed
/// exactly when this client has an identity, its noise raised to the policy's floor, and its
/// charge at that floor within the policy's per-release epsilon and the client's cap.
fn secure_input(
    secure: &SecureTask,
    task: &Task,
    received: &[f32],
    ours: &Ours,
) -> Result<Protection, Refusal> {
    let SecureTask {
        quantizer,
        noise_variance,
        signed,
        federation,
        run: _,
        min_survivors,
    } = secure;
    allowed(ours.policy, PolicyMode::SecAgg)?;
    same_federation(ours.policy, federation)?;
    match (*signed, ours.signing) {
        (false, true) => return Err(Refusal::UnsignedRound),
        (true, false) => return Err(Refusal::NoIdentity),
        (true, true) | (false, false) => {}
    }
    let digest = TaskDigest::of(task, secure, received);
    let Some(policy) = ours.policy else {
        return Ok(Protection::Secure {
            quantizer: *quantizer,
            digest,
            noise_variance: *noise_variance,
            min_survivors: *min_survivors,
            charge: None,
        });
    };
    let floor = policy.min_noise_variance(quantizer.clip, quantizer.scale);
    let charge = secure_charge(quantizer, floor, task.model.num_params());
    if let Some(charge) = &charge {
        let epsilon = ours.state.cost(charge);
        if epsilon > policy.max_release_epsilon {
            return Err(Refusal::SecureRoundTooCostly {
                federation: policy.federation.clone(),
                epsilon,
                max: policy.max_release_epsilon,
            });
        }
        ours.state.check(charge)?;
    }
    Ok(Protection::Secure {
        quantizer: *quantizer,
        digest,
        noise_variance: (*noise_variance).max(floor),
        min_survivors: *min_survivors,
        charge,
    })
}

/// Refuses a round of another federation than the policy's (any, without a policy).
fn same_federation(policy: Option<&FederationPolicy>, federation: &str) -> Result<(), Refusal> {
    match policy {
        Some(p) if p.federation != federation => Err(Refusal::OtherFederation {
            round: federation.to_string(),
            ours: p.federation.clone(),
        }),
        Some(_) | None => Ok(()),
    }
}

/// A verified upload: allowed by the policy, of the policy's federation, with a helper key to
/// seal to, and a shape that gives a circuit.
fn verified_input(
    verified: &VerifiedTask,
    task: &Task,
    received: &[f32],
    ours: &Ours,
) -> Result<Protection, Refusal> {
    let VerifiedTask {
        clip,
        federation,
        // What names the attempt and the helper's floor: bound by the digest, not decided here.
        run: _,
        min_clients: _,
    } = verified;
    allowed(ours.policy, PolicyMode::Verified)?;
    same_federation(ours.policy, federation)?;
    let helper = ours.privacy.helper_key.ok_or(Refusal::NoHelperKey)?;
    let shape =
        Shape::new(task.model.num_params(), *clip).map_err(|e| Refusal::Verified(e.to_string()))?;
    Ok(Protection::Verified {
        shape,
        digest: TaskDigest::of_verified(task, verified, received),
        helper,
    })
}

/// What a secure round costs this client against the server: its own discrete Gaussian noise
/// at the policy's floor `floor` alone (every other survivor may be the server's), for the sum's
/// sensitivity to this client's input replaced, 2 (gamma S + sqrt(d)) levels
/// ([`Quantizer::l2_sensitivity`]). `None` under a policy without a floor: such rounds cannot
/// be charged (docs/src/reference/policy.md says repeated ones are then unbounded).
fn secure_charge(quantizer: &Quantizer, floor: u64, dim: usize) -> Option<Charge> {
    if floor == 0 {
        return None;
    }
    let neighbours = Neighbours::ReplaceOne;
    Some(Charge::Secure(DdgRound {
        clients: 1,
        client_variance: floor,
        l2_sensitivity: neighbours.sensitivity(quantizer.l2_sensitivity(dim)),
        neighbours,
        dim: dim as u64,
    }))
}

/// A round that needs per-example L1 clipping inside training (the Laplace mechanism, IADMM)
/// is refused by a client whose trainer is not the built-in one.
fn check_trainer_kind(
    trainer: &dyn Trainer,
    protection: &Protection,
    admm: Option<&AdmmStep>,
) -> Result<(), Refusal> {
    if trainer.built_in().is_some() {
        return Ok(());
    }
    match (admm, protection.local()) {
        (Some(_), _) => Err(Refusal::NeedsBuiltIn("an IADMM round")),
        (None, Some(m)) if m.kind().needs_built_in_trainer() => {
            Err(Refusal::NeedsBuiltIn(m.name()))
        }
        (None, Some(_) | None) => Ok(()),
    }
}

#[cfg(test)]
mod tests;
