//! The book's internal links (`docs/src`, and README.md's into it): every relative link names a
//! page or file that exists, and every `#anchor` a heading of its page, with the ids mdBook gives
//! headings. Links to the web are not followed.

use crate::files;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The book's sources: `docs/src` of the tree checked.
fn book_src() -> PathBuf {
    files::root().join("docs/src")
}

/// The id mdBook gives a heading: lower case, spaces as `-`, only letters, digits, `-` and `_`.
fn heading_id(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            c if c.is_whitespace() => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// The lines of `text` outside fenced code blocks.
fn outside_code(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |line| {
        let fence = line.trim_start().starts_with("```");
        fenced ^= fence;
        !fenced && !fence
    })
}

/// The anchors of a page: its headings' ids (repeated headings get `-1`, `-2`, ...) and the
/// `id="..."` of its inline HTML.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in outside_code(text) {
        if let Some(heading) = line.strip_prefix('#') {
            let id = heading_id(heading.trim_start_matches('#'));
            let mut unique = id.clone();
            let mut n = 1;
            while found.contains(&unique) {
                unique = format!("{id}-{n}");
                n += 1;
            }
            found.insert(unique);
        }
        for (at, _) in line.match_indices("id=\"") {
            let rest = &line[at + 4..];
            found.insert(rest[..rest.find('"').unwrap_or(0)].to_string());
        }
    }
    found
}

/// The text of the page at `path` as mdBook renders it: each `{{#include FILE}}` line replaced by
/// that file's text (its path relative to the page).
fn expanded(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let lines = text.lines().map(|line| {
        let included =
            (line.trim().strip_prefix("{{#include ")).and_then(|rest| rest.strip_suffix("}}"));
        match included {
            Some(file) => expanded(&path.parent().unwrap().join(file.trim())),
            None => line.to_string(),
        }
    });
    lines.collect::<Vec<_>>().join("\n")
}

/// The targets of a page's Markdown links `[text](target)`, outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in outside_code(text) {
        // Inline code may hold `](` that is not a link.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join("");
        for (at, _) in prose.match_indices("](") {
            let rest = &prose[at + 2..];
            if let Some(end) = rest.find(')') {
                out.push(
                    rest[..end]
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .to_string(),
                );
            }
        }
    }
    out
}

/// The broken links of `page` (with its `text`), as `page: target (why)`.
fn broken_links(page: &Path, text: &str) -> Vec<String> {
    let mut broken = Vec::new();
    for target in links(text) {
        if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (file, anchor) = match target.split_once('#') {
            Some((file, anchor)) => (file, Some(anchor)),
            None => (target.as_str(), None),
        };
        let linked = if file.is_empty() {
            page.to_path_buf()
        } else {
            page.parent().unwrap().join(file)
        };
        if !linked.exists() {
            broken.push(format!("{}: {target} (no such file)", page.display()));
            continue;
        }
        if let Some(anchor) = anchor
            && linked.extension().is_some_and(|e| e == "md")
            && !anchors(&expanded(&linked)).contains(anchor)
        {
            broken.push(format!("{}: {target} (no such heading)", page.display()));
        }
    }
    broken
}

#[test]
fn every_link_of_the_book_leads_somewhere() {
    let mut broken = Vec::new();
    let readme = book_src().join("../../README.md");
    let pages = files::with_extension(&book_src(), "md")
        .into_iter()
        .chain([readme]);
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        broken.extend(broken_links(&page, &text));
    }
    assert!(
        broken.is_empty(),
        "broken links in the book:\n{}",
        broken.join("\n")
    );
}

#[test]
fn a_broken_link_or_anchor_is_found() {
    let dir = std::env::temp_dir().join(format!("fl-book-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let other = dir.join("other.md");
    std::fs::write(&other, "# The `fl privacy` page\n\n## Options\n").unwrap();
    let page = dir.join("page.md");
    let text = "See [it](other.md#the-fl-privacy-page), [options](other.md#options), \
                [gone](missing.md), [no heading](other.md#nothing), `[code](x.md)` and \
                [the web](https://example.org).";
    let mut broken = broken_links(&page, text);
    std::fs::write(dir.join("parts.md"), "## Included heading\n").unwrap();
    std::fs::write(dir.join("whole.md"), "# Whole\n{{#include parts.md}}\n").unwrap();
    broken.extend(broken_links(&page, "[part](whole.md#included-heading)"));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(broken[0].contains("missing.md (no such file)"));
    assert!(broken[1].contains("other.md#nothing (no such heading)"));
}

/// The words the newcomer's path uses before it explains them are defined on the Terms page,
/// which the book lists right after "Privacy in five minutes", before the tutorials.
#[test]
fn the_newcomers_words_are_defined_before_the_tutorials() {
    let docs = files::root().join("docs/src");
    let terms = std::fs::read_to_string(docs.join("terms.md")).unwrap();
    for word in [
        "| accountant |",
        "**PLD**",
        "**RDP**",
        "| composition |",
        "| Poisson sampling |",
        "privacy.budget = \"delta\"",
        "| budget |",
        "| ledger |",
    ] {
        assert!(terms.contains(word), "terms.md does not define {word}");
    }
    let summary = std::fs::read_to_string(docs.join("SUMMARY.md")).unwrap();
    let at = |page: &str| {
        summary
            .find(page)
            .unwrap_or_else(|| panic!("{page} not listed"))
    };
    assert!(at("(privacy-in-five-minutes.md)") < at("(terms.md)"));
    assert!(at("(terms.md)") < at("(tutorials/first-run.md)"));
}

/// A page that includes a file (mdBook's `{{#include FILE}}`, which the repository's web view
/// shows as it is) links to that file just before, so the page reads whole in either view.
#[test]
fn every_include_is_also_a_link() {
    let docs = files::root().join("docs/src");
    let mut pages = Vec::new();
    let mut dirs = vec![docs.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            match path.is_dir() {
                true => dirs.push(path),
                false if path.extension().is_some_and(|e| e == "md") => pages.push(path),
                false => {}
            }
        }
    }
    let mut unlinked = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(target) =
                (line.trim().strip_prefix("{{#include ")).and_then(|rest| rest.strip_suffix("}}"))
            else {
                continue;
            };
            let before = lines[i.saturating_sub(4)..i].join(" ");
            if !before.contains(&format!("]({target})")) {
                unlinked.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(
        unlinked.is_empty(),
        "includes without a link to their file: {unlinked:?}"
    );
}

/// The five pages a newcomer most needs a picture on carry one (a text diagram, which renders
/// alike in mdBook and in the repository's view).
#[test]
fn the_newcomers_pages_have_their_diagrams() {
    let docs = files::root().join("docs/src");
    for page in [
        "tutorials/processes.md",
        "how-to/tls-enrollment.md",
        "how-to/resume.md",
        "how-to/choose-mode.md",
        "tutorials/private-run.md",
    ] {
        let text = std::fs::read_to_string(docs.join(page)).unwrap();
        assert!(text.contains("```text\n"), "{page} has no text diagram");
    }
}
