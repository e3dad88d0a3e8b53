//! Clients in the server's own process (`fl sim`) call its service directly
//! (`Listener::InProcess`): a federation trains over it to the end, and once the run is over a
//! new call is refused as `UNAVAILABLE`, as a closed socket's would be, instead of waiting.

use crate::support;

use fl_client::{ClientError, ClientOptions, Connection, TrainingSlots, run_client};
use fl_server::Listener;
use fl_server::config::ModelKind;
use std::sync::Arc;
use std::time::Duration;
use support::{blobs, client_data, client_options, finished, small_config};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_in_process_train_and_are_refused_once_the_run_is_over() {
    let out = std::env::temp_dir().join(format!("fl-in-process-{}", std::process::id()));
    let data = Arc::new(blobs(300));
    let mut config = small_config(&out, 3, 3.0, 2);
    config.model.kind = ModelKind::Logistic;
    let (to_clients, service) = tokio::sync::oneshot::channel();
    let (_stop, stop) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(fl_server::serve(
        Listener::InProcess(to_clients),
        config,
        Some(data.clone()),
        None,
        None,
        stop,
    ));
    let connection = Connection::in_process(service.await.expect("the server serves"));
    let slots = TrainingSlots::new(2);
    let options = |i| ClientOptions {
        connection: Some(connection.clone()),
        ..client_options("http://in-process.invalid", i, &slots)
    };
    let clients: Vec<_> = (0..3)
        .map(|i| tokio::spawn(run_client(options(i), client_data(&data, i))))
        .collect();
    let summary = finished(server).await;
    assert_eq!(summary.rounds_completed, 2);
    for client in clients {
        let report = client.await.unwrap().expect("clients end normally");
        assert_eq!(report.rounds_trained, 2);
    }

    let late = ClientOptions {
        connect_timeout: Duration::ZERO,
        ..options(3)
    };
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        run_client(late, client_data(&data, 0)),
    )
    .await
    .expect("refused at once, not left waiting");
    match refused {
        Err(ClientError::Status(s)) => assert_eq!(s.code(), Code::Unavailable, "{s}"),
        other => panic!("expected UNAVAILABLE, got {other:?}"),
    }
    std::fs::remove_dir_all(&out).unwrap();
}
