//! A round's task as a client receives it, in the domain's terms: what to train, how, and how to
//! protect the result. `fl_proto`'s conversion builds it from the wire, refusing malformed tasks.

use crate::model::{LocalConfig, Model};
use crate::privacy::LocalMechanism;
use crate::secagg::Quantizer;

/// What a round asks of a sampled client.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// t.
    pub round: u64,
    /// The model.
    pub model: Model,
    /// E, B, eta.
    pub config: LocalConfig,
    /// The mechanism every upload must be protected with, under a client-side mode.
    pub local: Option<LocalMechanism>,
    /// The secure-aggregation round that follows training, if any.
    pub secure: Option<SecureTask>,
    /// The inexact-ADMM step to take instead of FedAvg's local SGD, if any.
    pub admm: Option<AdmmStep>,
    /// Federated evaluation: the client evaluates the received model on its own examples before
    /// training and reports the figures with a plain update (never with a protected one).
    pub evaluate: bool,
}

/// How a client enters a secure-aggregation round with its update.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SecureTask {
    /// The fixed-point code: clip to S, scale by gamma, round into the ring.
    pub quantizer: Quantizer,
    /// sigma_i^2: the discrete Gaussian noise each client adds to its code (0: none).
    pub noise_variance: u64,
}

/// One inexact-ADMM primal step's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdmmStep {
    /// rho.
    pub rho: f64,
    /// I: examples over all clients.
    pub total_examples: u64,
}

impl Task {
    /// The length of the tensor the task carries: the model, or for IADMM the anchor followed
    /// by the point.
    pub fn tensor_len(&self) -> usize {
        let d = self.model.num_params();
        match self.admm {
            Some(_) => 2 * d,
            None => d,
        }
    }
}
