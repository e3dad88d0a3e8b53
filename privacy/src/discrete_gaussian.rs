//! Exact sampling of the discrete Gaussian N_Z(0, sigma^2) with integer arithmetic only
//! (Canonne, Kamath, Steinke 2020, "The Discrete Gaussian for Differential Privacy", Algs 1-3).
//! No floating point touches the sample, so the distribution is exactly the one the accountant
//! assumes. sigma^2 is rounded *up* to an integer: more noise than accounted, never less.
//!
//! Written by hand: no maintained Rust crate implements the CKS sampler.

use rand::{CryptoRng, Rng};

/// Bernoulli(num / den).
fn bernoulli<R: Rng + CryptoRng>(num: u128, den: u128, rng: &mut R) -> bool {
    rng.random_range(0..den) < num
}

/// Bernoulli(exp(-num/den)) for num/den >= 0 (CKS Alg. 1).
fn bernoulli_exp_neg<R: Rng + CryptoRng>(num: u128, den: u128, rng: &mut R) -> bool {
    if num <= den {
        // K = 1; while Bernoulli(gamma / K): K += 1; return K odd.
        let mut k: u128 = 1;
        while bernoulli(num, den * k, rng) {
            k += 1;
        }
        k % 2 == 1
    } else {
        for _ in 0..num / den {
            if !bernoulli_exp_neg(1, 1, rng) {
                return false;
            }
        }
        bernoulli_exp_neg(num % den, den, rng)
    }
}

/// The discrete Laplace with scale t: P(Y = y) proportional to exp(-|y|/t) (CKS Alg. 2, s = 1).
fn discrete_laplace<R: Rng + CryptoRng>(t: u128, rng: &mut R) -> i128 {
    loop {
        let u = rng.random_range(0..t);
        if !bernoulli_exp_neg(u, t, rng) {
            continue;
        }
        let mut v: u128 = 0;
        while bernoulli_exp_neg(1, 1, rng) {
            v += 1;
        }
        let x = u + t * v;
        let negative = rng.random_bool(0.5);
        if negative && x == 0 {
            continue;
        }
        return if negative { -(x as i128) } else { x as i128 };
    }
}

/// Largest variance the sampler takes: 2^60 (larger requests are clamped to it).
pub const MAX_VARIANCE: u64 = 1 << 60;

/// The integer variance used for a requested standard deviation: ceil(sigma^2), at least 1.
pub fn discrete_variance(sigma: f64) -> u64 {
    (sigma * sigma).ceil().max(1.0) as u64
}

/// One draw of N_Z(0, sigma2) for an integer variance 1 <= sigma2 <= 2^60 (CKS Alg. 3): propose
/// Y ~ DLap(t), t = floor(sigma) + 1, accept with probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)).
/// In integers: gamma = (|Y| t - sigma2)^2 / (2 sigma2 t^2). A proposal so far out that this
/// overflows u128 (|Y| t > 2^64) has acceptance probability below exp(-2^60) and is rejected.
pub fn sample_discrete_gaussian<R: Rng + CryptoRng>(sigma2: u64, rng: &mut R) -> i64 {
    let sigma2 = sigma2.clamp(1, MAX_VARIANCE);
    let s2 = u128::from(sigma2);
    let t = (sigma2 as f64).sqrt().floor() as u128 + 1;
    let t = if t * t <= s2 { t + 1 } else { t }; // guard float sqrt: t > sigma
    loop {
        let y = discrete_laplace(t, rng);
        let a = y.unsigned_abs();
        let accepted = a
            .checked_mul(t)
            .filter(|&at| at < 1 << 64)
            .and_then(|at| {
                let diff = at.abs_diff(s2);
                let num = diff.checked_mul(diff)?;
                let den = 2u128.checked_mul(s2)?.checked_mul(t * t)?;
                Some(bernoulli_exp_neg(num, den, rng))
            })
            .unwrap_or(false);
        if accepted {
            return y as i64;
        }
    }
}

/// Adds independent N_Z(0, sigma2) to every value.
pub fn add_discrete_gaussian_noise<R: Rng + CryptoRng>(
    values: &mut [i64],
    sigma2: u64,
    rng: &mut R,
) {
    for v in values {
        *v += sample_discrete_gaussian(sigma2, rng);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    /// Large sigma: mean 0 and variance sigma^2 (the discrete Gaussian's variance is below
    /// sigma^2 by less than 1e-100 here), each within 5 standard errors of n = 200,000 draws.
    #[test]
    fn moments_match_for_a_wide_distribution() {
        let sigma2 = 10_000u64;
        let mut rng = StdRng::seed_from_u64(3);
        let n = 200_000;
        let xs: Vec<f64> = (0..n)
            .map(|_| sample_discrete_gaussian(sigma2, &mut rng) as f64)
            .collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let s2 = sigma2 as f64;
        assert!(mean.abs() < 5.0 * (s2 / n as f64).sqrt(), "mean {mean}");
        assert!(
            (var - s2).abs() < 5.0 * s2 * (2.0 / n as f64).sqrt(),
            "variance {var}"
        );
    }

    /// Small sigma (sigma^2 = 2): the frequencies of -4..=4 and of the tail |k| > 4 against the
    /// exact pmf exp(-k^2/4)/Z; chi-square with 9 degrees of freedom under 27.88 (p = 0.001).
    #[test]
    fn small_sigma_matches_the_exact_pmf() {
        let mut rng = StdRng::seed_from_u64(4);
        let n = 100_000;
        let mut counts = [0f64; 10];
        for _ in 0..n {
            let x = sample_discrete_gaussian(2, &mut rng);
            counts[if x.abs() <= 4 { (x + 4) as usize } else { 9 }] += 1.0;
        }
        let pmf = |k: i64| (-(k * k) as f64 / 4.0).exp();
        let z: f64 = (-60i64..=60).map(pmf).sum();
        let mut expected: Vec<f64> = (-4i64..=4).map(|k| n as f64 * pmf(k) / z).collect();
        expected.push(n as f64 - expected.iter().sum::<f64>());
        let chi2: f64 = counts
            .iter()
            .zip(&expected)
            .map(|(c, e)| (c - e).powi(2) / e)
            .sum();
        assert!(chi2 < 27.88, "chi-square {chi2}");
    }

    #[test]
    fn bernoulli_exp_neg_has_the_right_rate() {
        let mut rng = StdRng::seed_from_u64(5);
        let n = 100_000;
        for (num, den) in [(1u128, 2u128), (5, 2), (0, 1)] {
            let p = (-(num as f64) / den as f64).exp();
            let hits = (0..n)
                .filter(|_| bernoulli_exp_neg(num, den, &mut rng))
                .count() as f64;
            let se = (p * (1.0 - p) / n as f64).sqrt().max(1e-9);
            assert!(
                (hits / n as f64 - p).abs() < 5.0 * se,
                "{num}/{den}: {hits}"
            );
        }
        assert_eq!(discrete_variance(1.5), 3);
    }
}
