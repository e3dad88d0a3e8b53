//! The run configuration: one TOML file with `[server]`, `[model]`, `[train]` and `[data]`
//! sections, every key optional with the defaults below, unknown keys refused.

use fl_common::data::{DataSource, PartitionScheme};
use fl_common::model::{LocalConfig, ModelSpec};
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
}

/// `[server]`: networking, rounds and outputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// Address to listen on (`fl sim` always uses a free loopback port instead).
    pub listen: String,
    /// K: clients expected; the first round starts once K are connected.
    pub clients: usize,
    /// m: clients sampled per round (all connected ones when fewer are connected).
    pub clients_per_round: usize,
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
    /// Enrollment token clients must present at Join; none admits any client.
    pub token: Option<String>,
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:50051".into(),
            clients: 100,
            clients_per_round: 10,
            min_clients: 1,
            rounds: 50,
            round_timeout_secs: 300.0,
            join_timeout_secs: 600.0,
            out: "runs/latest".into(),
            seed: None,
            token: None,
        }
    }
}

/// The kind of model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Multinomial logistic regression.
    Logistic,
    /// Fully connected ReLU network with `hidden` widths.
    Mlp,
}

/// `[model]`: the architecture. Input width and classes come from the dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// `mlp` or `logistic`.
    pub kind: ModelKind,
    /// Hidden widths of the MLP (the Geyer et al. default 600, 100).
    pub hidden: Vec<usize>,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            kind: ModelKind::Mlp,
            hidden: vec![600, 100],
        }
    }
}

impl ModelSection {
    /// The architecture for `inputs` features and `classes` classes.
    pub fn spec(&self, inputs: usize, classes: usize) -> Result<ModelSpec, ConfigError> {
        match self.kind {
            ModelKind::Logistic => ModelSpec::logistic(inputs, classes),
            ModelKind::Mlp => ModelSpec::mlp(inputs, &self.hidden, classes),
        }
        .map_err(|e| ConfigError::Invalid(e.to_string()))
    }
}

/// `[train]`: local training each round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
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
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        let config: RunConfig = toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges and consistency; every run calls this before it starts.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let s = &self.server;
        let t = &self.train;
        let checks = [
            (
                s.clients >= 1,
                "server.clients (K) must be at least 1".to_string(),
            ),
            (
                (1..=s.clients).contains(&s.clients_per_round),
                format!(
                    "server.clients_per_round (m = {}) must be between 1 and clients (K = {})",
                    s.clients_per_round, s.clients
                ),
            ),
            (
                (1..=s.clients_per_round).contains(&s.min_clients),
                format!(
                    "server.min_clients ({}) must be between 1 and clients_per_round ({})",
                    s.min_clients, s.clients_per_round
                ),
            ),
            (s.rounds >= 1, "server.rounds must be at least 1".into()),
            (
                s.round_timeout_secs > 0.0 && s.round_timeout_secs.is_finite(),
                "server.round_timeout_secs must be positive".into(),
            ),
            (
                s.join_timeout_secs > 0.0 && s.join_timeout_secs.is_finite(),
                "server.join_timeout_secs must be positive".into(),
            ),
            (t.epochs >= 1, "train.epochs must be at least 1".into()),
            (
                t.batch_size >= 1,
                "train.batch_size must be at least 1".into(),
            ),
            (
                t.learning_rate > 0.0 && t.learning_rate.is_finite(),
                "train.learning_rate must be a positive number".into(),
            ),
            (
                self.model.kind == ModelKind::Logistic || !self.model.hidden.is_empty(),
                "model.hidden must list at least one width for an mlp".into(),
            ),
        ];
        match checks.into_iter().find(|(ok, _)| !ok) {
            Some((_, message)) => Err(ConfigError::Invalid(message)),
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
        assert_eq!(c.model.spec(784, 10).unwrap().num_params(), 7850);
    }

    #[test]
    fn refuses_unknown_keys_and_inconsistent_values() {
        assert!(toml::from_str::<RunConfig>("[server]\nclient = 3\n").is_err());
        assert!(toml::from_str::<RunConfig>("[data]\nsource = \"ftp:x\"\n").is_err());
        let mut c = RunConfig::default();
        c.server.clients_per_round = 101;
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
}
