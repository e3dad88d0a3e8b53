//! The aggregator tier with `fl-server` and `fl-client` as processes: an aggregator is killed
//! (SIGKILL) mid-round and started again under its name. The round completes with the other
//! group, its ledger entry standing; the aggregator's clients come back to it by themselves, and
//! training finishes with every round charged once.

use crate::{procs, support};

use fl_server::checkpoint::Checkpoint;
use fl_server::output::{GroupOutcome, RoundMetrics};
use procs::{Reaper, start_client, start_server, wait};
use std::path::Path;
use std::time::{Duration, Instant};

const ROUNDS: u64 = 14;
const TOKEN: &str = "aggregator-secret";

/// Central DP with a fixed sample of all K = 6 clients a round, behind 2 aggregators.
fn write_config(base: &Path) -> String {
    std::fs::create_dir_all(base).unwrap();
    let config = base.join("run.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nclients = 6\nclients_per_round = 6\nrounds = {ROUNDS}\naggregators = 2\n\
             round_timeout_secs = 30\njoin_timeout_secs = 60\n\
             [model]\nkind = \"logistic\"\n[train]\nepochs = 1\nbatch_size = 50\n\
             learning_rate = 0.05\n[data]\nsource = \"{}\"\n\
             [privacy]\nmode = \"central\"\nsampling = \"fixed\"\nnoise_multiplier = 1.0\n\
             clip = \"fixed\"\nclip_bound = 1.0\nepsilon = 1000.0\ndelta = 1e-5\n",
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

/// Round 1's metrics line is written once round 2's parts are out, and each client waits 1 s
/// before it answers: killing the aggregator as soon as the line appears lands in round 2.
#[test]
fn an_aggregator_killed_mid_round_costs_its_group_and_its_clients_come_back() {
    let base = std::env::temp_dir().join(format!("fl-tier-kill-{}", std::process::id()));
    let config = write_config(&base.join("config"));
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

    let deadline = Instant::now() + Duration::from_secs(60);
    while lines(&run).is_empty() {
        assert!(Instant::now() < deadline, "round 1 not written in time");
        std::thread::sleep(Duration::from_millis(5));
    }
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
    let checkpoint = Checkpoint::read(&run).unwrap();
    let ledger = run.join("ledger.jsonl");
    let (entries, _) = fl_server::ledger::verify(&ledger, checkpoint.progress.ledger.as_ref())
        .expect("the ledger verifies");
    let rounds: Vec<u64> = entries.iter().map(|e| e.round).collect();
    assert_eq!(rounds, (1..=ROUNDS).collect::<Vec<_>>());
    std::fs::remove_dir_all(&base).unwrap();
}
