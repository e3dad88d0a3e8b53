//! Client-side (local) mechanisms: Gaussian noise on a clipped update and Laplace noise on an
//! output, with what each costs a client over the rounds it takes part in.
//!
//! Gaussian local DP (W_p = W + G): the client clips its update u to L2 norm C and adds
//! N(0, sigma^2) per coordinate; replacing all of the client's data moves u by at most 2C, so one
//! release has RDP alpha (2C)^2 / (2 sigma^2) (Mironov 2017, Prop. 7) and r releases compose to r
//! times that. Laplace output perturbation (APPFL): L1 sensitivity Delta, noise Laplace(Delta/eps)
//! per coordinate, eps-DP per release (Dwork and Roth 2014, Thm 3.6); r releases compose to r eps
//! (basic composition). Delta for FedAvg's local SGD is [`sgd_l1_sensitivity`].

use super::accountant::{check_delta, epsilon_from_rdp};
use super::rdp::default_orders;
use rand::{CryptoRng, Rng};

/// The L1 norm of `u`.
pub fn l1_norm(u: &[f32]) -> f64 {
    u.iter().map(|&v| f64::from(v).abs()).sum()
}

/// u <- u / max(1, ||u||_1 / C), re-checked so rounding never leaves it above C; returns the
/// original norm.
pub fn clip_l1(u: &mut [f32], bound: f64) -> f64 {
    const SAFETY: f64 = 1.0 - 1e-6;
    let original = l1_norm(u);
    let mut norm = original;
    while norm > bound {
        let factor = (bound / norm * SAFETY) as f32;
        u.iter_mut().for_each(|v| *v *= factor);
        norm = l1_norm(u);
    }
    original
}

/// Adds Laplace(0, scale) to each value, by inverse CDF from a CSPRNG's uniform draws:
/// x = -scale sgn(U) ln(1 - 2|U|), U uniform on (-1/2, 1/2). Floating-point Laplace noise has
/// known weaknesses in its lowest bits (Mironov 2012); at model-update scales they are far below
/// the noise, and the discrete Gaussian is the float-free alternative.
pub fn add_laplace_noise<R: Rng + CryptoRng>(values: &mut [f32], scale: f64, rng: &mut R) {
    if scale == 0.0 {
        return;
    }
    for v in values {
        let u: f64 = rng.random::<f64>() - 0.5;
        let x = -scale * u.signum() * (1.0 - 2.0 * u.abs()).ln();
        *v = (f64::from(*v) + x) as f32;
    }
}

/// L1 sensitivity of a model released after `steps` SGD steps of rate eta on per-example
/// gradients clipped in L1 to C, in batches of B examples: Delta = 2 C eta (1/B + steps - 1).
/// The first step that sees the changed example moves by at most 2 C eta / B (the seed's case:
/// one full-batch step, B = I_p, gives 2 C eta / I_p); after it the two trajectories differ, so
/// with no smoothness assumed every later step's mean clipped gradient may differ by 2C. Output
/// perturbation after several local steps therefore pays almost linearly in the steps.
pub fn sgd_l1_sensitivity(clip: f64, learning_rate: f64, batch: usize, steps: u64) -> f64 {
    2.0 * clip * learning_rate * (1.0 / batch.max(1) as f64 + steps.saturating_sub(1) as f64)
}

/// epsilon after `releases` Gaussian local releases of an update clipped to L2 norm `clip` with
/// noise std `sigma`, at `delta`: RDP alpha (2C)^2 / (2 sigma^2) per release (replace-one),
/// composed and converted as in [`epsilon_from_rdp`].
pub fn local_gaussian_epsilon(sigma: f64, clip: f64, releases: u64, delta: f64) -> f64 {
    if releases == 0 || check_delta(delta).is_err() {
        return 0.0;
    }
    let orders = default_orders();
    let per = (2.0 * clip).powi(2) / (2.0 * sigma * sigma);
    let rdp: Vec<f64> = orders.iter().map(|a| releases as f64 * a * per).collect();
    epsilon_from_rdp(&orders, &rdp, delta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    /// Laplace(b) has mean 0 and variance 2 b^2; both within 5 standard errors for n = 10^6
    /// (the variance's standard error uses the fourth moment 24 b^4).
    #[test]
    fn laplace_noise_has_the_configured_scale() {
        let b = 0.3;
        let n = 1_000_000;
        let mut v = vec![0f32; n];
        add_laplace_noise(&mut v, b, &mut StdRng::seed_from_u64(7));
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / (n - 1) as f64;
        let var_true = 2.0 * b * b;
        assert!(
            mean.abs() < 5.0 * (var_true / n as f64).sqrt(),
            "mean {mean}"
        );
        let se_var = ((24.0 * b.powi(4) - var_true * var_true) / n as f64).sqrt();
        assert!(
            (var - var_true).abs() < 5.0 * se_var,
            "variance {var} vs {var_true}"
        );
    }

    #[test]
    fn sgd_sensitivity_is_the_seeds_for_one_step_and_grows_with_steps() {
        // One full-batch step over I_p = 600 examples: 2 C eta / I_p.
        assert!((sgd_l1_sensitivity(1.0, 0.1, 600, 1) - 2.0 * 0.1 / 600.0).abs() < 1e-15);
        let one = sgd_l1_sensitivity(1.0, 0.1, 20, 1);
        let thirty = sgd_l1_sensitivity(1.0, 0.1, 20, 30);
        assert!((thirty - (one + 29.0 * 0.2)).abs() < 1e-12);
    }

    #[test]
    fn l1_clipping_bounds_the_norm() {
        let mut rng = StdRng::seed_from_u64(8);
        for _ in 0..500 {
            let mut u: Vec<f32> = (0..50).map(|_| rng.random_range(-3.0..3.0)).collect();
            let before = u.clone();
            let norm = clip_l1(&mut u, 1.5);
            assert!(l1_norm(&u) <= 1.5);
            if norm <= 1.5 {
                assert_eq!(u, before);
            }
        }
    }

    /// One release at sigma = 2C sqrt(2 ln(1.25/delta)) / eps is (eps, delta)-DP by the classic
    /// bound; the RDP conversion gives no more than that eps (here eps = 0.5), and r releases cost
    /// more than one but at most r times as much.
    #[test]
    fn composed_local_loss_grows_with_participation() {
        let (clip, delta, eps) = (1.0, 1e-5, 0.5);
        let sigma = 2.0 * clip * (2.0 * (1.25f64 / delta).ln()).sqrt() / eps;
        let one = local_gaussian_epsilon(sigma, clip, 1, delta);
        assert!(one <= eps, "{one}");
        let ten = local_gaussian_epsilon(sigma, clip, 10, delta);
        assert!(ten > one && ten <= 10.0 * eps, "{ten}");
        assert_eq!(local_gaussian_epsilon(sigma, clip, 0, delta), 0.0);
    }
}
