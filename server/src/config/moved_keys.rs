//! Keys that have moved, still read: flat keys of a kind that now has its own table (DP-FTRL's
//! noise streams, `[privacy.noise.NAME]`; the trimmed mean, `[robust.aggregator.NAME]`; SignDS's
//! `[signds]`, now its `[local]` table), read into that table with one warning line each that
//! names the new place. The list is closed: a
//! new kind's keys live in its own table from the start. A checkpoint written before the move
//! holds them too (unset ones as nulls, defaults as written), and reads the same way.

use super::ConfigError;
use serde_json::{Map, Value};

/// A key that moved from `[section]` into the table of one kind of `section.holder`.
struct Moved {
    section: &'static str,
    old: &'static str,
    /// The key that names the kind: `noise`, `aggregator`.
    holder: &'static str,
    /// Its kind, and the holder's default kind.
    kind: &'static str,
    default: &'static str,
    /// Its key in the kind's table.
    key: &'static str,
    /// Whether, written beside another kind, it was refused (else it was read by nothing).
    refused_elsewhere: bool,
}

/// Every key that moved.
const MOVED: [Moved; 5] = [
    stream("tree_rounds", "tree", "rounds"),
    stream("min_separation", "banded", "min_separation"),
    stream("bands", "banded", "bands"),
    stream("max_participations", "banded", "max_participations"),
    Moved {
        section: "robust",
        old: "trim_fraction",
        holder: "aggregator",
        kind: "trimmed-mean",
        default: "mean",
        key: "trim_fraction",
        refused_elsewhere: false,
    },
];

/// A DP-FTRL key of `[privacy]`, now in its stream's table; written for the other stream, it was
/// refused.
const fn stream(old: &'static str, kind: &'static str, key: &'static str) -> Moved {
    Moved {
        section: "privacy",
        old,
        holder: "noise",
        kind,
        default: "tree",
        key,
        refused_elsewhere: true,
    }
}

/// Moves the old keys of a configuration file's `table` (as written, with `--set` overrides)
/// into their kinds' tables; a line for each, to be said as a warning.
pub(super) fn move_old_keys(table: &mut toml::Table) -> Result<Vec<String>, ConfigError> {
    let mut lines = Vec::new();
    if let Some(signds) = table.remove(SIGNDS) {
        let invalid = |e: String| ConfigError::Invalid(format!("[{SIGNDS}]: {e}"));
        let mut json = serde_json::json!({ SIGNDS: signds, LOCAL: table.remove(LOCAL) });
        lines.extend(move_signds(&mut json, true)?);
        let local = toml::Value::try_from(&json[LOCAL]).map_err(|e| invalid(e.to_string()))?;
        table.insert(LOCAL.into(), local);
    }
    for section in ["privacy", "robust"] {
        let Some(keys) = table.get_mut(section) else {
            continue;
        };
        let invalid = |e: String| ConfigError::Invalid(format!("[{section}]: {e}"));
        let mut json = serde_json::to_value(&*keys).map_err(|e| invalid(e.to_string()))?;
        let moved = move_in_section(section, &mut json, true)?;
        if !moved.is_empty() {
            *keys = toml::Value::try_from(json).map_err(|e| invalid(e.to_string()))?;
        }
        lines.extend(moved);
    }
    Ok(lines)
}

/// The same for a checkpoint's configuration (`config`, as JSON), whose unset keys are nulls
/// and whose defaults are written: a key of another kind than the holder's is dropped.
pub(crate) fn move_checkpoint_keys(config: &mut Value) -> Result<(), ConfigError> {
    move_signds(config, false)?;
    for section in ["privacy", "robust"] {
        if let Some(keys) = config.get_mut(section) {
            move_in_section(section, keys, false)?;
        }
    }
    Ok(())
}

/// The section SignDS's settings moved from, and the one they moved to.
const SIGNDS: &str = "signds";
const LOCAL: &str = "local";

/// Moves `[signds]`'s keys of `config` (as JSON; a null one is dropped) into `[local]`, with a
/// line for each when `written`; a key `[local]` sets too is refused.
fn move_signds(config: &mut Value, written: bool) -> Result<Vec<String>, ConfigError> {
    let Some(Value::Object(old)) = config.as_object_mut().and_then(|c| c.remove(SIGNDS)) else {
        return Ok(Vec::new());
    };
    let local = &mut config[LOCAL];
    if !local.is_object() {
        *local = Value::Object(Map::new());
    }
    let mut lines = Vec::new();
    for (key, value) in old.into_iter().filter(|(_, v)| !v.is_null()) {
        let place = format!("[{LOCAL}] {key}");
        if local.get(&key).is_some() {
            return Err(ConfigError::Invalid(format!(
                "{SIGNDS}.{key} has moved to {place}, which is set too: write it there once"
            )));
        }
        if written {
            lines.push(format!(
                "{SIGNDS}.{key} has moved: read as {place} (SignDS's settings); write it there"
            ));
        }
        local[&key] = value;
    }
    Ok(lines)
}

/// Moves `section`'s old keys (a null one is dropped) into their kinds' tables. An old key of
/// another kind than the holder names is refused or, if it was read by nothing before the
/// move, dropped with a line that says so; in a checkpoint (not `written`) it is dropped.
fn move_in_section(
    section: &str,
    keys: &mut Value,
    written: bool,
) -> Result<Vec<String>, ConfigError> {
    let Some(keys) = keys.as_object_mut() else {
        return Ok(Vec::new());
    };
    let mut lines = Vec::new();
    for m in MOVED.iter().filter(|m| m.section == section) {
        let Some(value) = keys.remove(m.old).filter(|v| !v.is_null()) else {
            continue;
        };
        let (old, kind, key, holder) = (m.old, m.kind, m.key, m.holder);
        let named = keys
            .entry(holder)
            .or_insert_with(|| Value::String(m.default.into()));
        if named.as_str() == Some(kind) {
            *named = Value::Object(Map::from_iter([(kind.to_string(), Map::new().into())]));
        }
        let place = format!("[{section}.{holder}.{kind}] {key}");
        let Some(Value::Object(settings)) = named.get_mut(kind) else {
            let elsewhere = format!("{section}.{old} is for {section}.{holder} = \"{kind}\"");
            match (written, m.refused_elsewhere) {
                (true, true) => {
                    return Err(ConfigError::Invalid(format!(
                        "{elsewhere} (its key is now {place})"
                    )));
                }
                (true, false) => lines.push(format!("{elsewhere}: ignored")),
                (false, _) => {}
            }
            continue;
        };
        settings.insert(key.into(), value);
        if written {
            lines.push(format!(
                "{section}.{old} has moved: read as {place}; write it there"
            ));
        }
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fl_privacy::StreamSettings;

    fn moved(text: &str) -> Result<(String, Vec<String>), String> {
        let mut table: toml::Table = toml::from_str(text).unwrap();
        let lines = move_old_keys(&mut table).map_err(|e| e.to_string())?;
        Ok((table["privacy"]["noise"].to_string(), lines))
    }

    /// Each old key lands in its stream's table with one line naming it; a stream's name
    /// becomes its table; an old key of another stream is refused.
    #[test]
    fn old_flat_keys_are_read_into_their_tables_with_a_line_each() {
        let (noise, lines) = moved("[privacy]\ntree_rounds = 4\n").unwrap();
        assert_eq!(noise, "{ tree = { rounds = 4 } }");
        assert_eq!(
            lines,
            ["privacy.tree_rounds has moved: read as [privacy.noise.tree] rounds; write it there"]
        );
        let (noise, lines) =
            moved("[privacy]\nnoise = \"banded\"\nmin_separation = 4\nmax_participations = 13\n")
                .unwrap();
        assert_eq!(
            noise,
            "{ banded = { max_participations = 13, min_separation = 4 } }"
        );
        assert_eq!(lines.len(), 2);
        let refused = moved("[privacy]\nbands = 2\n").unwrap_err();
        assert!(refused.contains("privacy.bands is for privacy.noise = \"banded\""));
        assert_eq!(moved("[privacy]\nnoise = \"tree\"\n").unwrap().1.len(), 0);
    }

    /// A checkpoint's configuration of before the move, unset keys as nulls, reads as a
    /// configuration: its set keys in their table.
    #[test]
    fn a_checkpoint_of_before_the_move_reads() {
        let mut config = serde_json::json!({"privacy": {"mode": "dp-ftrl", "noise": "banded",
            "tree_rounds": null, "min_separation": 4, "bands": null, "max_participations": null}});
        move_checkpoint_keys(&mut config).unwrap();
        let config: crate::config::RunConfig = serde_json::from_value(config).unwrap();
        let expected = fl_privacy::BandedSettings {
            min_separation: Some(4),
            ..Default::default()
        };
        assert_eq!(config.privacy.noise, StreamSettings::Banded(expected));
        let mut mean = serde_json::json!({"robust": {"aggregator": "mean", "trim_fraction": 0.1}});
        move_checkpoint_keys(&mut mean).unwrap();
        assert_eq!(mean, serde_json::json!({"robust": {"aggregator": "mean"}}));
    }

    /// `[signds]` moves into `[local]`, a line per key, in a file and in a checkpoint (whose
    /// defaults are written).
    #[test]
    fn signds_settings_move_into_the_local_table() {
        let text = "[privacy]\nmode = \"signds\"\n[local]\nepsilon = 2.0\n[signds]\ntop_k = 0.3\n";
        let mut table: toml::Table = toml::from_str(text).unwrap();
        let lines = move_old_keys(&mut table).unwrap();
        assert_eq!(table["local"].to_string(), "{ epsilon = 2.0, top_k = 0.3 }");
        assert!(!table.contains_key("signds"));
        assert_eq!(
            lines,
            ["signds.top_k has moved: read as [local] top_k (SignDS's settings); write it there"]
        );
        let twice = "[local]\ntop_k = 0.1\n[signds]\ntop_k = 0.3\n";
        let mut table: toml::Table = toml::from_str(twice).unwrap();
        assert!(move_old_keys(&mut table).is_err());
        let mut config = serde_json::json!({"privacy": {"mode": "signds"},
            "local": {"epsilon": 2.0, "delta": 1e-5, "clip_bound": 1.0, "steps": 1},
            "signds": {"top_k": 0.3, "output_dimensions": 2, "ratio": 0.6,
                "global_learning_rate": 0.5}});
        move_checkpoint_keys(&mut config).unwrap();
        let config: crate::config::RunConfig = serde_json::from_value(config).unwrap();
        let Ok(fl_privacy::LocalSettings::SignDs(s)) =
            config.local.settings(fl_privacy::LocalKind::SignDs)
        else {
            panic!("SignDS's settings");
        };
        assert_eq!((s.epsilon, s.top_k, s.output_dimensions), (2.0, 0.3, 2));
    }

    /// The trimmed mean's fraction moves into its table; beside the mean, which never read it,
    /// it is dropped with a line that says so.
    #[test]
    fn the_trim_fraction_moves_into_the_trimmed_means_table() {
        let mut table: toml::Table =
            toml::from_str("[robust]\naggregator = \"trimmed-mean\"\ntrim_fraction = 0.2\n")
                .unwrap();
        let lines = move_old_keys(&mut table).unwrap();
        let aggregator = table["robust"]["aggregator"].to_string();
        assert_eq!(aggregator, "{ trimmed-mean = { trim_fraction = 0.2 } }");
        assert_eq!(
            lines,
            [
                "robust.trim_fraction has moved: read as [robust.aggregator.trimmed-mean] \
              trim_fraction; write it there"
            ]
        );
        let mut mean: toml::Table = toml::from_str("[robust]\ntrim_fraction = 0.2\n").unwrap();
        let lines = move_old_keys(&mut mean).unwrap();
        assert_eq!(
            lines,
            ["robust.trim_fraction is for robust.aggregator = \"trimmed-mean\": ignored"]
        );
        assert_eq!(mean["robust"].to_string(), "{ aggregator = \"mean\" }");
    }
}
