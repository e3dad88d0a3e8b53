//! Architecture invariants checked on the source text (after rust-analyzer's tidy tests): the
//! privacy mode and algorithm are read in `build` (and parsed in `config`) only, and the round
//! logic knows nothing of the wire format or the transport.

use std::path::{Path, PathBuf};

/// Every `.rs` file below `server/src` and `client/src`, with its text outside `#[cfg(test)]`
/// modules (tests may name anything).
fn sources() -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
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

#[test]
fn the_round_logic_knows_nothing_of_the_wire_or_the_transport() {
    let round_logic = [
        "server/src/build.rs",
        "server/src/coordinator.rs",
        "server/src/rejection.rs",
        "server/src/local_accounts.rs",
        "server/src/ledger.rs",
    ];
    let folders = ["server/src/collection/", "server/src/strategy/"];
    let mut offenders = Vec::new();
    for (path, code) in sources() {
        let text = path.to_string_lossy().replace('\\', "/");
        let checked = round_logic.iter().any(|s| text.ends_with(s))
            || folders.iter().any(|f| text.contains(f));
        if checked && (code.contains("fl_proto::v1") || code.contains("tonic")) {
            offenders.push(path.display().to_string());
        }
    }
    assert!(
        offenders.is_empty(),
        "wire or transport types in: {offenders:?}"
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
