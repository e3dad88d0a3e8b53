//! The run configuration: one TOML file with `[server]`, `[model]`, `[train]`, `[data]`,
//! `[privacy]`, `[local]`, `[admm]`, `[secagg]`, `[robust]`, `[eval]` and `[buffer]`
//! sections,
//! every key optional with the defaults of each section's file, unknown keys refused. Each section
//! validates itself; [`plan`] parses the privacy mode with the sections it uses into one
//! [`PrivacyPlan`].

mod admm;
mod buffer;
mod data;
mod eval;
mod local;
mod model;
pub(crate) mod moved_keys;
pub mod plan;
mod privacy;
mod robust;
mod secagg;
mod server;
mod train;
mod verified;
mod wording;

pub use admm::AdmmSection;
pub use buffer::{BufferSection, Cadence};
pub use data::DataSection;
pub use eval::EvalSection;
pub use local::LocalTable;
pub use model::{ModelKind, ModelSection};
pub use plan::PrivacyPlan;
pub use privacy::{BudgetKind, ClipMode, PrivacyMode, PrivacySection};
pub use robust::{Aggregator, MeanSettings, NormAction, RobustSection, TrimmedMeanSettings};
pub use secagg::{DropoutStage, SecAggGraph, SecAggNoise, SecAggSection, SecureSettings};
pub use server::{ServerSection, is_loopback, open_door};
pub use train::{Algorithm, ServerOptimizerConfig, ServerOptimizerKind, ServerStep, TrainSection};
pub use verified::{VerifiedNoise, VerifiedSection};

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
    /// The file's keys or values do not fit the schema (said in words, with the nearest key to
    /// an unknown one).
    #[error("{path}: {message}")]
    Schema {
        /// The file.
        path: PathBuf,
        /// What does not fit.
        message: String,
    },
    /// A `--set section.key=VALUE` override does not fit the schema.
    #[error("--set {flag}: {message}")]
    Override {
        /// The override as given.
        flag: String,
        /// What does not fit (in words, with the nearest key to an unknown one).
        message: String,
    },
    /// A value is out of range or inconsistent with another (the rule, in words).
    #[error("invalid configuration: {0}")]
    Invalid(String),
    /// The federation authority's files (`secagg.authority`, `secagg.revocations`) are refused.
    #[error("secagg.authority: {0}")]
    Authority(#[from] fl_secagg::IdentityError),
    /// The federation policy (`secagg.policy`) is refused.
    #[error("secagg.policy: {0}")]
    Policy(#[from] fl_authority::files::FileError),
    /// The enrollment list (`server.enrollment`) is refused.
    #[error("server.enrollment: {0}")]
    Enrollment(#[from] crate::identity::credentials::EnrollmentError),
    /// The privacy settings cannot be accounted (the budget, or the first round's terms).
    #[error("invalid privacy settings: {0}")]
    Accounting(#[from] fl_privacy::AccountingError),
    /// The client-side mechanism's settings (`[local]`) are refused.
    #[error("[local]: {0}")]
    Mechanism(#[from] fl_privacy::LocalPrivacyError),
}

/// Everything a run needs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// The client-side mechanism's settings (with `privacy.mode` a mechanism's name): the keys
    /// of the mechanism the mode names.
    pub local: LocalTable,
    /// Inexact ADMM (with `train.algorithm = "iadmm"`).
    pub admm: AdmmSection,
    /// Defences against hostile updates: the aggregate's bound, and for non-private FedAvg an
    /// update-norm bound and the trimmed mean.
    pub robust: RobustSection,
    /// Federated evaluation on the clients' data (`privacy.mode = "none"` only).
    pub eval: EvalSection,
    /// Asynchronous buffered aggregation (with `server.aggregation = "async"`).
    pub buffer: BufferSection,
    /// Verified secure rounds (with `privacy.mode = "verified"`).
    pub verified: VerifiedSection,
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
        let base = path.parent().unwrap_or(Path::new(""));
        resolve_relative_paths(&mut table, base);
        let mut moved = moved_keys::move_old_keys(&mut table)?;
        let schema = |e: toml::de::Error| wording::in_words(e.message());
        let mut config: RunConfig = table.clone().try_into().map_err(|e| ConfigError::Schema {
            path: path.to_owned(),
            message: schema(e),
        })?;
        // Each override is tried on its own, so that an error names the flag that caused it.
        for o in overrides {
            apply_override(&mut table, o)?;
            moved.extend(moved_keys::move_old_keys(&mut table)?);
            config = table
                .clone()
                .try_into()
                .map_err(|e| ConfigError::Override {
                    flag: o.clone(),
                    message: schema(e),
                })?;
        }
        for line in moved {
            tracing::warn!("{line}");
        }
        refuse_privacy_without_a_mode(&table, &config)?;
        for ignored in ignored_keys(&table, &config) {
            tracing::warn!("{ignored}");
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges and consistency; every run calls this before it starts.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.server.validate()?;
        (self.train.local_config().check())
            .map_err(|e| ConfigError::Invalid(format!("train.{e}")))?;
        self.model.validate()?;
        // The ranges of sections this mode does not use too: an out-of-range value is a mistake
        // wherever it is, and would surprise whoever switches the mode later.
        self.secagg.validate()?;
        self.local.check()?;
        self.admm.validate()?;
        self.buffer.validate(self)?;
        self.plan().map(drop)
    }

    /// m_t, rounded to a whole number of clients.
    pub fn clients_at(&self, round: u64) -> usize {
        self.server
            .clients_per_round
            .at(round, self.server.rounds)
            .round() as usize
    }

    /// What the aggregator tier can run: each group sums what the coordinator's stack would
    /// have summed, so synchronous rounds of FedAvg's mean without privacy, of central DP with
    /// a fixed clip, or of secure aggregation (each group a secure round of its own, its noise
    /// central with a fixed clip or distributed); the other modes need each update or stable
    /// identities at one server, and federated evaluation's figures are not forwarded.
    fn check_tier(&self) -> Result<(), ConfigError> {
        use plan::{ClipRule, SecureNoise};
        let fixed = |noise: &plan::CentralNoise| matches!(noise.clip, ClipRule::Fixed(_));
        let sums = match self.plan()? {
            PrivacyPlan::None(a) => !a.rule.holds_each_update() && a.norm_bound.is_none(),
            PrivacyPlan::Central(noise) => fixed(&noise),
            PrivacyPlan::Secure(secure) => match &secure.noise {
                SecureNoise::Central(noise) => fixed(noise),
                SecureNoise::None | SecureNoise::Distributed { .. } => true,
            },
            _ => false,
        };
        if self.secagg.sim_dropout > 0.0 {
            return Err(ConfigError::Invalid(
                "secagg.sim_dropout is the one-process server's dropout injector: aggregators \
                 inject none, so a tier would run without the dropouts it asks for"
                    .into(),
            ));
        }
        if sums && self.server.aggregation == Cadence::Sync && !self.eval.federated {
            return Ok(());
        }
        Err(ConfigError::Invalid(
            "server.aggregators needs synchronous rounds of privacy.mode = \"none\" (the mean, \
             no robust.max_update_norm, no eval.federated), \"central\" with privacy.clip = \
             \"fixed\", or \"secagg\" (its central noise with privacy.clip = \"fixed\"): the \
             other modes need each update or stable identities at one server"
                .into(),
        ))
    }

    /// Refuses a run whose rounds every client under `policy` would refuse: a privacy mode or
    /// IADMM the policy does not allow, or federated evaluation (never answered under a policy).
    fn check_policy_modes(
        &self,
        policy: &fl_authority::policy::FederationPolicy,
    ) -> Result<(), ConfigError> {
        use fl_authority::policy::PolicyMode;
        let mode = match self.privacy.mode {
            PrivacyMode::None | PrivacyMode::Central | PrivacyMode::DpFtrl => PolicyMode::Plain,
            PrivacyMode::SecAgg => PolicyMode::SecAgg,
            PrivacyMode::Verified => PolicyMode::Verified,
            PrivacyMode::Local(kind) => PolicyMode::Local(kind),
        };
        let iadmm = (self.train.algorithm == Algorithm::Iadmm).then_some(PolicyMode::Iadmm);
        let refuse = |what: String| {
            let id = &policy.federation;
            Err(ConfigError::Invalid(format!(
                "federation {id:?} policy: {what}"
            )))
        };
        if let Some(m) = [Some(mode), iadmm]
            .into_iter()
            .flatten()
            .find(|m| !policy.allows(*m))
        {
            let allowed: Vec<&str> = policy.modes.iter().map(|m| m.name()).collect();
            return refuse(format!(
                "its clients refuse {m} rounds (it allows {}): privacy.mode = {:?} cannot run",
                allowed.join(", "),
                self.privacy.mode
            ));
        }
        if self.eval.federated {
            return refuse(
                "its clients never send federated evaluation's figures: set eval.federated = false"
                    .into(),
            );
        }
        Ok(())
    }

    /// Checks what only a server needs and a simulation fills in itself: IADMM's public I, and
    /// the stable identities DP-FTRL needs, and what the aggregator tier can run.
    pub fn validate_for_server(&self) -> Result<(), ConfigError> {
        // The authority's files are read before anything starts, and the policy checked against
        // every round's size.
        self.secagg.verifier()?;
        if let Some(policy) = self.secagg.policy()? {
            // Under the aggregator tier each group is a secure round of its own, of about
            // m_t / aggregators clients.
            let groups = self.server.aggregators.max(1);
            let fewest = (1..=self.server.rounds.max(1))
                .map(|r| self.clients_at(r) / groups)
                .min();
            self.secagg.check_policy(&policy, fewest.unwrap_or(0))?;
            self.check_policy_modes(&policy)?;
        }
        if self.secagg.sim_signed {
            return Err(ConfigError::Invalid(
                "secagg.sim_signed is for fl sim, which makes its own authority: a server signs \
                 rounds with secagg.authority, the public key of an authority it does not hold"
                    .into(),
            ));
        }
        // "Each client at most once per tree" holds only per identity: without enrollment a
        // client that joins again gets a new id and could enter the same tree twice.
        if self.privacy.mode == PrivacyMode::DpFtrl && self.server.enrollment.is_none() {
            return Err(ConfigError::Invalid(
                "privacy.mode = \"dp-ftrl\" needs server.enrollment (fl enroll): its privacy \
                 rests on each client contributing at most once per tree, which only stable \
                 identities can enforce; a client without one gets a new id when it joins again"
                    .into(),
            ));
        }
        if self.server.aggregators > 0 {
            self.check_tier()?;
            let s = &self.server;
            if s.aggregator_token.is_none() && s.aggregator_enrollment.is_none() {
                return Err(ConfigError::Invalid(
                    "server.aggregators needs server.aggregator_enrollment (a token per \
                     aggregator, fl enroll) or server.aggregator_token (or FL_AGGREGATOR_TOKEN): \
                     without either anyone who reaches the port could register as an \
                     aggregator, receive the model and sum its group's updates"
                        .into(),
                ));
            }
        }
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
}

/// The configuration's file paths (`section`, `key`, the prefix before the path, if any).
const PATH_KEYS: [(&str, &str, Option<&str>); 9] = [
    ("server", "out", None),
    ("server", "enrollment", None),
    ("server", "tls_cert", None),
    ("server", "tls_key", None),
    ("server", "tls_client_ca", None),
    ("model", "init", None),
    ("data", "source", Some(":")),
    ("secagg", "authority", None),
    ("secagg", "revocations", None),
];

/// Makes every relative path the file names relative to the file's folder `base` (so a
/// configuration means the same from any current directory); overrides on the command line,
/// applied after, stay relative to the current directory.
fn resolve_relative_paths(table: &mut toml::Table, base: &Path) {
    for (section, key, prefixed) in PATH_KEYS {
        let Some(toml::Value::String(value)) = (table.get_mut(section))
            .and_then(|s| s.as_table_mut())
            .and_then(|s| s.get_mut(key))
        else {
            continue;
        };
        let (head, path) = match prefixed.and_then(|sep| value.split_once(sep)) {
            Some((kind, path)) => (format!("{kind}:"), path.to_string()),
            None => (String::new(), value.clone()),
        };
        if path.is_empty() || Path::new(&path).is_absolute() {
            continue;
        }
        *value = format!("{head}{}", base.join(path).display());
    }
}

/// Sets `section.key` (any depth) of `table` to VALUE from a `section.key=VALUE` override.
/// The privacy modes that read a mode-specific key (`None`: every mode may read it).
fn readers(section: &str, key: &str) -> Option<Vec<PrivacyMode>> {
    use PrivacyMode::{DpFtrl, SecAgg};
    match (section, key) {
        ("local", key) => Some(
            local::readers(key)
                .into_iter()
                .map(PrivacyMode::Local)
                .collect(),
        ),
        // The authority's files: a policy binds every mode.
        ("secagg", "authority" | "revocations" | "policy") => None,
        ("secagg", _) => Some(vec![SecAgg]),
        ("privacy", "noise") => Some(vec![DpFtrl]),
        _ => None,
    }
}

/// One line for each key written (in the file or by `--set`) that this run's privacy mode does
/// not read, naming the key and the modes that would.
pub fn ignored_keys(table: &toml::Table, config: &RunConfig) -> Vec<String> {
    let mode = config.privacy.mode;
    let mut lines = Vec::new();
    for (section, keys) in table {
        let toml::Value::Table(keys) = keys else {
            continue;
        };
        for key in keys.keys() {
            let read_elsewhere = |m: &Vec<PrivacyMode>| !m.is_empty() && !m.contains(&mode);
            let Some(modes) = readers(section, key).filter(read_elsewhere) else {
                continue;
            };
            // A mode as the configuration writes it, quoted.
            let quoted = |m: &PrivacyMode| format!("\"{}\"", m.name());
            let names: Vec<String> = modes.iter().map(quoted).collect();
            lines.push(format!(
                "{section}.{key} is ignored: only privacy.mode = {} reads it, this run's is {}",
                names.join(" or "),
                quoted(&mode)
            ));
        }
    }
    lines
}

/// The sections only a private run reads.
const PRIVACY_SECTIONS: [&str; 2] = ["privacy", "local"];

/// Refuses a privacy setting written (in the file or by `--set`) for a run of
/// `privacy.mode = "none"`: whoever writes an epsilon must get privacy or an error, never a run
/// without privacy that looks private.
fn refuse_privacy_without_a_mode(
    table: &toml::Table,
    config: &RunConfig,
) -> Result<(), ConfigError> {
    if config.privacy.mode != PrivacyMode::None {
        return Ok(());
    }
    for section in PRIVACY_SECTIONS {
        let Some(toml::Value::Table(keys)) = table.get(section) else {
            continue;
        };
        if let Some(key) = keys
            .keys()
            .find(|k| (section, k.as_str()) != ("privacy", "mode"))
        {
            let modes = PrivacyMode::all();
            let names = (modes.iter().filter(|(m, ..)| *m != PrivacyMode::None))
                .map(|(_, name, _)| format!("\"{name}\""));
            return Err(ConfigError::Invalid(format!(
                "{section}.{key} is set, but privacy.mode = \"none\" runs without privacy: \
                 choose a mode (privacy.mode = {}) or remove {section}.{key}",
                names.collect::<Vec<_>>().join(", ")
            )));
        }
    }
    Ok(())
}

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
        let next =
            (here.entry(key.to_string())).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        // A name where a table is set (a noise stream's) is its table with nothing set.
        if let toml::Value::String(name) = next {
            let table = toml::Table::from_iter([(name.clone(), toml::Table::new().into())]);
            *next = toml::Value::Table(table);
        }
        here = next.as_table_mut().ok_or_else(bad)?;
    }
    here.insert(last.to_string(), value);
    Ok(())
}

#[cfg(test)]
pub(crate) mod reference;
#[cfg(test)]
mod tests;
