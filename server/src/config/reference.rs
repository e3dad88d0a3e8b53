//! The configuration reference of the book, generated from the configuration types and their doc
//! comments (through their JSON schema, `schemars`): every key of every section with its type,
//! default, meaning and allowed values; and the JSON schema itself, for editors that complete
//! TOML from one.

use super::RunConfig;
use serde_json::{Map, Value};

/// The page's introduction.
const INTRO: &str = "# Configuration reference\n\n\
A run is one TOML file of the sections below. Every key is optional (its default is shown) and an\n\
unknown key is refused. `fl sim --set section.key=VALUE` overrides one key; `fl-server` takes\n\
the same file. [`config.schema.json`](config.schema.json) is the same reference as a JSON\n\
schema, for editors that complete TOML from one. This page is generated from the configuration\n\
types and their documentation.\n";

/// The JSON schema of a run configuration.
fn schema() -> Value {
    serde_json::to_value(schemars::schema_for!(RunConfig)).expect("a schema is JSON")
}

/// The reference page of `schema`.
fn page(schema: &Value) -> String {
    let defs = &schema["$defs"];
    let mut out = String::from(INTRO);
    for (section, property) in object(&schema["properties"]) {
        let def = &defs[name_of(&property["$ref"])];
        out.push_str(&format!(
            "\n## `[{section}]`\n\n{}\n\n",
            prose(&property["description"])
        ));
        match mode_tables(def, defs) {
            Some(tables) => out.push_str(&tables),
            None => out.push_str(&keys(section, def, defs)),
        }
    }
    out
}

/// A section whose keys are those of the mechanism `privacy.mode` names (`[local]`): each
/// mechanism's keys under its name.
fn mode_tables(def: &Value, defs: &Value) -> Option<String> {
    let tables = def["oneOf"].as_array()?;
    let mut parts = Vec::new();
    for table in tables {
        let name = table["title"].as_str()?;
        let settings = &defs[name_of(&table["allOf"][0]["$ref"])];
        parts.push(format!(
            "With `privacy.mode = \"{name}\"`: {}\n\n{}",
            prose(&table["description"]),
            keys(name, settings, defs)
        ));
    }
    Some(parts.join("\n"))
}

/// The table of a section's (or a sub-table's) keys, then each key's values.
fn keys(section: &str, def: &Value, defs: &Value) -> String {
    if object(&def["properties"]).is_empty() {
        return "No keys.\n".into();
    }
    let mut out = String::from("| Key | Type | Default | Meaning |\n|---|---|---|---|\n");
    let mut values = String::new();
    for (key, field) in object(&def["properties"]) {
        let (kind, variants) = match named_tables(field, defs) {
            Some(tables) => named_tables_text(&format!("{section}.{key}"), &tables, defs),
            None => kind_of(field, defs),
        };
        let default = default_of(&field["default"]);
        let meaning = prose(&field["description"]).replace('|', "\\|");
        out.push_str(&format!("| `{key}` | {kind} | {default} | {meaning} |\n"));
        if !variants.is_empty() {
            values.push_str(&format!("\n`{section}.{key}`:\n\n{variants}"));
        }
    }
    out + &values
}

/// A key that holds a name or one of several named tables (a noise stream): each name with
/// its description and its table's definition.
fn named_tables<'a>(field: &Value, defs: &'a Value) -> Option<Vec<(String, String, &'a Value)>> {
    let def = &defs[name_of(field.get("$ref")?)];
    let options = def["anyOf"].as_array()?;
    let tables = options.iter().find_map(|o| o["oneOf"].as_array())?;
    let named = tables.iter().map(|table| {
        let (name, settings) = object(&table["properties"]).into_iter().next()?;
        let words: Vec<String> = (prose(&table["description"]).split_whitespace())
            .map(String::from)
            .collect();
        let description = words.join(" ");
        Some((name.clone(), description, &defs[name_of(&settings["$ref"])]))
    });
    named.collect()
}

/// A named-tables key's type (its names, or a table) and its values: each name, then each
/// table's keys as a table of their own.
fn named_tables_text(
    path: &str,
    tables: &[(String, String, &Value)],
    defs: &Value,
) -> (String, String) {
    let names: Vec<String> = tables.iter().map(|(n, ..)| format!("`\"{n}\"`")).collect();
    let mut values = String::from(
        "A name (its table's keys at their defaults) or one table, `[PATH.NAME]`:\n\n",
    )
    .replace("PATH", path);
    for (name, description, _) in tables {
        values.push_str(&format!("- `\"{name}\"`: {description}\n"));
    }
    for (name, _, def) in tables {
        values.push_str(&format!("\n`[{path}.{name}]`:\n\n"));
        values.push_str(&keys(&format!("{path}.{name}"), def, defs));
    }
    (format!("{} \\| a table", names.join(" \\| ")), values)
}

/// The entries of a JSON object, or none.
pub(crate) fn object(value: &Value) -> Vec<(&String, &Value)> {
    value
        .as_object()
        .map(Map::iter)
        .into_iter()
        .flatten()
        .collect()
}

/// The definition a `$ref` names (`#/$defs/Name` -> `Name`).
pub(crate) fn name_of(reference: &Value) -> &str {
    reference
        .as_str()
        .and_then(|r| r.rsplit('/').next())
        .unwrap_or("")
}

/// A doc comment as one paragraph, its intra-doc links as plain code.
pub(crate) fn prose(description: &Value) -> String {
    let text = description.as_str().unwrap_or("").replace('\n', " ");
    let mut out = String::new();
    let mut rest = text.as_str();
    // [`Item`] and [`Item`](path) become `Item`: the book cannot follow rustdoc's links.
    while let Some(start) = rest.find("[`") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let Some(end) = after.find("`]") else {
            out.push_str(&rest[start..]);
            rest = "";
            break;
        };
        out.push_str(&after[..end + 1]);
        rest = &after[end + 2..];
        if rest.starts_with('(')
            && let Some(close) = rest.find(')')
        {
            rest = &rest[close + 1..];
        }
    }
    out.push_str(rest);
    out
}

/// A field's type as the page shows it, and (for an enumeration) its values with their meaning
/// as a list.
pub(crate) fn kind_of(field: &Value, defs: &Value) -> (String, String) {
    if let Some(options) = field["anyOf"].as_array() {
        let inner = options.iter().find(|o| o["type"] != "null");
        let optional = options.iter().any(|o| o["type"] == "null");
        if let (Some(inner), true) = (inner, optional) {
            let (kind, values) = kind_of(inner, defs);
            return (format!("{kind}, optional"), values);
        }
    }
    if let Some(reference) = field.get("$ref") {
        let def = &defs[name_of(reference)];
        if let Some(variants) = def["oneOf"].as_array() {
            let names: Vec<String> = variants
                .iter()
                .map(|v| format!("`{}`", v["const"]))
                .collect();
            let list = variants
                .iter()
                .map(|v| format!("- `{}`: {}\n", v["const"], prose(&v["description"])))
                .collect();
            return (names.join(" \\| "), list);
        }
        if def.get("anyOf").is_some() {
            return (
                format!("{} (see below)", name_of(reference).to_lowercase()),
                schedule(def),
            );
        }
        return kind_of(def, defs);
    }
    let kind = match &field["type"] {
        Value::Array(types) => {
            let kinds: Vec<&str> = types.iter().filter_map(Value::as_str).collect();
            let main = kinds.iter().find(|k| **k != "null").copied().unwrap_or("");
            let optional = if kinds.contains(&"null") {
                ", optional"
            } else {
                ""
            };
            format!("{}{optional}", plain(main))
        }
        Value::String(kind) if kind == "array" => {
            format!("list of {}", kind_of(&field["items"], defs).0)
        }
        Value::String(kind) => plain(kind).to_string(),
        _ => "value".to_string(),
    };
    (kind, String::new())
}

/// A JSON schema type in TOML's words.
fn plain(kind: &str) -> &str {
    match kind {
        "number" => "number",
        "integer" => "integer",
        "boolean" => "boolean",
        "string" => "string",
        other => other,
    }
}

/// A value that may follow a schedule: its forms, each with its meaning.
fn schedule(def: &Value) -> String {
    let forms = def["anyOf"].as_array().into_iter().flatten();
    let mut out = format!("{}\n\n", prose(&def["description"]));
    for form in forms {
        out.push_str(&format!("- {}\n", prose(&form["description"])));
    }
    out
}

/// A default value as TOML writes it; `unset` for none.
fn default_of(value: &Value) -> String {
    match value {
        Value::Null => "unset".to_string(),
        Value::String(s) => format!("`\"{s}\"`"),
        Value::Number(n) if n.is_f64() => format!("`{}`", shortest(n.as_f64().unwrap_or(0.0))),
        other => format!("`{other}`"),
    }
}

/// A float as written: an f32 key's value (0.05 read back as 0.05000000074505806 in f64) as
/// the f32 it is, and always with a decimal point.
fn shortest(x: f64) -> String {
    let text = if f64::from(x as f32) == x {
        (x as f32).to_string()
    } else {
        x.to_string()
    };
    match text.contains(['.', 'e']) {
        true => text,
        false => format!("{text}.0"),
    }
}

/// docs/src/reference/config.md and config.schema.json are what the configuration types say.
#[test]
fn the_configuration_reference_is_current() {
    let test = "cargo test -p fl-server --lib the_configuration_reference_is_current";
    let schema = schema();
    let check = |page: &str, text: &str| {
        fl_common::generated_docs::assert_fresh(env!("CARGO_MANIFEST_DIR"), page, text, test);
    };
    check("docs/src/reference/config.md", &page(&schema));
    let json = serde_json::to_string_pretty(&schema).expect("a schema is JSON") + "\n";
    check("docs/src/reference/config.schema.json", &json);
}

#[test]
fn every_section_and_key_is_on_the_page() {
    let text = page(&schema());
    let defaults = toml::Value::try_from(RunConfig::default()).unwrap();
    for (section, keys) in defaults.as_table().unwrap() {
        assert!(text.contains(&format!("## `[{section}]`")), "[{section}]");
        for key in keys.as_table().unwrap().keys() {
            assert!(text.contains(&format!("| `{key}` |")), "{section}.{key}");
        }
    }
    assert!(
        text.contains("- `\"central\"`: "),
        "the modes' values are listed"
    );
}
