//! A secure-aggregation round's fixed-point code and distributed noise, fixed before its tasks go
//! out (Kairouz, Liu, Steinke 2021, "The Distributed Discrete Gaussian Mechanism for Federated
//! Learning with Secure Aggregation").

use super::{QuantizeError, Quantizer, Ring};
use fl_privacy::{DdgRound, DdgSettlement, Neighbours, discrete_variance};

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
    /// f_c >= f: the fraction of m_t whose noise together reaches z (the survivors expected;
    /// f_c = f calibrates for the fewest, as the round is charged up front).
    pub calibrate_for: f64,
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
    /// n_min: fewest survivors per stage.
    pub min_survivors: usize,
    /// n_c >= n_min: the survivors whose noise together reaches z.
    pub calibrated_for: usize,
    /// The distributed noise's accounting event charged up front, for n_min survivors, if any.
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

/// n_min = max(3, ceil(f m)): the fewest survivors a round planned for m clients goes on with
/// under the survivor fraction f, never fewer than three.
pub fn fewest_survivors(fraction: f64, planned: usize) -> usize {
    ((fraction * planned as f64).ceil() as usize).max(3)
}

impl Calibration {
    /// n_min = max(3, ceil(f m_t)) survivors, n_c = ceil(f_c m_t) clamped to [n_min, sampled],
    /// gamma for the sampled count, and, for distributed noise, each client's discrete variance
    /// sigma_i^2 = ceil((z Delta_2)^2 / n_c) so that any n_c survivors carry noise of standard
    /// deviation at least z Delta_2 (Kairouz et al. 2021). z is relative to one update's bound
    /// Delta_2; the accountant sees the sensitivity of the round's neighbouring relation
    /// (replace-one 2 Delta_2, zero-out Delta_2). The round is charged for n_min survivors
    /// before it runs and settled for those it had ([`Calibration::settle`]).
    pub fn plan(shape: &RoundShape) -> Result<Self, CalibrationError> {
        let dim = shape.dim;
        let at_least = |fraction: f64| fewest_survivors(fraction, shape.planned);
        let min_survivors = at_least(shape.min_survivor_fraction);
        let n_max = shape.sampled.max(min_survivors);
        let calibrated_for = at_least(shape.calibrate_for).clamp(min_survivors, n_max);
        let z = shape.distributed_noise.unwrap_or(0.0);
        // The noise of n_max clients, relative to Delta_2: z sqrt(n_max / n_c).
        let headroom = z * (n_max as f64 / calibrated_for as f64).sqrt();
        let ring = Ring::new(shape.ring_bits).map_err(CalibrationError::Ring)?;
        let quantizer = Quantizer::plan(ring, shape.clip, n_max, dim, headroom)?;
        let delta2 = quantizer.l2_sensitivity(dim);
        let sigma_i = z * delta2 / (calibrated_for as f64).sqrt();
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
            calibrated_for,
            ddg,
        })
    }

    /// The settlement of a round whose sum holds the noise of `survivors` clients, when it costs
    /// less than the up-front charge for n_min (see [`DdgSettlement`]).
    pub fn settle(&self, survivors: usize) -> Option<DdgSettlement> {
        let charged = self.ddg?;
        (survivors as u64 > charged.clients).then_some(DdgSettlement {
            charged,
            survivors: survivors as u64,
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
    use fl_privacy::LedgerEvent;

    fn shape(noise: Option<f64>) -> RoundShape {
        RoundShape {
            ring_bits: 32,
            clip: 1.0,
            dim: 100,
            planned: 10,
            sampled: 10,
            min_survivor_fraction: 0.5,
            calibrate_for: 0.5,
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
        use fl_privacy::{GaussianRound, PrivacyEvent, Sampling};
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

    /// Calibrated for all 10 of 10 clients, charged up front for n_min = 5: a round with all 10
    /// survivors settles to central noise of the same z; one with 7 is charged for the noise of
    /// 7 (z sqrt(7/10)); one with 5 keeps the charge. The settlement is never positive, even
    /// where the Prop. 14 bound grows with n (narrow noise).
    #[test]
    fn expected_survivors_are_settled_for_the_noise_present() {
        use fl_privacy::{GaussianRound, PrivacyEvent, Sampling};
        let z = 1.2;
        let c = Calibration::plan(&RoundShape {
            calibrate_for: 1.0,
            neighbours: Neighbours::ZeroOut,
            ..shape(Some(z))
        })
        .unwrap();
        assert_eq!((c.min_survivors, c.calibrated_for), (5, 10));
        let charged = PrivacyEvent::from(c.ddg.unwrap());
        let orders = [2.0, 8.0, 32.0];
        let total = |survivors: usize| -> Vec<f64> {
            let mut curve = charged.rdp_curve(&orders);
            if let Some(s) = c.settle(survivors) {
                let correction = PrivacyEvent::DdgSettlement(s).rdp_curve(&orders);
                curve.iter_mut().zip(correction).for_each(|(t, x)| *t += x);
            }
            curve
        };
        let gaussian = |z: f64| {
            PrivacyEvent::from(GaussianRound {
                q: 1.0,
                noise_multiplier: z,
                sampling: Sampling::Poisson,
            })
            .rdp_curve(&orders)
        };
        let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x / y - 1.0).abs() < 1e-6);
        assert!(close(&total(10), &gaussian(z)), "{:?}", total(10));
        assert!(close(&total(7), &gaussian(z * 0.7f64.sqrt())));
        assert!(close(&total(5), &gaussian(z * 0.5f64.sqrt())));
        assert!(c.settle(5).is_none());
        let narrow = DdgSettlement {
            charged: DdgRound {
                clients: 5,
                client_variance: 1,
                l2_sensitivity: 10.0,
                dim: 100_000,
                neighbours: Neighbours::ZeroOut,
            },
            survivors: 100,
        };
        assert!(narrow.charged.tau() > 1e-9);
        assert!(orders.iter().all(|&a| narrow.rdp(a) <= 0.0));
    }
}
