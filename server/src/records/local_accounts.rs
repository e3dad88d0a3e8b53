//! The server's view of client-side privacy: it checks that each upload is protected as the round
//! asks, and keeps every client's composed local privacy loss over the rounds it took part in.
//! The figures are what the clients claim to have applied (the server cannot see their noise);
//! each client logs the same figures for itself.

use crate::identity::ids::ClientId;
use fl_privacy::{LocalLedger, LocalMechanism, Release};
use serde::Serialize;
use std::collections::BTreeMap;

/// The round's mechanism and every client's ledger.
#[derive(Debug)]
pub(crate) struct LocalAccounts {
    mechanism: LocalMechanism,
    clients: BTreeMap<ClientId, LocalLedger>,
}

/// One client's line in `local_privacy.json`.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct ClientSpend {
    /// The client.
    pub client: ClientId,
    /// Uploads it made.
    pub releases: u64,
    /// Their composed epsilon.
    pub epsilon: f64,
}

/// `summary.json`'s `local_privacy` object.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct LocalPrivacySummary {
    /// `ldp-gaussian`, `ldp-laplace` or `signds`.
    pub mechanism: String,
    /// epsilon of one upload.
    pub epsilon_per_round: f64,
    /// delta of one upload and of the composed figures (0 for pure mechanisms).
    pub delta: f64,
    /// Clients that uploaded at least once.
    pub clients: usize,
    /// Most uploads by one client.
    pub max_releases: u64,
    /// Largest composed epsilon of any client.
    pub max_epsilon: f64,
    /// Mean composed epsilon over those clients.
    pub mean_epsilon: f64,
}

impl LocalAccounts {
    /// Accounts for `mechanism`, composing its releases at its delta.
    pub(crate) fn new(mechanism: LocalMechanism) -> Self {
        Self {
            mechanism,
            clients: BTreeMap::new(),
        }
    }

    /// The round's mechanism.
    pub(crate) fn mechanism(&self) -> LocalMechanism {
        self.mechanism
    }

    /// Checks an upload's declared protection against the round's mechanism.
    pub(crate) fn admit(&self, release: Option<&Release>) -> Result<Release, String> {
        let Some(release) = release else {
            return Err(format!(
                "this round's uploads must be protected with {}: the upload declares no release",
                self.mechanism.name()
            ));
        };
        self.mechanism.admits(release).map_err(|e| e.to_string())?;
        Ok(*release)
    }

    /// Records an absorbed upload.
    pub(crate) fn record(&mut self, client: ClientId, release: &Release) {
        self.clients.entry(client).or_default().record(release);
    }

    /// Every client's ledger, for a checkpoint.
    pub(crate) fn ledgers(&self) -> &BTreeMap<ClientId, LocalLedger> {
        &self.clients
    }

    /// Takes up the ledgers of a checkpoint (client ids survive restarts).
    pub(crate) fn restore(&mut self, ledgers: BTreeMap<ClientId, LocalLedger>) {
        self.clients = ledgers;
    }

    /// Largest composed epsilon of any client so far.
    pub(crate) fn max_epsilon(&self) -> f64 {
        self.clients
            .values()
            .map(|l| l.epsilon(self.mechanism.composed_delta()))
            .fold(0.0, f64::max)
    }

    /// Every client's figures.
    pub(crate) fn per_client(&self) -> Vec<ClientSpend> {
        self.clients
            .iter()
            .map(|(&client, l)| ClientSpend {
                client,
                releases: l.releases(),
                epsilon: l.epsilon(self.mechanism.composed_delta()),
            })
            .collect()
    }

    /// The run's figures.
    pub(crate) fn summary(&self) -> LocalPrivacySummary {
        let spends = self.per_client();
        let n = spends.len();
        let delta = self.mechanism.composed_delta();
        LocalPrivacySummary {
            mechanism: self.mechanism.name().into(),
            epsilon_per_round: self.mechanism.epsilon(),
            delta,
            clients: n,
            max_releases: spends.iter().map(|s| s.releases).max().unwrap_or(0),
            max_epsilon: self.max_epsilon(),
            mean_epsilon: spends.iter().map(|s| s.epsilon).sum::<f64>() / n.max(1) as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fl_privacy::{GaussianLdp, LocalKind, SignDsLdp};

    #[test]
    fn refuses_unprotected_or_mismatched_uploads_and_composes_per_client() {
        let mut a = LocalAccounts::new(LocalMechanism::SignDs(SignDsLdp {
            epsilon: 0.5,
            k: 10,
            h: 5,
        }));
        assert!(a.admit(None).unwrap_err().contains("signds"));
        let gaussian = LocalMechanism::Gaussian(GaussianLdp {
            epsilon: 0.5,
            delta: 1e-5,
            clip_bound: 1.0,
        })
        .accounted_release()
        .unwrap();
        assert!(a.admit(Some(&gaussian)).is_err());
        let ok = a
            .admit(Some(&Release {
                kind: LocalKind::SignDs,
                epsilon: 0.5,
                delta: 0.0,
                noise: 0.0,
                sensitivity: 0.0,
            }))
            .unwrap();
        for _ in 0..3 {
            a.record(7, &ok);
        }
        a.record(8, &ok);
        let s = a.summary();
        assert_eq!((s.clients, s.max_releases), (2, 3));
        assert_eq!((s.max_epsilon, s.mean_epsilon), (1.5, 1.0));
    }
}
