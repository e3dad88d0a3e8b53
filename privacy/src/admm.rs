//! Inexact ADMM (IADMM) for federated learning, as in APPFL (../shared/seeds/004): consensus
//! min_w sum_p (1/I) sum_{i in I_p} f_i(w) with a local copy z_p and a dual lambda_p per client.
//!
//! - Server (consensus): w <- argmin_w sum_p <lambda_p, w> + rho/2 ||w - z_p||^2
//!   = (1/P) sum_p (z_p - lambda_p / rho).
//! - Client p (one linearised step): z_p <- w + (1/rho)(lambda_p - g_p), with
//!   g_p = (1/I) sum_{i in I_p} grad f_i(z_p) (per-example gradients clipped in L1 to C when
//!   private), then Laplace noise of scale Delta/eps with Delta = 2C/(rho I) (seed, eq. for
//!   IADMM's sensitivity: one example changes g_p by at most 2C/I, scaled by 1/rho).
//! - Dual: lambda_p <- lambda_p + rho (w - z_p), computed from the released (noised) z_p, so the
//!   server can keep every lambda_p itself (post-processing: no extra privacy cost).
//! - Residual balancing (Boyd et al. 2011, Sec. 3.4.1): with primal residual r = ||w - z||
//!   and dual residual s = rho ||w_new - w_old||, rho <- rho tau if r > mu s, rho / tau if s > mu r.

/// One client's IADMM state: its last released primal z_p and its dual lambda_p.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientState {
    /// z_p.
    pub z: Vec<f32>,
    /// lambda_p.
    pub lambda: Vec<f32>,
}

impl ClientState {
    /// z_p = w, lambda_p = 0: the state before a client's first round.
    pub fn start(w: &[f32]) -> Self {
        Self {
            z: w.to_vec(),
            lambda: vec![0.0; w.len()],
        }
    }
}

/// The anchor a_p = w + lambda_p / rho the server sends client p: the primal step then needs
/// only a_p and the point z_p at which to take the gradient.
pub fn anchor(w: &[f32], lambda: &[f32], rho: f64) -> Vec<f32> {
    let inv_rho = (1.0 / rho) as f32;
    w.iter()
        .zip(lambda)
        .map(|(&w, &l)| w + inv_rho * l)
        .collect()
}

/// z_p <- w + (1/rho)(lambda_p - g_p) = a_p - g_p / rho, with g_p = `gradient_sum` / I,
/// `gradient_sum` = sum_{i in I_p} grad f_i(z_p) and `total_examples` = I over all clients.
pub fn primal_step(
    anchor: &[f32],
    gradient_sum: &[f32],
    rho: f64,
    total_examples: u64,
) -> Vec<f32> {
    let scale = (1.0 / (rho * total_examples as f64)) as f32;
    anchor
        .iter()
        .zip(gradient_sum)
        .map(|(&a, &g)| a - scale * g)
        .collect()
}

/// lambda_p <- lambda_p + rho (w - z_p).
pub fn dual_step(lambda: &mut [f32], w: &[f32], z: &[f32], rho: f64) {
    let rho = rho as f32;
    for ((l, &w), &z) in lambda.iter_mut().zip(w).zip(z) {
        *l += rho * (w - z);
    }
}

/// w <- (1/P) sum_p (z_p - lambda_p / rho) over every client's state.
pub fn consensus<'a>(
    states: impl IntoIterator<Item = &'a ClientState>,
    dim: usize,
    rho: f64,
) -> Vec<f32> {
    let mut w = vec![0.0f64; dim];
    let mut count = 0usize;
    for s in states {
        for ((acc, &z), &l) in w.iter_mut().zip(&s.z).zip(&s.lambda) {
            *acc += f64::from(z) - f64::from(l) / rho;
        }
        count += 1;
    }
    w.into_iter()
        .map(|v| (v / count.max(1) as f64) as f32)
        .collect()
}

/// The L1 sensitivity of a released z_p: Delta = 2C / (rho I).
pub fn laplace_sensitivity(clip: f64, rho: f64, total_examples: u64) -> f64 {
    2.0 * clip / (rho * total_examples as f64)
}

/// Residual balancing: the next rho given the primal residual r and dual residual s.
pub fn balance_rho(rho: f64, primal_residual: f64, dual_residual: f64, mu: f64, tau: f64) -> f64 {
    if primal_residual > mu * dual_residual {
        rho * tau
    } else if dual_residual > mu * primal_residual {
        rho / tau
    } else {
        rho
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two clients whose examples each have f_i(w) = (w - c_p)^2 / 2 (gradient sum I_p (z - c_p)):
    /// IADMM without noise converges to the weighted consensus optimum (I_1 c_1 + I_2 c_2) / I.
    /// The linearised step needs rho above the local objective's curvature (here I_p / I <= 0.75).
    #[test]
    fn converges_to_the_consensus_optimum_on_a_quadratic() {
        let (c, n) = ([1.0f32, 5.0], [30u64, 10]);
        let total = n.iter().sum::<u64>();
        let rho = 2.0;
        let mut states = vec![ClientState::start(&[0.0]), ClientState::start(&[0.0])];
        let mut w = vec![0.0f32];
        // The seed's order: w^{t+1} from (z^t, lambda^t), then z^{t+1} and lambda^{t+1}.
        for _ in 0..500 {
            w = consensus(&states, 1, rho);
            for (p, s) in states.iter_mut().enumerate() {
                let grad = [n[p] as f32 * (s.z[0] - c[p])];
                s.z = primal_step(&anchor(&w, &s.lambda, rho), &grad, rho, total);
                dual_step(&mut s.lambda, &w, &s.z, rho);
            }
        }
        let optimum = (30.0 * 1.0 + 10.0 * 5.0) / 40.0;
        assert!((w[0] - optimum).abs() < 1e-3, "w = {} vs {optimum}", w[0]);
    }

    #[test]
    fn rho_follows_the_larger_residual() {
        assert_eq!(balance_rho(1.0, 100.0, 1.0, 10.0, 2.0), 2.0);
        assert_eq!(balance_rho(1.0, 1.0, 100.0, 10.0, 2.0), 0.5);
        assert_eq!(balance_rho(1.0, 5.0, 1.0, 10.0, 2.0), 1.0);
        assert_eq!(laplace_sensitivity(1.0, 2.0, 100), 0.01);
    }
}
