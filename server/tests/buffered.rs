//! Asynchronous buffered aggregation end to end, in this process on loopback: server steps on
//! full buffers, a client that uploads for a model version it was never sent, and DP-FTRL's
//! tree steps stopped mid-buffer and resumed with nothing counted twice.

use crate::support;

use fl_privacy::PrivacyEvent;
use fl_server::config::{BufferSection, Cadence, ModelKind, PrivacyMode, RunConfig};
use std::sync::Arc;
use std::time::Duration;
use support::{blobs, read_metrics, small_config};

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("fl-buffered-{name}-{}", std::process::id()))
}

/// `clients` clients, at most `concurrency` training, steps of `size` updates, `steps` steps.
fn async_config(
    out: &std::path::Path,
    clients: usize,
    (concurrency, size): (usize, usize),
    steps: u64,
) -> RunConfig {
    let mut c = small_config(out, clients, 1.0, steps);
    c.model.kind = ModelKind::Logistic;
    c.server.aggregation = Cadence::Async;
    c.buffer = BufferSection {
        concurrency,
        size,
        max_staleness: 4,
    };
    c
}

/// Every metrics line is a server step of exactly K = 2 buffered updates, whose staleness
/// counts add up to them, with at most C = 4 clients training.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_run_steps_each_time_its_buffer_is_full() {
    let out = temp("steps");
    let data = Arc::new(blobs(600));
    let config = async_config(&out, 6, (4, 2), 6);
    let server = support::start_server(config, data.clone(), None, None).await;
    let clients = support::spawn_clients(&server.endpoint, &data, 6, None);
    let summary = support::finished(server.handle).await;
    for c in clients {
        c.await.unwrap().expect("clients finish normally");
    }
    assert_eq!(summary.rounds_completed, 6);
    assert!(
        summary.sampling.contains("asynchronous"),
        "{}",
        summary.sampling
    );
    let metrics = read_metrics(&out);
    assert_eq!(metrics.len(), 6);
    for m in &metrics {
        let b = m.buffer.as_ref().expect("a server step's buffer figures");
        assert_eq!((m.completed, b.size), (2, 2), "step {}", m.round);
        assert_eq!(b.staleness.iter().sum::<u64>(), 2, "step {}", m.round);
        assert!(b.training <= 4, "step {}: {} training", m.round, b.training);
        assert!(m.test_accuracy.is_some());
    }
    std::fs::remove_dir_all(&out).unwrap();
}

/// The evil-client federation of `support` run asynchronously: at most 3 training, steps of
/// 2 updates.
fn three_training_steps_of_two(c: &mut RunConfig) {
    c.server.aggregation = Cadence::Async;
    c.buffer = BufferSection {
        concurrency: 3,
        size: 2,
        max_staleness: 4,
    };
}

/// An upload for version 0, which no client is ever sent, ends its sender's stream; the honest
/// clients fill every step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_for_a_version_never_sent_is_refused() {
    fn never_sent(_round: u64, n: usize) -> Vec<fl_proto::v1::client_message::Body> {
        support::dense_upload(0, &vec![0.0; n], None)
    }
    let (status, metrics, steps) =
        support::run_with_evil_client(three_training_steps_of_two, never_sent).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("never sent"), "{status:?}");
    assert_eq!(steps, 2);
    assert!(metrics.iter().all(|m| m.completed == 2), "{metrics:?}");
}

/// A client's evaluation counts only when the model version it trained on asked for one (the
/// rule of synchronous rounds): figures sent unasked, with federated evaluation off, are in no
/// step's metrics, and the uploads that carry them still count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evaluation_nobody_asked_for_is_not_counted() {
    fn unasked(round: u64, n: usize) -> Vec<fl_proto::v1::client_message::Body> {
        let mut bodies = support::dense_upload(round, &vec![0.0; n], None);
        if let fl_proto::v1::client_message::Body::UpdateHeader(h) = &mut bodies[0] {
            h.evaluation = Some(fl_proto::v1::ClientEvaluation {
                loss: 0.5,
                accuracy: 0.5,
                num_examples: 100,
            });
        }
        bodies
    }
    let (status, metrics, steps) =
        support::run_with_evil_client(three_training_steps_of_two, unasked).await;
    assert_eq!(status.code(), tonic::Code::Ok, "{status:?}");
    assert_eq!(steps, 2);
    assert!(metrics.iter().all(|m| m.completed == 2), "{metrics:?}");
    assert!(
        metrics.iter().all(|m| m.federated_eval.is_none()),
        "{metrics:?}"
    );
}

/// DP-FTRL in asynchronous mode, trees of 2 steps of 2 updates over 6 enrolled clients: stopped
/// while its third step's buffer fills, then resumed to step 5. The ledger holds each step once,
/// its chain verifies against the checkpoint, and the resumed process starts a new tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_mid_buffer_and_resumed_nothing_is_counted_twice() {
    let out = temp("resume");
    let mut config = async_config(&out, 6, (3, 2), 5);
    config.privacy.mode = PrivacyMode::DpFtrl;
    config.privacy.noise_multiplier = 2.0.into();
    config.privacy.epsilon = 100.0;
    config.privacy.noise =
        fl_privacy::StreamSettings::Tree(fl_privacy::TreeSettings { rounds: Some(2) });
    let enrollment = out.with_extension("clients.toml");
    let tokens = support::enroll_clients(&enrollment, 6);
    config.server.enrollment = Some(enrollment.clone());
    let data = Arc::new(blobs(600));

    // Stop once step 2 is published: step 3's buffer is then filling.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let stop = Arc::new(stop);
    let on_step: fl_server::Observer = Arc::new(move |m| {
        if m.round == 2 {
            let _ = stop.send(true);
        }
    });
    let server = tokio::spawn(fl_server::serve(
        listener,
        config,
        Some(data.clone()),
        Some(on_step),
        None,
        stop_rx,
    ));
    support::spawn_enrolled_clients(&endpoint, &data, &tokens);
    let first = tokio::time::timeout(Duration::from_secs(60), server).await;
    let first = first.expect("server stops").unwrap().unwrap();
    assert_eq!(first.stopped_by, fl_server::output::StoppedBy::Interrupted);
    let checkpoint = fl_server::checkpoint::Checkpoint::read(&out).unwrap();
    let stopped_at = checkpoint.progress.round;
    assert!(
        (2..5).contains(&stopped_at),
        "checkpoint at step {stopped_at}"
    );
    let entries = fl_server::ledger::read(&out.join("ledger.jsonl")).unwrap();
    assert_eq!(
        entries.len() as u64,
        stopped_at,
        "a step charged but not checkpointed"
    );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    let dir = out.clone();
    let data_server = data.clone();
    let server = tokio::spawn(async move {
        let run = (dir.as_path(), checkpoint);
        fl_server::resume(listener, run, Some(data_server), None, None, stop_rx).await
    });
    support::spawn_enrolled_clients(&endpoint, &data, &tokens);
    let resumed = tokio::time::timeout(Duration::from_secs(60), server).await;
    let resumed = resumed.expect("server finishes").unwrap().unwrap();
    assert_eq!(resumed.rounds_completed, 5);

    let last = fl_server::checkpoint::Checkpoint::read(&out).unwrap();
    let ledger = out.join("ledger.jsonl");
    let (entries, _) = fl_server::ledger::verify(&ledger, last.progress.ledger.as_ref()).unwrap();
    let rounds: Vec<u64> = entries.iter().map(|e| e.round).collect();
    assert_eq!(rounds, [1, 2, 3, 4, 5], "each step once");
    let steps: Vec<u64> = (entries.iter())
        .map(|e| match e.event {
            PrivacyEvent::TreeAggregation(t) => t.tree_step,
            other => panic!("step {}: {other:?}", e.round),
        })
        .collect();
    // Trees of two steps; the resumed process starts a new tree at its first step.
    let mut expected: Vec<u64> = (1..=stopped_at).map(|r| (r - 1) % 2 + 1).collect();
    expected.extend((stopped_at + 1..=5).map(|r| (r - stopped_at - 1) % 2 + 1));
    assert_eq!(steps, expected);
    std::fs::remove_dir_all(&out).unwrap();
    std::fs::remove_file(&enrollment).unwrap();
}
