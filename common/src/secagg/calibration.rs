//! A secure-aggregation round's fixed-point code and distributed noise, fixed before its tasks go
//! out (Kairouz, Liu, Steinke 2021, "The Distributed Discrete Gaussian Mechanism for Federated
//! Learning with Secure Aggregation").

use super::{QuantizeError, Quantizer, Ring};
use crate::privacy::{DdgRound, Neighbours, discrete_variance};

/// Largest per-client discrete Gaussian standard deviation, in levels (2^30): keeps the exact
/// sampler's integer arithmetic in range.
pub const MAX_DISCRETE_SIGMA: f64 = 1_073_741_824.0;

/// What is asked of a round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundShape {
    /// The ring's bit width b.
    pub ring_bits: u32,
    /// S: the clients' L2 clip bound.
    pub clip: f64,
    /// d: the model's dimension.
    pub dim: usize,
    /// m_t: the clients the round samples.
    pub planned: usize,
    /// The clients actually sampled.
    pub sampled: usize,
    /// f: the fraction of m_t that must survive every stage.
    pub min_survivor_fraction: f64,
    /// z: the distributed noise's multiplier, or `None` for no client noise.
    pub distributed_noise: Option<f64>,
    /// The neighbouring relation the noise is accounted under.
    pub neighbours: Neighbours,
}

/// The round's code and noise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// The fixed-point code.
    pub quantizer: Quantizer,
    /// n_min: fewest survivors per stage (the distributed noise is calibrated for this many).
    pub min_survivors: usize,
    /// The distributed noise's accounting event, if any.
    pub ddg: Option<DdgRound>,
}

/// Why a round cannot be calibrated.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CalibrationError {
    /// The ring width is not supported.
    #[error("{0}")]
    Ring(String),
    /// The ring cannot hold the sum.
    #[error(transparent)]
    Quantize(#[from] QuantizeError),
    /// The per-client noise is beyond the exact sampler's range.
    #[error(
        "distributed noise of {0:.3e} levels per client is beyond the exact sampler's range \
         ({MAX_DISCRETE_SIGMA:.0e}); lower privacy.noise_multiplier"
    )]
    NoiseTooLarge(f64),
}

impl Calibration {
    /// n_min = max(3, ceil(f m_t)) survivors, gamma for the sampled count, and, for distributed
    /// noise, each client's discrete variance sigma_i^2 = ceil((z Delta_2)^2 / n_min) so that any
    /// n_min survivors carry noise of standard deviation at least z Delta_2 (Kairouz et al. 2021).
    /// z is relative to one update's bound Delta_2; the accountant sees the sensitivity of the
    /// round's neighbouring relation (replace-one 2 Delta_2, zero-out Delta_2).
    pub fn plan(shape: &RoundShape) -> Result<Self, CalibrationError> {
        let dim = shape.dim;
        let min_survivors =
            ((shape.min_survivor_fraction * shape.planned as f64).ceil() as usize).max(3);
        let n_max = shape.sampled.max(min_survivors);
        let z = shape.distributed_noise.unwrap_or(0.0);
        // The noise of n_max clients, relative to Delta_2: z sqrt(n_max / n_min).
        let headroom = z * (n_max as f64 / min_survivors as f64).sqrt();
        let ring = Ring::new(shape.ring_bits).map_err(CalibrationError::Ring)?;
        let quantizer = Quantizer::plan(ring, shape.clip, n_max, dim, headroom)?;
        let delta2 = quantizer.l2_sensitivity(dim);
        let sigma_i = z * delta2 / (min_survivors as f64).sqrt();
        if shape.distributed_noise.is_some() && sigma_i > MAX_DISCRETE_SIGMA {
            return Err(CalibrationError::NoiseTooLarge(sigma_i));
        }
        // The participants, hence the noise terms, are the same on both sides of a pair.
        let ddg = shape.distributed_noise.map(|_| DdgRound {
            clients: min_survivors as u64,
            client_variance: discrete_variance(sigma_i),
            l2_sensitivity: shape.neighbours.sensitivity(delta2),
            dim: dim as u64,
            neighbours: shape.neighbours,
        });
        Ok(Self {
            quantizer,
            min_survivors,
            ddg,
        })
    }

    /// The standard deviation, in model units, of the distributed noise in a sum of
    /// `contributors` inputs.
    pub fn noise_std(&self, contributors: usize) -> Option<f64> {
        self.ddg.map(|d| {
            (d.client_variance as f64).sqrt() / self.quantizer.scale * (contributors as f64).sqrt()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(noise: Option<f64>) -> RoundShape {
        RoundShape {
            ring_bits: 32,
            clip: 1.0,
            dim: 100,
            planned: 10,
            sampled: 10,
            min_survivor_fraction: 0.5,
            distributed_noise: noise,
            neighbours: Neighbours::ReplaceOne,
        }
    }

    #[test]
    fn any_n_min_survivors_carry_the_calibrated_noise() {
        let c = Calibration::plan(&shape(Some(1.0))).unwrap();
        assert_eq!(c.min_survivors, 5);
        let ddg = c.ddg.unwrap();
        let delta2 = c.quantizer.l2_sensitivity(100);
        // n_min sigma_i^2 >= (z Delta_2)^2.
        let total = ddg.clients as f64 * ddg.client_variance as f64;
        assert!(total >= delta2 * delta2, "{total} < {}", delta2 * delta2);
        assert_eq!(ddg.l2_sensitivity, 2.0 * delta2);
    }

    #[test]
    fn without_noise_there_is_no_event_and_at_least_three_survivors() {
        let c = Calibration::plan(&RoundShape {
            planned: 2,
            ..shape(None)
        })
        .unwrap();
        assert_eq!((c.min_survivors, c.ddg, c.noise_std(3)), (3, None, None));
        let huge = Calibration::plan(&shape(Some(1e12)));
        assert!(huge.is_err(), "{huge:?}");
    }

    /// Zero-out neighbours account distributed noise as central Gaussian noise of the same z on
    /// the same clients (q = 1, add/remove sensitivity S); replace-one pays twice the
    /// sensitivity, four times the RDP. With sigma_i in the thousands of levels tau vanishes, and
    /// only the rounding up of sigma_i^2 (relative 1/sigma_i^2) lowers the zero-out RDP.
    #[test]
    fn zero_out_noise_is_accounted_as_central_noise_of_the_same_z() {
        use crate::privacy::{GaussianRound, PrivacyEvent, Sampling};
        let z = 1.2;
        let event = |neighbours| {
            let c = Calibration::plan(&RoundShape {
                neighbours,
                ..shape(Some(z))
            })
            .unwrap();
            let ddg = c.ddg.unwrap();
            assert_eq!(ddg.neighbours, neighbours);
            assert!(ddg.tau() < 1e-300);
            PrivacyEvent::from(ddg)
        };
        let central = PrivacyEvent::from(GaussianRound {
            q: 1.0,
            noise_multiplier: z,
            sampling: Sampling::Poisson,
        });
        let orders = [2.0, 8.0, 32.0];
        let gaussian = central.rdp_curve(&orders);
        let zero_out = event(Neighbours::ZeroOut).rdp_curve(&orders);
        let replace_one = event(Neighbours::ReplaceOne).rdp_curve(&orders);
        for i in 0..orders.len() {
            let alpha = orders[i];
            assert!((gaussian[i] - alpha / (2.0 * z * z)).abs() < 1e-9 * gaussian[i]);
            assert!(zero_out[i] <= gaussian[i], "{zero_out:?} vs {gaussian:?}");
            assert!(
                zero_out[i] > gaussian[i] * (1.0 - 1e-6),
                "{zero_out:?} vs {gaussian:?}"
            );
            assert!(
                (replace_one[i] / zero_out[i] - 4.0).abs() < 1e-6,
                "{replace_one:?}"
            );
        }
    }
}
