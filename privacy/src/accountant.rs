//! The privacy accountant: rounds compose by adding their RDP curves; the (epsilon, delta)
//! guarantee is read off the composed curve.
//!
//! One interface, [`Accountant`]: `compose(event)` per round, `epsilon(delta)`, `delta(epsilon)`.
//! The ledger persists the events, never a running epsilon, so the budget can always be
//! recomputed from the file (the shape of Opacus' accountant history).

use super::event::PrivacyEvent;
use super::rdp::default_orders;
use super::sampled_gaussian::AccountingError;
use crate::ledger_event::LedgerEvent;

/// Checks delta in (0, 1).
pub fn check_delta(delta: f64) -> Result<(), AccountingError> {
    if delta > 0.0 && delta < 1.0 {
        Ok(())
    } else {
        Err(AccountingError::BadDelta(delta))
    }
}

/// Checks epsilon > 0.
pub fn check_epsilon(epsilon: f64) -> Result<(), AccountingError> {
    if epsilon > 0.0 && epsilon.is_finite() {
        Ok(())
    } else {
        Err(AccountingError::BadEpsilon(epsilon))
    }
}

/// A privacy accountant over rounds of the sampled Gaussian mechanism.
pub trait Accountant: Send + Sync {
    /// Name for summaries and ledgers (e.g. `rdp`).
    fn name(&self) -> &'static str;
    /// Adds `count` rounds of `event`.
    fn compose(&mut self, event: &PrivacyEvent, count: u64);
    /// The smallest epsilon such that the rounds so far are (epsilon, delta)-DP.
    fn epsilon(&self, delta: f64) -> f64;
    /// The smallest delta such that the rounds so far are (epsilon, delta)-DP, at most 1.
    fn delta(&self, epsilon: f64) -> f64;
    /// A copy, to try one more round without spending it.
    fn boxed(&self) -> Box<dyn Accountant>;
}

/// Rényi DP accountant on the [`default_orders`] grid.
///
/// Rounds are kept as counts of distinct events, each with its curve computed once: composing a
/// round is a count increment (schedules repeat one (q, sigma) for many rounds, so the event is
/// looked up from the newest), and the composed curve sum_e count_e RDP_e is formed when epsilon
/// or delta is asked for.
#[derive(Debug, Clone)]
pub struct RdpAccountant {
    orders: Vec<f64>,
    composed: Vec<Composed>,
}

/// Rounds of one distinct event.
#[derive(Debug, Clone)]
struct Composed {
    event: PrivacyEvent,
    /// RDP of one round at each order.
    curve: Vec<f64>,
    rounds: u64,
}

impl Default for RdpAccountant {
    fn default() -> Self {
        Self {
            orders: default_orders(),
            composed: Vec::new(),
        }
    }
}

impl RdpAccountant {
    /// The orders and the composed RDP at each.
    pub fn curve_so_far(&self) -> (&[f64], Vec<f64>) {
        let mut total = vec![0.0; self.orders.len()];
        for c in &self.composed {
            for (t, r) in total.iter_mut().zip(&c.curve) {
                *t += c.rounds as f64 * r;
            }
        }
        (&self.orders, total)
    }
}

impl Accountant for RdpAccountant {
    fn name(&self) -> &'static str {
        "rdp"
    }

    fn compose(&mut self, event: &PrivacyEvent, count: u64) {
        match self.composed.iter_mut().rev().find(|c| c.event == *event) {
            Some(c) => c.rounds += count,
            None => self.composed.push(Composed {
                event: *event,
                curve: event.rdp_curve(&self.orders),
                rounds: count,
            }),
        }
    }

    fn epsilon(&self, delta: f64) -> f64 {
        let (orders, total) = self.curve_so_far();
        epsilon_from_rdp(orders, &total, delta)
    }

    fn delta(&self, epsilon: f64) -> f64 {
        let (orders, total) = self.curve_so_far();
        delta_from_rdp(orders, &total, epsilon)
    }

    fn boxed(&self) -> Box<dyn Accountant> {
        Box::new(self.clone())
    }
}

/// RDP -> (epsilon, delta): epsilon(delta) = min_a [r_a + ln(1 - 1/a) - (ln delta + ln a)/(a - 1)]
/// (Balle et al. 2020, Thm 21; Canonne, Kamath, Steinke 2020, Prop. 12), and epsilon = 0 where
/// the KL bound delta >= sqrt(1 - e^{-r_a}) already holds. Orders a <= 1.01 are skipped (the
/// bound is unstable there).
pub fn epsilon_from_rdp(orders: &[f64], rdp: &[f64], delta: f64) -> f64 {
    orders
        .iter()
        .zip(rdp)
        .map(|(&a, &r)| {
            if delta * delta + (-r).exp_m1() > 0.0 {
                0.0
            } else if a > 1.01 {
                r + (-1.0 / a).ln_1p() - (delta * a).ln() / (a - 1.0)
            } else {
                f64::INFINITY
            }
        })
        .fold(f64::INFINITY, f64::min)
        .max(0.0)
}

/// RDP -> delta at fixed epsilon: delta = min_a exp((a-1)(r_a - epsilon + ln(1 - 1/a)) - ln a)
/// (same sources as [`epsilon_from_rdp`]), or the KL bound sqrt(1 - e^{-r_a}) when smaller;
/// capped at 1.
pub fn delta_from_rdp(orders: &[f64], rdp: &[f64], epsilon: f64) -> f64 {
    orders
        .iter()
        .zip(rdp)
        .map(|(&a, &r)| {
            let kl = if r == 0.0 {
                f64::NEG_INFINITY
            } else {
                0.5 * (-(-r).exp()).ln_1p()
            };
            if a > 1.01 {
                kl.min((a - 1.0) * (r - epsilon + (-1.0 / a).ln_1p()) - a.ln())
            } else {
                kl
            }
        })
        .fold(f64::INFINITY, f64::min)
        .exp()
        .min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GaussianRound, Sampling};

    /// Tiny q and 10^5 rounds stay finite and ordered (log-space arithmetic throughout).
    #[test]
    fn tiny_rates_and_many_rounds_are_stable() {
        let event = GaussianRound::new(1e-6, 1.0, Sampling::Poisson).unwrap();
        let mut acc = RdpAccountant::default();
        acc.compose(&event.into(), 10_000);
        let eps_1e4 = acc.epsilon(1e-6);
        acc.compose(&event.into(), 90_000);
        let eps_1e5 = acc.epsilon(1e-6);
        assert!(eps_1e4.is_finite() && eps_1e5.is_finite());
        assert!(
            0.0 < eps_1e4 && eps_1e4 < eps_1e5 && eps_1e5 < 1.0,
            "{eps_1e4} {eps_1e5}"
        );
        let (_, rdp) = acc.curve_so_far();
        assert!(rdp.iter().all(|r| r.is_finite() && *r >= 0.0));
    }

    #[test]
    fn invalid_inputs_are_refused() {
        assert_eq!(
            GaussianRound::new(0.0, 1.0, Sampling::Poisson),
            Err(AccountingError::BadRate(0.0))
        );
        assert!(GaussianRound::new(1.5, 1.0, Sampling::Poisson).is_err());
        assert!(GaussianRound::new(0.1, 0.0, Sampling::Fixed).is_err());
        assert!(GaussianRound::new(0.1, f64::NAN, Sampling::Fixed).is_err());
        assert!(check_delta(1.0).is_err() && check_delta(0.0).is_err());
        assert!(check_epsilon(0.0).is_err());
    }
}
