//! A round's task on the wire, with its local mechanism, its secure-aggregation settings and
//! the release a client declares with its upload.

use crate::v1;
use fl_model::{LocalConfig, Model};
use fl_privacy::{LocalKind, LocalMechanism, MAX_VARIANCE, Release};
use fl_secagg::task::{AdmmStep, SecureTask, Task, VerifiedTask};
use fl_secagg::{Quantizer, Ring};

use super::WireError;

impl From<LocalMechanism> for v1::LocalPrivacy {
    fn from(m: LocalMechanism) -> Self {
        v1::LocalPrivacy {
            mechanism: m.name().into(),
            parameters: m.parameters().into_iter().collect(),
        }
    }
}

impl TryFrom<&v1::LocalPrivacy> for LocalMechanism {
    type Error = WireError;
    fn try_from(p: &v1::LocalPrivacy) -> Result<Self, WireError> {
        let parameters = p.parameters.iter().map(|(k, &v)| (k.clone(), v)).collect();
        LocalMechanism::from_parameters(&p.mechanism, &parameters).map_err(WireError)
    }
}

impl From<&Release> for v1::LocalRelease {
    fn from(r: &Release) -> Self {
        v1::LocalRelease {
            mechanism: r.kind.name().into(),
            epsilon: r.epsilon,
            delta: r.delta,
            noise: r.noise,
            sensitivity: r.sensitivity,
        }
    }
}

impl TryFrom<&v1::LocalRelease> for Release {
    type Error = WireError;
    fn try_from(r: &v1::LocalRelease) -> Result<Self, WireError> {
        Ok(Release {
            kind: r.mechanism.parse::<LocalKind>().map_err(WireError)?,
            epsilon: r.epsilon,
            delta: r.delta,
            noise: r.noise,
            sensitivity: r.sensitivity,
        })
    }
}

/// A task the client can act on, or why it cannot: the model and settings read, the secure
/// round's code checked (positive finite S, gamma >= 1/S, noise within the sampler's range), an
/// IADMM step's rho and I checked.
impl TryFrom<&v1::RoundTask> for Task {
    type Error = WireError;
    fn try_from(t: &v1::RoundTask) -> Result<Self, WireError> {
        let bad = |m: String| WireError(m);
        let model = Model::try_from(
            t.model
                .as_ref()
                .ok_or(bad("task without a model spec".into()))?,
        )
        .map_err(|e| bad(e.to_string()))?;
        let config = LocalConfig::from(t.config.ok_or(bad("task without a local config".into()))?);
        let local = (t.local_privacy.as_ref())
            .map(LocalMechanism::try_from)
            .transpose()?;
        let secure = t.secagg.clone().map(secure_task).transpose()?;
        let verified = t.verified.clone().map(verified_task).transpose()?;
        if secure.is_some() && verified.is_some() {
            return Err(bad("a task both secure and verified".into()));
        }
        let admm = match t.admm {
            None => None,
            Some(a) if a.rho > 0.0 && a.rho.is_finite() && a.total_examples > 0 => Some(AdmmStep {
                rho: a.rho,
                total_examples: a.total_examples,
            }),
            Some(a) => {
                return Err(bad(format!(
                    "unusable IADMM step rho = {}, I = {}",
                    a.rho, a.total_examples
                )));
            }
        };
        Ok(Task {
            round: t.round,
            model,
            config,
            local,
            secure,
            verified,
            admm,
            evaluate: t.evaluate,
        })
    }
}

/// The secure round of a task: its code and noise, checked.
fn secure_task(task: v1::SecAggTask) -> Result<SecureTask, WireError> {
    let ring = Ring::new(task.ring_bits).map_err(WireError)?;
    if !(task.clip_bound > 0.0
        && task.clip_bound.is_finite()
        && task.scale >= 1.0 / task.clip_bound
        && task.scale.is_finite())
    {
        return Err(WireError(format!(
            "unusable quantisation S = {}, gamma = {}",
            task.clip_bound, task.scale
        )));
    }
    if task.noise_variance > MAX_VARIANCE {
        return Err(WireError(format!(
            "noise variance {} is beyond the sampler's range",
            task.noise_variance
        )));
    }
    Ok(SecureTask {
        quantizer: Quantizer {
            ring,
            clip: task.clip_bound,
            scale: task.scale,
        },
        noise_variance: task.noise_variance,
        signed: task.signed,
        federation: task.federation,
        run: task.run,
        min_survivors: task.min_survivors,
    })
}

/// The verified upload of a task: a positive finite S.
fn verified_task(task: v1::VerifiedTask) -> Result<VerifiedTask, WireError> {
    if !(task.clip_bound > 0.0 && task.clip_bound.is_finite()) {
        let bound = task.clip_bound;
        return Err(WireError(format!("unusable verified bound S = {bound}")));
    }
    Ok(VerifiedTask {
        clip: task.clip_bound,
        federation: task.federation,
        run: task.run,
        min_clients: task.min_clients,
    })
}

/// A task's wire message, without its tensor's size (`num_values` and `num_chunks` are the
/// sender's to fill in).
impl From<&Task> for v1::RoundTask {
    fn from(task: &Task) -> Self {
        v1::RoundTask {
            round: task.round,
            model: Some((&task.model).into()),
            config: Some(task.config.into()),
            num_values: 0,
            num_chunks: 0,
            secagg: task.secure.as_ref().map(|s| v1::SecAggTask {
                ring_bits: s.quantizer.ring.bits(),
                clip_bound: s.quantizer.clip,
                scale: s.quantizer.scale,
                noise_variance: s.noise_variance,
                signed: s.signed,
                federation: s.federation.clone(),
                run: s.run,
                min_survivors: s.min_survivors,
            }),
            verified: task.verified.as_ref().map(|v| v1::VerifiedTask {
                clip_bound: v.clip,
                federation: v.federation.clone(),
                run: v.run,
                min_clients: v.min_clients,
            }),
            local_privacy: task.local.map(v1::LocalPrivacy::from),
            admm: task.admm.map(|a| v1::AdmmTask {
                rho: a.rho,
                total_examples: a.total_examples,
            }),
            evaluate: task.evaluate,
        }
    }
}
