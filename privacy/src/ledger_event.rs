//! What each kind of ledger event answers about itself ([`LedgerEvent`]), and the answers of the
//! sampled Gaussian round, on which the others build. The other kinds answer beside their
//! mechanisms; [`PrivacyEvent`](crate::PrivacyEvent) dispatches to them.

use super::sampled_gaussian::{GaussianRound, Sampling};

/// What a kind of ledger event answers about itself.
pub trait LedgerEvent {
    /// RDP of this round at each of `orders` (infinite where no bound holds).
    fn rdp_curve(&self, orders: &[f64]) -> Vec<f64>;

    /// The Gaussian mechanism it composes as (`Some(None)`: a correlated-noise step that adds
    /// nothing to a client's worst case), or `None` when it is none: the PLD accountant covers
    /// exactly the events with one.
    fn as_gaussian(&self) -> Option<Option<GaussianRound>>;

    /// Whether a round spent with it, its result unreleased when the server crashed, may run
    /// again under the same entry: only independent noise the trusted curator adds after
    /// collecting, whose draw never left the server. Noise the clients add (distributed noise)
    /// may have been seen by the server, the adversary of that mode, in its noised sum;
    /// correlated noise (a tree, a banded stream) lives in memory only, and a restarted server
    /// starts a new stream, which is a new event.
    fn reruns_after_crash(&self) -> bool;
}

/// The RDP curve of `round` at `orders`, or none (zeros) for a step that adds nothing.
pub(crate) fn gaussian_curve(round: Option<GaussianRound>, orders: &[f64]) -> Vec<f64> {
    match round {
        Some(round) => round.rdp_curve(orders),
        None => vec![0.0; orders.len()],
    }
}

impl LedgerEvent for GaussianRound {
    fn rdp_curve(&self, orders: &[f64]) -> Vec<f64> {
        GaussianRound::rdp_curve(self, orders)
    }

    /// Itself under Poisson sampling; fixed-size sampling's replace-one bound has no PLD here.
    fn as_gaussian(&self) -> Option<Option<GaussianRound>> {
        match self.sampling {
            Sampling::Poisson => Some(Some(*self)),
            Sampling::Fixed => None,
        }
    }

    /// The curator's own noise, drawn after collecting: a round re-runs under its entry.
    fn reruns_after_crash(&self) -> bool {
        true
    }
}
