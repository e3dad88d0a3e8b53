//! Client-level DP end to end: the run stops exactly at the first round that would cross its
//! budget, never exceeds it, and its ledger alone reproduces the reported epsilon.

use crate::support;

use fl_privacy::{
    AccountantKind, Budget, GaussianRound, PrivacyEvent, Sampling, after_rounds, max_rounds,
};
use fl_server::config::{ModelKind, PrivacyMode, RunConfig};
use fl_server::ledger::replay;
use fl_server::output::RoundMetrics;
use std::sync::Arc;
use std::time::Duration;
use support::blobs;

const K: usize = 6;

fn private_config(out: &std::path::Path, sampling: Sampling, rounds: u64) -> RunConfig {
    let mut c = RunConfig::default();
    c.server.clients = K;
    c.server.clients_per_round = 3.0.into();
    c.server.rounds = rounds;
    c.server.round_timeout_secs = 20.0;
    c.server.join_timeout_secs = 20.0;
    c.server.seed = Some(5);
    c.server.out = out.to_owned();
    c.model.kind = ModelKind::Logistic;
    c.privacy.mode = PrivacyMode::Central;
    c.privacy.sampling = sampling;
    c.privacy.noise_multiplier = 1.5.into();
    c.privacy.clip_bound = 0.5;
    c.privacy.epsilon = 6.0;
    c.privacy.delta = 1e-5;
    c
}

/// Runs a federation of K honest clients; returns the summary and the metrics lines.
async fn run(config: RunConfig) -> (fl_server::output::Summary, Vec<RoundMetrics>) {
    run_enrolled(config, None).await
}

/// [`run`], the clients presenting `tokens` (enrolled by [`support::enroll_clients`]) if given.
async fn run_enrolled(
    config: RunConfig,
    tokens: Option<&[String]>,
) -> (fl_server::output::Summary, Vec<RoundMetrics>) {
    let out = config.server.out.clone();
    let data = Arc::new(blobs(600));
    let support::TestServer {
        endpoint,
        handle: server,
        stop: _stop_tx,
        ..
    } = support::start_server(config, data.clone(), None, None).await;
    match tokens {
        Some(tokens) => support::spawn_enrolled_clients(&endpoint, &data, tokens),
        None => support::spawn_clients(&endpoint, &data, K, None),
    };
    let summary = tokio::time::timeout(Duration::from_secs(120), server)
        .await
        .expect("server finishes")
        .unwrap()
        .unwrap();
    let metrics = support::read_metrics(&out);
    (summary, metrics)
}

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("fl-privacy-{name}-{}", std::process::id()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn training_stops_at_the_first_round_that_would_cross_the_budget() {
    let out = temp("stop");
    let config = private_config(&out, Sampling::Poisson, 1000);
    let budget = config.privacy.budget();
    let event: PrivacyEvent = GaussianRound::new(0.5, 1.5, Sampling::Poisson)
        .unwrap()
        .into();
    let allowed = max_rounds(AccountantKind::Pld, &event, &budget, 1000).unwrap();
    assert!(
        (3..100).contains(&allowed),
        "test needs a budget of a few rounds, got {allowed}"
    );

    let (summary, metrics) = run(config).await;

    assert_eq!(summary.stopped_by, fl_server::output::StoppedBy::Budget);
    assert_eq!(
        metrics.len() as u64,
        allowed,
        "ran exactly the rounds the budget allows"
    );
    let Budget::Epsilon { epsilon, delta } = budget else {
        unreachable!()
    };
    for (i, m) in metrics.iter().enumerate() {
        let spent = m.epsilon.unwrap();
        assert!(
            spent <= epsilon,
            "round {} spent {spent} > {epsilon}",
            m.round
        );
        let expected = after_rounds(AccountantKind::Pld, &event, i as u64 + 1).epsilon(delta);
        assert!((spent - expected).abs() < 1e-9);
        assert_eq!(m.clip_bound, Some(0.5));
        assert_eq!(m.noise_std, Some(1.5 * 0.5));
    }
    // One more round would have crossed the budget.
    assert!(after_rounds(AccountantKind::Pld, &event, allowed + 1).epsilon(delta) > epsilon);
    // The ledger alone reproduces the reported figure.
    let ((eps, d), rounds) =
        replay(&out.join("ledger.jsonl"), &budget, AccountantKind::Pld).unwrap();
    assert_eq!(rounds as u64, allowed);
    assert_eq!(eps, summary.epsilon.unwrap());
    assert_eq!(d, delta);
    assert_eq!(summary.accountant.as_deref(), Some("pld"));
    assert_eq!(summary.sampling, "poisson");
    assert!(!summary.clip_bound_leaks);
    // --seed makes the sampling reproducible: the figures are marked as not a guarantee.
    assert!(summary.sampling_seeded);
    let entries = fl_server::ledger::read(&out.join("ledger.jsonl")).unwrap();
    assert!(entries.iter().all(|e| e.sampling_seeded));
    std::fs::remove_dir_all(&out).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_size_sampling_is_reported_with_its_own_bound() {
    let out = temp("fixed");
    let mut config = private_config(&out, Sampling::Fixed, 3);
    config.privacy.epsilon = 100.0;
    let (summary, metrics) = run(config).await;
    assert_eq!(summary.sampling, "fixed");
    assert_eq!(summary.accountant.as_deref(), Some("rdp"));
    assert!(metrics.iter().all(|m| m.sampled == 3));
    let fixed: PrivacyEvent = GaussianRound::new(0.5, 1.5, Sampling::Fixed)
        .unwrap()
        .into();
    let poisson: PrivacyEvent = GaussianRound::new(0.5, 1.5, Sampling::Poisson)
        .unwrap()
        .into();
    let reported = summary.epsilon.unwrap();
    assert!((reported - after_rounds(AccountantKind::Rdp, &fixed, 3).epsilon(1e-5)).abs() < 1e-9);
    assert!(reported > after_rounds(AccountantKind::Rdp, &poisson, 3).epsilon(1e-5));
    std::fs::remove_dir_all(&out).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn median_clipping_is_marked_as_leaking() {
    let out = temp("median");
    let mut config = private_config(&out, Sampling::Poisson, 2);
    config.privacy.clip = fl_server::config::ClipMode::Median;
    config.server.seed = None;
    let (summary, _) = run(config).await;
    assert!(summary.clip_bound_leaks);
    assert!(!summary.sampling_seeded);
    assert_eq!(summary.clip_mode.as_deref(), Some("median"));
    let ledger = std::fs::read_to_string(out.join("ledger.jsonl")).unwrap();
    assert!(
        ledger
            .lines()
            .all(|l| l.contains("\"clip_bound_leaks\":true"))
    );
    std::fs::remove_dir_all(&out).unwrap();
}

/// Adaptive clipping: the sum's noise and the noised clip count compose into the multiplier the
/// ledger charges, z = (z_sum^-2 + (sigma_b / (1/2))^-2)^(-1/2) (Andrew et al. 2021, Thm 1 with
/// the centred count, whose sensitivity is 1/2), where z_sum = noise std / S of each round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quantile_clipping_charges_the_multiplier_of_sum_and_count() {
    let out = temp("quantile");
    let mut config = private_config(&out, Sampling::Poisson, 3);
    config.privacy.clip = fl_server::config::ClipMode::Quantile;
    config.privacy.clip_count_noise = Some(1.0);
    config.privacy.epsilon = 100.0;
    let sigma_b = 1.0;
    let (_, metrics) = run(config).await;
    let ledger = fl_server::ledger::read(&out.join("ledger.jsonl")).unwrap();
    assert_eq!(ledger.len(), metrics.len());
    for (m, entry) in metrics.iter().zip(&ledger) {
        let PrivacyEvent::SampledGaussian(event) = entry.event else {
            panic!("round {}: not a Gaussian round", m.round)
        };
        let z_sum = m.noise_std.unwrap() / m.clip_bound.unwrap();
        let effective = (z_sum.powi(-2) + (sigma_b / 0.5f64).powi(-2)).powf(-0.5);
        assert!(
            (effective - event.noise_multiplier).abs() < 1e-9,
            "round {}: sum and count compose to z = {effective}, the ledger charges {}",
            m.round,
            event.noise_multiplier
        );
    }
    std::fs::remove_dir_all(&out).unwrap();
}

/// Under central DP no exact participant count decides a release: every round releases its
/// noised sum over the expected count, however few clients answered (`min_clients` does not
/// apply; the decision would otherwise leak the Poisson-sampled count, which is not accounted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn central_rounds_release_whatever_the_number_of_participants() {
    let out = temp("release");
    let mut config = private_config(&out, Sampling::Poisson, 8);
    config.server.min_clients = 3;
    config.privacy.epsilon = 100.0;
    let (summary, metrics) = run(config).await;
    assert_eq!(metrics.len(), 8);
    assert!(
        metrics.iter().any(|m| m.completed < 3),
        "the seed must give a round of fewer than 3 participants: {:?}",
        metrics.iter().map(|m| m.completed).collect::<Vec<_>>()
    );
    for m in &metrics {
        assert!(
            m.applied,
            "round {} with {} results not released",
            m.round, m.completed
        );
    }
    assert_eq!(summary.rounds_completed, 8);
    std::fs::remove_dir_all(&out).unwrap();
}

/// DP-FTRL over the K clients, 2 per round (trees of K/m = 3 rounds), nodes of z = 3, the
/// clients enrolled beside `out`; with their tokens.
fn ftrl_config(out: &std::path::Path, rounds: u64) -> (RunConfig, Vec<String>) {
    let mut config = private_config(out, Sampling::Fixed, rounds);
    config.privacy.mode = PrivacyMode::DpFtrl;
    config.server.clients_per_round = 2.0.into();
    config.privacy.noise_multiplier = 3.0.into();
    let enrollment = out.with_extension("clients.toml");
    let tokens = support::enroll_clients(&enrollment, K);
    config.server.enrollment = Some(enrollment);
    (config, tokens)
}

/// DP-FTRL end to end: trees of K/m = 3 rounds restart, each round's ledger entry is its step
/// (zero-out neighbours), only steps 1 and 2 of a tree add a node (epsilon stays at step 3), the
/// run stops at the first round whose node would cross the budget, and the ledger alone
/// reproduces the reported epsilon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dp_ftrl_accounts_its_trees_and_stops_at_the_budget() {
    use fl_privacy::{Neighbours, TreeRound, tree_nodes};
    let out = temp("ftrl");
    let (config, tokens) = ftrl_config(&out, 1000);
    let budget = config.privacy.budget();
    let Budget::Epsilon { epsilon, delta } = budget else {
        unreachable!()
    };
    let node: PrivacyEvent = TreeRound::zero_out(3.0, 1).node().unwrap().into();
    let nodes = max_rounds(AccountantKind::Pld, &node, &budget, 1000).unwrap();
    let allowed = (1..)
        .take_while(|t| tree_nodes(*t, 3) <= nodes)
        .last()
        .unwrap();
    assert!((6..60).contains(&allowed), "{allowed} rounds");

    let (summary, metrics) = run_enrolled(config, Some(&tokens)).await;

    assert_eq!(summary.stopped_by, fl_server::output::StoppedBy::Budget);
    assert_eq!(metrics.len() as u64, allowed);
    assert_eq!(summary.accountant.as_deref(), Some("pld"));
    let ledger = fl_server::ledger::read(&out.join("ledger.jsonl")).unwrap();
    assert_eq!(ledger.len(), metrics.len());
    for (i, (m, entry)) in metrics.iter().zip(&ledger).enumerate() {
        let step = i as u64 % 3 + 1;
        assert_eq!(
            entry.event,
            PrivacyEvent::TreeAggregation(TreeRound {
                noise_multiplier: 3.0,
                tree_step: step,
                neighbours: Neighbours::ZeroOut,
            })
        );
        assert_eq!(m.sampled, 2, "round {}", m.round);
        assert_eq!(m.noise_std, Some(3.0 * 0.5));
        let spent = m.epsilon.unwrap();
        let expected = after_rounds(AccountantKind::Pld, &node, tree_nodes(i as u64 + 1, 3));
        assert!(
            (spent - expected.epsilon(delta)).abs() < 1e-9,
            "round {}",
            m.round
        );
        assert!(spent <= epsilon);
        if step == 3 {
            assert_eq!(
                spent,
                metrics[i - 1].epsilon.unwrap(),
                "step 3 adds no node"
            );
        }
    }
    let ((eps, _), rounds) =
        replay(&out.join("ledger.jsonl"), &budget, AccountantKind::Pld).unwrap();
    assert_eq!((rounds as u64, eps), (allowed, summary.epsilon.unwrap()));
    std::fs::remove_dir_all(&out).unwrap();
    std::fs::remove_file(out.with_extension("clients.toml")).unwrap();
}

/// Banded DP-FTRL end to end: b = K/m = 3, each round's ledger entry is its step; a charge
/// (epsilon moves) exactly at rounds 1, 4, 7, ...; the run stops at the first charge that would
/// cross the budget, every round is full (the rule leaves m of the K clients each round), and
/// the ledger alone reproduces the reported epsilon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn banded_dp_ftrl_charges_once_per_separation_and_stops_at_the_budget() {
    use fl_privacy::BandedRound;
    let out = temp("banded");
    let (mut config, tokens) = ftrl_config(&out, 1000);
    config.privacy.noise = fl_privacy::StreamSettings::Banded(Default::default());
    let budget = config.privacy.budget();
    let Budget::Epsilon { delta, .. } = budget else {
        unreachable!()
    };
    let event = |step| BandedRound {
        noise_multiplier: 3.0,
        step,
        bands: 3,
        min_separation: 3,
        max_participations: None,
        neighbours: fl_privacy::Neighbours::ZeroOut,
    };
    let charge: PrivacyEvent = event(1).charge().unwrap().into();
    let charges = max_rounds(AccountantKind::Pld, &charge, &budget, 1000).unwrap();
    assert!((3..30).contains(&charges), "{charges} charges");

    let (summary, metrics) = run_enrolled(config, Some(&tokens)).await;

    assert_eq!(summary.stopped_by, fl_server::output::StoppedBy::Budget);
    assert_eq!(metrics.len() as u64, 3 * charges);
    let ledger = fl_server::ledger::read(&out.join("ledger.jsonl")).unwrap();
    for (i, (m, entry)) in metrics.iter().zip(&ledger).enumerate() {
        let step = i as u64 + 1;
        assert_eq!(entry.event, PrivacyEvent::BandedMatrix(event(step)));
        assert_eq!(
            (m.sampled, m.noise_std),
            (2, Some(3.0 * 0.5)),
            "round {step}"
        );
        let expected = after_rounds(AccountantKind::Pld, &charge, i as u64 / 3 + 1);
        assert!(
            (m.epsilon.unwrap() - expected.epsilon(delta)).abs() < 1e-9,
            "round {step}"
        );
    }
    let ((eps, _), rounds) =
        replay(&out.join("ledger.jsonl"), &budget, AccountantKind::Pld).unwrap();
    assert_eq!((rounds, eps), (metrics.len(), summary.epsilon.unwrap()));
    std::fs::remove_dir_all(&out).unwrap();
    std::fs::remove_file(out.with_extension("clients.toml")).unwrap();
}

/// Ledgers written before events named their `mechanism` (by `fl sim` of an earlier version,
/// central DP and DP-FTRL, 4 rounds at delta 1e-3) still verify, read as the kinds they were
/// written as, and replay to the epsilon their runs reported in `summary.json`.
#[test]
fn ledgers_from_before_tagged_events_read_and_verify() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/untagged-ledgers");
    // (file, the epsilon its run's summary.json reported)
    for (name, reported) in [
        ("central", 4.573814629333321),
        ("dp-ftrl", 1.6072411116265277),
    ] {
        let path = dir.join(format!("{name}.jsonl"));
        let (entries, head) = fl_server::ledger::verify(&path, None).unwrap();
        assert_eq!((entries.len(), head.lines), (4, 4), "{name}");
        for e in &entries {
            let kind_ok = match name {
                "central" => matches!(e.event, PrivacyEvent::SampledGaussian(_)),
                _ => matches!(e.event, PrivacyEvent::TreeAggregation(_)),
            };
            assert!(kind_ok, "{name} round {}: {:?}", e.round, e.event);
        }
        let budget = Budget::Epsilon {
            epsilon: f64::INFINITY,
            delta: 1e-3,
        };
        let ((eps, _), rounds) = replay(&path, &budget, AccountantKind::Pld).unwrap();
        assert_eq!(rounds, 4);
        assert!((eps - reported).abs() < 1e-9, "{name}: {eps} vs {reported}");
    }
}

/// The name each kind of event is stored under: every kind named, so that a new kind fails to
/// compile here until a line of it is added to the golden ledger below.
fn stored_tag(event: &PrivacyEvent) -> &'static str {
    match event {
        PrivacyEvent::SampledGaussian(_) => "sampled-gaussian",
        PrivacyEvent::DistributedDiscreteGaussian(_) => "distributed-discrete-gaussian",
        PrivacyEvent::DdgSettlement(_) => "ddg-settlement",
        PrivacyEvent::TreeAggregation(_) => "tree-aggregation",
        PrivacyEvent::UnsampledGaussian(_) => "unsampled-gaussian",
        PrivacyEvent::BandedMatrix(_) => "banded-matrix",
    }
}

/// A ledger with a line of every kind of event, as this version writes them
/// (`tests/data/tagged-ledger/ledger.jsonl`, written once by `Ledger::spend`): each line reads
/// as its kind and writes back byte for byte, so the chain verifies to the same head, and the
/// ledger replays to the same epsilon. A change to how events are stored or charged fails here.
#[test]
fn a_ledger_of_every_kind_of_event_reads_hashes_and_charges_as_written() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/tagged-ledger/ledger.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let (entries, head) = fl_server::ledger::verify(&path, None).unwrap();
    assert_eq!(
        head.digest,
        "sha256:35be816f480faa689844afdadc5b49349736c392e5647b880a20c302e5d0bc71"
    );
    let mut tags = Vec::new();
    for (entry, line) in entries.iter().zip(text.lines()) {
        assert_eq!(serde_json::to_string(entry).unwrap(), line);
        let stored: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(stored["mechanism"], stored_tag(&entry.event), "{line}");
        tags.push(stored_tag(&entry.event));
    }
    let every = [
        "sampled-gaussian",
        "distributed-discrete-gaussian",
        "ddg-settlement",
        "tree-aggregation",
        "unsampled-gaussian",
        "banded-matrix",
    ];
    assert_eq!(tags, every);
    // What this version's RDP accountant composes them to at delta 1e-5, when the file was
    // written: a regression figure, which a refactor of the events must keep.
    let budget = Budget::Epsilon {
        epsilon: f64::INFINITY,
        delta: 1e-5,
    };
    let ((eps, _), rounds) = replay(&path, &budget, AccountantKind::Rdp).unwrap();
    assert_eq!(rounds, 6);
    assert!((eps - 22.276750954828636).abs() < 1e-9, "epsilon {eps}");
}

/// The tree's noise is a secret held in memory only: a DP-FTRL checkpoint holds the model and no
/// tensor beside it, and a resumed run starts a new tree, which its ledger accounts as one (steps
/// 1, 2, 3, 1 before the restart, then 1, 2 again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dp_ftrl_keeps_its_tree_out_of_checkpoints_and_restarts_it_on_resume() {
    let out = temp("ftrl-resume");
    let (mut config, tokens) = ftrl_config(&out, 4);
    config.privacy.epsilon = 100.0;
    run_enrolled(config, Some(&tokens)).await;
    let mut checkpoint = fl_server::checkpoint::Checkpoint::read(&out).unwrap();
    assert!(
        checkpoint.tensors.is_empty(),
        "{:?}",
        checkpoint.tensors.len()
    );
    assert_eq!(checkpoint.progress.round, 4);

    checkpoint.progress.config.server.rounds = 6;
    let data = Arc::new(blobs(600));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    let data_server = data.clone();
    let dir = out.clone();
    let server = tokio::spawn(async move {
        let run = (dir.as_path(), checkpoint);
        fl_server::resume(listener, run, Some(data_server), None, None, stop_rx).await
    });
    support::spawn_enrolled_clients(&endpoint, &data, &tokens);
    tokio::time::timeout(Duration::from_secs(120), server)
        .await
        .expect("server finishes")
        .unwrap()
        .unwrap();
    let steps: Vec<u64> = fl_server::ledger::read(&out.join("ledger.jsonl"))
        .unwrap()
        .iter()
        .map(|e| match e.event {
            PrivacyEvent::TreeAggregation(t) => t.tree_step,
            other => panic!("round {}: {other:?}", e.round),
        })
        .collect();
    assert_eq!(steps, [1, 2, 3, 1, 1, 2]);
    std::fs::remove_dir_all(&out).unwrap();
    std::fs::remove_file(out.with_extension("clients.toml")).unwrap();
}
