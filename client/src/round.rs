//! What a client computes for a round, without I/O: the trainer's work, then the update and the
//! round's local mechanism (`fl_privacy::Protected`) before anything leaves the device.
//!
//! - FedAvg, no mechanism: u = w_k - w_t, with the loss and n_k for the trusted curator.
//! - FedAvg under a local mechanism: local training under the gradient rule the mechanism names
//!   (the trainer's own, or the built-in trainer's L1-clipped SGD for `ldp-laplace`), then
//!   `LocalMechanism::protect_update` on u.
//! - IADMM: z_p = a_p - (1/(rho I)) sum_i clip_1(grad f_i(z_p^t)) by the built-in trainer, plus
//!   `LocalMechanism::protect_admm_step` under a mechanism that protects it (`ldp-laplace`; APPFL,
//!   IADMM, Example 2).
//!
//! Noise and SignDS draws come from an OS-seeded CSPRNG, even in seeded runs; the seed only fixes
//! the order of local examples.

use crate::admission::Protection;
use crate::refusal::{ComputationError, Refusal};
use crate::trainer::{Evaluation, SgdTrainer, TrainRequest, Trainer};
use fl_common::cores::CoreBudget;
use fl_model::{GradientRule, all_finite, subtract_global};
use fl_privacy::admm::primal_step;
use fl_privacy::{LocalMechanism, ProtectError, Protected, Release};
use fl_secagg::task::{AdmmStep, Task};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// A round's work, once admitted.
#[derive(Debug, Clone)]
pub(crate) struct Work {
    /// The task as received (H(task) is over it).
    pub task: Task,
    /// What admission permits to leave, and how it is protected: everything below acts on
    /// this, never on the task's own mechanism.
    pub protection: Protection,
    /// The global model (IADMM: the anchor, then the point).
    pub received: Vec<f32>,
    /// The seed of the local examples' order.
    pub seed: u64,
}

/// What a round produced. Under a local mechanism the server is the adversary, so the result is
/// the mechanism's [`Protected`] output alone (no loss, no example count).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Computed {
    /// No local mechanism (the curator is trusted, or secure aggregation hides it): u for FedAvg
    /// or z_p for IADMM, with the training loss and n_k.
    Plain {
        /// The values.
        values: Vec<f32>,
        /// Mean training loss, if the trainer reported it.
        loss: Option<f32>,
        /// n_k.
        examples: u64,
        /// The received model's figures on this client's examples, when the task asked for
        /// federated evaluation (only ever with a plain upload to a trusted server).
        evaluation: Option<Evaluation>,
    },
    /// A local mechanism's release.
    Protected(Protected),
}

impl Computed {
    /// The privacy loss of the result, if protected.
    pub(crate) fn release(&self) -> Option<&Release> {
        match self {
            Self::Plain { .. } => None,
            Self::Protected(p) => Some(p.release()),
        }
    }
}

/// The built-in trainer, which a round of `work`'s kind needs (admission refused the round
/// when the client has another).
fn built_in(trainer: &dyn Trainer) -> Result<&SgdTrainer, Refusal> {
    (trainer.built_in()).ok_or(Refusal::NeedsBuiltIn("this round"))
}

/// Runs the round's local computation with `trainer` and protects the result. When the server
/// is the adversary (a local mechanism or secure aggregation) a computation that fails
/// (diverged, or the trainer failed) is not reported: the failure could depend on the client's
/// examples. The client sends [`fallback`], the zero update through the same mechanism, and
/// keeps the reason in its own log.
pub(crate) fn compute(work: &Work, trainer: &dyn Trainer) -> Result<Computed, Refusal> {
    match compute_once(work, trainer) {
        Err(reason) if work.protection.against_the_server() => {
            tracing::warn!(
                round = work.task.round,
                %reason,
                "the round's computation failed: sending the zero update through the round's \
                 protection instead (the reason stays on this client)"
            );
            fallback(work)
        }
        other => other,
    }
}

/// The data-independent result of a failed round: the zero update (IADMM: the zero iterate)
/// through the round's mechanism, or as the plain input of secure aggregation.
fn fallback(work: &Work) -> Result<Computed, Refusal> {
    let zeros = vec![0.0; work.task.model.num_params()];
    let mut noise_rng = StdRng::from_os_rng();
    match (work.protection.local(), work.task.admm) {
        (None, _) => Ok(Computed::Plain {
            values: zeros,
            loss: None,
            examples: 0,
            evaluation: None,
        }),
        (Some(m), Some(step)) => m
            .protect_admm_step(zeros, step.rho, step.total_examples, &mut noise_rng)
            .map(Computed::Protected)
            .map_err(Refusal::from),
        (Some(m), None) => m
            .protect_update(zeros, &work.task.config, &mut noise_rng)
            .map(Computed::Protected)
            .map_err(Refusal::from),
    }
}

/// One attempt at the round's computation: training, then the mechanism.
fn compute_once(work: &Work, trainer: &dyn Trainer) -> Result<Computed, Refusal> {
    let mut noise_rng = StdRng::from_os_rng();
    let computed = match work.task.admm {
        Some(step) => admm_step(work, step, built_in(trainer)?, &mut noise_rng)?,
        None => fedavg(work, trainer, &mut noise_rng)?,
    };
    let values = match &computed {
        Computed::Plain { values, .. } => Some(values.as_slice()),
        Computed::Protected(p) => p.values(),
    };
    if values.is_some_and(|v| !all_finite(v)) {
        return Err(ComputationError::Diverged.into());
    }
    Ok(computed)
}

/// The reason sent to the server when the trainer fails: a fixed text, since the trainer's own
/// (`reason`) may describe the data, and under a client-side mode the server is the adversary.
/// The trainer's reason stays on the device, in the client's log.
fn trainer_failed(reason: String) -> Refusal {
    tracing::warn!(%reason, "the trainer failed");
    ComputationError::TrainerFailed.into()
}

/// The received model's figures on this client's examples, if admission permitted them (a
/// plain upload to a trusted curator, without a policy): under a local mechanism or secure
/// aggregation the server is the adversary, so nothing beside the protected values leaves the
/// client. A failed evaluation is logged here and not reported.
fn evaluation(work: &Work, trainer: &dyn Trainer) -> Option<Evaluation> {
    let task = &work.task;
    if work.protection != (Protection::Plain { evaluate: true }) {
        return None;
    }
    let evaluated = trainer.evaluate(&task.model, &work.received);
    let valid =
        |e: &Evaluation| e.loss.is_finite() && (0.0..=1.0).contains(&e.accuracy) && e.examples > 0;
    match evaluated {
        Ok(e) if valid(&e) => Some(e),
        Ok(e) => {
            tracing::warn!(?e, "the trainer's evaluation is unusable: not reported");
            None
        }
        Err(reason) => {
            tracing::warn!(%reason, "the trainer could not evaluate: not reported");
            None
        }
    }
}

/// Runs `work` (a trainer's steps) holding one of the process's cores, which it shares with
/// the other clients' training and, in `fl sim`, the server's test evaluation. The federated
/// evaluation runs after the hold is given back: its workers hold cores of their own.
fn on_a_core<T>(work: impl FnOnce() -> T) -> T {
    let _core = CoreBudget::process().hold();
    work()
}

/// The request the trainer gets.
fn request(work: &Work) -> TrainRequest {
    TrainRequest {
        round: work.task.round,
        model: work.task.model.clone(),
        config: work.task.config,
        seed: work.seed,
    }
}

/// FedAvg's local training from w_t, then the round's mechanism on u = w_k - w_t.
fn fedavg(work: &Work, trainer: &dyn Trainer, noise_rng: &mut StdRng) -> Result<Computed, Refusal> {
    let global = &work.received;
    let request = request(work);
    let mechanism = work.protection.local();
    let (weights, loss, examples) = match mechanism.map(LocalMechanism::gradient_rule) {
        Some(GradientRule::ClippedL1 { clip, steps }) => {
            let sgd = built_in(trainer)?;
            let (weights, loss) = on_a_core(|| sgd.train_clipped_l1(&request, global, clip, steps))
                .map_err(trainer_failed)?;
            (weights, Some(loss), sgd.examples())
        }
        Some(GradientRule::Mean) | None => {
            let t = on_a_core(|| trainer.train(&request, global)).map_err(trainer_failed)?;
            (t.weights, t.loss, t.examples)
        }
    };
    if weights.len() != global.len() {
        return Err(ComputationError::TrainerLength {
            returned: weights.len(),
            params: global.len(),
        }
        .into());
    }
    let mut u = weights;
    subtract_global(&mut u, global);
    let Some(mechanism) = mechanism else {
        return Ok(Computed::Plain {
            values: u,
            loss,
            examples,
            evaluation: evaluation(work, trainer),
        });
    };
    let protected = mechanism.protect_update(u, &work.task.config, noise_rng)?;
    Ok(Computed::Protected(protected))
}

/// One inexact-ADMM primal step from the anchor and point the task carries.
fn admm_step(
    work: &Work,
    step: AdmmStep,
    sgd: &SgdTrainer,
    noise_rng: &mut StdRng,
) -> Result<Computed, Refusal> {
    let d = work.task.model.num_params();
    let received = &work.received;
    if received.len() != 2 * d {
        return Err(ComputationError::AdmmTensor {
            params: d,
            sent: received.len(),
        }
        .into());
    }
    let (anchor, point) = received.split_at(d);
    let mechanism = work.protection.local();
    let clip = match mechanism.map(|m| (m, m.gradient_rule())) {
        None => f64::INFINITY,
        Some((_, GradientRule::ClippedL1 { clip, .. })) => clip,
        Some((m, GradientRule::Mean)) => return Err(ProtectError::NoAdmmStep(m.name()).into()),
    };
    let (gradient_sum, loss) =
        on_a_core(|| sgd.clipped_gradient_sum(&work.task.model, point, clip))
            .map_err(trainer_failed)?;
    let z = primal_step(anchor, &gradient_sum, step.rho, step.total_examples);
    match mechanism {
        None => Ok(Computed::Plain {
            values: z,
            loss: Some(loss),
            examples: sgd.examples(),
            evaluation: None,
        }),
        Some(m) => {
            let protected = m.protect_admm_step(z, step.rho, step.total_examples, noise_rng)?;
            Ok(Computed::Protected(protected))
        }
    }
}
