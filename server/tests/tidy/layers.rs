//! The domain crates' layers (ARCHITECTURE.md, "The domain crates"): each depends on exactly the
//! workspace crates its place allows, and none on the wire or the runtime. Cargo then keeps the
//! code to it: a crate cannot import one its manifest does not name.

use crate::files::root;
use std::collections::BTreeSet;

/// Each domain crate's folder and the workspace crates it may depend on.
const LAYERS: [(&str, &[&str]); 6] = [
    ("common", &[]),
    ("datasets", &[]),
    ("model", &["fl-common", "fl-datasets"]),
    ("privacy", &["fl-common", "fl-model"]),
    ("authority", &["fl-privacy"]),
    ("secagg", &["fl-authority", "fl-model", "fl-privacy"]),
];

/// What only the wire and the processes may know.
const WIRE_AND_RUNTIME: [&str; 7] = [
    "tonic",
    "tonic-prost",
    "prost",
    "tokio",
    "axum",
    "tower",
    "hyper",
];

/// The names under `[dependencies]` of the crate in `folder`.
fn dependencies(folder: &str) -> BTreeSet<String> {
    let path = root().join(folder).join("Cargo.toml");
    let manifest: toml::Table = std::fs::read_to_string(&path).unwrap().parse().unwrap();
    manifest
        .get("dependencies")
        .and_then(|d| d.as_table())
        .map(|d| d.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn each_domain_crate_depends_only_on_the_layers_below_it() {
    let mut wrong = Vec::new();
    for (folder, allowed) in LAYERS {
        let deps = dependencies(folder);
        let workspace: BTreeSet<&str> = deps
            .iter()
            .map(String::as_str)
            .filter(|d| d.starts_with("fl-"))
            .collect();
        if workspace != allowed.iter().copied().collect() {
            wrong.push(format!("{folder}: {workspace:?}, allowed {allowed:?}"));
        }
        for banned in WIRE_AND_RUNTIME.iter().filter(|b| deps.contains(**b)) {
            wrong.push(format!("{folder} depends on {banned}"));
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}
