//! `fl sim` runs the real server and clients over loopback and writes a complete run folder whose
//! summary has every key DESIGN.md promises to scripts.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `fl sim` on a config made of `body` with the shipped MNIST as data split by
/// `partition`; returns the run folder (inside `dir`) and its parsed `summary.json`.
fn sim(dir: &Path, partition: &str, body: &str) -> (PathBuf, serde_json::Value) {
    std::fs::create_dir_all(dir).unwrap();
    let mnist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    let config = dir.join("run.toml");
    let data = format!(
        "[data]\nsource = \"mnist:{}\"\npartition = \"{partition}\"\n",
        mnist.display()
    );
    std::fs::write(&config, format!("{body}\n{data}")).unwrap();
    let out = dir.join("run");
    let status = Command::new(env!("CARGO_BIN_EXE_fl"))
        .arg("sim")
        .arg("--config")
        .arg(&config)
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let summary =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    (out, summary)
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("fl-sim-{name}-{}", std::process::id()))
}

#[test]
fn sim_writes_a_complete_run_folder() {
    let dir = temp("plain");
    let (out, summary) = sim(
        &dir,
        "dirichlet:1.0",
        "[server]\nclients = 5\nclients_per_round = 3\n\
         rounds = 3\nseed = 1\n[model]\nkind = \"logistic\"\n[train]\nepochs = 1\nbatch_size = 50",
    );
    for file in [
        "metrics.jsonl",
        "summary.json",
        "model.safetensors",
        "accuracy.svg",
    ] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    for key in [
        "rounds_completed",
        "test_accuracy",
        "test_loss",
        "epsilon",
        "delta",
        "accountant",
        "sampling",
        "clip_mode",
        "clip_bound_leaks",
        "stopped_by",
        "client_updates",
        "bytes_up",
        "bytes_down",
        "wall_seconds",
        "config",
    ] {
        assert!(summary.get(key).is_some(), "summary.json lacks `{key}`");
    }
    assert_eq!(summary["rounds_completed"], 3);
    assert_eq!(summary["client_updates"], 9);
    assert_eq!(summary["config"]["server"]["clients"], 5);
    assert_eq!(summary["config"]["data"]["partition"], "dirichlet:1");
    assert!(
        summary["test_accuracy"].as_f64().unwrap() > 0.6,
        "{summary}"
    );
    let svg = std::fs::read_to_string(out.join("accuracy.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("<polyline"),
        "no curve in the plot"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn private_sim_reports_its_privacy_and_plots_it() {
    let dir = temp("private");
    let (out, summary) = sim(
        &dir,
        "iid",
        "[server]\nclients = 5\nclients_per_round = 3\nrounds = 3\n\
         [model]\nkind = \"logistic\"\n[train]\nepochs = 1\nbatch_size = 50\n\
         [privacy]\nmode = \"central\"\nnoise_multiplier = 2.0\nepsilon = 50.0",
    );
    assert!(out.join("privacy.svg").is_file());
    assert!(out.join("ledger.jsonl").is_file());
    assert_eq!(summary["accountant"], "rdp");
    assert_eq!(summary["sampling"], "poisson");
    assert_eq!(summary["clip_mode"], "fixed");
    assert!(summary["epsilon"].as_f64().unwrap() > 0.0);
    assert_eq!(summary["delta"], 1e-5);
    std::fs::remove_dir_all(&dir).unwrap();
}
