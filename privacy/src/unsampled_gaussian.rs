//! A Gaussian round without sampling amplification: the round's participants are public (every
//! enrolled client, or a set drawn independently of the data and not kept secret), so nothing is
//! gained from sampling, and neighbouring datasets differ in one participant's contribution.
//!
//! Under zero-out neighbours (Kairouz et al. 2021, "Practical and Private (Deep) Learning
//! without Sampling or Shuffling", Sec. 2) that contribution becomes zero and the clipped sum
//! moves by at most S; under replace-one it becomes any other and moves by at most 2S. Noise
//! N(0, z^2 S^2) on the sum is then the Gaussian mechanism of multiplier z / (sensitivity / S),
//! whose RDP at order a is a / (2 (z S / Delta)^2) (Mironov 2017, Prop. 7).

use super::ddg::Neighbours;
use super::ledger_event::LedgerEvent;
use super::sampled_gaussian::GaussianRound;
use serde::{Deserialize, Serialize};

/// One unsampled Gaussian round, as the accountant sees it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct UnsampledGaussian {
    /// z: the noise standard deviation on the sum divided by the clip bound S.
    pub noise_multiplier: f64,
    /// The neighbouring relation the round is accounted under.
    pub neighbours: Neighbours,
}

impl UnsampledGaussian {
    /// The same round as a Gaussian mechanism over add/remove-one neighbours at sensitivity S:
    /// q = 1 and multiplier z over the relation's sensitivity factor (as a tree node is).
    pub fn as_round(&self) -> GaussianRound {
        GaussianRound::unsampled(self.noise_multiplier / self.neighbours.sensitivity(1.0))
    }

    /// RDP of this round at each of `orders`.
    pub fn rdp_curve(&self, orders: &[f64]) -> Vec<f64> {
        self.as_round().rdp_curve(orders)
    }
}

impl LedgerEvent for UnsampledGaussian {
    fn rdp_curve(&self, orders: &[f64]) -> Vec<f64> {
        self.as_round().rdp_curve(orders)
    }

    fn as_gaussian(&self) -> Option<Option<GaussianRound>> {
        Some(Some(self.as_round()))
    }

    /// The curator's own noise, drawn after collecting: a round re-runs under its entry.
    fn reruns_after_crash(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zero-out: a / (2 z^2); replace-one: four times that (sensitivity 2S).
    #[test]
    fn rdp_is_the_gaussian_mechanisms() {
        let orders = [2.0, 8.0, 32.0];
        let z = 1.5;
        let at = |neighbours| {
            UnsampledGaussian {
                noise_multiplier: z,
                neighbours,
            }
            .rdp_curve(&orders)
        };
        for ((&a, zero), replace) in orders
            .iter()
            .zip(at(Neighbours::ZeroOut))
            .zip(at(Neighbours::ReplaceOne))
        {
            let expected = a / (2.0 * z * z);
            assert!(
                (zero - expected).abs() < 1e-12 * expected,
                "{zero} vs {expected}"
            );
            assert!((replace - 4.0 * expected).abs() < 1e-12 * expected);
        }
    }

    /// T rounds of the Gaussian mechanism at multiplier z are one at z / sqrt(T), whose exact
    /// (epsilon, delta) is the analytic Gaussian's (Balle and Wang 2018, Thm 8): the PLD
    /// accountant must give that epsilon, from above, under both relations. The tolerance is the
    /// PLD's discretisation (its grid errs toward a larger epsilon).
    #[test]
    fn pld_composition_matches_the_analytic_gaussian() {
        use crate::{AccountantKind, after_rounds, gaussian_epsilon};
        let (z, rounds, delta) = (1.4715, 8u64, 1e-3);
        for neighbours in [Neighbours::ZeroOut, Neighbours::ReplaceOne] {
            let event = UnsampledGaussian {
                noise_multiplier: z,
                neighbours,
            };
            let pld = after_rounds(AccountantKind::Pld, &event.into(), rounds).epsilon(delta);
            let effective = z / neighbours.sensitivity(1.0) / (rounds as f64).sqrt();
            let exact = gaussian_epsilon(effective, 1.0, delta);
            assert!(
                pld >= exact - 1e-9 && pld <= exact * 1.01,
                "{neighbours:?}: pld {pld}, exact {exact}"
            );
        }
    }
}
