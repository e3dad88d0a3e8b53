//! The run configuration: one TOML file with `[server]`, `[model]`, `[train]` and `[data]`
//! sections, every key optional with the defaults below, unknown keys refused.

use crate::credentials::Token;
use fl_common::data::{DataSource, PartitionScheme};
use fl_common::model::{LayerSpec, LocalConfig, ModelSpec, Shape, cnn};
use fl_common::privacy::LocalMechanism;
use fl_common::privacy::{
    AccountantKind, Budget, GaussianRound, PrivacyEvent, Sampling, max_rounds,
};
use fl_common::schedule::Schedule;
use fl_common::secagg::{GraphKind, Stage, auto_degree, check_combination};
use fl_common::signds::{SignDs, SignDsError};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Why a configuration is refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        source: toml::de::Error,
    },
    /// A value is out of range or inconsistent with another.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Everything a run needs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// Networking, rounds and outputs.
    pub server: ServerSection,
    /// The model architecture.
    pub model: ModelSection,
    /// Local training, sent to clients each round.
    pub train: TrainSection,
    /// The dataset (the server evaluates on its test split; `fl sim` partitions its training
    /// split across the simulated clients).
    pub data: DataSection,
    /// Client-level differential privacy.
    pub privacy: PrivacySection,
    /// Secure aggregation (with `privacy.mode = "secagg"`).
    pub secagg: SecAggSection,
    /// Client-side mechanisms (with `privacy.mode = "ldp-gaussian"`, `"ldp-laplace"` or
    /// `"signds"`).
    pub local: LocalSection,
    /// SignDS (with `privacy.mode = "signds"`).
    pub signds: SignDsSection,
    /// Inexact ADMM (with `train.algorithm = "iadmm"`).
    pub admm: AdmmSection,
    /// Defences against hostile updates: the aggregate's bound, and for non-private FedAvg an
    /// update-norm bound and the trimmed mean.
    pub robust: RobustSection,
}

/// `[server]`: networking, rounds and outputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// Address to listen on (`fl sim` always uses a free loopback port instead).
    pub listen: String,
    /// K: clients expected; the first round starts once K are connected.
    pub clients: usize,
    /// m_t: clients sampled per round (all connected ones when fewer are connected); a number
    /// or a schedule. Under Poisson sampling each client is included with q_t = m_t / K.
    pub clients_per_round: Schedule,
    /// Fewest results for a round to update the model; otherwise the round is skipped.
    pub min_clients: usize,
    /// T: number of rounds.
    pub rounds: u64,
    /// Seconds a round waits for results before dropping the sampled clients that have not
    /// answered.
    pub round_timeout_secs: f64,
    /// Seconds to wait for K clients before giving up.
    pub join_timeout_secs: f64,
    /// Run folder for metrics, summary and model.
    pub out: PathBuf,
    /// Seed for sampling and initialisation; reproducible experiments only, never for privacy.
    pub seed: Option<u64>,
    /// Enrollment token every client must present at Join (in clear, or as `sha256:HEX`; always
    /// written out as its digest); none admits any client. Excludes `enrollment`.
    pub token: Option<Token>,
    /// Enrollment file naming each client with its own token or certificate, which can revoke
    /// clients while the server runs (see [`crate::credentials`]).
    pub enrollment: Option<PathBuf>,
    /// Seconds a sampled client that lost its stream has to come back with the same identity and
    /// receive its task again before the round counts it as dropped (plain rounds; 0: dropped at
    /// once).
    pub reconnect_grace_secs: f64,
    /// Seconds a client may pause in the middle of sending a tensor before it is dropped.
    pub upload_stall_secs: f64,
    /// Seconds a new connection has to send its first bytes (the HTTP/2 preface, or the TLS
    /// ClientHello) before it is closed.
    pub handshake_timeout_secs: f64,
    /// Seconds a client without a live stream (joined but never opened its Session, or gone) is
    /// remembered; after that it must join again.
    pub forget_after_secs: f64,
    /// Most clients without a live stream held at once; Join is refused with RESOURCE_EXHAUSTED
    /// beyond it.
    pub max_idle_clients: usize,
    /// Address of the Prometheus endpoint (`GET /metrics`); none serves no metrics.
    pub metrics_listen: Option<String>,
    /// Joins (and partition requests) allowed per second from one address; more get
    /// RESOURCE_EXHAUSTED and retry later.
    pub join_rate: f64,
    /// Joins one address may make at once before `join_rate` applies.
    pub join_burst: u32,
    /// PEM certificate (chain) of the server: TLS is on when it and `tls_key` are set.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// PEM certificate of the CA that signs client certificates: with it, only clients that
    /// present a certificate from this CA can connect (mutual TLS).
    pub tls_client_ca: Option<PathBuf>,
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:50051".into(),
            clients: 100,
            clients_per_round: Schedule::Constant(10.0),
            min_clients: 1,
            rounds: 50,
            round_timeout_secs: 300.0,
            join_timeout_secs: 600.0,
            out: "runs/latest".into(),
            seed: None,
            token: None,
            enrollment: None,
            reconnect_grace_secs: 10.0,
            upload_stall_secs: 60.0,
            handshake_timeout_secs: 10.0,
            forget_after_secs: 120.0,
            max_idle_clients: 20_000,
            metrics_listen: None,
            join_rate: 100.0,
            join_burst: 2000,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
        }
    }
}

/// The kind of model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// Multinomial logistic regression.
    Logistic,
    /// Fully connected ReLU network with `hidden` widths.
    Mlp,
    /// Convolutional network of the listed `layers`.
    Cnn,
    /// McMahan et al. 2017's CNN ([`cnn::FEDAVG_CNN`]).
    FedavgCnn,
    /// LeNet-5 ([`cnn::LENET5`]).
    Lenet5,
}

impl std::str::FromStr for ModelKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::deserialize(toml::Value::String(s.into()))
            .map_err(|_| format!("unknown model `{s}` (logistic, mlp, cnn, fedavg-cnn or lenet5)"))
    }
}

/// `[model]`: the architecture. The input's shape and the classes come from the dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// `mlp`, `logistic`, `cnn`, or a named CNN: `fedavg-cnn`, `lenet5`.
    pub kind: ModelKind,
    /// Hidden widths of the MLP (the Geyer et al. default 600, 100).
    pub hidden: Vec<usize>,
    /// The layers of a `cnn`, e.g. `["conv:32:5:pad2", "relu", "maxpool:2", "dense:10"]`; the
    /// last is dense with one unit per class.
    pub layers: Vec<String>,
    /// Starting weights: a safetensors file with the network's tensor names and shapes (as the
    /// run's `model.safetensors` has them). Without it the weights are drawn afresh.
    pub init: Option<PathBuf>,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            kind: ModelKind::Mlp,
            hidden: vec![600, 100],
            layers: Vec::new(),
            init: None,
        }
    }
}

impl ModelSection {
    /// The architecture for examples of shape `input` and `classes` classes.
    pub fn spec(&self, input: Shape, classes: usize) -> Result<ModelSpec, ConfigError> {
        let invalid = |e: String| ConfigError::Invalid(format!("model: {e}"));
        match self.kind {
            ModelKind::Logistic => ModelSpec::logistic(input.len(), classes),
            ModelKind::Mlp => ModelSpec::mlp(input.len(), &self.hidden, classes),
            ModelKind::Cnn | ModelKind::FedavgCnn | ModelKind::Lenet5 => {
                let mut layers = self.conv_layers().map_err(invalid)?;
                let last = layers.len() - 1;
                match (&mut layers[last], self.kind) {
                    // A named network ends in one unit per class of the data.
                    (LayerSpec::Dense { units }, ModelKind::FedavgCnn | ModelKind::Lenet5) => {
                        *units = classes;
                    }
                    (&mut LayerSpec::Dense { units }, _) if units != classes => {
                        return Err(invalid(format!(
                            "layer {last} (dense:{units}): the last layer needs one unit per \
                             class, and the data has {classes}"
                        )));
                    }
                    _ => {}
                }
                ModelSpec::cnn(input, &layers)
            }
        }
        .map_err(|e| invalid(e.to_string()))
    }

    /// The layer list of a convolutional kind, parsed; a bad text is named.
    fn conv_layers(&self) -> Result<Vec<LayerSpec>, String> {
        let texts: Vec<&str> = match self.kind {
            ModelKind::Cnn => self.layers.iter().map(String::as_str).collect(),
            ModelKind::FedavgCnn => cnn::FEDAVG_CNN.to_vec(),
            ModelKind::Lenet5 => cnn::LENET5.to_vec(),
            ModelKind::Logistic | ModelKind::Mlp => Vec::new(),
        };
        if texts.is_empty() {
            return Err("kind = \"cnn\" needs its `layers`".into());
        }
        (texts.iter().enumerate())
            .map(|(i, text)| {
                text.parse()
                    .map_err(|e| format!("layer {i} ({text:?}): {e}"))
            })
            .collect()
    }

    /// Checks what does not depend on the data: the kind's settings, and every layer's text.
    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |e: String| Err(ConfigError::Invalid(e));
        match self.kind {
            ModelKind::Mlp if self.hidden.is_empty() => {
                invalid("model.hidden must list at least one width for an mlp".into())
            }
            ModelKind::Cnn => {
                (self.conv_layers().map(drop)).or_else(|e| invalid(format!("model.layers: {e}")))
            }
            _ if !self.layers.is_empty() => {
                invalid("model.layers is for kind = \"cnn\" (the other kinds fix theirs)".into())
            }
            _ => Ok(()),
        }
    }
}

/// The training algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// Federated averaging: E epochs of local SGD, the server averages the updates.
    FedAvg,
    /// Inexact ADMM (APPFL): one linearised primal step per round, duals kept by the server.
    Iadmm,
}

impl ServerSection {
    /// Checks the server's ranges and consistency.
    fn validate(&self) -> Result<(), ConfigError> {
        let s = self;
        let m = &s.clients_per_round;
        let checks = [
            (
                s.clients >= 1,
                "server.clients (K) must be at least 1".to_string(),
            ),
            (s.rounds >= 1, "server.rounds must be at least 1".into()),
            (
                s.min_clients >= 1
                    && m.values()
                        .iter()
                        .all(|&v| s.min_clients as f64 <= v.round()),
                format!(
                    "server.min_clients ({}) must be between 1 and clients_per_round ({m})",
                    s.min_clients
                ),
            ),
            (
                s.round_timeout_secs > 0.0 && s.round_timeout_secs.is_finite(),
                "server.round_timeout_secs must be positive".into(),
            ),
            (
                s.join_timeout_secs > 0.0 && s.join_timeout_secs.is_finite(),
                "server.join_timeout_secs must be positive".into(),
            ),
            (
                s.reconnect_grace_secs >= 0.0 && s.reconnect_grace_secs.is_finite(),
                "server.reconnect_grace_secs must be 0 or more".into(),
            ),
            (
                s.upload_stall_secs > 0.0 && s.upload_stall_secs.is_finite(),
                "server.upload_stall_secs must be positive".into(),
            ),
            (
                s.handshake_timeout_secs > 0.0 && s.handshake_timeout_secs.is_finite(),
                "server.handshake_timeout_secs must be positive".into(),
            ),
            (
                s.forget_after_secs.is_finite()
                    && s.forget_after_secs >= s.reconnect_grace_secs
                    && s.forget_after_secs > 0.0,
                "server.forget_after_secs must be positive and at least reconnect_grace_secs"
                    .into(),
            ),
            (
                s.max_idle_clients >= 1,
                "server.max_idle_clients must be at least 1".into(),
            ),
            (
                s.token.is_none() || s.enrollment.is_none(),
                "server.token and server.enrollment exclude each other: enrolled clients each \
                 have their own token"
                    .into(),
            ),
            (
                s.join_rate > 0.0 && s.join_rate.is_finite() && s.join_burst >= 1,
                "server.join_rate must be positive and server.join_burst at least 1".into(),
            ),
            (
                s.tls_cert.is_some() == s.tls_key.is_some()
                    && (s.tls_client_ca.is_none() || s.tls_cert.is_some()),
                "server.tls_cert and server.tls_key go together, and tls_client_ca needs them"
                    .into(),
            ),
        ];
        if let Some((_, message)) = checks.into_iter().find(|(ok, _)| !ok) {
            return Err(ConfigError::Invalid(message));
        }
        m.check(
            "server.clients_per_round",
            |v| v.round() >= 1.0 && v.round() <= s.clients as f64,
            &format!("between 1 and clients (K = {})", s.clients),
        )
        .map_err(ConfigError::Invalid)
    }
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

/// `[data]`: the dataset and, for simulations, how it is split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataSection {
    /// `mnist:DIR` or `csv:FILE` (the server reads the test split).
    pub source: DataSource,
    /// For `fl sim`: `iid`, `shards` or `dirichlet:ALPHA`.
    pub partition: PartitionScheme,
    /// Seed of the partition (a simulation device, not a privacy mechanism).
    pub partition_seed: u64,
}

impl Default for DataSection {
    fn default() -> Self {
        Self {
            source: DataSource::Mnist("data/mnist".into()),
            partition: PartitionScheme::Shards,
            partition_seed: 0,
        }
    }
}

impl RunConfig {
    /// Reads and validates a TOML file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_with(path, &[])
    }

    /// Reads a TOML file, applies `overrides` (`section.key=VALUE`, VALUE in TOML syntax or a
    /// bare string, e.g. `local.epsilon=2` or `data.partition=iid`), and validates the result.
    pub fn load_with(path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        let parse = |source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        };
        let mut table: toml::Table = toml::from_str(&text).map_err(parse)?;
        for o in overrides {
            apply_override(&mut table, o)?;
        }
        let config: RunConfig = table.try_into().map_err(parse)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges and consistency; every run calls this before it starts.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.server.validate()?;
        (self.train.local_config().check())
            .map_err(|e| ConfigError::Invalid(format!("train.{e}")))?;
        self.model.validate()?;
        self.robust.validate(self)?;
        self.privacy.validate(self)
    }

    /// m_t, rounded to a whole number of clients.
    pub fn clients_at(&self, round: u64) -> usize {
        self.server
            .clients_per_round
            .at(round, self.server.rounds)
            .round() as usize
    }

    /// The central Gaussian mechanism of round `round` with K clients, or `None` when no
    /// central noise is added (non-private runs, and distributed noise under secure aggregation,
    /// which the round loop accounts once it knows the round's quantisation).
    pub fn round_event(&self, round: u64) -> Option<GaussianRound> {
        let p = &self.privacy;
        let central = match p.mode {
            PrivacyMode::None
            | PrivacyMode::LdpGaussian
            | PrivacyMode::LdpLaplace
            | PrivacyMode::SignDs => false,
            PrivacyMode::Central => true,
            PrivacyMode::SecAgg => self.secagg.noise == SecAggNoise::Central,
        };
        central.then(|| GaussianRound {
            q: self.clients_at(round) as f64 / self.server.clients as f64,
            noise_multiplier: p.noise_multiplier.at(round, self.server.rounds),
            sampling: p.sampling,
        })
    }

    /// The accountant of the run's ledger: `privacy.accountant`, or by default PLD (tighter) when
    /// every round is a Poisson-subsampled Gaussian one and RDP otherwise.
    pub fn accountant(&self) -> AccountantKind {
        self.privacy
            .accountant
            .unwrap_or(if self.rounds_are_poisson_gaussian() {
                AccountantKind::Pld
            } else {
                AccountantKind::Rdp
            })
    }

    /// Checks what only a server needs and a simulation fills in itself: IADMM's public I.
    pub fn validate_for_server(&self) -> Result<(), ConfigError> {
        if self.train.algorithm == Algorithm::Iadmm
            && self.admm.total_examples.is_none_or(|i| i == 0)
        {
            return Err(ConfigError::Invalid(
                "train.algorithm = \"iadmm\" needs admm.total_examples, the public number I of \
                 examples over all clients (clients do not send their counts)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Whether every accounted round is a Poisson-subsampled Gaussian one, all PLD accounts.
    fn rounds_are_poisson_gaussian(&self) -> bool {
        let distributed = self.privacy.mode == PrivacyMode::SecAgg
            && self.secagg.noise == SecAggNoise::Distributed;
        self.privacy.sampling == Sampling::Poisson && !distributed
    }

    /// Whether the clip bound S itself leaks the clients' data (the paper's median rule): the
    /// ledger and summary say so, and the reported epsilon does not cover it.
    pub fn clip_bound_leaks(&self) -> bool {
        self.privacy.clip == ClipMode::Median
    }

    /// Whether the run keeps a central privacy ledger (local mechanisms are accounted per
    /// client instead).
    pub fn is_private(&self) -> bool {
        match self.privacy.mode {
            PrivacyMode::None
            | PrivacyMode::LdpGaussian
            | PrivacyMode::LdpLaplace
            | PrivacyMode::SignDs => false,
            PrivacyMode::Central => true,
            PrivacyMode::SecAgg => self.secagg.noise != SecAggNoise::None,
        }
    }

    /// The client-side mechanism of the run for a model of `dim` parameters, or `None`.
    pub fn local_mechanism(&self, dim: usize) -> Result<Option<LocalMechanism>, ConfigError> {
        let l = &self.local;
        let mechanism = match self.privacy.mode {
            PrivacyMode::LdpGaussian => LocalMechanism::Gaussian {
                epsilon: l.epsilon,
                delta: l.delta,
                clip: l.clip_bound,
            },
            PrivacyMode::LdpLaplace => LocalMechanism::Laplace {
                epsilon: l.epsilon,
                clip: l.clip_bound,
            },
            PrivacyMode::SignDs => {
                let invalid = |e: SignDsError| ConfigError::Invalid(e.to_string());
                let k = ((self.signds.top_k * dim as f64).round() as usize).max(1);
                let signds = match self.signds.output_dimensions {
                    0 => SignDs::with_ratio(dim, k, l.epsilon, self.signds.ratio),
                    h => SignDs::new(dim, k, h, l.epsilon),
                }
                .map_err(invalid)?;
                LocalMechanism::SignDs {
                    epsilon: l.epsilon,
                    k: signds.k,
                    h: signds.h,
                }
            }
            PrivacyMode::None | PrivacyMode::Central | PrivacyMode::SecAgg => return Ok(None),
        };
        mechanism
            .check(dim)
            .map_err(|e| ConfigError::Invalid(format!("[local]: {e}")))?;
        Ok(Some(mechanism))
    }
}

/// Sets `section.key` (any depth) of `table` to VALUE from a `section.key=VALUE` override.
fn apply_override(table: &mut toml::Table, o: &str) -> Result<(), ConfigError> {
    let bad = || ConfigError::Invalid(format!("override {o:?}: expected section.key=VALUE"));
    let (path, raw) = o.split_once('=').ok_or_else(bad)?;
    let keys: Vec<&str> = path.trim().split('.').collect();
    let (last, sections) = keys.split_last().ok_or_else(bad)?;
    if last.is_empty() || sections.is_empty() {
        return Err(bad());
    }
    let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.trim().to_string()));
    let mut here = table;
    for key in sections {
        here = here
            .entry(key.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .ok_or_else(bad)?;
    }
    here.insert(last.to_string(), value);
    Ok(())
}

/// Whether and how the server protects clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrivacyMode {
    /// Plain FedAvg.
    None,
    /// Client-level central DP (Geyer et al.): clipping, Gaussian noise on the sum, accountant.
    Central,
    /// Secure aggregation: the server sees only the sum of clipped, quantised updates (with
    /// optional central or distributed noise, see `[secagg]`).
    SecAgg,
    /// Each client clips its update and adds Gaussian noise (W_p = W + G), see `[local]`.
    #[serde(rename = "ldp-gaussian")]
    LdpGaussian,
    /// Each client trains on L1-clipped per-example gradients and adds Laplace noise to its
    /// output (APPFL), see `[local]`.
    #[serde(rename = "ldp-laplace")]
    LdpLaplace,
    /// Each client uploads only a sign and a few dimensions (SignDS, EM-MDS), see `[signds]`.
    #[serde(rename = "signds")]
    SignDs,
}

/// How the clip bound S is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

/// Which quantity the budget caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BudgetKind {
    /// epsilon(delta) <= `epsilon` at `delta`.
    Epsilon,
    /// delta(epsilon) <= `delta` at fixed `epsilon` (Geyer et al.'s Q).
    Delta,
}

/// `[privacy]`: client-level differential privacy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrivacySection {
    /// `none` or `central`.
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
    /// sigma_b: noise standard deviation on the unclipped count (`quantile`); default m/20 as
    /// Andrew et al. suggest.
    pub clip_count_noise: Option<f64>,
    /// `epsilon` (cap epsilon at `delta`) or `delta` (cap delta at fixed `epsilon`).
    pub budget: BudgetKind,
    /// The epsilon of the budget.
    pub epsilon: f64,
    /// The delta of the budget (the threshold Q for `budget = "delta"`).
    pub delta: f64,
    /// `pld` or `rdp`; unset: PLD for Poisson sampling, RDP otherwise ([`RunConfig::accountant`]).
    pub accountant: Option<AccountantKind>,
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

    fn validate(&self, run: &RunConfig) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let local = matches!(
            self.mode,
            PrivacyMode::LdpGaussian | PrivacyMode::LdpLaplace | PrivacyMode::SignDs
        );
        if local {
            run.local.validate(self.mode)?;
        }
        if self.mode == PrivacyMode::SignDs {
            run.signds.validate()?;
        }
        if run.train.algorithm == Algorithm::Iadmm {
            run.admm.validate()?;
            if !matches!(self.mode, PrivacyMode::None | PrivacyMode::LdpLaplace) {
                return bad(format!(
                    "train.algorithm = \"iadmm\" works with privacy.mode \"none\" or \
                     \"ldp-laplace\", not {:?}",
                    self.mode
                ));
            }
        }
        if self.mode == PrivacyMode::SecAgg {
            run.secagg.validate()?;
            let admm = run.train.algorithm == Algorithm::Iadmm;
            check_combination(local, admm).map_err(|e| ConfigError::Invalid(e.into()))?;
            if self.clip != ClipMode::Fixed {
                return bad(
                    "secure aggregation needs privacy.clip = \"fixed\": the server never \
                            sees the update norms a median or quantile would need"
                        .into(),
                );
            }
        }
        if run.secagg.noise == SecAggNoise::Distributed
            && self.mode == PrivacyMode::SecAgg
            && self.sampling != Sampling::Fixed
        {
            return bad(
                "distributed noise is accounted for replace-one neighbours: set \
                        privacy.sampling = \"fixed\""
                    .into(),
            );
        }
        if !run.is_private() {
            return Ok(());
        }
        self.validate_noise(run)
    }

    /// The checks of a run with a central ledger: noise, clip bound, budget, the quantile
    /// rule's parameters, and a first round the budget allows.
    fn validate_noise(&self, run: &RunConfig) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        self.noise_multiplier
            .check(
                "privacy.noise_multiplier",
                |z| z > 0.0 && z.is_finite(),
                "positive (sigma > 0)",
            )
            .map_err(ConfigError::Invalid)?;
        if !(self.clip_bound > 0.0 && self.clip_bound.is_finite()) {
            return bad(format!(
                "privacy.clip_bound S = {} must be positive",
                self.clip_bound
            ));
        }
        self.budget()
            .check()
            .map_err(|e| ConfigError::Invalid(format!("privacy budget: {e}")))?;
        if self.clip == ClipMode::Quantile {
            self.validate_quantile(run)?;
        }
        self.validate_first_round(run)
    }

    /// The adaptive clip rule's parameters (Andrew et al. 2021).
    fn validate_quantile(&self, run: &RunConfig) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let m_min = run
            .server
            .clients_per_round
            .values()
            .into_iter()
            .fold(f64::INFINITY, f64::min);
        let sigma_b = self.count_noise(m_min);
        let z_max = self
            .noise_multiplier
            .values()
            .into_iter()
            .fold(0.0, f64::max);
        if !(self.target_quantile > 0.0 && self.target_quantile < 1.0) {
            return bad("privacy.target_quantile must be in (0, 1)".into());
        }
        if !(self.clip_learning_rate > 0.0 && self.clip_learning_rate.is_finite()) {
            return bad("privacy.clip_learning_rate must be positive".into());
        }
        if !(sigma_b > 0.0 && z_max < 2.0 * sigma_b) {
            return bad(format!(
                "privacy.clip_count_noise sigma_b = {sigma_b} must exceed z/2 = {} so that \
                     the sum keeps finite noise (Andrew et al. 2021)",
                z_max / 2.0
            ));
        }
        Ok(())
    }

    /// A budget already spent by the first round is refused now, not discovered later.
    fn validate_first_round(&self, run: &RunConfig) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        // A budget already spent by the first round is refused now, not discovered later. The
        // distributed discrete Gaussian is checked as a Gaussian round without sampling (q = 1)
        // at z/2 (replace-one), which its RDP approaches for wide noise; the ledger enforces its
        // exact bound.
        let first = run.round_event(1).unwrap_or(GaussianRound {
            q: 1.0,
            noise_multiplier: self.noise_multiplier.at(1, run.server.rounds) / 2.0,
            sampling: Sampling::Poisson,
        });
        let first = GaussianRound::new(first.q, first.noise_multiplier, first.sampling)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let event = PrivacyEvent::from(first);
        let accountant = run.accountant();
        if accountant == AccountantKind::Pld && !run.rounds_are_poisson_gaussian() {
            return bad(format!(
                "privacy.accountant = \"{accountant}\" accounts Poisson-subsampled Gaussian \
                 rounds only: use \"rdp\" with fixed-size sampling or distributed noise"
            ));
        }
        if max_rounds(accountant, &event, &self.budget(), 1)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?
            == 0
        {
            return bad(format!(
                "privacy budget {:?} is already spent by round 1 (q = {:.4}, sigma = {}): raise \
                 the noise multiplier or lower clients_per_round",
                self.budget(),
                first.q,
                first.noise_multiplier
            ));
        }
        Ok(())
    }
}

/// `[local]`: the per-round parameters of the client-side mechanisms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalSection {
    /// epsilon of each upload (a client's loss composes over the rounds it takes part in).
    pub epsilon: f64,
    /// delta of each upload (`ldp-gaussian`).
    pub delta: f64,
    /// C: the L2 bound of the update (`ldp-gaussian`) or the L1 bound of each per-example
    /// gradient (`ldp-laplace`).
    pub clip_bound: f64,
}

impl Default for LocalSection {
    fn default() -> Self {
        Self {
            epsilon: 1.0,
            delta: 1e-5,
            clip_bound: 1.0,
        }
    }
}

impl LocalSection {
    fn validate(&self, mode: PrivacyMode) -> Result<(), ConfigError> {
        let ok = self.epsilon > 0.0
            && self.epsilon.is_finite()
            && (mode != PrivacyMode::LdpGaussian || (self.delta > 0.0 && self.delta < 1.0))
            && (mode == PrivacyMode::SignDs
                || (self.clip_bound > 0.0 && self.clip_bound.is_finite()));
        if ok {
            Ok(())
        } else {
            Err(ConfigError::Invalid(format!(
                "[local] needs epsilon > 0, delta in (0, 1) and clip_bound C > 0 (got epsilon = \
                 {}, delta = {}, clip_bound = {})",
                self.epsilon, self.delta, self.clip_bound
            )))
        }
    }
}

/// `[signds]`: SignDS's sizes and the server's step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SignDsSection {
    /// k as a fraction of d: the top-k set's size.
    pub top_k: f64,
    /// h: dimensions released; 0 takes the largest h with E[nu]/h >= `ratio`.
    pub output_dimensions: usize,
    /// The E[nu]/h ratio that picks h when `output_dimensions` is 0.
    pub ratio: f64,
    /// eta_g: the server's step along the mean sparse sign update.
    pub global_learning_rate: f64,
}

impl Default for SignDsSection {
    fn default() -> Self {
        Self {
            top_k: 0.01,
            output_dimensions: 0,
            ratio: 0.6,
            global_learning_rate: 0.05,
        }
    }
}

impl SignDsSection {
    fn validate(&self) -> Result<(), ConfigError> {
        let ok = self.top_k > 0.0
            && self.top_k < 1.0
            && self.ratio > 0.0
            && self.ratio <= 1.0
            && self.global_learning_rate > 0.0
            && self.global_learning_rate.is_finite();
        if ok {
            Ok(())
        } else {
            Err(ConfigError::Invalid(
                "[signds] needs top_k in (0, 1), ratio in (0, 1] and global_learning_rate > 0"
                    .into(),
            ))
        }
    }
}

/// `[admm]`: the penalty of inexact ADMM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdmmSection {
    /// rho: the penalty (the step of the linearised primal update is 1/rho).
    pub rho: f64,
    /// Residual balancing (Boyd et al. 2011, Sec. 3.4.1): adapt rho each round.
    pub balance: bool,
    /// mu: how far apart the residuals may be before rho changes.
    pub balance_mu: f64,
    /// tau: the factor rho changes by.
    pub balance_tau: f64,
    /// I: the examples of all clients, public (clients send no counts; `fl sim` fills it in
    /// from its partition).
    pub total_examples: Option<u64>,
}

impl Default for AdmmSection {
    fn default() -> Self {
        Self {
            rho: 1.0,
            balance: false,
            balance_mu: 10.0,
            balance_tau: 2.0,
            total_examples: None,
        }
    }
}

impl AdmmSection {
    fn validate(&self) -> Result<(), ConfigError> {
        let ok = self.rho > 0.0
            && self.rho.is_finite()
            && self.balance_mu > 1.0
            && self.balance_tau > 1.0
            && self.balance_mu.is_finite()
            && self.balance_tau.is_finite();
        if ok {
            Ok(())
        } else {
            Err(ConfigError::Invalid(
                "[admm] needs rho > 0, balance_mu > 1 and balance_tau > 1".into(),
            ))
        }
    }
}

/// What the server does with an update whose L2 norm exceeds `robust.max_update_norm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NormAction {
    /// Refuse it (the client gets INVALID_ARGUMENT and is dropped from the round).
    Refuse,
    /// Scale it down to the bound: u * min(1, bound / ||u||).
    Clip,
}

/// How non-private FedAvg combines the round's updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Aggregator {
    /// The example-weighted mean (McMahan et al. 2017).
    Mean,
    /// The coordinate-wise trimmed mean (Yin et al. 2018): unweighted, robust to a fraction
    /// `trim_fraction` of arbitrary updates; holds the round's updates in memory.
    TrimmedMean,
}

/// `[robust]`: defences against hostile clients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RobustSection {
    /// Largest |w_j| a released model may hold; a round whose aggregate has a larger or a
    /// non-finite parameter is skipped, with the reason in `metrics.jsonl` (every mode).
    pub max_parameter_abs: f64,
    /// Bound on each update's L2 norm (`privacy.mode = "none"`, FedAvg only; off when absent).
    pub max_update_norm: Option<f64>,
    /// What happens to an update beyond `max_update_norm`.
    pub norm_action: NormAction,
    /// `mean` or `trimmed-mean` (FedAvg with `privacy.mode` `none` or `ldp-*`).
    pub aggregator: Aggregator,
    /// beta: the fraction of values dropped at each end of every coordinate by the trimmed mean.
    pub trim_fraction: f64,
}

impl Default for RobustSection {
    fn default() -> Self {
        Self {
            max_parameter_abs: 1e6,
            max_update_norm: None,
            norm_action: NormAction::Refuse,
            aggregator: Aggregator::Mean,
            trim_fraction: 0.1,
        }
    }
}

impl RobustSection {
    fn validate(&self, run: &RunConfig) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.into()));
        if !(self.max_parameter_abs > 0.0 && self.max_parameter_abs <= f64::from(f32::MAX)) {
            return bad("robust.max_parameter_abs must be positive and at most 3.4e38");
        }
        if self
            .max_update_norm
            .is_some_and(|b| !(b > 0.0 && b.is_finite()))
        {
            return bad("robust.max_update_norm must be positive");
        }
        if !(0.0..0.5).contains(&self.trim_fraction) {
            return bad("robust.trim_fraction must be in [0, 0.5)");
        }
        let fedavg = run.train.algorithm == Algorithm::FedAvg;
        let mode = run.privacy.mode;
        if self.max_update_norm.is_some() && !(fedavg && mode == PrivacyMode::None) {
            return bad(
                "robust.max_update_norm applies to privacy.mode = \"none\" with FedAvg only: \
                 private modes bound updates by their own clipping",
            );
        }
        let sees_updates = matches!(
            mode,
            PrivacyMode::None | PrivacyMode::LdpGaussian | PrivacyMode::LdpLaplace
        );
        if self.aggregator != Aggregator::Mean && !(fedavg && sees_updates) {
            return bad(
                "robust.aggregator = \"trimmed-mean\" applies to FedAvg with privacy.mode \
                 \"none\", \"ldp-gaussian\" or \"ldp-laplace\": the server must see each \
                 (released) update",
            );
        }
        Ok(())
    }
}

/// Where the noise of a secure-aggregation run comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecAggNoise {
    /// No noise: updates are hidden, the sum is not differentially private.
    None,
    /// The server adds Gaussian noise to the unmasked sum (trusted to add it, not to see updates).
    Central,
    /// Each client adds discrete Gaussian noise; the server never sees a noiseless sum (Kairouz,
    /// Liu, Steinke 2021).
    Distributed,
}

/// The neighbour graph of a secure-aggregation round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecAggGraph {
    /// Every pair masks (Bonawitz et al. 2017).
    Complete,
    /// A random k-regular graph (SecAgg+, Bell et al. 2020); k = `degree`, or O(log n) when 0.
    Regular,
}

/// When the simulation's dropout injector drops clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DropoutStage {
    /// After advertising keys, before sharing them.
    BeforeShares,
    /// After sharing keys, before the masked input (their masks must be recovered).
    AfterShares,
    /// After the masked input, before unmasking.
    AfterMasked,
}

impl DropoutStage {
    /// The stage whose message the injector's clients do not receive.
    pub fn withheld(self) -> Stage {
        match self {
            DropoutStage::BeforeShares => Stage::ShareKeys,
            DropoutStage::AfterShares => Stage::CheckShares,
            DropoutStage::AfterMasked => Stage::Unmasking,
        }
    }
}

impl SecAggSection {
    /// The neighbour graph of a round of `sampled` clients.
    pub fn graph(&self, sampled: usize) -> GraphKind {
        match self.graph {
            SecAggGraph::Complete => GraphKind::Complete,
            SecAggGraph::Regular if self.degree == 0 => GraphKind::Regular(auto_degree(sampled)),
            SecAggGraph::Regular => GraphKind::Regular(self.degree),
        }
    }
}

/// `[secagg]`: secure aggregation settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecAggSection {
    /// `none`, `central` or `distributed`.
    pub noise: SecAggNoise,
    /// b: ring bit width, 32 or 64.
    pub bits: u32,
    /// Shamir threshold as a fraction of a client's neighbours (t = ceil(fraction * |N|), and
    /// always more than half).
    pub threshold: f64,
    /// Fewest survivors of each stage, as a fraction of the expected m_t; below it the round
    /// aborts. Distributed noise is calibrated so that this many clients' noise suffices.
    pub min_survivors: f64,
    /// `complete` or `regular`.
    pub graph: SecAggGraph,
    /// k for the regular graph; 0 picks O(log n).
    pub degree: usize,
    /// Seconds each stage after the first waits for answers.
    pub stage_timeout_secs: f64,
    /// `fl sim` only: fraction of each round's clients the dropout injector drops.
    pub sim_dropout: f64,
    /// `fl sim` only: the stage at which they drop.
    pub sim_dropout_stage: DropoutStage,
}

impl Default for SecAggSection {
    fn default() -> Self {
        Self {
            noise: SecAggNoise::None,
            bits: 32,
            threshold: 0.6,
            min_survivors: 0.5,
            graph: SecAggGraph::Complete,
            degree: 0,
            stage_timeout_secs: 60.0,
            sim_dropout: 0.0,
            sim_dropout_stage: DropoutStage::AfterShares,
        }
    }
}

impl SecAggSection {
    fn validate(&self) -> Result<(), ConfigError> {
        let checks = [
            (
                self.bits == 32 || self.bits == 64,
                "secagg.bits must be 32 or 64",
            ),
            (
                self.threshold > 0.5 && self.threshold <= 1.0,
                "secagg.threshold must be in (0.5, 1]: a minority must never hold t shares",
            ),
            (
                self.min_survivors > 0.0 && self.min_survivors <= 1.0,
                "secagg.min_survivors must be in (0, 1]",
            ),
            (
                self.stage_timeout_secs > 0.0 && self.stage_timeout_secs.is_finite(),
                "secagg.stage_timeout_secs must be positive",
            ),
            (
                (0.0..1.0).contains(&self.sim_dropout),
                "secagg.sim_dropout must be in [0, 1)",
            ),
            (
                self.graph == SecAggGraph::Complete || self.degree == 0 || self.degree >= 2,
                "secagg.degree must be 0 (automatic) or at least 2",
            ),
        ];
        match checks.into_iter().find(|(ok, _)| !ok) {
            Some((_, message)) => Err(ConfigError::Invalid(message.into())),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_partial_files_over_defaults() {
        let c: RunConfig = toml::from_str(
            "[server]\nclients = 20\nclients_per_round = 5\n[model]\nkind = \"logistic\"\n\
             [data]\npartition = \"dirichlet:0.3\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.server.clients, 20);
        assert_eq!(c.server.rounds, 50);
        assert_eq!(c.data.partition, PartitionScheme::Dirichlet { alpha: 0.3 });
        assert_eq!(
            c.model.spec(Shape::flat(784), 10).unwrap().num_params(),
            7850
        );
    }

    #[test]
    fn refuses_unknown_keys_and_inconsistent_values() {
        assert!(toml::from_str::<RunConfig>("[server]\nclient = 3\n").is_err());
        assert!(toml::from_str::<RunConfig>("[data]\nsource = \"ftp:x\"\n").is_err());
        let mut c = RunConfig::default();
        c.server.clients_per_round = Schedule::Constant(101.0);
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("clients_per_round")
        );
        let mut c = RunConfig::default();
        c.train.learning_rate = f32::NAN;
        assert!(c.validate().is_err());
        let mut c = RunConfig::default();
        c.server.min_clients = 11;
        assert!(c.validate().is_err());
    }

    /// A bad layer list stops the start naming the layer: its text at validation, its fit to the
    /// data's shape and classes when the network is built.
    #[test]
    fn cnn_layers_are_checked_and_named() {
        let cnn = |layers: &str| {
            toml::from_str::<RunConfig>(&format!("[model]\nkind = \"cnn\"\nlayers = {layers}\n"))
                .unwrap()
        };
        let digit = Shape {
            height: 28,
            width: 28,
            channels: 1,
        };
        let e = refused(&cnn(
            r#"["conv:8:5", "relu", "maxpool:2", "conv:16:x", "dense:10"]"#,
        ));
        assert!(e.contains(r#"model.layers: layer 3 ("conv:16:x")"#), "{e}");
        assert!(refused(&cnn("[]")).contains("needs its `layers`"));
        let wrong_classes = cnn(r#"["conv:8:5", "relu", "dense:5"]"#);
        wrong_classes.validate().unwrap();
        let e = wrong_classes.model.spec(digit, 10).unwrap_err().to_string();
        assert!(e.contains("layer 2 (dense:5)") && e.contains("10"), "{e}");
        let too_big = cnn(r#"["conv:8:5", "maxpool:32", "dense:10"]"#);
        let e = too_big.model.spec(digit, 10).unwrap_err().to_string();
        assert!(e.contains("layer 1 (maxpool:32)"), "{e}");
        let mut mlp_with_layers = cnn(r#"["dense:10"]"#);
        mlp_with_layers.model.kind = ModelKind::Mlp;
        assert!(refused(&mlp_with_layers).contains("model.layers is for kind"));
        // The named networks end in the data's classes.
        let mut lenet = RunConfig::default();
        lenet.model.kind = "lenet5".parse().unwrap();
        lenet.validate().unwrap();
        let spec = lenet.model.spec(digit, 3).unwrap();
        assert_eq!((spec.classes(), spec.num_params()), (3, 61_706 - 7 * 85));
        assert!("resnet".parse::<ModelKind>().is_err());
    }

    fn private() -> RunConfig {
        let mut c = RunConfig::default();
        c.privacy.mode = PrivacyMode::Central;
        c
    }

    fn refused(c: &RunConfig) -> String {
        c.validate().unwrap_err().to_string()
    }

    #[test]
    fn private_runs_refuse_bad_privacy_settings_at_start_up() {
        private().validate().unwrap();
        let mut c = private();
        c.privacy.noise_multiplier = 0.0.into();
        assert!(refused(&c).contains("sigma > 0"));
        let mut c = private();
        c.privacy.noise_multiplier = (-1.0).into();
        assert!(refused(&c).contains("noise_multiplier"));
        let mut c = private();
        c.privacy.delta = 1.0;
        assert!(refused(&c).contains("delta"));
        let mut c = private();
        c.privacy.delta = 0.0;
        assert!(refused(&c).contains("delta"));
        let mut c = private();
        c.privacy.epsilon = -2.0;
        assert!(refused(&c).contains("epsilon"));
        // q = m / K > 1.
        let mut c = private();
        c.server.clients_per_round = 150.0.into();
        assert!(refused(&c).contains("clients_per_round"));
        let mut c = private();
        c.privacy.clip_bound = 0.0;
        assert!(refused(&c).contains("clip_bound"));
    }

    #[test]
    fn a_budget_spent_by_the_first_round_is_refused() {
        let mut c = private();
        c.privacy.noise_multiplier = 0.1.into();
        c.privacy.epsilon = 0.5;
        assert!(
            refused(&c).contains("already spent by round 1"),
            "{}",
            refused(&c)
        );
    }

    #[test]
    fn the_accountant_defaults_to_pld_for_poisson_and_pld_refuses_fixed_sampling() {
        let mut c = private();
        c.privacy.sampling = Sampling::Poisson;
        assert_eq!(c.accountant(), AccountantKind::Pld);
        c.privacy.sampling = Sampling::Fixed;
        assert_eq!(c.accountant(), AccountantKind::Rdp);
        c.privacy.accountant = Some(AccountantKind::Pld);
        assert!(refused(&c).contains("Poisson"), "{}", refused(&c));
    }

    #[test]
    fn inconsistent_schedules_are_refused() {
        let mut c = private();
        c.privacy.noise_multiplier = Schedule::Steps {
            steps: vec![(3, 1.0)],
        };
        assert!(refused(&c).contains("round 1"));
        let mut c = private();
        c.server.clients_per_round = Schedule::Steps {
            steps: vec![(1, 10.0), (20, 10.0), (10, 30.0)],
        };
        assert!(refused(&c).contains("strictly"));
        let mut c = private();
        c.privacy.clip = ClipMode::Quantile;
        c.privacy.clip_count_noise = Some(0.2);
        assert!(refused(&c).contains("sigma_b"));
    }

    #[test]
    fn secure_aggregation_settings_are_checked() {
        let mut c = RunConfig::default();
        c.privacy.mode = PrivacyMode::SecAgg;
        c.validate().unwrap();
        assert!(!c.is_private());
        c.secagg.noise = SecAggNoise::Distributed;
        assert!(c.is_private() && c.round_event(1).is_none());
        assert!(refused(&c).contains("replace-one"));
        c.privacy.sampling = Sampling::Fixed;
        // Accounted at z/2: z = 1 spends the default budget in one round, z = 4 does not.
        assert!(refused(&c).contains("already spent by round 1"));
        c.privacy.noise_multiplier = 4.0.into();
        c.validate().unwrap();
        c.secagg.noise = SecAggNoise::Central;
        assert!(c.round_event(1).is_some());
        let mut bad = c.clone();
        bad.secagg.bits = 16;
        assert!(refused(&bad).contains("bits"));
        let mut bad = c.clone();
        bad.secagg.threshold = 0.5;
        assert!(refused(&bad).contains("threshold"));
        let mut bad = c.clone();
        bad.privacy.clip = ClipMode::Median;
        assert!(refused(&bad).contains("fixed"));
        let mut bad = c;
        bad.secagg.sim_dropout = 1.0;
        assert!(refused(&bad).contains("sim_dropout"));
    }

    #[test]
    fn robust_options_go_only_where_the_server_sees_updates() {
        let with = |mode, norm: Option<f64>, aggregator| {
            let mut c = RunConfig::default();
            c.privacy.mode = mode;
            c.robust.max_update_norm = norm;
            c.robust.aggregator = aggregator;
            c.validate()
        };
        let trimmed = Aggregator::TrimmedMean;
        assert!(with(PrivacyMode::None, Some(10.0), trimmed).is_ok());
        assert!(with(PrivacyMode::LdpGaussian, None, trimmed).is_ok());
        assert!(with(PrivacyMode::LdpGaussian, Some(10.0), Aggregator::Mean).is_err());
        assert!(with(PrivacyMode::Central, None, trimmed).is_err());
        assert!(with(PrivacyMode::SecAgg, None, trimmed).is_err());
        assert!(with(PrivacyMode::None, Some(-1.0), Aggregator::Mean).is_err());
        let mut c = RunConfig::default();
        c.robust.trim_fraction = 0.5;
        assert!(c.validate().is_err());
    }

    #[test]
    fn client_side_settings_are_checked() {
        let mut c = RunConfig::default();
        c.privacy.mode = PrivacyMode::LdpGaussian;
        c.validate().unwrap();
        assert!(!c.is_private() && c.round_event(1).is_none());
        assert!(matches!(
            c.local_mechanism(100).unwrap(),
            Some(LocalMechanism::Gaussian { .. })
        ));
        let mut bad = c.clone();
        bad.local.epsilon = 0.0;
        assert!(refused(&bad).contains("epsilon > 0"));
        let mut bad = c.clone();
        bad.local.clip_bound = -1.0;
        assert!(refused(&bad).contains("clip_bound C > 0"));
        let mut bad = c.clone();
        bad.local.delta = 1.0;
        assert!(refused(&bad).contains("delta in (0, 1)"));
        // IADMM works without noise or with Laplace noise only.
        let mut bad = c.clone();
        bad.train.algorithm = Algorithm::Iadmm;
        assert!(refused(&bad).contains("iadmm"));
        bad.privacy.mode = PrivacyMode::LdpLaplace;
        bad.validate().unwrap();
        bad.admm.rho = 0.0;
        assert!(refused(&bad).contains("rho > 0"));
        let mut signds = c;
        signds.privacy.mode = PrivacyMode::SignDs;
        signds.local.clip_bound = 0.0; // SignDS does not clip.
        signds.signds.output_dimensions = 5;
        signds.validate().unwrap();
        assert_eq!(
            signds.local_mechanism(1000).unwrap(),
            Some(LocalMechanism::SignDs {
                epsilon: 1.0,
                k: 10,
                h: 5
            })
        );
        // h above k.
        signds.signds.output_dimensions = 11;
        assert!(signds.local_mechanism(1000).is_err());
        signds.signds.top_k = 1.5;
        assert!(refused(&signds).contains("top_k"));
    }

    #[test]
    fn overrides_set_keys_in_any_section() {
        let dir = std::env::temp_dir().join(format!("fl-override-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.toml");
        std::fs::write(&path, "[server]\nclients = 20\n").unwrap();
        let set = |o: &[&str]| {
            let o: Vec<String> = o.iter().map(|s| s.to_string()).collect();
            RunConfig::load_with(&path, &o)
        };
        let c = set(&["local.epsilon=2.5", "data.partition=iid", "server.rounds=7"]).unwrap();
        assert_eq!(c.local.epsilon, 2.5);
        assert_eq!(c.data.partition, PartitionScheme::Iid);
        assert_eq!((c.server.clients, c.server.rounds), (20, 7));
        assert!(set(&["epsilon=2"]).is_err());
        assert!(set(&["local.nonsense=2"]).is_err());
        assert!(set(&["server.clients=0"]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
