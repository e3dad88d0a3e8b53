//! `[train]`: local training each round.

use fl_common::model::LocalConfig;
use serde::{Deserialize, Serialize};

/// The training algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// Federated averaging: E epochs of local SGD, the server averages the updates.
    FedAvg,
    /// Inexact ADMM (APPFL): one linearised primal step per round, duals kept by the server.
    Iadmm,
}

/// `[train]`: local training each round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// `fedavg` or `iadmm` (which ignores epochs, batch size and learning rate: its step is
    /// 1/rho).
    pub algorithm: Algorithm,
    /// E: local epochs.
    pub epochs: u32,
    /// B: local mini-batch size.
    pub batch_size: u32,
    /// eta: local SGD learning rate.
    pub learning_rate: f32,
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            algorithm: Algorithm::FedAvg,
            epochs: 1,
            batch_size: 10,
            learning_rate: 0.05,
        }
    }
}

impl TrainSection {
    /// The per-round instructions for clients.
    pub fn local_config(&self) -> LocalConfig {
        LocalConfig {
            epochs: self.epochs,
            batch_size: self.batch_size,
            learning_rate: self.learning_rate,
        }
    }
}
