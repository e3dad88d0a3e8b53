//! One step of banded DP-FTRL as the ledger holds it ([`BandedRound`]), and its charge: the
//! accounting of the parent module's documentation. Apart from the stream, so that the ledger's
//! events do not import the stream's planning.

use crate::ddg::Neighbours;
use crate::ledger_event::{LedgerEvent, gaussian_curve};
use crate::sampled_gaussian::GaussianRound;
use serde::{Deserialize, Serialize};

/// One step of banded DP-FTRL, as the accountant sees it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct BandedRound {
    /// z: the noise standard deviation of Z over the clip bound S (unit column norm).
    pub noise_multiplier: f64,
    /// t: the step in its stream, from 1 (1 starts a new stream and a new factorization).
    pub step: u64,
    /// p: the factorization's bands.
    pub bands: u64,
    /// b: the fewest steps between two contributions of one client.
    pub min_separation: u64,
    /// k: the most contributions of one client in a stream (`None`: only b limits them).
    pub max_participations: Option<u64>,
    /// The neighbouring relation (zero-out; replace-one doubles the sensitivity).
    pub neighbours: Neighbours,
}

impl BandedRound {
    /// The Gaussian mechanism this step adds to a client's worst case: multiplier z over the
    /// relation's sensitivity factor, without sampling, when t = 1 (mod b) and fewer than k
    /// charges came before it; nothing otherwise (module documentation).
    pub fn charge(&self) -> Option<GaussianRound> {
        let (b, before) = (self.min_separation.max(1), self.step.max(1) - 1);
        let charged = before % b == 0 && self.max_participations.is_none_or(|k| before / b < k);
        charged.then_some(GaussianRound::unsampled(
            self.noise_multiplier / self.neighbours.sensitivity(1.0),
        ))
    }

    /// The charges among steps 1..=`steps` of one stream, as [`charge`](Self::charge) makes
    /// them: one at each t = 1 (mod b), at most k.
    pub fn charges_in(&self, steps: u64) -> u64 {
        let charges = steps.div_ceil(self.min_separation.max(1));
        self.max_participations.map_or(charges, |k| charges.min(k))
    }

    /// The most steps of one stream, at most `cap`, whose [`charges_in`](Self::charges_in) are
    /// at most `charges` (all `cap` once `charges` reaches k).
    pub fn steps_covered(&self, charges: u64, cap: u64) -> u64 {
        match self.max_participations {
            Some(k) if charges >= k => cap,
            Some(_) | None => charges.saturating_mul(self.min_separation.max(1)).min(cap),
        }
    }

    /// Whether the bands fit the separation (p <= b), which the bound of [`charge`](Self::charge)
    /// needs: overlapping bands are no mechanism this accounting covers.
    pub fn separated(&self) -> bool {
        self.bands >= 1 && self.bands <= self.min_separation
    }
}

impl LedgerEvent for BandedRound {
    /// Its charge's curve, or infinite when the bands overlap (no bound covers that).
    fn rdp_curve(&self, orders: &[f64]) -> Vec<f64> {
        match self.separated() {
            true => gaussian_curve(self.charge(), orders),
            false => vec![f64::INFINITY; orders.len()],
        }
    }

    /// Its charge, when the bands are separated.
    fn as_gaussian(&self) -> Option<Option<GaussianRound>> {
        self.separated().then(|| self.charge())
    }

    /// Correlated noise in memory only: a restarted server starts a new stream.
    fn reruns_after_crash(&self) -> bool {
        false
    }
}
