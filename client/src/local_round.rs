//! What a client computes for a plain (not secure-aggregation) round: it trains, by FedAvg's
//! local SGD or one inexact-ADMM step, then protects the result with the round's local mechanism
//! before anything leaves the device.
//!
//! - FedAvg, no mechanism: u = w_local - w_t.
//! - `ldp-gaussian`: u clipped to L2 norm C, plus N(0, sigma^2) with sigma the analytic Gaussian
//!   calibration for (eps, delta) at sensitivity 2C.
//! - `ldp-laplace`: SGD on per-example gradients clipped in L1 to C, plus Laplace(Delta / eps) with
//!   Delta = 2 C eta (1/B_min + steps - 1) ([`sgd_l1_sensitivity`]; B_min is the smallest batch).
//! - `signds`: the update's sign s and h dimensions J (EM-MDS) instead of the update.
//! - IADMM: z_p = a_p - (1/(rho I)) sum_i clip_1(grad f_i(z_p^t)), plus Laplace(2C/(rho I eps))
//!   under `ldp-laplace` (seed 004, Example 2).
//!
//! Noise and SignDS draws come from an OS-seeded CSPRNG, even in seeded runs; the seed only fixes
//! the order of local examples.

use crate::LocalData;
use fl_common::admm::{laplace_sensitivity, primal_step};
use fl_common::model::{GradientRule, LocalConfig, ModelSpec, clipped_gradient_sum, train_local};
use fl_common::privacy::{
    LocalMechanism, Release, add_gaussian_noise, add_laplace_noise, clip_l2, sgd_l1_sensitivity,
};
use fl_common::signds::SignDs;
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
/// is built from the mechanism's output alone: those variants hold nothing else (no loss, and
/// the client's example count is never attached to them).
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
    /// A local mechanism's dense output.
    Released {
        /// The protected values.
        values: Vec<f32>,
        /// The mechanism and its parameters.
        release: Release,
    },
    /// A SignDS release.
    Sign {
        /// s.
        sign: i8,
        /// J, sorted.
        indices: Vec<u32>,
        /// Its epsilon.
        release: Release,
    },
}

impl Upload {
    /// The privacy loss of the upload, if protected.
    pub(crate) fn release(&self) -> Option<&Release> {
        match self {
            Self::Plain { .. } => None,
            Self::Released { release, .. } | Self::Sign { release, .. } => Some(release),
        }
    }

    /// A dense upload: `release` protected `values`, or nothing did (`loss` then goes along).
    fn dense(values: Vec<f32>, loss: f32, release: Option<Release>) -> Self {
        match release {
            Some(release) => Self::Released { values, release },
            None => Self::Plain { values, loss },
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
    if let Upload::Plain { values, .. } | Upload::Released { values, .. } = &upload
        && !values.iter().all(|v| v.is_finite())
    {
        return Err("local training diverged (non-finite parameters)".into());
    }
    Ok(upload)
}

fn fedavg(
    work: &Work,
    global: &[f32],
    local: &LocalData,
    seed: u64,
    noise_rng: &mut StdRng,
) -> Result<Upload, String> {
    let rule = match work.mechanism {
        Some(LocalMechanism::Laplace { clip, .. }) => GradientRule::ClippedL1(clip),
        _ => GradientRule::Mean,
    };
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
    let release = match work.mechanism {
        None => None,
        Some(LocalMechanism::Gaussian {
            epsilon,
            delta,
            clip,
        }) => {
            clip_l2(&mut u, clip);
            let release = Release::gaussian(epsilon, delta, clip).map_err(|e| e.to_string())?;
            add_gaussian_noise(&mut u, release.noise, noise_rng);
            Some(release)
        }
        Some(LocalMechanism::Laplace { epsilon, clip }) => {
            let n = local.indices.len();
            let batch = (work.config.batch_size as usize).clamp(1, n);
            let smallest = match n % batch {
                0 => batch,
                rest => rest,
            };
            let steps = u64::from(work.config.epochs) * n.div_ceil(batch) as u64;
            let sensitivity =
                sgd_l1_sensitivity(clip, f64::from(work.config.learning_rate), smallest, steps);
            let release = Release::laplace(epsilon, sensitivity);
            add_laplace_noise(&mut u, release.noise, noise_rng);
            Some(release)
        }
        Some(LocalMechanism::SignDs { epsilon, k, h }) => {
            let mechanism = SignDs::new(u.len(), k, h, epsilon).map_err(|e| e.to_string())?;
            let (sign, indices) = mechanism.release(&u, noise_rng);
            return Ok(Upload::Sign {
                sign,
                indices,
                release: Release::signds(epsilon),
            });
        }
    };
    Ok(Upload::dense(u, loss, release))
}

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
    let (clip, epsilon) = match work.mechanism {
        None => (f64::INFINITY, None),
        Some(LocalMechanism::Laplace { epsilon, clip }) => (clip, Some(epsilon)),
        Some(other) => {
            return Err(format!(
                "IADMM rounds support ldp-laplace only, not {}",
                other.name()
            ));
        }
    };
    let n = local.indices.len();
    let (gradient_sum, loss_sum) =
        clipped_gradient_sum(&work.spec, point, &local.data, &local.indices, clip);
    let mut z = primal_step(anchor, &gradient_sum, step.rho, step.total_examples);
    let release = epsilon.map(|epsilon| {
        let sensitivity = laplace_sensitivity(clip, step.rho, step.total_examples);
        let release = Release::laplace(epsilon, sensitivity);
        add_laplace_noise(&mut z, release.noise, noise_rng);
        release
    });
    Ok(Upload::dense(
        z,
        (loss_sum / n.max(1) as f64) as f32,
        release,
    ))
}
