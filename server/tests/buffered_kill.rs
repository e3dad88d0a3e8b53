//! Asynchronous DP-FTRL with `fl-server` and `fl-client` as processes: the server is killed
//! (SIGKILL) while a buffer fills and resumed with `--resume`; the buffer is lost uncharged and
//! the ledger holds each server step once.

use crate::procs;

use fl_server::checkpoint::Checkpoint;
use procs::{Reaper, start_client, start_server, wait};
use std::path::Path;
use std::time::{Duration, Instant};

const STEPS: u64 = 5;

/// Three enrolled clients (`token-0` .. `token-2`), C = K = 2, trees of one step, STEPS steps.
fn write_config(base: &Path) -> String {
    std::fs::create_dir_all(base).unwrap();
    let enrollment = base.join("clients.toml");
    procs::enroll_numbered(&enrollment, 3);
    let config = base.join("run.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nenrollment = \"{}\"\nclients = 3\nrounds = {STEPS}\n\
             aggregation = \"async\"\nround_timeout_secs = 30\njoin_timeout_secs = 60\n\
             [buffer]\nconcurrency = 2\nsize = 2\nmax_staleness = 4\n\
             [model]\nkind = \"logistic\"\n[train]\nepochs = 1\nbatch_size = 50\n\
             learning_rate = 0.05\n[data]\nsource = \"{}\"\n\
             [privacy]\nmode = \"dp-ftrl\"\nnoise_multiplier = 4.0\nclip_bound = 1.0\n\
             epsilon = 50.0\ndelta = 1e-5\n",
            enrollment.display(),
            procs::mnist()
        ),
    )
    .unwrap();
    config.display().to_string()
}

/// The step of the run's checkpoint, if one is written.
fn checkpointed(run: &Path) -> Option<u64> {
    Checkpoint::read(run).ok().map(|c| c.progress.round)
}

/// Each client waits 0.4 s after training before it uploads, and C = K: after a step nobody is
/// training, so the next step is at least 0.4 s away. Killed within that window once step 2 is
/// checkpointed, the server has buffered at most one update of step 3 and charged nothing for
/// it; resumed, it runs steps 3 to 5, each charged once.
#[test]
fn a_server_killed_mid_buffer_resumes_with_each_step_charged_once() {
    let base = std::env::temp_dir().join(format!("fl-buffered-kill-{}", std::process::id()));
    let config = write_config(&base.join("config"));
    let run = base.join("run");
    let out = run.display().to_string();
    let listen = procs::reusable_address();
    let args = ["--config", &config, "--listen", &listen, "--out", &out];
    let (mut server, addr) = start_server("server", &args);
    let mut clients: Vec<Reaper> = (0..3)
        .map(|i| {
            let (partition, token) = (format!("iid:3:{i}"), format!("token-{i}"));
            let flags = [
                "--partition",
                &partition,
                "--token",
                &token,
                "--speeds",
                "lognormal:0.4:0",
                "--connect-timeout",
                "60",
            ];
            start_client(&format!("client-{i}"), &addr, &flags)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while checkpointed(&run).is_none_or(|step| step < 2) {
        assert!(Instant::now() < deadline, "step 2 not checkpointed in time");
        std::thread::sleep(Duration::from_millis(5));
    }
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    drop(server);
    let killed_at = checkpointed(&run).unwrap();
    assert!(killed_at < STEPS, "killed after the last step");
    let read = || fl_server::ledger::read(&run.join("ledger.jsonl")).unwrap();
    assert_eq!(
        read().len() as u64,
        killed_at,
        "the lost buffer was charged"
    );

    let mut server = start_server("server-resumed", &["--resume", &out, "--listen", &addr]).0;
    assert!(wait(&mut server, Duration::from_secs(120)).success());
    for c in &mut clients {
        assert!(wait(c, Duration::from_secs(60)).success());
    }
    let last = Checkpoint::read(&run).unwrap();
    let ledger = run.join("ledger.jsonl");
    let (entries, _) = fl_server::ledger::verify(&ledger, last.progress.ledger.as_ref()).unwrap();
    let steps: Vec<u64> = entries.iter().map(|e| e.round).collect();
    assert_eq!(
        steps,
        (1..=STEPS).collect::<Vec<_>>(),
        "each step charged once"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["rounds_completed"], STEPS);
    std::fs::remove_dir_all(&base).unwrap();
}
