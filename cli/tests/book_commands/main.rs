//! Every command of README.md and of the book's tutorials and how-to pages runs as the page
//! gives it, and prints what the page shows: a command exits non-zero only where the page shows
//! its `error:` line, and each line the page shows under a command is the line it prints, but for
//! timestamps and the figures the block marks as varying (`varies=` on its fence). Long runs are
//! shortened (an edit, or stopped once the lines the page shows are out); ports are free ones.
//!
//! Each command is matched by exactly one rule of [`rules::RULES`], which says how it runs or
//! where else it is run (a Docker engine, a Kubernetes cluster, a release build): a new command
//! on a page fails here until a rule says what becomes of it.
//!
//! The binaries are this build's (`fl-server`, `fl-client` and `own-trainer` beside `fl`), as
//! `cargo test --workspace` leaves them; alone: `cargo build --workspace && cargo test -p fl-cli
//! --test book_commands`.

mod output;
mod page;
mod rules;
mod shell;

use page::Step;
use rules::{How, RULES, Rule};
use std::path::{Path, PathBuf};

/// The repository.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// README.md, "Privacy in five minutes", the tutorials and the how-to pages.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![
        repo().join("README.md"),
        repo().join("docs/src/privacy-in-five-minutes.md"),
    ];
    for dir in ["docs/src/tutorials", "docs/src/how-to"] {
        let mut more: Vec<PathBuf> = std::fs::read_dir(repo().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        more.sort();
        pages.extend(more);
    }
    pages
}

/// A page's file name.
fn name(page: &Path) -> String {
    page.file_name().unwrap().to_string_lossy().into_owned()
}

/// The rule for `step` of page `name`: the first rule of that page whose text is in it.
fn rule_for(name: &str, step: &Step) -> &'static Rule {
    (RULES.iter())
        .find(|r| r.page == name && step.script.contains(r.command))
        .unwrap_or_else(|| {
            panic!(
                "{name} line {}: no rule says how to run `{}` (cli/tests/book_commands/rules.rs)",
                step.line, step.script
            )
        })
}

/// Runs every command of `page` in a folder of its own; the differences from the page.
fn run_page(page: &Path) -> Vec<String> {
    let name = name(page);
    let text = std::fs::read_to_string(page).unwrap();
    let dir = std::env::temp_dir().join(format!(
        "fl-book-{}-{}",
        std::process::id(),
        name.trim_end_matches(".md")
    ));
    let binaries = Path::new(env!("CARGO_BIN_EXE_fl")).parent().unwrap();
    let mut shell = shell::Shell::new(&repo(), dir.clone(), binaries);
    let mut errors = Vec::new();
    let (started, mut ran) = (std::time::Instant::now(), 0);
    for step in page::steps(&text) {
        match rule_for(&name, &step).how {
            How::Run(run) => {
                ran += 1;
                errors.extend(shell.run(&step, run).err());
            }
            How::Elsewhere(why) => eprintln!("{name} line {}: not run here: {why}", step.line),
        }
    }
    errors.extend(shell.wait_all().err());
    drop(shell);
    let seconds = started.elapsed().as_secs_f64();
    eprintln!("{name}: {ran} commands run in {seconds:.1} s");
    if errors.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    errors.into_iter().map(|e| format!("{name} {e}")).collect()
}

/// Runs every page whose name starts with one of `names`.
fn run_pages(names: &[&str]) {
    let chosen: Vec<PathBuf> = (pages().into_iter())
        .filter(|p| names.iter().any(|n| name(p).starts_with(n)))
        .collect();
    assert!(!chosen.is_empty(), "no page named {names:?}");
    let errors: Vec<String> = chosen.iter().flat_map(|p| run_page(p)).collect();
    assert!(errors.is_empty(), "\n{}", errors.join("\n\n"));
}

#[test]
fn every_command_has_one_rule_and_every_rule_a_command() {
    let mut used = vec![0; RULES.len()];
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for step in page::steps(&text) {
            let rule = rule_for(&name(&page), &step);
            used[RULES.iter().position(|r| std::ptr::eq(r, rule)).unwrap()] += 1;
        }
    }
    for (rule, n) in RULES.iter().zip(used) {
        assert!(
            n > 0,
            "{}: no command `{}` any more",
            rule.page,
            rule.command
        );
    }
}

#[test]
fn the_readme_and_the_first_pages_run_as_written() {
    run_pages(&[
        "README",
        "privacy-in-five-minutes",
        "first-run",
        "own-model",
    ]);
}

#[test]
fn the_private_run_tutorial_runs_as_written() {
    run_pages(&["private-run"]);
}

#[test]
fn the_processes_tutorial_runs_as_written() {
    run_pages(&["processes"]);
}

#[test]
fn the_how_to_pages_run_as_written() {
    run_pages(&[
        "accuracy",
        "aggregators",
        "async",
        "choose",
        "compose",
        "flower",
        "kubernetes",
        "resume",
        "tls",
        "troubleshooting",
        "watch",
    ]);
}
