//! Keys that have moved, still read: DP-FTRL's flat keys of `[privacy]`, read into their noise
//! stream's table (`[privacy.noise.NAME]`) with one warning line each that names the new place.
//! The list is closed: a new stream's keys live in its own table from the start. A checkpoint
//! written before the move holds them too (unset ones as nulls), and reads the same way.

use super::ConfigError;
use fl_privacy::StreamSettings;
use serde_json::{Map, Value};

/// (old key of `[privacy]`, its stream, its key in the stream's table).
const MOVED: [(&str, &str, &str); 4] = [
    ("tree_rounds", "tree", "rounds"),
    ("min_separation", "banded", "min_separation"),
    ("bands", "banded", "bands"),
    ("max_participations", "banded", "max_participations"),
];

/// Moves the old keys of a configuration file's `table` (as written, with `--set` overrides)
/// into their streams' tables; a line for each, to be said as a warning.
pub(super) fn move_old_keys(table: &mut toml::Table) -> Result<Vec<String>, ConfigError> {
    let Some(privacy) = table.get_mut("privacy") else {
        return Ok(Vec::new());
    };
    let invalid = |e: String| ConfigError::Invalid(format!("[privacy]: {e}"));
    let mut json = serde_json::to_value(&*privacy).map_err(|e| invalid(e.to_string()))?;
    let lines = move_in_section(&mut json)?;
    if !lines.is_empty() {
        *privacy = toml::Value::try_from(json).map_err(|e| invalid(e.to_string()))?;
    }
    Ok(lines)
}

/// The same for a checkpoint's configuration (`config`, as JSON), whose unset keys are nulls.
pub(crate) fn move_checkpoint_keys(config: &mut Value) -> Result<(), ConfigError> {
    match config.get_mut("privacy") {
        Some(privacy) => move_in_section(privacy).map(drop),
        None => Ok(()),
    }
}

/// Moves `[privacy]`'s old keys (a null one is dropped) into their streams' tables. Refuses an
/// old key of a stream other than the one `privacy.noise` names (as before the move).
fn move_in_section(privacy: &mut Value) -> Result<Vec<String>, ConfigError> {
    let Some(privacy) = privacy.as_object_mut() else {
        return Ok(Vec::new());
    };
    let mut lines = Vec::new();
    for (old, stream, key) in MOVED {
        let Some(value) = privacy.remove(old).filter(|v| !v.is_null()) else {
            continue;
        };
        let default = || Value::String(StreamSettings::default().name().into());
        let noise = privacy.entry("noise").or_insert_with(default);
        if let Value::String(name) = noise {
            *noise = Value::Object(Map::from_iter([(name.clone(), Map::new().into())]));
        }
        let Some(Value::Object(settings)) = noise.get_mut(stream) else {
            return Err(ConfigError::Invalid(format!(
                "privacy.{old} is for privacy.noise = \"{stream}\" (its key is now \
                 [privacy.noise.{stream}] {key})"
            )));
        };
        settings.insert(key.into(), value);
        lines.push(format!(
            "privacy.{old} has moved: read as [privacy.noise.{stream}] {key}; write it there"
        ));
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
