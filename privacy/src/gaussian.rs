//! The Gaussian mechanism's noise: N(0, std^2) added to every coordinate, drawn only from a
//! cryptographically secure generator (the `CryptoRng` bound makes any other generator a compile
//! error).
//!
//! Floating-point samplers have known weaknesses in their lowest bits (Mironov 2012 for Laplace);
//! for a federated sum of model updates the noise scale dwarfs them, and the distributed
//! discrete-Gaussian option of secure aggregation avoids floats entirely.

use rand::{CryptoRng, Rng};
use rand_distr::{Distribution, Normal};

/// Adds N(0, std^2) independently to each value. `std` must be finite and non-negative.
pub fn add_gaussian_noise<R: Rng + CryptoRng>(values: &mut [f32], std: f64, rng: &mut R) {
    if std == 0.0 {
        return;
    }
    let normal = Normal::new(0.0, std).expect("std is finite and non-negative");
    for v in values {
        *v = (f64::from(*v) + normal.sample(rng)) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    /// The added noise has mean 0 and the configured standard deviation. With n = 10^6 draws, the
    /// sample mean has standard error std/sqrt(n) and the sample variance has standard error
    /// std^2 sqrt(2/(n-1)); both are checked at 5 standard errors (fixed seed).
    #[test]
    fn noise_has_the_configured_standard_deviation() {
        let std = 0.37;
        let n = 1_000_000;
        let mut values = vec![1.5f32; n];
        add_gaussian_noise(&mut values, std, &mut StdRng::seed_from_u64(42));
        let noise: Vec<f64> = values.iter().map(|&v| f64::from(v) - 1.5).collect();
        let mean = noise.iter().sum::<f64>() / n as f64;
        let var = noise.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let se_mean = std / (n as f64).sqrt();
        let se_var = std * std * (2.0 / (n - 1) as f64).sqrt();
        assert!(mean.abs() < 5.0 * se_mean, "mean {mean}");
        assert!(
            (var - std * std).abs() < 5.0 * se_var,
            "variance {var} vs {}",
            std * std
        );
    }
}
