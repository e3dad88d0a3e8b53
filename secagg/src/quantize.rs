//! Fixed-point quantisation of clipped updates into Z_{2^b}.
//!
//! A client clips its update u to L2 norm S (so every coordinate is in [-S, S]), scales it by
//! gamma and rounds each coordinate stochastically to an integer: floor(gamma x) + Bernoulli(frac),
//! which is unbiased. gamma is the largest scale for which the sum of n_max clients (plus any
//! distributed noise, to 20 standard deviations) stays inside (-2^(b-1), 2^(b-1)): the sum never
//! wraps, so decoding it is exact up to rounding.

use super::ring::Ring;
use fl_privacy::clip_l2;
use rand::{CryptoRng, Rng};
use serde::{Deserialize, Serialize};

/// Most levels per S: 2^24, the precision of an f32 mantissa; a finer grid buys nothing, and it
/// keeps distributed-noise variances (in levels^2) far inside the exact sampler's integer range.
const MAX_LEVELS: f64 = 16_777_216.0;
/// Noise standard deviations of headroom kept for distributed noise (P(|N(0,1)| > 20) < 1e-88).
const NOISE_HEADROOM_STDS: f64 = 20.0;

/// Why a quantiser cannot be built.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum QuantizeError {
    /// The ring is too small for this many clients at any useful resolution.
    #[error(
        "a {bits}-bit ring cannot hold the sum of {clients} clients at clip bound {clip} (scale {scale:.3e} < 1 level per S); use 64 bits or fewer clients"
    )]
    TooManyClients {
        /// b.
        bits: u32,
        /// n_max.
        clients: usize,
        /// S.
        clip: f64,
        /// The scale that would fit.
        scale: f64,
    },
    /// S not a positive number.
    #[error("clip bound S = {0} must be a positive number")]
    BadClip(f64),
}

/// The fixed-point code of one round: ring, clip bound S and scale gamma.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Quantizer {
    /// The ring Z_{2^b}.
    pub ring: Ring,
    /// S: the L2 clip bound applied before scaling.
    pub clip: f64,
    /// gamma: integer levels per unit.
    pub scale: f64,
}

impl Quantizer {
    /// The largest gamma (at most 2^24 / S) such that n_max clipped, rounded updates plus noise of total standard
    /// deviation `noise_std_per_delta` * Delta (Delta = gamma S + sqrt(d), see
    /// [`Quantizer::l2_sensitivity`]) cannot wrap in `ring`:
    /// n_max (gamma S + 1) + 20 z_tot (gamma S + sqrt(d)) <= 2^(b-1) - 1.
    pub fn plan(
        ring: Ring,
        clip: f64,
        max_clients: usize,
        dim: usize,
        noise_std_per_delta: f64,
    ) -> Result<Self, QuantizeError> {
        if !(clip > 0.0 && clip.is_finite()) {
            return Err(QuantizeError::BadClip(clip));
        }
        let n = max_clients.max(1) as f64;
        let a = NOISE_HEADROOM_STDS * noise_std_per_delta;
        let gamma_s = (ring.max_signed() - n - a * (dim as f64).sqrt()) / (n + a);
        let scale = gamma_s.min(MAX_LEVELS) / clip;
        if gamma_s.is_nan() || gamma_s < 1.0 {
            return Err(QuantizeError::TooManyClients {
                bits: ring.bits(),
                clients: max_clients,
                clip,
                scale,
            });
        }
        Ok(Self { ring, clip, scale })
    }

    /// Delta_2 = gamma S + sqrt(d): the L2 norm bound of one quantised update. Clipping bounds
    /// ||gamma u|| by gamma S and stochastic rounding moves each coordinate by less than 1, so by
    /// the triangle inequality ||round(gamma u)|| < gamma S + sqrt(d) (deterministic, no
    /// conditional rounding needed).
    pub fn l2_sensitivity(&self, dim: usize) -> f64 {
        self.scale * self.clip + (dim as f64).sqrt()
    }

    /// The decoded sum's sensitivity in model units: Delta_2 / gamma = S + sqrt(d)/gamma.
    pub fn decoded_sensitivity(&self, dim: usize) -> f64 {
        self.l2_sensitivity(dim) / self.scale
    }

    /// Clips `update` to S and rounds gamma u stochastically: floor(gamma x) + Bernoulli(frac).
    pub fn encode<R: Rng + CryptoRng>(&self, update: &[f32], rng: &mut R) -> Vec<i64> {
        let mut u = update.to_vec();
        clip_l2(&mut u, self.clip);
        u.iter()
            .map(|&x| {
                let v = f64::from(x) * self.scale;
                let floor = v.floor();
                floor as i64 + i64::from(rng.random::<f64>() < v - floor)
            })
            .collect()
    }

    /// The ring elements of signed integers.
    pub fn to_ring(&self, values: &[i64]) -> Vec<u64> {
        values.iter().map(|&x| self.ring.from_signed(x)).collect()
    }

    /// The float vector a ring sum stands for: signed(sum) / gamma.
    pub fn decode(&self, sum: &[u64]) -> Vec<f32> {
        sum.iter()
            .map(|&s| (self.ring.to_signed(s) as f64 / self.scale) as f32)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    /// Stochastic rounding is unbiased: over n = 20000 draws of the same value, the mean code is
    /// within 5 standard errors (at most 0.5/sqrt(n)) of gamma x.
    #[test]
    fn rounding_is_unbiased_and_within_one_level() {
        let q = Quantizer {
            ring: Ring::new(32).unwrap(),
            clip: 1000.0,
            scale: 3.0,
        };
        let mut rng = StdRng::seed_from_u64(1);
        let x = [0.1234f32; 20_000];
        let codes = q.encode(&x, &mut rng);
        let target = 0.1234f32 as f64 * 3.0;
        let mean = codes.iter().sum::<i64>() as f64 / codes.len() as f64;
        assert!((mean - target).abs() < 5.0 * 0.5 / (codes.len() as f64).sqrt());
        assert!(codes.iter().all(|&c| (c as f64 - target).abs() < 1.0));
    }

    /// The planned scale leaves room for n_max worst-case updates: n_max codes of +gamma S + 1
    /// (and of the negative extreme) sum without wrapping, and decode back.
    #[test]
    fn worst_case_sum_of_n_max_clients_does_not_wrap() {
        for (bits, n) in [(32, 100), (32, 1000), (64, 10_000)] {
            let ring = Ring::new(bits).unwrap();
            let q = Quantizer::plan(ring, 2.0, n, 1000, 0.0).unwrap();
            let extreme = (q.scale * q.clip).floor() as i64 + 1;
            for sign in [1i64, -1] {
                let mut acc = vec![0u64; 1];
                for _ in 0..n {
                    ring.add_assign(&mut acc, &q.to_ring(&[sign * extreme]));
                }
                assert_eq!(ring.to_signed(acc[0]), sign * extreme * n as i64);
            }
        }
    }

    #[test]
    fn a_ring_too_small_is_refused() {
        let ring = Ring::new(32).unwrap();
        assert!(matches!(
            Quantizer::plan(ring, 1.0, 3_000_000_000, 10, 0.0),
            Err(QuantizeError::TooManyClients { .. })
        ));
        assert_eq!(
            Quantizer::plan(ring, 0.0, 10, 10, 0.0),
            Err(QuantizeError::BadClip(0.0))
        );
    }

    #[test]
    fn clipped_updates_decode_within_quantisation_error() {
        let ring = Ring::new(32).unwrap();
        let q = Quantizer::plan(ring, 1.0, 10, 4, 0.0).unwrap();
        let mut rng = StdRng::seed_from_u64(2);
        let u = [3.0f32, 4.0, 0.0, 0.0]; // norm 5, clipped to 1: (0.6, 0.8, 0, 0)
        let decoded = q.decode(&q.to_ring(&q.encode(&u, &mut rng)));
        for (d, want) in decoded.iter().zip([0.6f32, 0.8, 0.0, 0.0]) {
            assert!(
                (d - want).abs() <= (1.0 / q.scale) as f32 + 1e-6,
                "{d} vs {want}"
            );
        }
        assert!(q.l2_sensitivity(4) > q.scale);
    }
}
