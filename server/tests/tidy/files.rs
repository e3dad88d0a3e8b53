//! The tree the tidy tests read: this checkout, or the one `FL_TIDY_ROOT` names (to see how
//! another revision fares: `git worktree add ../old REV && FL_TIDY_ROOT=../old cargo test -p
//! fl-server --test tidy`), and its files by extension.

use std::path::{Path, PathBuf};

/// The workspace's root.
pub fn root() -> PathBuf {
    match std::env::var_os("FL_TIDY_ROOT") {
        Some(other) => PathBuf::from(other),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
    }
}

/// The folders of the workspace's crates, as the root `Cargo.toml` lists its members.
pub fn crates() -> Vec<String> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let start = manifest.find("members = [").expect("a members list") + "members = [".len();
    let end = start + manifest[start..].find(']').unwrap();
    manifest[start..end]
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect()
}

/// Every file below `dir` whose extension is `extension`, sorted; none when `dir` is missing.
pub fn with_extension(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(with_extension(&path, extension));
        } else if path.extension().is_some_and(|e| e == extension) {
            out.push(path);
        }
    }
    out.sort();
    out
}
