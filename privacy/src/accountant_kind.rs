//! Which accountant reads a run's events: RDP (the subsampled Gaussian's Rényi curves) or PLD
//! (privacy loss distributions), chosen by name in configurations and on the command line.

use super::accountant::{Accountant, RdpAccountant};
use super::event::PrivacyEvent;
use super::pld::PldAccountant;
use serde::{Deserialize, Serialize};

/// Which accountant reads a ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum AccountantKind {
    /// Rényi DP ([`RdpAccountant`]): every event the system releases.
    Rdp,
    /// Privacy-loss distributions ([`PldAccountant`]): tighter, for Poisson-subsampled
    /// Gaussian rounds and tree aggregation.
    Pld,
}

impl AccountantKind {
    /// An empty accountant of this kind.
    pub fn accountant(self) -> Box<dyn Accountant> {
        match self {
            AccountantKind::Rdp => Box::new(RdpAccountant::default()),
            AccountantKind::Pld => Box::new(PldAccountant::default()),
        }
    }

    /// Whether this kind accounts `event` (PLD: Poisson-subsampled Gaussian rounds only).
    pub fn supports(self, event: &PrivacyEvent) -> bool {
        match self {
            AccountantKind::Rdp => true,
            AccountantKind::Pld => PldAccountant::supports(event),
        }
    }
}

impl std::fmt::Display for AccountantKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AccountantKind::Rdp => "rdp",
            AccountantKind::Pld => "pld",
        })
    }
}

impl std::str::FromStr for AccountantKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "rdp" => Ok(AccountantKind::Rdp),
            "pld" => Ok(AccountantKind::Pld),
            _ => Err(format!("unknown accountant `{s}` (rdp or pld)")),
        }
    }
}
