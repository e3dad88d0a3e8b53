//! Client-side (local) mechanisms: Laplace noise on an output, and the L1 sensitivity of local SGD
//! (the L1 clip is [`fl_model::norms::clip_l1`]).
//!
//! Laplace output perturbation (APPFL): L1 sensitivity Delta, noise Laplace(Delta/eps) per
//! coordinate, eps-DP per release (Dwork and Roth 2014, Thm 3.6). Delta for FedAvg's local SGD is
//! [`sgd_l1_sensitivity`]. What releases cost over rounds is in [`super::release`].

use rand::{CryptoRng, Rng};

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

#[cfg(test)]
mod tests {
    use super::*;
    use fl_datasets::Dataset;
    use fl_model::{GradientRule, LocalConfig, ModelSpec, train_local};
    use ndarray::Array2;
    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use rand_chacha::ChaCha8Rng;

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

    /// Replacing one example moves the output of L1-clipped SGD by no more than the sensitivity
    /// the Laplace mechanism is calibrated to, 2 C eta (1/B + steps - 1), for one full-batch step
    /// (the seed's 2 C eta / I_p) and for several mini-batch steps.
    #[test]
    fn clipped_sgd_stays_within_its_l1_sensitivity() {
        let n = 20;
        let make = |last_label: u32, shift: f32| {
            let labels: Vec<u32> = (0..n)
                .map(|i| {
                    if i == n - 1 {
                        last_label
                    } else {
                        (i % 3) as u32
                    }
                })
                .collect();
            let features = Array2::from_shape_fn((n, 4), |(i, j)| {
                let v = ((i * 5 + j * 3) % 7) as f32 - 3.0;
                if i == n - 1 { v * shift } else { v }
            });
            Dataset::new(features, labels, 3).unwrap()
        };
        let (a, b) = (make(0, 1.0), make(2, -4.0));
        let spec = ModelSpec::mlp(4, &[5], 3).unwrap();
        let start = spec.init(&mut ChaCha8Rng::seed_from_u64(2));
        let all: Vec<usize> = (0..n).collect();
        let clip = 0.5;
        // One full-batch step, several small-batch steps, and batches larger than the client.
        for (steps, batch) in [(1u64, n as u32), (12, 5), (3, 2 * n as u32)] {
            let config = LocalConfig {
                epochs: 1,
                batch_size: batch,
                learning_rate: 0.3,
                random_shift: 0,
            };
            let run = |data: &Dataset| {
                let mut p = start.clone();
                let rule = GradientRule::ClippedL1 { clip, steps };
                let mut rng = ChaCha8Rng::seed_from_u64(9);
                train_local(&spec, &mut p, data, &all, &config, rule, &mut rng);
                p
            };
            let (pa, pb) = (run(&a), run(&b));
            let moved: f64 = pa
                .iter()
                .zip(&pb)
                .map(|(x, y)| f64::from(x - y).abs())
                .sum();
            let bound = sgd_l1_sensitivity(clip, 0.3, batch as usize, steps);
            assert!(
                moved > 0.0 && moved <= bound * (1.0 + 1e-5),
                "{moved} > {bound}"
            );
        }
    }
}
