//! `[local]`: the table of the client-side mechanism `privacy.mode` names. Each mechanism
//! declares its own keys (`fl_privacy::ClientMechanism::Settings`); this file only reads the
//! table as that mechanism's. A key another mechanism reads is said to be ignored (one line),
//! a key no mechanism reads is refused.

use super::ConfigError;
use fl_privacy::{LocalKind, LocalSettings};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// `[local]` as written: read as the settings of the mechanism the run names.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LocalTable(toml::Table);

impl LocalTable {
    /// Sets `key` (for configurations built in code).
    pub fn set(&mut self, key: &str, value: impl Into<toml::Value>) {
        self.0.insert(key.into(), value.into());
    }

    /// The settings of `kind`: its keys as written, the others' dropped, unknown ones refused.
    pub fn settings(&self, kind: LocalKind) -> Result<LocalSettings, ConfigError> {
        let own = keys_of(kind);
        let elsewhere = every_key();
        let read = (self.0.iter())
            .filter(|(key, _)| own.contains(*key) || !elsewhere.contains(*key))
            .map(|(key, value)| (key.clone(), value.clone()));
        let table = toml::Value::Table(read.collect());
        let settings = LocalSettings::read(kind, table)
            .map_err(|e| ConfigError::Invalid(format!("[local] for {kind}: {}", e.message())))?;
        settings.validate()?;
        Ok(settings)
    }

    /// Refuses a key no mechanism reads, and an out-of-range value for any mechanism that reads
    /// it, whatever the run's mode: a mistake wherever it is, and a surprise for whoever
    /// switches the mode later.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        let known = every_key();
        if let Some(key) = self.0.keys().find(|key| !known.contains(*key)) {
            return Err(ConfigError::Invalid(format!(
                "[local] has no key `{key}`: the mechanisms read {}",
                Vec::from_iter(known).join(", ")
            )));
        }
        for &kind in LocalKind::ALL {
            self.settings(kind)?;
        }
        Ok(())
    }
}

/// The mechanisms that read `key` of `[local]`.
pub(super) fn readers(key: &str) -> Vec<LocalKind> {
    let reads = |kind: &&LocalKind| keys_of(**kind).contains(key);
    LocalKind::ALL.iter().filter(reads).copied().collect()
}

/// The keys of `kind`'s table.
fn keys_of(kind: LocalKind) -> BTreeSet<String> {
    let defaults = toml::Table::try_from(LocalSettings::default_of(kind));
    defaults
        .map(|t| t.keys().cloned().collect())
        .unwrap_or_default()
}

/// The keys any mechanism reads.
fn every_key() -> BTreeSet<String> {
    LocalKind::ALL
        .iter()
        .flat_map(|&kind| keys_of(kind))
        .collect()
}

impl schemars::JsonSchema for LocalTable {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "LocalTable".into()
    }

    /// One table per mechanism, titled with its name.
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let tables: Vec<schemars::Schema> = (LocalKind::ALL.iter())
            .map(|&kind| {
                let settings = kind.settings_schema(generator);
                schemars::json_schema!({
                    "title": kind.name(),
                    "description": kind.description(),
                    "allOf": [settings],
                })
            })
            .collect();
        schemars::json_schema!({
            "description": "The keys of the client-side mechanism privacy.mode names.",
            "type": "object",
            "oneOf": tables,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_read_as_its_mechanisms() {
        let mut table = LocalTable::default();
        table.set("epsilon", 2.5);
        table.set("steps", 3);
        let LocalSettings::Gaussian(g) = table.settings(LocalKind::Gaussian).unwrap() else {
            panic!("the Gaussian mechanism's settings");
        };
        assert_eq!((g.epsilon, g.delta), (2.5, 1e-5));
        let LocalSettings::Laplace(l) = table.settings(LocalKind::Laplace).unwrap() else {
            panic!("the Laplace mechanism's settings");
        };
        assert_eq!((l.epsilon, l.steps), (2.5, 3));
        assert_eq!(readers("steps"), [LocalKind::Laplace]);
        assert_eq!(readers("epsilon"), LocalKind::ALL);
        table.set("stepz", 3);
        let err = table.check().unwrap_err().to_string();
        assert!(err.contains("no key `stepz`"), "{err}");
        let err = table.settings(LocalKind::Laplace).unwrap_err().to_string();
        assert!(err.contains("unknown field `stepz`"), "{err}");
    }
}
