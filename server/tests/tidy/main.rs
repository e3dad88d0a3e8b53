//! Architecture invariants checked on the source (after rust-analyzer's tidy tests): each layer
//! (folder) of `server/src` imports only the layers below it and nothing of `lib.rs`; the privacy
//! mode and algorithm are read in `run/build.rs` (and parsed in `config`) only; the round logic
//! imports nothing of the wire format or the transport; the modules of `server/src` import each
//! other without a cycle; no function is longer than a screen; no file cites a session or an issue
//! by number; no wildcard arm where a privacy or robustness decision is made. Imports are read from the code's
//! `crate::` paths and the crates it names, not from the words of its comments.

mod book;
mod citations;
mod decisions;
mod files;
mod imports;
mod layers;
mod tree;

use files::crates;
use imports::{crate_paths, cycles, without_comments};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file below `server/src` and `client/src` of the tree checked ([`files::root`]),
/// with its text outside `#[cfg(test)]` modules (tests may name anything).
fn sources() -> Vec<(PathBuf, String)> {
    sources_of(&["server/src", "client/src"])
}

/// The sources of every crate of the workspace, as [`sources`] reads them.
fn every_crates_sources() -> Vec<(PathBuf, String)> {
    let dirs: Vec<String> = crates().iter().map(|c| format!("{c}/src")).collect();
    sources_of(&dirs.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The `.rs` files below `dirs`, as [`sources`] reads them, without the files of modules
/// declared `#[cfg(test)] mod NAME;` (tests, whole).
fn sources_of(dirs: &[&str]) -> Vec<(PathBuf, String)> {
    let root = files::root();
    let files = (dirs.iter()).flat_map(|dir| files::with_extension(&root.join(dir), "rs"));
    let texts: Vec<(PathBuf, String)> = files
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect();
    let tests: BTreeSet<PathBuf> = (texts.iter())
        .flat_map(|(p, text)| test_module_files(p, text))
        .collect();
    (texts.into_iter())
        .filter(|(p, _)| !tests.contains(p))
        .map(|(p, text)| {
            let code = match text.find("#[cfg(test)]") {
                Some(i) => text[..i].to_string(),
                None => text,
            };
            (p, code)
        })
        .collect()
}

/// The files of the modules that `text`, the file at `path`, declares `#[cfg(test)] mod NAME;`.
fn test_module_files(path: &Path, text: &str) -> Vec<PathBuf> {
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let dir = match stem.as_ref() {
        "mod" | "lib" | "main" => path.parent().unwrap().to_path_buf(),
        _ => path.with_extension(""),
    };
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    (lines.windows(2))
        .filter(|w| w[0] == "#[cfg(test)]")
        .filter_map(|w| w[1].strip_prefix("mod ")?.strip_suffix(';'))
        .flat_map(|name| {
            [
                dir.join(format!("{name}.rs")),
                dir.join(name).join("mod.rs"),
            ]
        })
        .collect()
}

fn is(path: &Path, suffix: &str) -> bool {
    path.to_string_lossy().replace('\\', "/").ends_with(suffix)
}

#[test]
fn only_build_and_config_read_the_privacy_mode_and_algorithm() {
    let enums = [
        "PrivacyMode",
        "Algorithm",
        "SecAggNoise",
        "ClipMode",
        "SecAggGraph",
        "Aggregator",
        "PrivacyPlan",
        "SecureNoise",
        "LocalRule",
    ];
    let sources = sources();
    let mut offenders = Vec::new();
    for (path, code) in &sources {
        let text = path.to_string_lossy().replace('\\', "/");
        if is(path, "server/src/run/build.rs") || text.contains("server/src/config/") {
            continue;
        }
        // The module that defines an enum may match on it (its Display, its own methods).
        let read = enums
            .iter()
            .filter(|e| !code.contains(&format!("pub enum {e} ")))
            .map(|e| format!("{e}::"))
            .collect::<Vec<_>>();
        for (n, line) in code.lines().enumerate() {
            let line = line.trim_start();
            if !line.starts_with("//") && read.iter().any(|e| line.contains(e.as_str())) {
                offenders.push(format!("{}:{}: {line}", path.display(), n + 1));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "mode branches outside build:\n{}",
        offenders.join("\n")
    );
}

/// The privacy sections reach the run through the plan: only `config` parses them and only
/// `build` (and the plan's policies it builds) acts on them.
#[test]
fn only_build_and_config_read_the_privacy_sections() {
    let sections = ["privacy", "secagg", "local", "signds", "admm"];
    let mut offenders = Vec::new();
    for (path, code) in sources() {
        let text = path.to_string_lossy().replace('\\', "/");
        if is(&path, "server/src/run/build.rs") || text.contains("server/src/config/") {
            continue;
        }
        for (n, line) in code.lines().enumerate() {
            if sections
                .iter()
                .any(|s| line.contains(&format!("config.{s}.")))
            {
                offenders.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "privacy settings read outside build:\n{}",
        offenders.join("\n")
    );
}

/// The layers of `server/src`, lowest first: a file in one may import (by `crate::` paths) only
/// its own layer and those before it; `lib.rs` and `main.rs` sit above them all.
const LAYERS: [&str; 8] = [
    "identity", "config", "error", "records", "round", "edge", "operator", "run",
];

/// The round logic: the files that know nothing of the wire format or the transport, and reach
/// the edge (if at all) through its port to the clients and the vocabulary below it.
const ROUND_LOGIC: [&str; 6] = [
    "server/src/records/",
    "server/src/round/",
    "server/src/run/build.rs",
    "server/src/run/collection/",
    "server/src/run/coordinator/",
    "server/src/run/model_setup.rs",
];

/// What of the edge the round logic may name: the round's ports to the clients and to a
/// verified round's helper.
const EDGE_PORTS: [&str; 2] = ["edge::clients", "edge::helper::HelperLink"];

/// The client's modules that know nothing of the wire: the engine, the round's computation, the
/// secure round, the verified upload and the trainer.
const CLIENT_CORE: [&str; 5] = [
    "client/src/engine.rs",
    "client/src/round.rs",
    "client/src/secure.rs",
    "client/src/trainer.rs",
    "client/src/verified.rs",
];

/// Whether `code` (comments aside) names the wire crate or the transport.
fn names_the_wire(code: &str) -> bool {
    let code = without_comments(code);
    ["fl_proto", "tonic", "prost"]
        .iter()
        .any(|w| code.contains(w))
}

/// `path` below `server/src/`, with `/` separators.
fn server_relative(path: &Path) -> Option<String> {
    let text = path.to_string_lossy().replace('\\', "/");
    text.split("server/src/").nth(1).map(str::to_string)
}

/// Checked by what the code imports and calls, not by the names it mentions in prose.
#[test]
fn the_round_logic_imports_nothing_of_the_wire_or_the_transport() {
    let mut offenders = Vec::new();
    for (path, code) in sources() {
        let text = path.to_string_lossy().replace('\\', "/");
        let server_logic = ROUND_LOGIC.iter().any(|l| text.contains(l));
        let client_core = CLIENT_CORE.iter().any(|c| text.ends_with(c));
        if !(server_logic || client_core) {
            continue;
        }
        if names_the_wire(&code) {
            offenders.push(format!("{text}: uses fl_proto, prost or tonic"));
        }
        for used in crate_paths(&code) {
            let used = used.join("::");
            let port = EDGE_PORTS.iter().any(|p| used.starts_with(p));
            if server_logic && used.starts_with("edge") && !port {
                offenders.push(format!("{text}: uses crate::{used}"));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "the round logic reaches the wire or the transport:\n{}",
        offenders.join("\n")
    );
}

/// The layer of a file of `server/src`: its folder, or its own name for a file at the top.
fn layer_of(relative: &str) -> &str {
    let first = relative.split('/').next().unwrap_or_default();
    first.strip_suffix(".rs").unwrap_or(first)
}

/// Every `crate::` path of `files` that climbs: to a layer above the file's own, or to an item
/// of `lib.rs` (anything after `crate::` that is not a layer).
fn upward_imports(files: &[(String, String)]) -> Vec<String> {
    let rank = |layer: &str| LAYERS.iter().position(|l| *l == layer);
    let mut offenders = Vec::new();
    for (relative, code) in files {
        let layer = layer_of(relative);
        let Some(own) = rank(layer) else {
            continue; // lib.rs and main.rs may import every layer
        };
        for used in crate_paths(code) {
            let target = used.first().map(String::as_str).unwrap_or_default();
            match rank(target) {
                Some(r) if r <= own => {}
                Some(_) => offenders.push(format!(
                    "server/src/{relative} ({layer}) imports crate::{}, a layer above it",
                    used.join("::")
                )),
                None => offenders.push(format!(
                    "server/src/{relative} ({layer}) imports crate::{}, from lib.rs",
                    used.join("::")
                )),
            }
        }
    }
    offenders
}

/// The layering of `server/src` (its `mod.rs` files and `lib.rs`'s documentation say what each
/// owns): `cargo test -p fl-server --test tidy each_layer_imports_only_the_layers_below_it`.
#[test]
fn each_layer_imports_only_the_layers_below_it() {
    let mut files = Vec::new();
    let mut layers = BTreeSet::new();
    for (path, code) in sources() {
        if let Some(relative) = server_relative(&path) {
            layers.insert(layer_of(&relative).to_string());
            files.push((relative, code));
        }
    }
    let expected: BTreeSet<String> = LAYERS
        .iter()
        .chain(&["lib", "main"])
        .map(|l| l.to_string())
        .collect();
    assert_eq!(
        layers, expected,
        "server/src holds exactly the layers of LAYERS (and lib.rs, main.rs)"
    );
    let offenders = upward_imports(&files);
    assert!(
        offenders.is_empty(),
        "imports that climb a layer:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn an_upward_import_is_found() {
    let files = [
        (
            "records/ledger.rs".to_string(),
            "use crate::config::ClipMode;".to_string(),
        ),
        (
            "round/events.rs".to_string(),
            "use crate::edge::outbox::Outbox;".to_string(),
        ),
        (
            "edge/wire.rs".to_string(),
            "let e = crate::ServerError::Interrupted;".to_string(),
        ),
        (
            "run/start.rs".to_string(),
            "use crate::{edge::shared, round};".to_string(),
        ),
    ];
    let found = upward_imports(&files);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("round/events.rs") && found[0].contains("crate::edge::outbox"));
    assert!(found[1].contains("from lib.rs"));
}

#[test]
fn no_function_is_longer_than_80_lines() {
    let mut long = Vec::new();
    for (path, code) in every_crates_sources() {
        let lines: Vec<&str> = code.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let trimmed = line.trim_start();
            if !is_fn_signature(trimmed) || is_declaration(&lines[i..]) {
                continue;
            }
            // A function ends at the first line that is its indentation and a closing brace.
            let indent = &line[..line.len() - trimmed.len()];
            let end = format!("{indent}}}");
            if let Some(n) = lines[i..].iter().position(|l| *l == end)
                && n + 1 > 80
            {
                long.push(format!("{}:{} ({} lines)", path.display(), i + 1, n + 1));
            }
        }
    }
    assert!(long.is_empty(), "functions over 80 lines: {long:?}");
}

/// Whether the function whose signature starts `lines` is a declaration without a body (a
/// trait's required method): its signature ends with `;` before any `{`.
fn is_declaration(lines: &[&str]) -> bool {
    let end = lines
        .iter()
        .find(|l| l.contains('{') || l.trim_end().ends_with(';'));
    end.is_some_and(|l| !l.contains('{'))
}

#[test]
fn a_trait_method_without_a_body_is_not_measured() {
    let required = ["    fn protect(", "        &self,", "    ) -> Output;", "}"];
    assert!(is_declaration(&required));
    let provided = [
        "    fn protect(&self) -> Output {",
        "        todo()",
        "    }",
    ];
    assert!(!is_declaration(&provided));
}

/// Whether a trimmed line opens a function: `fn`, after any visibility, `const`, `async` or
/// `unsafe`.
fn is_fn_signature(trimmed: &str) -> bool {
    let mut rest = trimmed;
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    rest.starts_with("fn ")
}

/// The module of `server/src` a file belongs to, as a node of the import graph: `error` for
/// `error.rs`, `round::strategy` for `round/strategy/layer.rs`, `edge::session` for
/// `edge/session.rs`.
fn module_of(relative: &str) -> String {
    let parts: Vec<&str> = relative.split('/').collect();
    let take = parts.len().min(2);
    let names: Vec<&str> = parts[..take]
        .iter()
        .map(|p| p.strip_suffix(".rs").unwrap_or(p))
        .filter(|p| *p != "mod")
        .collect();
    names.join("::")
}

/// Which modules of `server/src` each uses (a module's own files are one node).
fn server_imports() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut uses = Vec::new();
    for (path, code) in sources() {
        let Some(relative) = server_relative(&path) else {
            continue;
        };
        let module = module_of(&relative);
        if module == "lib" || module == "main" {
            continue;
        }
        graph.entry(module.clone()).or_default();
        uses.push((module, crate_paths(&code)));
    }
    for (module, paths) in uses {
        for path in paths {
            let two = path.iter().take(2).cloned().collect::<Vec<_>>().join("::");
            let node = if graph.contains_key(&two) {
                two
            } else {
                path[0].clone()
            };
            if node != module {
                graph.get_mut(&module).unwrap().insert(node);
            }
        }
    }
    graph
}

/// `cargo test -p fl-server --test tidy -- --nocapture server_modules_import_no_cycle` prints
/// the module graph.
#[test]
fn server_modules_import_no_cycle() {
    let graph = server_imports();
    for (module, uses) in &graph {
        println!(
            "{module} -> {}",
            Vec::from_iter(uses.iter().cloned()).join(", ")
        );
    }
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "import cycles among server/src modules: {found:?}"
    );
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.into(), v.into_iter().map(String::from).collect()))
    .collect();
    let found = cycles(&graph);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].len(), 3);
    let paths =
        crate_paths("use crate::{a::B, b, c::{D, e::F}};\nlet x = crate::d::f(); // crate::e");
    let paths: Vec<String> = paths.into_iter().map(|p| p.join("::")).collect();
    assert_eq!(paths, ["a::B", "b", "c::D", "c::e::F", "d::f"]);
}
