//! The run folder's reference page of the book: the files a run writes, and the fields of
//! `metrics.jsonl`, `ledger.jsonl` and `summary.json` generated from the types that write them
//! and their doc comments.

use super::ledger::LedgerEntry;
use super::output::{RoundMetrics, Summary};
use crate::config::reference::{kind_of, name_of, object, prose};
use serde_json::Value;

/// The files of a run folder, as `RunFolder`, the ledger and the checkpoint write them.
const FILES: &str = "# The run folder\n\n\
Every run writes one folder: the config's `server.out`, `fl sim --out`, or else a new\n\
`runs/NAME-YYYYMMDD-HHMMSS/` (UTC) that `runs/latest` points to. A new run never starts in a\n\
folder that holds a run: `--resume DIR` continues it, `--overwrite` archives its ledger first.\n\n\
| File | What it holds |\n|---|---|\n\
| `metrics.jsonl` | One line per round, written once the round's ledger entry and checkpoint are durable (fields below) |\n\
| `ledger.jsonl` | The privacy ledger: one line per accounted round, synced before the round's model is released; `fl privacy ledger DIR` recomputes the budget from it (fields below) |\n\
| `summary.json` | The run's totals, written when it ends (fields below) |\n\
| `local_privacy.json` | Under a client-side mechanism: each client's composed local epsilon |\n\
| `model.safetensors` | The released model (an iterate average when `train.average_decay` is set) |\n\
| `checkpoint.safetensors` | The model, counters and strategy state to resume from |\n\
| `accuracy.svg`, `privacy.svg` | Plots of the metrics (`fl plot DIR` redraws them) |\n";

/// A type's fields as a table, then a table for each field that is itself an object.
fn fields(title: &str, schema: &Value) -> String {
    let defs = &schema["$defs"];
    let mut out = format!("\n## `{title}`\n\n{}\n", prose(&schema["description"]));
    let mut nested = Vec::new();
    table(schema, defs, &mut out, &mut nested);
    for variant in schema["anyOf"].as_array().into_iter().flatten() {
        let def = &defs[name_of(&variant["$ref"])];
        let what = prose(&variant["description"]);
        let mut chars = what.trim_end_matches('.').chars();
        let first = chars.next().map(|c| c.to_lowercase().collect::<String>());
        out.push_str(&format!(
            "\nWith {}{}:\n",
            first.unwrap_or_default(),
            chars.as_str()
        ));
        table(def, defs, &mut out, &mut nested);
    }
    for (name, def) in nested {
        out.push_str(&format!(
            "\n`{title}`'s `{name}`: {}\n",
            prose(&def["description"])
        ));
        table(def, defs, &mut out, &mut Vec::new());
    }
    out
}

/// The rows of `def`'s properties; objects they hold are pushed onto `nested`.
fn table<'a>(
    def: &'a Value,
    defs: &'a Value,
    out: &mut String,
    nested: &mut Vec<(String, &'a Value)>,
) {
    out.push_str("\n| Field | Type | Meaning |\n|---|---|---|\n");
    for (key, field) in object(&def["properties"]) {
        let (kind, _) = kind_of(field, defs);
        let meaning = prose(&field["description"]).replace('|', "\\|");
        out.push_str(&format!("| `{key}` | {kind} | {meaning} |\n"));
        let reference = field["anyOf"]
            .as_array()
            .and_then(|o| o.iter().find(|v| v.get("$ref").is_some()));
        let target = defs.get(name_of(reference.map_or(&field["$ref"], |r| &r["$ref"])));
        if let Some(target) = target.filter(|t| t["type"] == "object") {
            nested.push((key.clone(), target));
        }
    }
}

/// The page.
fn page() -> String {
    let schema = |s: schemars::Schema| serde_json::to_value(s).expect("a schema is JSON");
    let mut out = String::from(FILES);
    out.push_str(&fields(
        "metrics.jsonl",
        &schema(schemars::schema_for!(RoundMetrics)),
    ));
    out.push_str(&fields(
        "ledger.jsonl",
        &schema(schemars::schema_for!(LedgerEntry)),
    ));
    out.push_str(&fields(
        "summary.json",
        &schema(schemars::schema_for!(Summary)),
    ));
    out
}

/// docs/src/reference/run-folder.md is what the types that write the run folder say.
#[test]
fn the_run_folder_reference_is_current() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let test = "cargo test -p fl-server --lib the_run_folder_reference_is_current";
    fl_common::generated_docs::check(&root, "docs/src/reference/run-folder.md", &page(), test)
        .unwrap();
}
