//! What a client computes for a plain (not secure-aggregation) round: it trains, by FedAvg's
//! local SGD or one inexact-ADMM step, then protects the result with the round's local mechanism
//! (`fl_common::privacy::Protected`) before anything leaves the device.
//!
//! - FedAvg, no mechanism: u = w_local - w_t.
//! - FedAvg under a mechanism: `LocalMechanism::protect_update`.
//! - IADMM: z_p = a_p - (1/(rho I)) sum_i clip_1(grad f_i(z_p^t)), plus Laplace(2C/(rho I eps))
//!   under `ldp-laplace` (seed 004, Example 2).
//!
//! Noise and SignDS draws come from an OS-seeded CSPRNG, even in seeded runs; the seed only fixes
//! the order of local examples.

use crate::LocalData;
use fl_common::admm::{laplace_sensitivity, primal_step};
use fl_common::model::{GradientRule, LocalConfig, ModelSpec, clipped_gradient_sum, train_local};
use fl_common::privacy::{LocalMechanism, LocalSgd, Protected, Release, add_laplace_noise};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// One inexact-ADMM step's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AdmmStep {
    /// rho.
    pub rho: f64,
    /// I: examples over all clients.
    pub total_examples: u64,
}

/// What a round asks of this client, after its own limits were applied.
#[derive(Debug, Clone)]
pub(crate) struct Work {
    /// The model.
    pub spec: ModelSpec,
    /// E, B, eta.
    pub config: LocalConfig,
    /// The local mechanism, if any.
    pub mechanism: Option<LocalMechanism>,
    /// Present for an IADMM round.
    pub admm: Option<AdmmStep>,
}

/// What the client uploads. Under a local mechanism the server is the adversary, so an upload
/// is the mechanism's [`Protected`] output alone (no loss, and the client's example count is
/// never attached to it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Upload {
    /// No local mechanism (the curator is trusted): u for FedAvg or z_p for IADMM, and the
    /// training loss.
    Plain {
        /// The values.
        values: Vec<f32>,
        /// Mean training loss.
        loss: f32,
    },
    /// A local mechanism's release.
    Protected(Protected),
}

impl Upload {
    /// The privacy loss of the upload, if protected.
    pub(crate) fn release(&self) -> Option<&Release> {
        match self {
            Self::Plain { .. } => None,
            Self::Protected(p) => Some(p.release()),
        }
    }
}

/// Runs the round's local computation on `received` (the global model, or for IADMM the anchor
/// followed by the point) and protects the result.
pub(crate) fn compute(
    work: &Work,
    received: &[f32],
    local: &LocalData,
    seed: u64,
) -> Result<Upload, String> {
    let mut noise_rng = StdRng::from_os_rng();
    let upload = match work.admm {
        Some(step) => admm_step(work, step, received, local, &mut noise_rng)?,
        None => fedavg(work, received, local, seed, &mut noise_rng)?,
    };
    if let Upload::Plain { values, .. } | Upload::Protected(Protected::Dense { values, .. }) =
        &upload
        && !values.iter().all(|v| v.is_finite())
    {
        return Err("local training diverged (non-finite parameters)".into());
    }
    Ok(upload)
}

/// FedAvg's local SGD from `global`, then the round's mechanism on u = w_local - w_t.
fn fedavg(
    work: &Work,
    global: &[f32],
    local: &LocalData,
    seed: u64,
    noise_rng: &mut StdRng,
) -> Result<Upload, String> {
    let mechanism = work.mechanism.as_ref();
    let rule = mechanism.map_or(GradientRule::Mean, LocalMechanism::gradient_rule);
    let mut params = global.to_vec();
    let mut shuffle = StdRng::seed_from_u64(seed);
    let loss = train_local(
        &work.spec,
        &mut params,
        &local.data,
        &local.indices,
        &work.config,
        rule,
        &mut shuffle,
    );
    let mut u = params;
    for (p, g) in u.iter_mut().zip(global) {
        *p -= g;
    }
    let Some(mechanism) = mechanism else {
        return Ok(Upload::Plain { values: u, loss });
    };
    let sgd = LocalSgd {
        examples: local.indices.len(),
        config: work.config,
    };
    mechanism
        .protect_update(u, &sgd, noise_rng)
        .map(Upload::Protected)
}

/// One inexact-ADMM primal step from the anchor and point in `received`.
fn admm_step(
    work: &Work,
    step: AdmmStep,
    received: &[f32],
    local: &LocalData,
    noise_rng: &mut StdRng,
) -> Result<Upload, String> {
    let d = work.spec.num_params();
    if received.len() != 2 * d {
        return Err(format!(
            "an IADMM task carries 2 x {d} values (anchor and point), not {}",
            received.len()
        ));
    }
    let (anchor, point) = received.split_at(d);
    let (clip, epsilon) = match &work.mechanism {
        None => (f64::INFINITY, None),
        Some(m) => m
            .admm_laplace()
            .map(|(clip, epsilon)| (clip, Some(epsilon)))?,
    };
    let n = local.indices.len();
    let (gradient_sum, loss_sum) =
        clipped_gradient_sum(&work.spec, point, &local.data, &local.indices, clip);
    let mut z = primal_step(anchor, &gradient_sum, step.rho, step.total_examples);
    let Some(epsilon) = epsilon else {
        let loss = (loss_sum / n.max(1) as f64) as f32;
        return Ok(Upload::Plain { values: z, loss });
    };
    let release = Release::laplace(
        epsilon,
        laplace_sensitivity(clip, step.rho, step.total_examples),
    );
    add_laplace_noise(&mut z, release.noise, noise_rng);
    Ok(Upload::Protected(Protected::Dense { values: z, release }))
}
