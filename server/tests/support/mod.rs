//! Helpers shared by the in-process federation tests (each test binary uses some of them).

#![allow(dead_code)]

use fl_client::{
    ClientError, ClientOptions, ClientReport, ClientTls, LocalData, TrainingSlots, run_client,
};
use fl_datasets::Dataset;
use fl_privacy::Release;
use fl_proto::v1::federation_client::FederationClient;
use fl_proto::v1::{
    ClientMessage, Hello, JoinReply, JoinRequest, LocalRelease, ReleaseHeader, ServerMessage,
    UpdateHeader, client_message, server_message,
};
use fl_secagg::PlainInputs;
use fl_server::config::{ModelKind, RunConfig};
use fl_server::output::{RoundMetrics, Summary};
use fl_server::{Observer, ServerError};
use ndarray::Array2;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

/// Two separable blobs in 4 dimensions, labels alternating.
pub fn blobs(n: usize) -> Dataset {
    let labels: Vec<u32> = (0..n).map(|i| (i % 2) as u32).collect();
    let features = Array2::from_shape_fn((n, 4), |(i, j)| {
        let sign = if labels[i] == 1 { 1.0 } else { -1.0 };
        sign * (1.0 + j as f32 * 0.1) + ((i * 7 + j * 3) % 11) as f32 * 0.05
    });
    Dataset::new(features, labels, 2).unwrap()
}

/// Starts `count` honest clients against `endpoint`, client i training on examples
/// i*100 .. (i+1)*100 of `data`; in secure-aggregation rounds they record their plain inputs in
/// `oracle`, if any.
pub fn spawn_clients(
    endpoint: &str,
    data: &Arc<Dataset>,
    count: usize,
    oracle: Option<Arc<PlainInputs>>,
) -> Vec<JoinHandle<Result<ClientReport, ClientError>>> {
    spawn_clients_with(endpoint, data, count, oracle, None)
}

/// [`spawn_clients`] over TLS.
pub fn spawn_clients_with(
    endpoint: &str,
    data: &Arc<Dataset>,
    count: usize,
    oracle: Option<Arc<PlainInputs>>,
    tls: Option<ClientTls>,
) -> Vec<JoinHandle<Result<ClientReport, ClientError>>> {
    let slots = TrainingSlots::new(2);
    (0..count)
        .map(|i| {
            let opts = ClientOptions {
                oracle: oracle.clone(),
                tls: tls.clone(),
                connection: None,
                ..client_options(endpoint, i, &slots)
            };
            tokio::spawn(run_client(opts, client_data(data, i)))
        })
        .collect()
}

/// Enrolls clients `client-0` .. `client-{count-1}` (the names of [`client_options`]) in a new
/// enrollment file at `path`; returns their tokens.
pub fn enroll_clients(path: &std::path::Path, count: usize) -> Vec<String> {
    let names: Vec<String> = (0..count).map(|i| format!("client-{i}")).collect();
    let mut list = fl_server::credentials::EnrollmentList::default();
    let tokens = list.enroll_with_new_tokens(&names).unwrap();
    std::fs::write(path, list.to_toml()).unwrap();
    tokens
}

/// Honest clients `0 .. tokens.len()`, each presenting its own token of [`enroll_clients`].
pub fn spawn_enrolled_clients(
    endpoint: &str,
    data: &Arc<Dataset>,
    tokens: &[String],
) -> Vec<JoinHandle<Result<ClientReport, ClientError>>> {
    let slots = TrainingSlots::new(2);
    (tokens.iter().enumerate())
        .map(|(i, token)| {
            let opts = ClientOptions {
                token: token.clone(),
                ..client_options(endpoint, i, &slots)
            };
            tokio::spawn(run_client(opts, client_data(data, i)))
        })
        .collect()
}

/// The options of honest client `i`: no token, seed i, 10 s to connect.
pub fn client_options(endpoint: &str, i: usize, slots: &TrainingSlots) -> ClientOptions {
    ClientOptions {
        name: format!("client-{i}"),
        seed: Some(i as u64),
        connect_timeout: Duration::from_secs(10),
        training_slots: slots.clone(),
        ..ClientOptions::new(endpoint)
    }
}

/// Client `i`'s examples: i*100 .. (i+1)*100 of `data`.
pub fn client_data(data: &Arc<Dataset>, i: usize) -> LocalData {
    LocalData {
        data: data.clone(),
        indices: (i * 100..(i + 1) * 100).collect(),
    }
}

/// A hand-driven client for hostile tests: joins as `name`, opens its Session with Hello and
/// returns its id, its outgoing queue and the server's stream.
pub async fn raw_session(
    endpoint: &str,
    name: &str,
) -> (
    u64,
    mpsc::Sender<ClientMessage>,
    tonic::Streaming<ServerMessage>,
) {
    let joined = raw_join(endpoint, name, "").await.unwrap();
    let id = joined.client_id.parse().unwrap();
    let (tx, inbound) = raw_hello(endpoint, &joined).await.unwrap();
    (id, tx, inbound)
}

/// The round key of a secure task `task`, reading the model chunks that follow it from
/// `inbound`: the round and H(task) of the task and model received.
#[allow(dead_code)]
pub async fn secure_tag(
    inbound: &mut tonic::Streaming<ServerMessage>,
    task: &fl_proto::v1::RoundTask,
) -> fl_secagg::RoundTag {
    let mut assembler =
        fl_proto::TensorAssembler::new(task.round, task.num_values, task.num_chunks).unwrap();
    let model = loop {
        let message = inbound.message().await.unwrap().unwrap();
        let Some(fl_proto::v1::server_message::Body::ModelChunk(chunk)) = message.body else {
            panic!("a model chunk was expected, not {message:?}");
        };
        if let Some(values) = assembler.push(chunk).unwrap() {
            break values;
        }
    };
    let parsed = fl_secagg::task::Task::try_from(task).unwrap();
    fl_secagg::RoundTag {
        round: task.round,
        digest: parsed.secure_digest(&model).unwrap(),
    }
}

/// Joins as `name` with `token`.
pub async fn raw_join(endpoint: &str, name: &str, token: &str) -> Result<JoinReply, tonic::Status> {
    let mut grpc = FederationClient::connect(endpoint.to_string())
        .await
        .unwrap();
    let request = JoinRequest {
        token: token.into(),
        name: name.into(),
    };
    grpc.join(request).await.map(tonic::Response::into_inner)
}

/// Opens a Session with Hello for the identity `joined`; returns the outgoing queue and the
/// server's stream.
pub async fn raw_hello(
    endpoint: &str,
    joined: &JoinReply,
) -> Result<(mpsc::Sender<ClientMessage>, tonic::Streaming<ServerMessage>), tonic::Status> {
    let mut grpc = FederationClient::connect(endpoint.to_string())
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(64);
    let hello = client_message::Body::Hello(Hello {
        client_id: joined.client_id.clone(),
        session_key: joined.session_key.clone(),
    });
    tx.send(ClientMessage { body: Some(hello) }).await.unwrap();
    let inbound = grpc.session(ReceiverStream::new(rx)).await?.into_inner();
    Ok((tx, inbound))
}

/// A loopback address with a port free now, for a server to bind (an endpoint whose address
/// comes from the configuration).
pub fn free_loopback_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// A plain HTTP/1.1 GET of `path` at `addr` with an optional `Authorization` header, blocking:
/// the whole response, status line first.
pub fn http_get(addr: &str, path: &str, authorization: Option<&str>) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let auth = authorization.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

/// The lines of a run folder's `metrics.jsonl`.
pub fn read_metrics(out: &Path) -> Vec<RoundMetrics> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A test federation writing to `out`: K = `clients`, m = `per_round`, `rounds` rounds, 20 s
/// to join and per round.
pub fn small_config(out: &Path, clients: usize, per_round: f64, rounds: u64) -> RunConfig {
    let mut c = RunConfig::default();
    c.server.clients = clients;
    c.server.clients_per_round = per_round.into();
    c.server.rounds = rounds;
    c.server.round_timeout_secs = 20.0;
    c.server.join_timeout_secs = 20.0;
    c.server.out = out.to_owned();
    c
}

/// The hostile tests' federation: 3 clients on [`blobs`], logistic regression, 2 rounds.
pub fn evil_config(out: &Path) -> RunConfig {
    let mut c = small_config(out, 3, 3.0, 2);
    c.server.seed = Some(1);
    c.model.kind = ModelKind::Logistic;
    c
}

/// The run folder of [`run_with_evil_client`] called on this thread.
pub fn evil_out_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "fl-bad-input-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ))
}

/// Builds what the evil client sends once it holds round `round`'s task for a model of `n`
/// parameters.
pub type Behaviour = fn(round: u64, n: usize) -> Vec<client_message::Body>;

/// Runs a 3-client federation (configured by [`evil_config`], then `configure`) in which one
/// client follows `evil`; returns the status that client got (`OK` when its session ended
/// normally), the run's metrics lines and the number of completed rounds.
pub async fn run_with_evil_client(
    configure: fn(&mut RunConfig),
    evil: Behaviour,
) -> (tonic::Status, Vec<RoundMetrics>, u64) {
    let out = evil_out_dir();
    let data = Arc::new(blobs(200));
    let mut config = evil_config(&out);
    configure(&mut config);
    let TestServer {
        endpoint,
        handle: server,
        stop: _stop_tx,
        ..
    } = start_server(config, data.clone(), None, None).await;
    let good = spawn_clients(&endpoint, &data, 2, None);

    let (_, tx, mut inbound) = raw_session(&endpoint, "evil").await;
    let send = |body| ClientMessage { body: Some(body) };
    let status = loop {
        match inbound.message().await {
            Ok(Some(m)) => match m.body {
                Some(server_message::Body::Task(task)) => {
                    for body in evil(task.round, task.num_values as usize) {
                        // The server may refuse the upload before reading all of it (a header
                        // that announces the wrong length, say) and close its end: the status
                        // then follows on `inbound`.
                        if tx.send(send(body)).await.is_err() {
                            break;
                        }
                    }
                }
                // Its uploads were taken and the run ended.
                Some(server_message::Body::Shutdown(_)) => {
                    break tonic::Status::ok("the run ended");
                }
                _ => {}
            },
            Ok(None) => panic!("stream ended without an error status or a Shutdown"),
            Err(status) => break status,
        }
    };
    drop(tx);
    let summary = finished(server).await;
    for g in good {
        g.await
            .unwrap()
            .expect("well-behaved clients finish normally");
    }
    let metrics = read_metrics(&out);
    std::fs::remove_dir_all(&out).unwrap();
    (status, metrics, summary.rounds_completed)
}

/// The summary of a server task that must finish within 60 s without an error.
pub async fn finished(handle: JoinHandle<Result<Summary, ServerError>>) -> Summary {
    tokio::time::timeout(Duration::from_secs(60), handle)
        .await
        .expect("server finishes")
        .unwrap()
        .unwrap()
}

/// A server running in this process on a free loopback port.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The port.
    pub port: u16,
    /// Resolves to the run's summary.
    pub handle: JoinHandle<Result<Summary, ServerError>>,
    /// Sending true stops training after the current round.
    pub stop: tokio::sync::watch::Sender<bool>,
}

/// Starts [`fl_server::serve`] with `config` on a free loopback port, evaluating on `data`.
pub async fn start_server(
    config: RunConfig,
    data: Arc<Dataset>,
    observer: Option<Observer>,
    oracle: Option<Arc<PlainInputs>>,
) -> TestServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let handle = tokio::spawn(fl_server::serve(
        listener,
        config,
        Some(data),
        observer,
        oracle,
        stop_rx,
    ));
    TestServer {
        endpoint: format!("http://127.0.0.1:{port}"),
        port,
        handle,
        stop,
    }
}

/// The header of a hand-made upload of `num_values` values: a local release's, or a plain one
/// claiming 100 examples.
pub fn update_header(
    round: u64,
    num_values: usize,
    release: Option<&Release>,
) -> client_message::Body {
    let num_chunks = fl_proto::chunk_count(num_values);
    match release {
        Some(release) => client_message::Body::ReleaseHeader(ReleaseHeader {
            round,
            num_values: num_values as u64,
            num_chunks,
            release: Some(LocalRelease::from(release)),
        }),
        None => client_message::Body::UpdateHeader(UpdateHeader {
            round,
            num_examples: 100,
            num_values: num_values as u64,
            num_chunks,
            train_loss: Some(0.5),
            evaluation: None,
        }),
    }
}

/// A hand-made dense upload: its header, then its chunks.
pub fn dense_upload(
    round: u64,
    values: &[f32],
    release: Option<&Release>,
) -> Vec<client_message::Body> {
    let mut out = vec![update_header(round, values.len(), release)];
    out.extend(fl_proto::encode_chunks(round, values).map(client_message::Body::UpdateChunk));
    out
}
