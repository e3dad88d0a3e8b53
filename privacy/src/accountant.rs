//! The privacy accountant: rounds compose by adding their RDP curves; the (epsilon, delta)
//! guarantee is read off the composed curve.
//!
//! One interface, [`Accountant`]: `compose(event)` per round, `epsilon(delta)`, `delta(epsilon)`.
//! The ledger persists the events, never a running epsilon, so the budget can always be
//! recomputed from the file (the shape of Opacus' accountant history).

use super::banded::BandedRound;
use super::ddg::{DdgRound, DdgSettlement};
use super::rdp::default_orders;
use super::sampled_gaussian::{AccountingError, GaussianRound, Sampling};
use super::tree::TreeRound;
use super::unsampled_gaussian::UnsampledGaussian;
use serde::{Deserialize, Serialize};

/// One round of any mechanism the accountant knows. On disk (the ledger's lines) it is tagged by
/// `mechanism`; [`read_event`] also reads the untagged lines of earlier ledgers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "mechanism", rename_all = "kebab-case")]
pub enum PrivacyEvent {
    /// Central Gaussian noise on the sum of a sampled round.
    SampledGaussian(GaussianRound),
    /// Distributed discrete Gaussian noise under secure aggregation (no sampling amplification).
    DistributedDiscreteGaussian(DdgRound),
    /// A round of DP-FTRL's tree aggregation (zero-out neighbours, no sampling).
    TreeAggregation(TreeRound),
    /// The correction of a distributed-noise round once its survivors are known (never
    /// positive).
    DdgSettlement(DdgSettlement),
    /// Central Gaussian noise on the sum of a round whose participants are public (no sampling
    /// amplification).
    UnsampledGaussian(UnsampledGaussian),
    /// A step of banded matrix-factorization DP-FTRL (zero-out neighbours, no sampling).
    BandedMatrix(BandedRound),
}

/// The ledger lines written before events were tagged: the kinds of that time, told apart by
/// their fields, in the order they were tried then.
#[derive(Deserialize)]
#[serde(untagged)]
enum UntaggedEvent {
    SampledGaussian(GaussianRound),
    DistributedDiscreteGaussian(DdgRound),
    TreeAggregation(TreeRound),
    DdgSettlement(DdgSettlement),
    UnsampledGaussian(UnsampledGaussian),
}

/// A stored event: tagged, or an earlier ledger's untagged line.
#[derive(Deserialize)]
#[serde(untagged)]
enum StoredEvent {
    Tagged(PrivacyEvent),
    Untagged(UntaggedEvent),
}

/// Reads a stored event, tagged or untagged (for `#[serde(deserialize_with)]`).
pub fn read_event<'de, D: serde::Deserializer<'de>>(d: D) -> Result<PrivacyEvent, D::Error> {
    Ok(match StoredEvent::deserialize(d)? {
        StoredEvent::Tagged(event) => event,
        StoredEvent::Untagged(old) => match old {
            UntaggedEvent::SampledGaussian(g) => PrivacyEvent::SampledGaussian(g),
            UntaggedEvent::DistributedDiscreteGaussian(d) => {
                PrivacyEvent::DistributedDiscreteGaussian(d)
            }
            UntaggedEvent::TreeAggregation(t) => PrivacyEvent::TreeAggregation(t),
            UntaggedEvent::DdgSettlement(s) => PrivacyEvent::DdgSettlement(s),
            UntaggedEvent::UnsampledGaussian(g) => PrivacyEvent::UnsampledGaussian(g),
        },
    })
}

impl PrivacyEvent {
    /// RDP of this round at each of `orders` (infinite for a banded step whose bands overlap).
    pub fn rdp_curve(&self, orders: &[f64]) -> Vec<f64> {
        match self {
            PrivacyEvent::SampledGaussian(g) => g.rdp_curve(orders),
            PrivacyEvent::DistributedDiscreteGaussian(d) => {
                orders.iter().map(|&a| d.rdp(a)).collect()
            }
            PrivacyEvent::DdgSettlement(s) => orders.iter().map(|&a| s.rdp(a)).collect(),
            PrivacyEvent::BandedMatrix(b) if !b.separated() => vec![f64::INFINITY; orders.len()],
            PrivacyEvent::TreeAggregation(_)
            | PrivacyEvent::UnsampledGaussian(_)
            | PrivacyEvent::BandedMatrix(_) => match self.as_gaussian() {
                Some(Some(round)) => round.rdp_curve(orders),
                _ => vec![0.0; orders.len()],
            },
        }
    }

    /// The Gaussian mechanism this event composes as (`Some(None)`: a correlated-noise step that
    /// adds nothing to a client's worst case), or `None` when it is none: the PLD accountant
    /// covers exactly the events with one.
    pub fn as_gaussian(&self) -> Option<Option<GaussianRound>> {
        match self {
            PrivacyEvent::SampledGaussian(
                round @ GaussianRound {
                    sampling: Sampling::Poisson,
                    ..
                },
            ) => Some(Some(*round)),
            PrivacyEvent::SampledGaussian(_) => None,
            PrivacyEvent::TreeAggregation(tree) => Some(tree.node()),
            PrivacyEvent::UnsampledGaussian(g) => Some(Some(g.as_round())),
            PrivacyEvent::BandedMatrix(b) => b.separated().then(|| b.charge()),
            PrivacyEvent::DistributedDiscreteGaussian(_) | PrivacyEvent::DdgSettlement(_) => None,
        }
    }

    /// Whether a round spent with this event, its result unreleased when the server crashed,
    /// may run again under the same entry: only independent noise the trusted curator adds
    /// after collecting, whose draw never left the server. Noise the clients add (distributed
    /// noise) may have been seen by the server, the adversary of that mode, in its noised sum;
    /// correlated noise (a tree, a banded stream) lives in memory only, and a restarted server
    /// starts a new stream, which is a new event.
    pub fn reruns_after_crash(&self) -> bool {
        match self {
            PrivacyEvent::SampledGaussian(_) | PrivacyEvent::UnsampledGaussian(_) => true,
            PrivacyEvent::DistributedDiscreteGaussian(_)
            | PrivacyEvent::DdgSettlement(_)
            | PrivacyEvent::TreeAggregation(_)
            | PrivacyEvent::BandedMatrix(_) => false,
        }
    }
}

impl From<BandedRound> for PrivacyEvent {
    fn from(b: BandedRound) -> Self {
        PrivacyEvent::BandedMatrix(b)
    }
}

impl From<UnsampledGaussian> for PrivacyEvent {
    fn from(g: UnsampledGaussian) -> Self {
        PrivacyEvent::UnsampledGaussian(g)
    }
}

impl From<GaussianRound> for PrivacyEvent {
    fn from(g: GaussianRound) -> Self {
        PrivacyEvent::SampledGaussian(g)
    }
}

impl From<TreeRound> for PrivacyEvent {
    fn from(t: TreeRound) -> Self {
        PrivacyEvent::TreeAggregation(t)
    }
}

impl From<DdgRound> for PrivacyEvent {
    fn from(d: DdgRound) -> Self {
        PrivacyEvent::DistributedDiscreteGaussian(d)
    }
}

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
    use crate::Neighbours;

    fn read(line: &str) -> PrivacyEvent {
        read_event(&mut serde_json::Deserializer::from_str(line)).unwrap()
    }

    /// Every kind is written tagged and reads back as itself; the untagged lines of earlier
    /// ledgers read as the kind they were written as, a tree round (which has an unsampled
    /// round's two fields and one more) as a tree round.
    #[test]
    fn stored_events_read_back_as_their_kind() {
        let unsampled = UnsampledGaussian {
            noise_multiplier: 1.36,
            neighbours: Neighbours::ZeroOut,
        };
        let banded = BandedRound {
            noise_multiplier: 2.0,
            step: 5,
            bands: 4,
            min_separation: 4,
            max_participations: Some(13),
            neighbours: Neighbours::ZeroOut,
        };
        let events: [PrivacyEvent; 4] = [
            GaussianRound::new(0.25, 1.2, Sampling::Poisson)
                .unwrap()
                .into(),
            TreeRound::zero_out(1.5, 6).into(),
            unsampled.into(),
            banded.into(),
        ];
        for event in events {
            let line = serde_json::to_string(&event).unwrap();
            assert!(line.starts_with(r#"{"mechanism":"#), "{line}");
            assert_eq!(read(&line), event, "{line}");
        }
        let untagged = [
            (
                r#"{"q":0.25,"noise_multiplier":1.2,"sampling":"poisson"}"#,
                events[0],
            ),
            (
                r#"{"noise_multiplier":1.5,"tree_step":6,"neighbours":"zero-out"}"#,
                events[1],
            ),
            (
                r#"{"noise_multiplier":1.36,"neighbours":"zero-out"}"#,
                events[2],
            ),
        ];
        for (line, event) in untagged {
            assert_eq!(read(line), event, "{line}");
        }
    }

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
