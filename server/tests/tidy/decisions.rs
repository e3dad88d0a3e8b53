//! Default deny where a privacy or robustness decision is made: no wildcard arm (`_ =>`) in the
//! files that choose a mechanism, admit a task, decide what a client sends, account a release,
//! or accept what a peer sent. Every variant is named there, so that a new mode, mechanism,
//! message or event fails to compile until someone decides what it means.

use super::{is, sources_of};

/// The folders (every file below) and files where those decisions are made.
const DECISIONS: &[&str] = &[
    // The client: admission of a task, what it computes and sends, its secure round.
    "client/src/admission",
    "client/src/round.rs",
    "client/src/engine.rs",
    "client/src/secure.rs",
    "client/src/verified.rs",
    "client/src/state.rs",
    // The mechanisms and what a release costs.
    "privacy/src/mechanism",
    "privacy/src/local_ledger.rs",
    "privacy/src/local.rs",
    "privacy/src/stream",
    "privacy/src/event.rs",
    "privacy/src/ledger_event.rs",
    // The federation's policy.
    "authority/src/policy.rs",
    // Secure aggregation's checks, on both sides.
    "secagg/src/client.rs",
    "secagg/src/binding.rs",
    "secagg/src/server",
    "secagg/src/verified",
    // The server: the plan a configuration makes, the round's participation rules, and what it
    // accepts from clients and aggregators.
    "server/src/config/plan",
    "server/src/config/privacy.rs",
    "server/src/config/local.rs",
    "server/src/config/robust.rs",
    "server/src/config/verified.rs",
    "server/src/config/moved_keys.rs",
    "server/src/round/policy",
    "server/src/round/rejection.rs",
    "server/src/run/collection",
    "server/src/run/build.rs",
];

/// `file:line` of each wildcard arm in `code`, and of each `matches!`, whose other variants are
/// a wildcard's `false`.
fn wildcard_arms(name: &str, code: &str) -> Vec<String> {
    (code.lines().enumerate())
        .filter(|(_, line)| {
            let line = line.trim_start();
            line.starts_with("_ =>")
                || line.starts_with("_ if ")
                || line.contains("| _ =>")
                || line.contains("matches!(")
        })
        .map(|(n, _)| format!("{name}:{}", n + 1))
        .collect()
}

#[test]
fn no_wildcard_arm_where_a_privacy_or_robustness_decision_is_made() {
    let crates: Vec<&str> = vec![
        "client/src",
        "privacy/src",
        "authority/src",
        "secagg/src",
        "server/src",
    ];
    let mut checked = 0;
    let mut found = Vec::new();
    for (path, code) in sources_of(&crates) {
        let name = path.to_string_lossy().replace('\\', "/");
        let decides = DECISIONS
            .iter()
            .any(|d| is(&path, d) || name.contains(&format!("/{d}/")));
        if decides {
            checked += 1;
            found.extend(wildcard_arms(&name, &code));
        }
    }
    // Every listed folder or file exists: a rename must not empty the list unnoticed.
    assert!(checked >= DECISIONS.len(), "only {checked} files checked");
    assert!(
        found.is_empty(),
        "wildcard arms where a decision is made: {found:?}"
    );
}

#[test]
fn a_wildcard_arm_is_found() {
    let code = "match kind {\n    Kind::A => 1,\n    _ => 2,\n}\nmatch x { Some(_) => 1, None => 0 }\n\
                let a = matches!(kind, Kind::A);";
    assert_eq!(wildcard_arms("f.rs", code), ["f.rs:3", "f.rs:6"]);
}
