//! Verified rounds over real gRPC streams: a server, its helper (`fl_server::help`, the role of
//! `fl-server --role helper`) and clients, one of them compromised. The compromised client sends
//! its update scaled far above the bound with a proof that claims the bound; both aggregators
//! exclude it, the round's metrics count it, and the honest clients' rounds go on.

use crate::support;

use fl_client::{ClientOptions, TrainingSlots, run_client};
use fl_proto::v1::{ClientMessage, server_message};
use fl_secagg::verified::{Binder, Shape, shard_unclipped};
use fl_server::config::{ModelKind, PrivacyMode, RunConfig};
use fl_server::{HelperFloors, HelperOptions};
use std::path::Path;
use std::sync::Arc;
use support::blobs;

/// The token the test's server presents to its helper.
const TOKEN: &str = "test-leader-token";

/// A helper on a free loopback port with a new key in `dir`: its address and public key.
async fn start_helper(dir: &Path, stop: tokio::sync::watch::Receiver<bool>) -> (String, [u8; 32]) {
    let floors: HelperFloors = "2:0".parse().unwrap();
    let options = HelperOptions::read(&dir.join("helper.key"), TOKEN.into(), floors).unwrap();
    let public = options.key.public().to_bytes();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = fl_server::config::ServerSection::default();
    tokio::spawn(async move { fl_server::help(listener, &server, options, stop).await });
    (format!("http://127.0.0.1:{port}"), public)
}

/// 3 clients on [`support::blobs`], all in each of 2 verified rounds, S = 1.
fn config(out: &Path, helper: &str) -> RunConfig {
    let mut c = support::small_config(out, 3, 3.0, 2);
    c.model.kind = ModelKind::Logistic;
    c.privacy.mode = PrivacyMode::Verified;
    c.privacy.clip_bound = 1.0;
    c.verified.helper = helper.into();
    let token_file = out.with_extension("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    c.verified.helper_token_file = Some(token_file);
    c
}

/// The compromised client: to each task, its update of 5.0 in every coordinate (norm 5 sqrt(d),
/// far above S = 1), unclipped, with a proof claiming the bound.
async fn compromised(endpoint: String, helper: [u8; 32]) {
    let key = fl_secagg::verified::HelperPublicKey::from_bytes(&helper).unwrap();
    let (id, tx, mut inbound) = support::raw_session(&endpoint, "compromised").await;
    while let Ok(Some(message)) = inbound.message().await {
        match message.body {
            Some(server_message::Body::Task(task)) => {
                let tag = support::secure_tag(&mut inbound, &task).await;
                let n = task.num_values as usize;
                let shape = Shape::new(n, 1.0).unwrap();
                let report = shard_unclipped(&shape, &Binder::new(&tag, id), &key, &vec![5.0; n]);
                for body in fl_proto::verified_upload(task.round, &report.unwrap()) {
                    let _ = tx.send(ClientMessage { body: Some(body) }).await;
                }
            }
            Some(server_message::Body::Shutdown(_)) => break,
            _ => {}
        }
    }
}

/// Runs `config` with 2 honest clients and, with `attacked`, the compromised one (else a third
/// honest client); returns the summary and the run folder.
async fn run(
    out: &Path,
    configure: fn(&mut RunConfig),
    attacked: bool,
) -> fl_server::output::Summary {
    std::fs::create_dir_all(out).unwrap();
    let (_stop_helper, helper_stop) = tokio::sync::watch::channel(false);
    let (helper, public) = start_helper(out, helper_stop).await;
    let data = Arc::new(blobs(300));
    let mut c = config(out, &helper);
    configure(&mut c);
    let server = support::start_server(c, data.clone(), None, None).await;
    let slots = TrainingSlots::new(2);
    let honest_count = if attacked { 2 } else { 3 };
    let honest: Vec<_> = (0..honest_count)
        .map(|i| {
            let mut options: ClientOptions = support::client_options(&server.endpoint, i, &slots);
            options.privacy.helper_key = Some(public);
            tokio::spawn(run_client(options, support::client_data(&data, i)))
        })
        .collect();
    let evil = attacked.then(|| tokio::spawn(compromised(server.endpoint.clone(), public)));
    let summary = support::finished(server.handle).await;
    for client in honest {
        client.await.unwrap().expect("honest clients finish");
    }
    if let Some(evil) = evil {
        evil.await.unwrap();
    }
    summary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_upload_is_excluded_and_the_honest_ones_are_summed() {
    let out = std::env::temp_dir().join(format!("fl-verified-{}", std::process::id()));
    let summary = run(&out, |_| {}, true).await;
    assert_eq!(summary.rounds_completed, 2);
    for m in support::read_metrics(&out) {
        let verified = m.verified.expect("a verified round's figures");
        assert_eq!(
            (verified.uploads, verified.accepted),
            (3, 2),
            "round {}",
            m.round
        );
        assert_eq!(
            verified.excluded.get("proof"),
            Some(&1),
            "round {}",
            m.round
        );
        assert_eq!(verified.aborted, None);
        assert_eq!(m.completed, 2);
    }
    std::fs::remove_dir_all(&out).unwrap();
}

/// With the aggregators' noise the run keeps a ledger like `central`'s: its chain verifies and
/// it replays to the epsilon the run reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noised_verified_run_keeps_a_ledger_that_replays_to_its_epsilon() {
    let out = std::env::temp_dir().join(format!("fl-verified-dp-{}", std::process::id()));
    let noised = |c: &mut RunConfig| {
        c.verified.noise = fl_server::config::VerifiedNoise::Aggregators;
        c.privacy.sampling = fl_privacy::Sampling::Fixed;
        c.privacy.noise_multiplier = 1.0.into();
        c.privacy.epsilon = 100.0;
    };
    let summary = run(&out, noised, false).await;
    assert_eq!(summary.rounds_completed, 2);
    let ledger = out.join("ledger.jsonl");
    let (entries, _) = fl_server::ledger::verify(&ledger, None).unwrap();
    assert_eq!(entries.len(), 2);
    let mut planned = config(&out, "http://the-helper.invalid");
    noised(&mut planned);
    let terms = *planned
        .plan()
        .unwrap()
        .ledger()
        .expect("a noised run keeps a ledger");
    let replayed = fl_server::ledger::replay(&ledger, &terms.budget, terms.accountant);
    let ((epsilon, _), rounds) = replayed.unwrap();
    assert_eq!(rounds, 2);
    let reported = summary.epsilon.expect("the run's epsilon");
    assert!(
        (epsilon - reported).abs() <= 1e-9 * reported,
        "{epsilon} vs {reported}"
    );
    for m in support::read_metrics(&out) {
        assert_eq!(m.verified.map(|v| v.accepted), Some(3));
        assert!(m.noise_std.is_some_and(|s| s > 0.0), "round {}", m.round);
    }
    std::fs::remove_dir_all(&out).unwrap();
}
