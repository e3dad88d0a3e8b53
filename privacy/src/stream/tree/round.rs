//! One step of tree aggregation as the ledger holds it ([`TreeRound`]), and the node it adds:
//! the accounting of the parent module's documentation. Apart from the stream, so that the
//! ledger's events do not import the stream.

use crate::ddg::Neighbours;
use crate::ledger_event::{LedgerEvent, gaussian_curve};
use crate::sampled_gaussian::GaussianRound;
use serde::{Deserialize, Serialize};

/// One round of tree aggregation, as the accountant sees it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TreeRound {
    /// z: each node's noise standard deviation over the clip bound S.
    pub noise_multiplier: f64,
    /// n: the round's step in its tree, from 1 (1 starts a new tree).
    pub tree_step: u64,
    /// The neighbouring relation (DP-FTRL's is zero-out, dp_accounting's `REPLACE_SPECIAL`;
    /// replace-one doubles a node's sensitivity).
    pub neighbours: Neighbours,
}

impl TreeRound {
    /// A zero-out round: step `tree_step` of a tree of nodes of multiplier `noise_multiplier`.
    pub fn zero_out(noise_multiplier: f64, tree_step: u64) -> Self {
        Self {
            noise_multiplier,
            tree_step,
            neighbours: Neighbours::ZeroOut,
        }
    }

    /// The node this step adds to a client's worst case: a Gaussian mechanism without sampling
    /// (q = 1) of multiplier z over the relation's sensitivity factor when n is a power of two,
    /// nothing otherwise (module documentation).
    pub fn node(&self) -> Option<GaussianRound> {
        self.tree_step
            .is_power_of_two()
            .then_some(GaussianRound::unsampled(
                self.noise_multiplier / self.neighbours.sensitivity(1.0),
            ))
    }
}

impl LedgerEvent for TreeRound {
    fn rdp_curve(&self, orders: &[f64]) -> Vec<f64> {
        gaussian_curve(self.node(), orders)
    }

    /// Its new node, if the step adds one to a client's worst case.
    fn as_gaussian(&self) -> Option<Option<GaussianRound>> {
        Some(self.node())
    }

    /// Correlated noise in memory only: a restarted server starts a new tree.
    fn reruns_after_crash(&self) -> bool {
        false
    }
}
