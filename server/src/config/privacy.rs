//! `[privacy]`: client-level differential privacy.

use fl_common::schedule::Schedule;
use fl_privacy::{AccountantKind, Budget, LocalKind, Sampling, StreamSettings};
use serde::{Deserialize, Serialize};

/// Whether and how the server protects clients: `none`, `central`, `secagg`, `dp-ftrl` or a
/// client-side mechanism's name (`ldp-gaussian`, `ldp-laplace`, `signds`). Each mode's meaning,
/// as the configuration reference gives it, is in [`PrivacyMode::all`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrivacyMode {
    /// `none`: plain FedAvg.
    None,
    /// `central`: client-level central DP.
    Central,
    /// `secagg`: secure aggregation.
    SecAgg,
    /// A client-side mechanism, by its name; its keys are `[local]`.
    Local(LocalKind),
    /// `dp-ftrl`: DP-FTRL.
    DpFtrl,
    /// `verified`: secure rounds whose every contribution is proved within the norm bound.
    Verified,
}

impl PrivacyMode {
    /// The modes that are not a client-side mechanism, with their names and meanings.
    const SERVER_SIDE: [(PrivacyMode, &'static str, &'static str); 5] = [
        (Self::None, "none", "Plain FedAvg."),
        (
            Self::Central,
            "central",
            "Client-level central DP (Geyer et al.): clipping, Gaussian noise on the sum, \
             accountant.",
        ),
        (
            Self::SecAgg,
            "secagg",
            "Secure aggregation: the server sees only the sum of clipped, quantised updates \
             (with optional central or distributed noise, see `[secagg]`).",
        ),
        (
            Self::DpFtrl,
            "dp-ftrl",
            "DP-FTRL (Kairouz et al. 2021): the trusted curator clips and adds correlated noise \
             (`noise`: a tree or a banded matrix factorization); no sampling, each client within \
             the noise's participation rule. Each client's contributions are counted by its \
             identity, which needs stable identities: `fl-server` refuses DP-FTRL without \
             `server.enrollment`, and `fl sim` enrolls its own clients in \
             `RUN/sim-enrollment.toml`.",
        ),
        (
            Self::Verified,
            "verified",
            "Verified secure rounds: each client splits its clipped update between the server \
             and a helper (a second aggregator, `[verified]`) with a zero-knowledge proof that \
             its L2 norm is at most `privacy.clip_bound`; a contribution whose proof fails is \
             excluded, and neither aggregator sees any one update.",
        ),
    ];

    /// Every mode with its name and meaning, the client-side mechanisms from their list.
    pub fn all() -> Vec<(PrivacyMode, &'static str, &'static str)> {
        let local = (LocalKind::ALL.iter()).map(|&k| (Self::Local(k), k.name(), k.description()));
        let (server, ftrl) = Self::SERVER_SIDE.split_at(3);
        (server.iter().copied().chain(local))
            .chain(ftrl.iter().copied())
            .collect()
    }

    /// Its name in configurations.
    pub fn name(self) -> &'static str {
        match self {
            Self::Local(kind) => kind.name(),
            Self::None | Self::Central | Self::SecAgg | Self::DpFtrl | Self::Verified => {
                let same = |(m, ..): &&(PrivacyMode, &str, &str)| *m == self;
                Self::SERVER_SIDE
                    .iter()
                    .find(same)
                    .map_or("", |(_, n, _)| n)
            }
        }
    }

    /// The client-side mechanism, if the mode is one.
    pub fn local(self) -> Option<LocalKind> {
        match self {
            Self::Local(kind) => Some(kind),
            Self::None | Self::Central | Self::SecAgg | Self::DpFtrl | Self::Verified => None,
        }
    }
}

impl std::str::FromStr for PrivacyMode {
    type Err = String;

    /// The mode [`PrivacyMode::name`] names.
    fn from_str(s: &str) -> Result<Self, String> {
        let all = Self::all();
        let found = all.iter().find(|(_, name, _)| *name == s);
        found.map(|(mode, ..)| *mode).ok_or_else(|| {
            let names: Vec<&str> = all.iter().map(|(_, name, _)| *name).collect();
            format!(
                "unknown privacy mode `{s}`, expected one of {}",
                names.join(", ")
            )
        })
    }
}

impl Serialize for PrivacyMode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for PrivacyMode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for PrivacyMode {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "PrivacyMode".into()
    }

    /// Each name with its meaning.
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let variants: Vec<serde_json::Value> = (Self::all().into_iter())
            .map(|(_, name, meaning)| {
                serde_json::json!({ "type": "string", "const": name, "description": meaning })
            })
            .collect();
        schemars::json_schema!({
            "description": "Whether and how the server protects clients.",
            "oneOf": variants,
        })
    }
}

/// Which quantity the budget caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BudgetKind {
    /// epsilon(delta) <= `epsilon` at `delta`.
    Epsilon,
    /// delta(epsilon) <= `delta` at fixed `epsilon` (Geyer et al.'s Q).
    Delta,
}

/// `[privacy]`: client-level differential privacy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PrivacySection {
    /// `none`, `central`, `secagg`, `ldp-gaussian`, `ldp-laplace`, `signds` or `dp-ftrl`.
    pub mode: PrivacyMode,
    /// `poisson` (each client with probability q_t = m_t/K; exact accounting) or `fixed`
    /// (exactly m_t; accounted with a valid but looser bound).
    pub sampling: Sampling,
    /// z_t: noise standard deviation over S; a number or a schedule.
    pub noise_multiplier: Schedule,
    /// `fixed`, `median` or `quantile`.
    pub clip: ClipMode,
    /// S (the starting S for `quantile`).
    pub clip_bound: f64,
    /// gamma: target quantile of update norms (`quantile`).
    pub target_quantile: f64,
    /// eta_C: geometric step of the adaptive bound (`quantile`).
    pub clip_learning_rate: f64,
    /// sigma_b: noise standard deviation on the centred count sum_i (b_i - 1/2) of unclipped
    /// updates (sensitivity 1/2), for `quantile`; must exceed z/2; unset: m/20 as Andrew et al.
    /// suggest.
    pub clip_count_noise: Option<f64>,
    /// `epsilon` (stop before epsilon(delta) passes `epsilon`) or `delta` (stop before
    /// delta(epsilon) passes `delta`, the paper's Q).
    pub budget: BudgetKind,
    /// The epsilon of the budget.
    pub epsilon: f64,
    /// The delta of the budget (the threshold Q for `budget = "delta"`).
    pub delta: f64,
    /// `pld` (privacy-loss distributions: tighter, for Poisson-subsampled Gaussian rounds and
    /// DP-FTRL's tree nodes) or `rdp`; unset: PLD for Poisson sampling and DP-FTRL, RDP
    /// otherwise.
    pub accountant: Option<AccountantKind>,
    /// DP-FTRL's noise stream: its name (`"tree"`, `"banded"`), every setting at its default,
    /// or its table (`[privacy.noise.banded]`, keys below).
    pub noise: StreamSettings,
}

impl Default for PrivacySection {
    fn default() -> Self {
        Self {
            mode: PrivacyMode::None,
            sampling: Sampling::Poisson,
            noise_multiplier: Schedule::Constant(1.0),
            clip: ClipMode::Fixed,
            clip_bound: 1.0,
            target_quantile: 0.5,
            clip_learning_rate: 0.2,
            clip_count_noise: None,
            budget: BudgetKind::Epsilon,
            epsilon: 8.0,
            delta: 1e-5,
            accountant: None,
            noise: StreamSettings::default(),
        }
    }
}

impl PrivacySection {
    /// The budget the ledger enforces.
    pub fn budget(&self) -> Budget {
        match self.budget {
            BudgetKind::Epsilon => Budget::Epsilon {
                epsilon: self.epsilon,
                delta: self.delta,
            },
            BudgetKind::Delta => Budget::Delta {
                epsilon: self.epsilon,
                delta: self.delta,
            },
        }
    }

    /// sigma_b for a round of `m` clients.
    pub fn count_noise(&self, m: f64) -> f64 {
        self.clip_count_noise.unwrap_or(m / 20.0)
    }
}

/// How the clip bound S is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClipMode {
    /// S = `clip_bound` every round.
    Fixed,
    /// S = median of the round's update norms (Geyer et al.); NOT private, marked as leaking.
    Median,
    /// S adapted towards `target_quantile` of the norms with a noised count (Andrew et al. 2021).
    Quantile,
}

impl std::fmt::Display for ClipMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ClipMode::Fixed => "fixed",
            ClipMode::Median => "median",
            ClipMode::Quantile => "quantile",
        })
    }
}
