//! The book's prose figures are what the commands print today: every "`fl privacy ...` gives X"
//! in the prose is run and its answer rounded as X is written, and the model sizes the pages
//! quote are the models'. (The console blocks' commands and outputs are run and compared by
//! `tests/book_commands`.) A change to an accountant that moves a quoted figure fails here until
//! the page is updated.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The book's pages.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src"),
        &mut out,
    );
    out.sort();
    out
}

/// What `fl privacy ARGS` prints (`args` as written after `fl`).
fn fl(args: &str) -> String {
    let run = Command::new(env!("CARGO_BIN_EXE_fl"))
        .args(args.split_whitespace())
        .output()
        .unwrap();
    assert!(run.status.success(), "fl {args}: {run:?}");
    String::from_utf8(run.stdout).unwrap()
}

/// The prose's "`fl privacy ARGS` gives [NAME = ]X" claims: (ARGS, X as written).
fn prose_claims(text: &str) -> Vec<(String, String)> {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut claims = Vec::new();
    for (at, _) in flat.match_indices("`fl privacy ") {
        let rest = &flat[at + 4..];
        let Some(end) = rest.find('`') else { continue };
        let Some(said) = rest[end + 1..].strip_prefix(" gives ") else {
            continue;
        };
        // "gives sigma = 1.027": the figure after the name.
        let said = match said.split_once(" = ") {
            Some((name, value)) if name.chars().all(|c| c.is_ascii_alphabetic() || c == '_') => {
                value
            }
            _ => said,
        };
        let number: String = said
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ',')
            .collect();
        let number = number.trim_end_matches(['.', ',']).replace(',', "");
        // A ledger's figures depend on a run, not on the command alone.
        if !rest[..end].contains(" ledger ") {
            claims.push((rest[..end].to_string(), number));
        }
    }
    claims
}

/// The figure a `fl privacy SUBCOMMAND` answers with, from its output (`key = value, ...`).
fn answer(args: &str, output: &str) -> f64 {
    let key = args.split_whitespace().nth(1).unwrap();
    let value = (output.trim().split(", "))
        .filter_map(|pair| pair.split_once(" = "))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_string())
        .or_else(|| {
            let json: serde_json::Value = serde_json::from_str(output).ok()?;
            Some(json[key].to_string())
        });
    let value = value.unwrap_or_else(|| panic!("no {key} in {output}"));
    value.parse().unwrap_or_else(|_| panic!("{key} = {value}"))
}

#[test]
fn the_books_prose_privacy_figures_are_what_fl_privacy_prints() {
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let name = page.file_name().unwrap().to_string_lossy();
        for (args, said) in prose_claims(&text) {
            let value = answer(&args, &fl(&args));
            let decimals = said.split_once('.').map_or(0, |(_, d)| d.len());
            let rounded = format!("{value:.decimals$}");
            assert_eq!(rounded, said, "{name}: `fl {args}` gives {value}");
            checked += 1;
        }
    }
    // The prose's claims at least: a parser that finds nothing must not pass.
    assert!(checked >= 2, "only {checked} quoted figures found");
}

#[test]
fn claims_are_found_in_prose() {
    let text = "See `fl privacy sigma --q 0.5\n --eps 8` gives sigma = 1,027.5. And `fl privacy \
                rounds --q 1` (117).";
    assert_eq!(
        prose_claims(text),
        vec![("privacy sigma --q 0.5 --eps 8".into(), "1027.5".into())]
    );
    assert_eq!(
        answer("privacy rounds --q 1", "q = 1, rounds = 117\n"),
        117.0
    );
    assert_eq!(answer("privacy sigma --json", "{\"sigma\": 1.5}"), 1.5);
}

/// The numbers that follow each occurrence of `marker` in `text` (commas as thousands
/// separators), e.g. 532110 for "the MLP (d = 532,110)".
fn figures_after(text: &str, marker: &str) -> Vec<u64> {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    (flat.match_indices(marker))
        .filter_map(|(at, _)| {
            let rest = flat[at + marker.len()..].trim_start_matches("d = ");
            let digits: String = (rest.chars())
                .take_while(|c| c.is_ascii_digit() || *c == ',')
                .filter(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .collect()
}

#[test]
fn the_books_model_sizes_are_the_models() {
    use fl_model::ModelSpec;
    let mlp = ModelSpec::mlp(784, &[600, 100], 10).unwrap().num_params() as u64;
    let logistic = ModelSpec::logistic(784, 10).unwrap().num_params() as u64;
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let name = page.file_name().unwrap().to_string_lossy();
        for (marker, size) in [("the MLP (", mlp), ("logistic regression (d = ", logistic)] {
            for figure in figures_after(&text, marker) {
                assert_eq!(figure, size, "{name}: {marker}{figure}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 3, "only {checked} model sizes found");
}
