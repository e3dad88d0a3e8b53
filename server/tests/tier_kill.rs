//! The aggregator tier with `fl-server` and `fl-client` as processes: an aggregator is killed
//! (SIGKILL) mid-round and started again under its name. The round completes with the other
//! group, its ledger entry standing; the aggregator's clients come back to it by themselves, and
//! training finishes with every round charged once. The same under central DP and with secure
//! aggregation (distributed noise) in the groups. And a coordinator stopped to be resumed: its
//! aggregators keep their clients, reconnect once it is back, and the run finishes.

use crate::{procs, support};

use fl_server::checkpoint::Checkpoint;
use fl_server::output::{GroupOutcome, RoundMetrics};
use procs::{Reaper, signal, start_client, start_server, wait};
use std::path::Path;
use std::time::{Duration, Instant};

const ROUNDS: u64 = 14;
const TOKEN: &str = "aggregator-secret";

/// Central DP on the coordinator.
const CENTRAL: &str = "[privacy]\nmode = \"central\"\nsampling = \"fixed\"\n\
    noise_multiplier = 1.0\nclip = \"fixed\"\nclip_bound = 1.0\nepsilon = 1000.0\ndelta = 1e-5\n";

/// Secure aggregation in each group, each client adding its share of the noise.
const SECURE: &str = "[privacy]\nmode = \"secagg\"\nsampling = \"fixed\"\n\
    noise_multiplier = 1.0\nclip_bound = 1.0\nepsilon = 1000.0\ndelta = 1e-5\n\
    [secagg]\nnoise = \"distributed\"\nstage_timeout_secs = 20\n";

/// A fixed sample of all K = 6 clients a round, behind 2 aggregators, under `privacy`.
fn write_config(base: &Path, privacy: &str) -> String {
    std::fs::create_dir_all(base).unwrap();
    let config = base.join("run.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nclients = 6\nclients_per_round = 6\nrounds = {ROUNDS}\naggregators = 2\n\
             round_timeout_secs = 30\njoin_timeout_secs = 60\n\
             [model]\nkind = \"logistic\"\n[train]\nepochs = 1\nbatch_size = 50\n\
             learning_rate = 0.05\n[data]\nsource = \"{}\"\n{privacy}",
            procs::mnist()
        ),
    )
    .unwrap();
    config.display().to_string()
}

/// Starts the aggregator `name` for the coordinator at `upstream`, listening on `listen`;
/// returns it with its address.
fn start_aggregator(name: &str, upstream: &str, listen: &str) -> (Reaper, String) {
    let upstream = format!("http://{upstream}");
    let args = [
        "--role",
        "aggregator",
        "--upstream",
        &upstream,
        "--name",
        name,
        "--listen",
        listen,
        "--aggregator-token",
        TOKEN,
    ];
    start_server(name, &args)
}

/// Three simulated clients from partition index `first` at the aggregator `addr`; each waits
/// 1 s after training, so that a round lasts at least that long.
fn start_clients(name: &str, addr: &str, first: usize) -> Reaper {
    let partition = format!("iid:6:{first}");
    let flags = [
        "--partition",
        &partition,
        "--simulate",
        "3",
        "--speeds",
        "lognormal:1.0:0",
        "--connect-timeout",
        "60",
    ];
    start_client(name, addr, &flags)
}

/// The metrics lines written so far.
fn lines(run: &Path) -> Vec<RoundMetrics> {
    match std::fs::read_to_string(run.join("metrics.jsonl")) {
        Ok(_) => support::read_metrics(run),
        Err(_) => Vec::new(),
    }
}

/// Waits (up to 60 s) for round 1's metrics line.
fn until_round_one(run: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while lines(run).is_empty() {
        assert!(Instant::now() < deadline, "round 1 not written in time");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The run's ledger verifies against its checkpoint and holds every round once.
fn assert_every_round_once(run: &Path) {
    let checkpoint = Checkpoint::read(run).unwrap();
    let ledger = run.join("ledger.jsonl");
    let (entries, _) = fl_server::ledger::verify(&ledger, checkpoint.progress.ledger.as_ref())
        .expect("the ledger verifies");
    let rounds: Vec<u64> = entries.iter().map(|e| e.round).collect();
    assert_eq!(rounds, (1..=ROUNDS).collect::<Vec<_>>());
}

#[test]
fn an_aggregator_killed_mid_round_costs_its_group_and_its_clients_come_back() {
    kill_mid_round("central", CENTRAL);
}

#[test]
fn a_secure_group_killed_mid_round_costs_its_group_and_its_clients_come_back() {
    kill_mid_round("secure", SECURE);
}

/// Round 1's metrics line is written once round 2's parts are out, and each client waits 1 s
/// before it answers: killing the aggregator as soon as the line appears lands in round 2.
fn kill_mid_round(name: &str, privacy: &str) {
    let base = std::env::temp_dir().join(format!("fl-tier-kill-{name}-{}", std::process::id()));
    let config = write_config(&base.join("config"), privacy);
    let run = base.join("run");
    let out = run.display().to_string();
    let args = [
        "--config",
        &config,
        "--listen",
        "127.0.0.1:0",
        "--out",
        &out,
        "--aggregator-token",
        TOKEN,
    ];
    let (mut coordinator, upstream) = start_server("coordinator", &args);
    let a_listen = procs::reusable_address();
    let (mut agg_a, _) = start_aggregator("agg-a", &upstream, &a_listen);
    let (mut agg_b, b_addr) = start_aggregator("agg-b", &upstream, "127.0.0.1:0");
    let mut clients = [
        start_clients("clients-a", &a_listen, 0),
        start_clients("clients-b", &b_addr, 3),
    ];

    until_round_one(&run);
    agg_a.0.kill().unwrap();
    agg_a.0.wait().unwrap();
    let (mut agg_a, _) = start_aggregator("agg-a", &upstream, &a_listen);

    assert!(wait(&mut coordinator, Duration::from_secs(120)).success());
    for process in clients.iter_mut().chain([&mut agg_a, &mut agg_b]) {
        assert!(wait(process, Duration::from_secs(60)).success());
    }
    let metrics = lines(&run);
    assert_eq!(metrics.len() as u64, ROUNDS);
    // Round 2 lost agg-a's group and completed with agg-b's.
    let killed = &metrics[1];
    let outcome = |m: &RoundMetrics, name: &str| {
        let group = m.groups.iter().find(|g| g.aggregator == name);
        group.map(|g| g.outcome)
    };
    assert_eq!(
        outcome(killed, "agg-a"),
        Some(GroupOutcome::Lost),
        "{killed:?}"
    );
    assert_eq!(outcome(killed, "agg-b"), Some(GroupOutcome::Summed));
    assert_eq!((killed.sampled, killed.completed), (6, 3), "{killed:?}");
    assert!(killed.applied, "{killed:?}");
    // A secure run's rounds were secure: the survivors of the group that answered.
    let survivors = killed.secagg.as_ref().map(|s| s.survivors);
    assert_eq!(survivors, (privacy == SECURE).then_some(3), "{killed:?}");
    // agg-a's clients came back to it, and later rounds had all six again.
    let back = metrics[2..].iter().position(|m| m.completed == 6);
    let back = back.expect("agg-a's clients never came back") + 3;
    let last = metrics.last().unwrap();
    assert_eq!(
        outcome(last, "agg-a"),
        Some(GroupOutcome::Summed),
        "{last:?}"
    );
    assert_eq!(last.completed, 6, "back from round {back}: {last:?}");
    // Every round charged once, the lost one included, and the chain verifies.
    assert_every_round_once(&run);
    std::fs::remove_dir_all(&base).unwrap();
}

/// The coordinator is stopped (SIGTERM) after round 1 and resumed on the same address: each
/// aggregator keeps its clients, reaches the coordinator again by itself, and the run finishes
/// with every round in the ledger once.
#[test]
fn a_coordinator_stopped_and_resumed_gets_its_aggregators_back() {
    let base = std::env::temp_dir().join(format!("fl-tier-resume-{}", std::process::id()));
    let config = write_config(&base.join("config"), CENTRAL);
    let run = base.join("run");
    let (out, listen) = (run.display().to_string(), procs::reusable_address());
    let token = ["--aggregator-token", TOKEN, "--listen", &listen];
    let fresh = [["--config", &config, "--out", &out].as_slice(), &token].concat();
    let (mut coordinator, upstream) = start_server("coordinator", &fresh);
    let (mut agg_a, a_addr) = start_aggregator("agg-a", &upstream, "127.0.0.1:0");
    let (mut agg_b, b_addr) = start_aggregator("agg-b", &upstream, "127.0.0.1:0");
    let mut clients = [
        start_clients("clients-a", &a_addr, 0),
        start_clients("clients-b", &b_addr, 3),
    ];

    until_round_one(&run);
    signal(&coordinator, libc::SIGTERM);
    assert_eq!(
        wait(&mut coordinator, Duration::from_secs(60)).code(),
        Some(143)
    );
    let stopped_after = lines(&run).len();
    assert!((stopped_after as u64) < ROUNDS, "{stopped_after} rounds");
    for process in clients.iter_mut().chain([&mut agg_a, &mut agg_b]) {
        assert!(process.0.try_wait().unwrap().is_none(), "a process exited");
    }
    let resume = [["--resume", out.as_str()].as_slice(), &token].concat();
    let (mut coordinator, _) = start_server("coordinator-resumed", &resume);

    assert!(wait(&mut coordinator, Duration::from_secs(120)).success());
    for process in clients.iter_mut().chain([&mut agg_a, &mut agg_b]) {
        assert!(wait(process, Duration::from_secs(60)).success());
    }
    let metrics = lines(&run);
    assert_eq!(metrics.len() as u64, ROUNDS);
    // Both aggregators summed their groups again after the restart.
    let last = metrics.last().unwrap();
    assert_eq!((last.groups.len(), last.completed), (2, 6), "{last:?}");
    assert_every_round_once(&run);
    std::fs::remove_dir_all(&base).unwrap();
}
