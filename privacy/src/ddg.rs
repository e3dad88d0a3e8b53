//! Accounting for the distributed discrete Gaussian (Kairouz, Liu, Steinke 2021, "The
//! Distributed Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation").
//!
//! n clients each add N_Z(0, sigma^2) to their quantised update; the sum of n such noises is
//! close to, but not exactly, N_Z(0, n sigma^2), and Prop. 14 bounds the RDP of the sum with the
//! excess tau. The participants, and so the number of noise terms, are the same on both sides of
//! a neighbouring pair ([`Neighbours`]: one client's data replaced, or its contribution zeroed
//! while it still adds its noise share); more survivors than the n accounted only add
//! independent noise (post-processing). No amplification by sampling is claimed: each round is
//! accounted as if every client took part (q = 1), which errs towards a larger epsilon.

use super::ledger_event::LedgerEvent;
use super::sampled_gaussian::GaussianRound;
use serde::{Deserialize, Serialize};

/// The neighbouring relation a round is accounted under.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum Neighbours {
    /// One client's data replaced by any other: the sum moves by at most 2 Delta_2.
    #[default]
    ReplaceOne,
    /// One client's contribution replaced by zero, its noise share still added (Kairouz et al.
    /// 2021, "Practical and Private (Deep) Learning without Sampling or Shuffling", Sec. 2, as
    /// TFF's DP-FTRL and DDGauss deployments account): the sum moves by at most Delta_2.
    ZeroOut,
}

impl Neighbours {
    /// The sum's L2 sensitivity between neighbours when one contribution is bounded by `bound`.
    pub fn sensitivity(self, bound: f64) -> f64 {
        match self {
            Neighbours::ReplaceOne => 2.0 * bound,
            Neighbours::ZeroOut => bound,
        }
    }
}

/// One round of the distributed discrete Gaussian, as the accountant sees it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DdgRound {
    /// n: the fewest clients whose noise is in the sum (the round aborts below it).
    pub clients: u64,
    /// sigma^2: each client's discrete variance, in quantisation levels.
    pub client_variance: u64,
    /// Delta_2: L2 sensitivity of the noiseless sum between neighbouring datasets, in
    /// quantisation levels ([`Neighbours::sensitivity`] of one client's quantised-update bound).
    pub l2_sensitivity: f64,
    /// The neighbouring relation `l2_sensitivity` is for (ledgers written before it was
    /// recorded used replace-one).
    #[serde(default)]
    pub neighbours: Neighbours,
    /// d: the model's dimension.
    pub dim: u64,
}

impl DdgRound {
    /// tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k/(k+1)) (Kairouz et al. 2021, Thm 1).
    pub fn tau(&self) -> f64 {
        let s2 = self.client_variance as f64;
        10.0 * (1..self.clients)
            .map(|k| {
                let k = k as f64;
                (-2.0 * std::f64::consts::PI.powi(2) * s2 * k / (k + 1.0)).exp()
            })
            .sum::<f64>()
    }

    /// RDP at order alpha: min{ alpha/2 Delta^2/(n sigma^2) + tau d,
    /// alpha/2 (Delta/(sqrt(n) sigma) + tau sqrt(d))^2 } (Kairouz et al. 2021, Prop. 14; its
    /// middle bound needs Delta_1 and is not used: dropping a term of a min only raises it).
    pub fn rdp(&self, alpha: f64) -> f64 {
        let n = self.clients as f64;
        let s2 = self.client_variance as f64;
        let d = self.dim as f64;
        let tau = self.tau();
        let delta = self.l2_sensitivity;
        let first = alpha / 2.0 * delta * delta / (n * s2) + tau * d;
        let third = alpha / 2.0 * (delta / (n * s2).sqrt() + tau * d.sqrt()).powi(2);
        first.min(third)
    }
}

/// The correction of a round charged up front for its fewest survivors once its survivors are
/// known: more survivors put more independent noise in the sum, which is post-processing of the
/// sum of the fewest, so the round costs min(RDP_charged, RDP_survivors) at each order (the
/// Prop. 14 bound grows with n through tau, the true cost cannot). The settlement's curve is that
/// minus the charge: never positive, so a round's total never exceeds what the budget gate
/// allowed, and a crash before the settlement leaves the larger charge.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DdgSettlement {
    /// The event charged before the round.
    pub charged: DdgRound,
    /// The clients whose noise is in the released sum.
    pub survivors: u64,
}

impl DdgSettlement {
    /// The correction at order alpha: min(RDP_charged, RDP_survivors) - RDP_charged <= 0.
    pub fn rdp(&self, alpha: f64) -> f64 {
        let actual = DdgRound {
            clients: self.survivors,
            ..self.charged
        };
        let charged = self.charged.rdp(alpha);
        charged.min(actual.rdp(alpha)) - charged
    }
}

/// The answers of the discrete Gaussian events, a round and its settlement alike: RDP from their
/// own `rdp`; no Gaussian mechanism, so no PLD; and no re-run after a crash, as the noise is the
/// clients', which the server (this mode's adversary) may have seen summed.
macro_rules! discrete_gaussian_events {
    ($($kind:ty),*) => {
        $(impl LedgerEvent for $kind {
            fn rdp_curve(&self, orders: &[f64]) -> Vec<f64> {
                orders.iter().map(|&a| self.rdp(a)).collect()
            }

            fn as_gaussian(&self) -> Option<Option<GaussianRound>> {
                None
            }

            fn reruns_after_crash(&self) -> bool {
                false
            }
        })*
    };
}

discrete_gaussian_events!(DdgRound, DdgSettlement);

#[cfg(test)]
mod tests {
    use super::*;

    /// With sigma large, tau vanishes and the bound is that of a continuous Gaussian of variance
    /// n sigma^2: alpha Delta^2 / (2 n sigma^2).
    #[test]
    fn wide_noise_matches_the_gaussian_rdp() {
        let r = DdgRound {
            clients: 10,
            client_variance: 400,
            l2_sensitivity: 60.0,
            dim: 1000,
            neighbours: Neighbours::ReplaceOne,
        };
        assert!(r.tau() < 1e-300);
        let gaussian = 8.0 * 60.0f64.powi(2) / (2.0 * 10.0 * 400.0);
        assert!((r.rdp(8.0) - gaussian).abs() < 1e-12 * gaussian);
    }

    /// With sigma small, tau is large and the bound grows past the Gaussian one.
    #[test]
    fn narrow_noise_pays_for_the_discrete_sum() {
        let r = DdgRound {
            clients: 100,
            client_variance: 1,
            l2_sensitivity: 10.0,
            dim: 100_000,
            neighbours: Neighbours::ReplaceOne,
        };
        assert!(r.tau() > 1e-9);
        assert!(r.rdp(2.0) > 2.0 * 100.0 / (2.0 * 100.0));
    }
}
