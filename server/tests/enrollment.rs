//! Client identity over gRPC: per-client enrollment tokens, revocation while the server runs, and
//! a sampled client that loses its stream mid-round and comes back to finish the round.

use crate::procs;
use crate::support;

use fl_client::{ClientError, run_client};
use fl_proto::v1::server_message;
use fl_server::output::RoundMetrics;
use std::sync::Arc;
use std::time::Duration;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_client_loses_its_session_is_never_sampled_again_and_cannot_rejoin() {
    let out = std::env::temp_dir().join(format!("fl-revoke-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let file = out.join("clients.toml");
    let list = procs::enroll_numbered(&file, 3);
    let mut config = support::evil_config(&out.join("run"));
    config.server.rounds = 1000;
    config.server.enrollment = Some(file.clone());
    let data = Arc::new(support::blobs(300));
    // After round 2, the operator revokes client-2 (as `fl revoke` does: the file is rewritten).
    let (recorded_tx, mut recorded) = tokio::sync::watch::channel(0u64);
    let observer: fl_server::Observer = Arc::new(move |m: &RoundMetrics| {
        recorded_tx.send_replace(m.round);
        if m.round == 2 {
            let mut list = list.clone();
            list.revoke("client-2").unwrap();
            std::fs::write(&file, list.to_toml()).unwrap();
        }
    });
    let server = support::start_server(config, data.clone(), Some(observer), None).await;
    let slots = fl_client::TrainingSlots::new(2);
    let clients: Vec<_> = (0..3)
        .map(|i| {
            let opts = fl_client::ClientOptions {
                token: format!("token-{i}"),
                ..support::client_options(&server.endpoint, i, &slots)
            };
            tokio::spawn(run_client(opts, support::client_data(&data, i)))
        })
        .collect();
    let mut clients = clients.into_iter();
    let (first, second) = (clients.next().unwrap(), clients.next().unwrap());
    let revoked = tokio::time::timeout(Duration::from_secs(60), clients.next().unwrap())
        .await
        .expect("the revoked client is cut off")
        .unwrap();
    match revoked {
        Err(ClientError::Status(s)) => assert_eq!(s.code(), Code::PermissionDenied, "{s:?}"),
        other => panic!("the revoked client ended with {other:?}"),
    }
    // It cannot join again, and tokens nobody was given admit nobody.
    let again = support::raw_join(&server.endpoint, "client-2", "token-2").await;
    assert_eq!(again.unwrap_err().code(), Code::PermissionDenied);
    let stranger = support::raw_join(&server.endpoint, "stranger", "token-9").await;
    assert_eq!(stranger.unwrap_err().code(), Code::Unauthenticated);
    // An enrolled client that joins again keeps its id.
    let a = support::raw_join(&server.endpoint, "client-0", "token-0").await;
    let b = support::raw_join(&server.endpoint, "client-0", "token-0").await;
    assert_eq!(a.unwrap().client_id, b.unwrap().client_id);

    // The observer of round 2 runs once round 3's tasks are out (round 2's evaluation overlaps
    // round 3's training), so round 3 was sampled before the revocation: wait for round 4.
    let round_4 = recorded.wait_for(|&round| round >= 4);
    tokio::time::timeout(Duration::from_secs(60), round_4)
        .await
        .expect("round 4 is recorded")
        .unwrap();
    server.stop.send(true).unwrap();
    let summary = support::finished(server.handle).await;
    // Stopped as by Ctrl-C, the server told the enrolled clients it will be resumed: they wait
    // to reconnect (the rounds they trained are in the metrics below).
    for c in [first, second] {
        c.abort();
    }
    let metrics = support::read_metrics(&out.join("run"));
    assert!(metrics.len() >= 4, "{} rounds ran", metrics.len());
    assert_eq!((metrics[0].sampled, metrics[1].sampled), (3, 3));
    for m in &metrics[3..] {
        assert!(
            m.sampled <= 2,
            "round {}: the revoked client was sampled",
            m.round
        );
    }
    assert!(summary.rounds_completed >= 4);
    std::fs::remove_dir_all(&out).unwrap();
}

/// Answers every task with a zero update until Shutdown; returns the rounds of the tasks.
async fn answer_every_task(
    tx: tokio::sync::mpsc::Sender<fl_proto::v1::ClientMessage>,
    mut inbound: tonic::Streaming<fl_proto::v1::ServerMessage>,
) -> Vec<u64> {
    let mut rounds = Vec::new();
    while let Some(m) = inbound.message().await.unwrap() {
        match m.body {
            Some(server_message::Body::Task(t)) => {
                let zeros = vec![0.0; t.num_values as usize];
                for body in support::dense_upload(t.round, &zeros, None) {
                    tx.send(fl_proto::v1::ClientMessage { body: Some(body) })
                        .await
                        .unwrap();
                }
                rounds.push(t.round);
            }
            Some(server_message::Body::Shutdown(_)) => break,
            _ => {}
        }
    }
    rounds
}

/// A stream the round loop learns of while it collects a round gets that round's task once: here
/// a client reopens its session when round 1 is published, which is after round 2's task went to
/// its old stream (round 1's evaluation overlaps round 2's training), so the news of its new
/// stream is read during round 2's collection. (A stream opened before the tasks go out, whose
/// news is read after, takes the same path: `RoundTasks::send` sends once per stream generation.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_hears_each_task_once_even_when_its_arrival_is_read_late() {
    let out = std::env::temp_dir().join(format!("fl-task-once-{}", std::process::id()));
    let config = support::evil_config(&out);
    let data = Arc::new(support::blobs(300));
    let endpoint = Arc::new(std::sync::OnceLock::<String>::new());
    let joined = Arc::new(std::sync::OnceLock::new());
    let reopened = Arc::new(std::sync::Mutex::new(None));
    let observer: fl_server::Observer = {
        let (endpoint, joined, reopened) = (endpoint.clone(), joined.clone(), reopened.clone());
        Arc::new(move |m: &RoundMetrics| {
            if m.round == 1 {
                let session = tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(support::raw_hello(
                        endpoint.get().unwrap(),
                        joined.get().unwrap(),
                    ))
                });
                *reopened.lock().unwrap() = Some(session.unwrap());
            }
        })
    };
    let server = support::start_server(config, data.clone(), Some(observer), None).await;
    endpoint.set(server.endpoint.clone()).unwrap();
    let good = support::spawn_clients(&server.endpoint, &data, 2, None);
    let reply = support::raw_join(&server.endpoint, "twice", "")
        .await
        .unwrap();
    joined.set(reply.clone()).unwrap();
    let (tx, mut inbound) = support::raw_hello(&server.endpoint, &reply).await.unwrap();
    // Round 1 on the first stream.
    let task = loop {
        if let Some(server_message::Body::Task(t)) = inbound.message().await.unwrap().unwrap().body
        {
            break t;
        }
    };
    for body in support::dense_upload(1, &vec![0.0; task.num_values as usize], None) {
        tx.send(fl_proto::v1::ClientMessage { body: Some(body) })
            .await
            .unwrap();
    }
    // Round 2 on the second.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (tx2, inbound2) = loop {
        if let Some(session) = reopened.lock().unwrap().take() {
            break session;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "round 1 did not end"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(answer_every_task(tx2, inbound2).await, [2]);
    let summary = support::finished(server.handle).await;
    for g in good {
        g.await.unwrap().expect("honest clients finish normally");
    }
    assert_eq!(summary.client_updates, 6);
    drop((tx, inbound));
    std::fs::remove_dir_all(&out).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampled_client_that_reconnects_mid_round_gets_its_task_again_and_counts() {
    let out = std::env::temp_dir().join(format!("fl-reconnect-{}", std::process::id()));
    let mut config = support::evil_config(&out);
    config.server.reconnect_grace_secs = 20.0;
    let data = Arc::new(support::blobs(300));
    let server = support::start_server(config, data.clone(), None, None).await;
    let good = support::spawn_clients(&server.endpoint, &data, 2, None);

    let joined = support::raw_join(&server.endpoint, "flaky", "")
        .await
        .unwrap();
    let (tx, mut inbound) = support::raw_hello(&server.endpoint, &joined).await.unwrap();
    // Round 1's task arrives; the connection breaks before the client answers.
    let first = inbound.message().await.unwrap().unwrap();
    let Some(server_message::Body::Task(task)) = first.body else {
        panic!("expected round 1's task, got {first:?}");
    };
    assert_eq!(task.round, 1);
    drop((tx, inbound));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The same identity reopens its session and is sent the task again; it answers every round.
    let (tx, inbound) = support::raw_hello(&server.endpoint, &joined).await.unwrap();
    let rounds_answered = answer_every_task(tx, inbound).await;
    assert_eq!(rounds_answered, [1, 2]);
    let summary = support::finished(server.handle).await;
    for g in good {
        g.await.unwrap().expect("honest clients finish normally");
    }
    let metrics = support::read_metrics(&out);
    for m in &metrics {
        assert_eq!(
            (m.sampled, m.completed, m.dropped),
            (3, 3, 0),
            "round {}",
            m.round
        );
    }
    assert_eq!(summary.client_updates, 6);
    std::fs::remove_dir_all(&out).unwrap();
}
