//! No file of the tree cites a work session or a tracker issue by number: a reader has neither.
//! Code, docs, configs and scripts cite a doc section, a test or a benchmark instead. Build
//! output and run folders (gitignored) are not read.

use crate::files;
use std::path::{Path, PathBuf};

/// Folders below the root that hold no file of the tree: git's, build output, run folders.
const SKIPPED: [&str; 5] = [".git", "runs", "docs/book", "fuzz/corpus", "fuzz/artifacts"];

/// Folder names skipped wherever they are (each crate's or tool's build output).
const SKIPPED_NAMES: [&str; 3] = ["target", "__pycache__", "node_modules"];

/// Every file of the tree, sorted.
fn tree_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        let relative = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            if !SKIPPED.contains(&relative.as_str()) && !SKIPPED_NAMES.contains(&name.as_str()) {
                tree_files(root, &path, out);
            }
        } else {
            out.push(path);
        }
    }
}

/// The lines of `text` that cite a session or an issue by number: the word, a space, a digit.
fn citations(text: &str) -> Vec<String> {
    let lower = text.to_lowercase();
    lower
        .lines()
        .zip(text.lines())
        .filter(|(line, _)| {
            ["session ", "issue "].iter().any(|word| {
                line.match_indices(word)
                    .any(|(i, _)| line[i + word.len()..].starts_with(|c: char| c.is_ascii_digit()))
            })
        })
        .map(|(_, original)| original.trim().to_string())
        .collect()
}

#[test]
fn no_file_cites_a_session_or_an_issue_by_number() {
    let root = files::root();
    let mut paths = Vec::new();
    tree_files(&root, &root, &mut paths);
    paths.sort();
    assert!(
        paths.len() > 100,
        "only {} files found below {}",
        paths.len(),
        root.display()
    );
    let mut found = Vec::new();
    for path in paths {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue; // not UTF-8: an image or a data file
        };
        for line in citations(&text) {
            found.push(format!(
                "{}: {line}",
                path.strip_prefix(&root).unwrap().display()
            ));
        }
    }
    assert!(
        found.is_empty(),
        "cite a doc section, a test or a benchmark instead:\n{}",
        found.join("\n")
    );
}

#[test]
fn a_citation_is_found() {
    // The words are joined at run time so that this file does not cite anything itself.
    let (session, issue) = ("session", "Issue");
    let text = format!("measured in {session} 27\nsee {issue} 29's table\nthe Session stream");
    let expected = [
        format!("measured in {session} 27"),
        format!("see {issue} 29's table"),
    ];
    assert_eq!(citations(&text), expected);
    assert!(citations("a session of 5 rounds; issue: none").is_empty());
}
