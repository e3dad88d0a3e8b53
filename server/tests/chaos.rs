//! Chaos: real processes killed with SIGKILL. The server is killed at a random point of a private
//! run in each of 10 trials and resumed with `--resume`; every trial finishes, its ledger holds
//! each round exactly once, and its epsilon equals the epsilon of the same rounds run without
//! interruption. Separately, a client killed during training does not stop the run, and an
//! enrolled client killed and restarted mid-round comes back as itself and finishes the round.

use crate::procs;

use fl_privacy::{Accountant, RdpAccountant};
use fl_server::checkpoint::Checkpoint;
use fl_server::ledger::LedgerEntry;
use procs::{Reaper, start_client, start_server, wait};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::time::{Duration, Instant};

const ROUNDS: u64 = 6;
const DELTA: f64 = 1e-5;

/// A private run of 3 clients on MNIST with logistic regression; `server` adds keys to its
/// `[server]` section.
fn write_config(dir: &Path, server: &str) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let config = dir.join("run.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\n{server}clients = 3\nclients_per_round = 3\nrounds = {ROUNDS}\n\
             round_timeout_secs = 30\njoin_timeout_secs = 60\n\
             [model]\nkind = \"logistic\"\n[train]\nepochs = 1\nbatch_size = 50\n\
             learning_rate = 0.05\n[data]\nsource = \"{}\"\n\
             [privacy]\nmode = \"central\"\nsampling = \"fixed\"\nnoise_multiplier = 4.0\n\
             clip_bound = 1.0\nepsilon = 50.0\ndelta = {DELTA}\n",
            procs::mnist()
        ),
    )
    .unwrap();
    config.display().to_string()
}

/// Starts `fl-server` on a free loopback port with `config`, writing to `out`.
fn start_run(name: &str, config: &str, out: &str) -> (Reaper, String) {
    // The resumed server listens on the same address: one no one else can take in between.
    let listen = procs::reusable_address();
    let args = ["--config", config, "--listen", &listen, "--out", out];
    start_server(name, &args)
}

/// Waits (at most 60 s) until `path` exists.
fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} not written in time",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits (at most 60 s) until the run folder `run` has recorded `rounds` rounds.
fn wait_for_rounds(run: &Path, rounds: usize) {
    let metrics = run.join("metrics.jsonl");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&metrics)
        .unwrap_or_default()
        .lines()
        .count()
        < rounds
    {
        assert!(
            Instant::now() < deadline,
            "{rounds} rounds not recorded in time"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn ledger(run: &Path) -> Vec<LedgerEntry> {
    std::fs::read_to_string(run.join("ledger.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The rounds' epsilon had nothing interrupted them: every round is the same mechanism.
fn uninterrupted_epsilon(entry: &LedgerEntry) -> f64 {
    let mut accountant = RdpAccountant::default();
    accountant.compose(&entry.event, ROUNDS);
    accountant.epsilon(DELTA)
}

#[test]
fn a_server_killed_at_random_points_resumes_without_losing_privacy_spent() {
    let mut rng = StdRng::seed_from_u64(2026);
    let mut interrupted = 0;
    let base = std::env::temp_dir().join(format!("fl-chaos-server-{}", std::process::id()));
    for trial in 0..10 {
        let run = base.join(format!("trial-{trial}"));
        let config = write_config(&base.join(format!("config-{trial}")), "");
        let out = run.display().to_string();
        let (mut server, addr) = start_run(&format!("server-{trial}"), &config, &out);
        let mut clients = start_client(
            &format!("clients-{trial}"),
            &addr,
            &[
                "--partition",
                "iid:3:0",
                "--simulate",
                "3",
                "--connect-timeout",
                "60",
            ],
        );
        // Kill once a random number of rounds (0 to all but one) is recorded, plus up to 0.15 s:
        // before the first round, between rounds, in the middle of one, or after the last.
        let recorded = rng.random_range(0..ROUNDS) as usize;
        let extra = Duration::from_millis(rng.random_range(0..150));
        // A server killed before its first checkpoint (round 0, written once it starts serving)
        // has nothing to resume: the earliest kill is just after it.
        wait_for_file(&run.join("checkpoint.safetensors"));
        wait_for_rounds(&run, recorded);
        std::thread::sleep(extra);
        if server.0.try_wait().unwrap().is_none() {
            interrupted += 1;
            server.0.kill().unwrap();
            server.0.wait().unwrap();
            drop(server);
            // The clients keep joining again; the server comes back on the same address.
            let name = format!("server-{trial}-resumed");
            server = start_server(&name, &["--resume", &out, "--listen", &addr]).0;
        }
        assert!(
            wait(&mut server, Duration::from_secs(120)).success(),
            "trial {trial}: the server did not finish"
        );
        assert!(
            wait(&mut clients, Duration::from_secs(60)).success(),
            "trial {trial}: the clients did not finish"
        );
        let entries = ledger(&run);
        let rounds: Vec<u64> = entries.iter().map(|e| e.round).collect();
        assert_eq!(
            rounds,
            (1..=ROUNDS).collect::<Vec<_>>(),
            "trial {trial} (killed after {recorded} rounds + {extra:?}): each round spent once"
        );
        assert!(entries.iter().all(|e| e.event == entries[0].event));
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap())
                .unwrap();
        let epsilon = summary["epsilon"].as_f64().unwrap();
        let expected = uninterrupted_epsilon(&entries[0]);
        assert!(
            (epsilon - expected).abs() <= 1e-9 * expected,
            "trial {trial}: epsilon {epsilon} against {expected} uninterrupted"
        );
        assert_eq!(summary["stopped_by"], "rounds");
        let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
        let logged: Vec<u64> = metrics
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["round"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert!(
            logged.windows(2).all(|w| w[0] < w[1]) && logged.last() == Some(&ROUNDS),
            "trial {trial}: metrics rounds {logged:?}"
        );
    }
    assert!(
        interrupted >= 8,
        "only {interrupted} of 10 trials were interrupted"
    );
    std::fs::remove_dir_all(&base).unwrap();
}

/// The lines of `metrics.jsonl` in `run`.
fn metrics_lines(run: &Path) -> Vec<String> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A crash between a round's end and its checkpoint releases nothing of the round: the
/// server's checkpoint write is made to fail at round 1 (a directory where its temporary file
/// goes), which kills the server inside that window. Round 1 has then been spent in the ledger
/// (before anything left) but no metrics line of it exists, since a line written there would be
/// a noisy result that the resumed run draws again under the same ledger entry. Resumed, the
/// run finishes with each round spent and recorded once.
#[test]
fn a_server_that_dies_before_a_round_is_checkpointed_has_released_nothing_of_it() {
    let base = std::env::temp_dir().join(format!("fl-chaos-window-{}", std::process::id()));
    let config = write_config(&base.join("config"), "");
    let run = base.join("run");
    let out = run.display().to_string();
    let (mut server, addr) = start_run("server", &config, &out);
    // Round 0's checkpoint is written before any client can join; block the next one.
    let deadline = Instant::now() + Duration::from_secs(60);
    while Checkpoint::read(&run).is_err() {
        assert!(Instant::now() < deadline, "no initial checkpoint");
        std::thread::sleep(Duration::from_millis(10));
    }
    let obstacle = run.join("checkpoint.tmp");
    std::fs::create_dir(&obstacle).unwrap();
    let simulate = [
        "--partition",
        "iid:3:0",
        "--simulate",
        "3",
        "--connect-timeout",
        "60",
    ];
    let mut clients = start_client("clients", &addr, &simulate);
    assert!(
        !wait(&mut server, Duration::from_secs(120)).success(),
        "the server must fail when its checkpoint cannot be written"
    );
    assert_eq!(
        ledger(&run).len(),
        1,
        "round 1 is spent before anything leaves"
    );
    assert_eq!(
        metrics_lines(&run),
        Vec::<String>::new(),
        "a result of round 1 was recorded before its checkpoint"
    );
    std::fs::remove_dir(&obstacle).unwrap();
    let mut server = start_server("server-resumed", &["--resume", &out, "--listen", &addr]).0;
    assert!(wait(&mut server, Duration::from_secs(120)).success());
    assert!(wait(&mut clients, Duration::from_secs(60)).success());
    let rounds: Vec<u64> = ledger(&run).iter().map(|e| e.round).collect();
    assert_eq!(rounds, (1..=ROUNDS).collect::<Vec<_>>());
    assert_eq!(metrics_lines(&run).len() as u64, ROUNDS);
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn a_client_killed_during_training_does_not_stop_the_run() {
    let base = std::env::temp_dir().join(format!("fl-chaos-client-{}", std::process::id()));
    let config = write_config(&base.join("config"), "");
    let run = base.join("run");
    let out = run.display().to_string();
    let (mut server, addr) = start_run("server", &config, &out);
    let mut clients: Vec<Reaper> = (0..3)
        .map(|i| {
            let partition = format!("iid:3:{i}");
            start_client(&format!("client-{i}"), &addr, &["--partition", &partition])
        })
        .collect();
    // Once the first round has been recorded, kill one client.
    wait_for_rounds(&run, 1);
    let victim = clients.remove(1);
    drop(victim);
    assert!(wait(&mut server, Duration::from_secs(120)).success());
    for c in &mut clients {
        assert!(wait(c, Duration::from_secs(30)).success());
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["rounds_completed"], ROUNDS);
    assert_eq!(summary["stopped_by"], "rounds");
    assert_eq!(ledger(&run).len() as u64, ROUNDS);
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn an_enrolled_client_killed_and_restarted_mid_round_keeps_its_identity_and_its_round() {
    let base = std::env::temp_dir().join(format!("fl-chaos-identity-{}", std::process::id()));
    std::fs::create_dir_all(&base).unwrap();
    let enrollment = base.join("clients.toml");
    procs::enroll_numbered(&enrollment, 3);
    let server_keys = format!(
        "enrollment = \"{}\"\nreconnect_grace_secs = 30\n",
        enrollment.display()
    );
    let config = write_config(&base.join("config"), &server_keys);
    let run = base.join("run");
    let out = run.display().to_string();
    let (mut server, addr) = start_run("server", &config, &out);
    let client = |i: usize, name: &str| {
        let (partition, token) = (format!("iid:3:{i}"), format!("token-{i}"));
        start_client(name, &addr, &["--partition", &partition, "--token", &token])
    };
    let mut clients: Vec<Reaper> = (0..3).map(|i| client(i, &format!("client-{i}"))).collect();
    // Once round 1's checkpoint is written, round 2 has sampled every client and sent the
    // model; within the next 10 ms, while they train, kill client 1 and start it again.
    let deadline = Instant::now() + Duration::from_secs(60);
    while Checkpoint::read(&run).map_or(0, |c| c.progress.round) < 1 {
        assert!(
            Instant::now() < deadline,
            "round 1 not checkpointed in time"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let metrics = run.join("metrics.jsonl");
    drop(clients.remove(1));
    clients.push(client(1, "client-1-restarted"));
    assert!(wait(&mut server, Duration::from_secs(120)).success());
    for c in &mut clients {
        assert!(wait(c, Duration::from_secs(30)).success());
    }
    // No round lost a client: the restarted one took its round up again.
    for line in std::fs::read_to_string(&metrics).unwrap().lines() {
        let m: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(
            (m["completed"].as_u64(), m["dropped"].as_u64()),
            (Some(3), Some(0)),
            "{line}"
        );
    }
    // And it kept its identity: three ids were ever handed out.
    let checkpoint = Checkpoint::read(&run).unwrap();
    let clients = &checkpoint.progress.clients;
    assert_eq!(clients.names.len(), 3);
    assert_eq!(clients.next_id, 3);
    std::fs::remove_dir_all(&base).unwrap();
}
