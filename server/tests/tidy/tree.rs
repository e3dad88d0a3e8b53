//! The shape of every crate's tree: no file over 600 lines, and no two files of a crate that
//! import each other, directly or around a longer loop.
//!
//! A file's imports are the paths its code names from `crate`, `super` or `self`, each resolved to
//! the file that defines the item: through a module's `pub use` re-exports, so that naming
//! `super::Item` when `mod.rs` re-exports it from `a.rs` is an import of `a.rs`. A module's own
//! submodules are not its imports (declaring and re-exporting them is the module's job), and
//! `#[cfg(test)]` code may name anything.

use crate::files::{crates, root, with_extension};
use crate::imports::{cycles, rooted_paths};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a file may be.
const MAX_LINES: usize = 600;

#[test]
fn no_file_is_longer_than_600_lines() {
    let root = root();
    let mut long = Vec::new();
    let folders = crates()
        .into_iter()
        .flat_map(|c| ["src", "tests", "benches", "examples"].map(|sub| root.join(&c).join(sub)));
    for file in folders
        .chain([root.join("fuzz")])
        .flat_map(|d| with_extension(&d, "rs"))
    {
        let lines = std::fs::read_to_string(&file).unwrap().lines().count();
        if lines > MAX_LINES {
            long.push(format!("{} ({lines} lines)", file.display()));
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// One crate's files: each module path (`["privacy", "tree"]` for `privacy/tree.rs`, `[]` for the
/// root) with its file and its code outside tests.
struct Crate {
    modules: BTreeMap<Vec<String>, (PathBuf, String)>,
}

impl Crate {
    /// The crate whose sources are below `src`: the library's if it has one, else the binary's.
    fn read(src: &Path) -> Crate {
        let mut modules = BTreeMap::new();
        let has_lib = src.join("lib.rs").exists();
        for file in with_extension(src, "rs") {
            let relative = file
                .strip_prefix(src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let mut module: Vec<String> = relative
                .trim_end_matches(".rs")
                .split('/')
                .map(str::to_string)
                .collect();
            let last = module.last().cloned().unwrap_or_default();
            if last == "mod" || (module.len() == 1 && (last == "lib" || last == "main")) {
                if module.len() == 1 && last == "main" && has_lib {
                    continue; // a binary over the library: it imports it by name, not `crate::`
                }
                module.pop();
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let code = match text.find("#[cfg(test)]") {
                Some(i) => text[..i].to_string(),
                None => text,
            };
            modules.insert(module, (file, code));
        }
        Crate { modules }
    }

    /// `path` (rooted at `crate`, `super` or `self`, as named in `module`) as a path from the
    /// crate's root.
    fn absolute(module: &[String], path: &[String]) -> Vec<String> {
        let mut base = module.to_vec();
        let mut rest = path;
        match path.first().map(String::as_str) {
            Some("crate") => {
                base.clear();
                rest = &path[1..];
            }
            Some("self") => rest = &path[1..],
            _ => {}
        }
        while rest.first().is_some_and(|s| s == "super") {
            base.pop();
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        base
    }

    /// The module whose file defines what `path` (from the root) names: its longest prefix
    /// that is a module, followed through that module's `pub use` of the next segment.
    fn defining_module(&self, path: &[String], depth: usize) -> Option<Vec<String>> {
        let k = (0..=path.len())
            .rev()
            .find(|&k| self.modules.contains_key(&path[..k]))?;
        let module = path[..k].to_vec();
        let (Some(item), true) = (path.get(k), depth < 8) else {
            return Some(module);
        };
        let code = &self.modules[&module].1;
        // Each statement, on one line or several.
        let reexport = code
            .split(';')
            .filter_map(|s| {
                s.find("pub use ")
                    .or_else(|| s.find("pub(crate) use "))
                    .map(|i| &s[i..])
            })
            .flat_map(|s| {
                let tree = s.split(" use ").nth(1).unwrap_or_default();
                let tree = tree.split_whitespace().collect::<Vec<_>>().join(" ");
                let rooted = ["crate::", "super::", "self::"]
                    .iter()
                    .any(|r| tree.starts_with(r));
                rooted_paths(&if rooted {
                    tree.to_string()
                } else {
                    format!("self::{tree}")
                })
            })
            .find(|p| p.last() == Some(item));
        match reexport {
            Some(target) => {
                let target = Self::absolute(&module, &target);
                let through = [target.as_slice(), &path[k + 1..]].concat();
                self.defining_module(&through, depth + 1)
            }
            None => Some(module),
        }
    }

    /// Which files each file imports, by module path; a module's submodules are not counted.
    fn imports(&self) -> BTreeMap<String, BTreeSet<String>> {
        let name = |m: &[String]| self.modules[m].0.display().to_string();
        let mut graph = BTreeMap::new();
        for (module, (_, code)) in &self.modules {
            let mut uses = BTreeSet::new();
            for path in rooted_paths(code) {
                let absolute = Self::absolute(module, &path);
                let Some(target) = self.defining_module(&absolute, 0) else {
                    continue;
                };
                if !target.starts_with(module) {
                    uses.insert(name(&target));
                }
            }
            graph.insert(name(module), uses);
        }
        graph
    }
}

#[test]
fn no_two_files_of_a_crate_import_each_other() {
    let root = root();
    let mut found = Vec::new();
    for name in crates() {
        let graph = Crate::read(&root.join(name).join("src")).imports();
        found.extend(cycles(&graph));
    }
    assert!(found.is_empty(), "import cycles among files: {found:#?}");
}

#[test]
fn a_cycle_through_a_reexport_is_found() {
    let mut modules = BTreeMap::new();
    for (m, code) in [
        (&[][..], "mod p;"),
        (
            &["p"][..],
            "mod a;\nmod b;\npub use a::Alpha;\npub use b::{\n    Beta,\n    Gamma,\n};",
        ),
        (&["p", "a"][..], "use super::Beta;\npub struct Alpha;"),
        (&["p", "b"][..], "use crate::p::a::Alpha;\npub struct Beta;"),
    ] {
        let module: Vec<String> = m.iter().map(|s| s.to_string()).collect();
        let path = PathBuf::from(format!("{}.rs", module.join("/")));
        modules.insert(module, (path, code.to_string()));
    }
    let graph = Crate { modules }.imports();
    assert_eq!(graph["p/a.rs"], BTreeSet::from(["p/b.rs".to_string()]));
    assert_eq!(cycles(&graph).len(), 1, "{graph:?}");
}

/// The secrets the how-to pages make (tokens, keys, test certificates, enrollment lists, a
/// client's state) are ignored by git, so a checkout never commits one; `git check-ignore`
/// decides, as git itself would.
#[test]
fn the_secrets_the_docs_make_are_ignored_by_git() {
    let root = root();
    if !root.join(".git").exists() {
        return; // Not a checkout (a packaged source tree): nothing can be committed from it.
    }
    for secret in [
        "fl-token",
        "clients.toml",
        "aggregators.toml",
        "deploy/certs/ca.key",
        "deploy/certs/client-2.pem",
        "site/identity.key",
        "authority/authority.key",
        "fl-client-state/hospitals--site-1.json",
    ] {
        let checked = std::process::Command::new("git")
            .args(["check-ignore", "-q", secret])
            .current_dir(&root)
            .status()
            .unwrap();
        assert!(checked.success(), "{secret} is not ignored by .gitignore");
    }
}
