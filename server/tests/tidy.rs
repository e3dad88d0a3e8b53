//! Architecture invariants checked on the source (after rust-analyzer's tidy tests): the privacy
//! mode and algorithm are read in `build` (and parsed in `config`) only; the round logic imports
//! nothing of the wire format or the transport (checked by its `crate::` paths and the crates it
//! names, not by the words of its comments); the modules of `server/src` import each other
//! without a cycle; no function is longer than a screen.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file below `server/src` and `client/src`, with its text outside `#[cfg(test)]`
/// modules (tests may name anything).
/// The tree checked is this checkout, or the one `FL_TIDY_ROOT` names (to see how another
/// revision fares: `git worktree add ../old REV && FL_TIDY_ROOT=../old cargo test -p fl-server
/// --test tidy`).
fn sources() -> Vec<(PathBuf, String)> {
    let root = match std::env::var_os("FL_TIDY_ROOT") {
        Some(other) => PathBuf::from(other),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
    };
    let mut files = Vec::new();
    for dir in ["server/src", "client/src"] {
        collect(&root.join(dir), &mut files);
    }
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let code = match text.find("#[cfg(test)]") {
                Some(i) => text[..i].to_string(),
                None => text,
            };
            (p, code)
        })
        .collect()
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
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
        "MechanismSpec",
    ];
    let sources = sources();
    let mut offenders = Vec::new();
    for (path, code) in &sources {
        let text = path.to_string_lossy().replace('\\', "/");
        if is(path, "server/src/build.rs") || text.contains("server/src/config/") {
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
        if is(&path, "server/src/build.rs") || text.contains("server/src/config/") {
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

/// The modules of `server/src` that hold the round logic: they know nothing of the wire format
/// or the transport.
const ROUND_LOGIC: [&str; 11] = [
    "build",
    "checkpoint",
    "collection",
    "coordinator",
    "events",
    "ids",
    "ledger",
    "local_accounts",
    "policy",
    "rejection",
    "strategy",
];

/// The edge: the only modules of `server/src` that know `flp.v1`, `tonic` or the streams.
/// `clients` is the round logic's one port to it.
const EDGE: [&str; 10] = [
    "accept",
    "framer",
    "join_gate",
    "outbox",
    "registry",
    "service",
    "session",
    "shared",
    "transport",
    "wire",
];

/// The client's modules that know nothing of the wire: the engine, the round's computation, the
/// secure round and the trainer.
const CLIENT_CORE: [&str; 4] = [
    "client/src/engine.rs",
    "client/src/round.rs",
    "client/src/secure.rs",
    "client/src/trainer.rs",
];

/// Whether `code` (comments aside) names the wire crate or the transport.
fn names_the_wire(code: &str) -> bool {
    let code = without_comments(code);
    ["fl_proto", "tonic", "prost"]
        .iter()
        .any(|w| code.contains(w))
}

/// Checked by what the code imports and calls, not by the names it mentions in prose.
#[test]
fn the_round_logic_imports_nothing_of_the_wire_or_the_transport() {
    let mut offenders = Vec::new();
    for (path, code) in sources() {
        let text = path.to_string_lossy().replace('\\', "/");
        let module = module_of(&path).unwrap_or_default();
        let server_logic = text.contains("server/src/") && ROUND_LOGIC.contains(&module.as_str());
        let client_core = CLIENT_CORE.iter().any(|c| text.ends_with(c));
        if !(server_logic || client_core) {
            continue;
        }
        if names_the_wire(&code) {
            offenders.push(format!("{text}: uses fl_proto, prost or tonic"));
        }
        for used in crate_uses(&code).intersection(&EDGE.map(String::from).into()) {
            offenders.push(format!("{text}: uses crate::{used}"));
        }
    }
    assert!(
        offenders.is_empty(),
        "the round logic reaches the wire or the transport:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn no_function_is_longer_than_80_lines() {
    let mut long = Vec::new();
    for (path, code) in sources() {
        let lines: Vec<&str> = code.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let trimmed = line.trim_start();
            let signature = [
                "fn ",
                "pub fn ",
                "pub(crate) fn ",
                "async fn ",
                "pub async fn ",
            ]
            .iter()
            .any(|s| trimmed.starts_with(s));
            if !signature {
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

/// The top-level module of `server/src` that `path` belongs to: `collection` for
/// `server/src/collection/plain.rs`, `coordinator` for `server/src/coordinator.rs`.
fn module_of(path: &Path) -> Option<String> {
    let text = path.to_string_lossy().replace('\\', "/");
    let rest = text.split("server/src/").nth(1)?;
    let first = rest.split('/').next()?;
    Some(first.trim_end_matches(".rs").to_string())
}

/// The code of `text` without comments (line comments and doc comments).
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules of its own crate that `code` uses: the first segment after every
/// `crate::`, and each item of a `use crate::{a, b::c}` group.
fn crate_uses(code: &str) -> BTreeSet<String> {
    let code = without_comments(code);
    let mut used = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        match rest.strip_prefix('{') {
            Some(group) => {
                let mut depth = 0;
                let end = group
                    .char_indices()
                    .find(|&(_, c)| {
                        depth += i32::from(c == '{') - i32::from(c == '}');
                        depth < 0
                    })
                    .map_or(group.len(), |(e, _)| e);
                let mut depth = 0;
                let mut start = 0;
                for (j, c) in group[..end].char_indices() {
                    depth += i32::from(c == '{') - i32::from(c == '}');
                    if c == ',' && depth == 0 {
                        used.insert(first_segment(&group[start..j]));
                        start = j + 1;
                    }
                }
                used.insert(first_segment(&group[start..end]));
            }
            None => {
                used.insert(first_segment(rest));
            }
        }
    }
    used.retain(|m| !m.is_empty() && m.chars().next().is_some_and(char::is_lowercase));
    used
}

/// The leading identifier of a path.
fn first_segment(path: &str) -> String {
    path.trim()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// Which top-level modules of `server/src` each uses (a module's own files are one node).
fn server_imports() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, code) in sources() {
        let Some(module) = module_of(&path) else {
            continue;
        };
        if module == "lib" || module == "main" {
            continue;
        }
        let uses = crate_uses(&code);
        let entry = graph.entry(module.clone()).or_default();
        entry.extend(uses.into_iter().filter(|u| *u != module));
    }
    graph
}

/// The import cycles of `graph`: its strongly connected components of more than one module
/// (Tarjan's algorithm).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.graph.contains_key(w) {
                    continue;
                }
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let at = self.stack.iter().rposition(|&x| x == v).unwrap();
                let component: Vec<String> = self.stack.drain(at..).map(str::to_string).collect();
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.found
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
    let uses = crate_uses("use crate::{a::B, b, c::{D, E}};\nlet x = crate::d::f(); // crate::e");
    assert_eq!(Vec::from_iter(uses), ["a", "b", "c", "d"]);
}
