//! Under a client-side mechanism the server is the adversary, so nothing but the mechanism's
//! output may leave a client. This test plays the server: a fake curator records every message a
//! real client sends (its Join, its Hello, its upload) through one round of each local mode. Two
//! clients with the same seed but different data must send identical messages in every field but
//! the mechanism's noised payload; and that payload's noise must be what the release claims.
//!
//! The two clients' data also differ in size (600 and 437 examples): the count is part of what
//! is protected. Under `ldp-laplace` too, whose sensitivity and noise come from the round's
//! public numbers (C, eta, B and the steps S), not from the client's count.

use fl_client::{ClientOptions, LocalData, run_client};
use fl_datasets::Dataset;
use fl_proto::v1::federation_server::{Federation, FederationServer};
use fl_proto::v1::{
    ClientMessage, JoinReply, JoinRequest, LocalConfig, LocalPrivacy, ModelSpec, PartitionReply,
    PartitionRequest, RoundTask, ServerMessage, Shutdown, client_message, server_message,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status, Streaming};

const FEATURES: usize = 200;
const CLASSES: usize = 10;
const PARAMS: usize = (FEATURES + 1) * CLASSES;

/// What a client sent the fake curator.
#[derive(Debug, Default)]
struct Recorded {
    joins: Vec<JoinRequest>,
    messages: Vec<ClientMessage>,
}

/// A curator that samples its one client into round 1 with `mechanism`, records everything the
/// client sends, and ends the session once the upload is complete.
struct FakeCurator {
    mechanism: LocalPrivacy,
    recorded: Arc<Mutex<Recorded>>,
}

/// Whether `message` completes an upload of the round.
fn completes_upload(message: &ClientMessage, chunks: &mut u32) -> bool {
    match &message.body {
        Some(client_message::Body::SigndsUpload(_)) => true,
        Some(client_message::Body::ReleaseHeader(h)) => {
            *chunks = h.num_chunks;
            false
        }
        Some(client_message::Body::UpdateHeader(h)) => {
            *chunks = h.num_chunks;
            false
        }
        Some(client_message::Body::UpdateChunk(c)) => c.index + 1 == *chunks,
        Some(client_message::Body::TaskFailed(_)) => true,
        _ => false,
    }
}

#[tonic::async_trait]
impl Federation for FakeCurator {
    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinReply>, Status> {
        self.recorded
            .lock()
            .unwrap()
            .joins
            .push(request.into_inner());
        Ok(Response::new(JoinReply {
            client_id: "1".into(),
            session_key: vec![7; 32],
        }))
    }

    async fn session(
        &self,
        request: Request<Streaming<ClientMessage>>,
    ) -> Result<Response<BoxStream<ServerMessage>>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let recorded = self.recorded.clone();
        let task = RoundTask {
            round: 1,
            model: Some(ModelSpec {
                layer_sizes: vec![FEATURES as u32, CLASSES as u32],
                ..Default::default()
            }),
            config: Some(LocalConfig {
                epochs: 1,
                batch_size: 10,
                learning_rate: 0.1,
                random_shift: 0,
            }),
            num_values: PARAMS as u64,
            num_chunks: fl_proto::chunk_count(PARAMS),
            secagg: None,
            verified: None,
            local_privacy: Some(self.mechanism.clone()),
            admm: None,
            // A curious server asks for evaluation too: a protected upload carries none.
            evaluate: true,
        };
        tokio::spawn(async move {
            let send = |body| ServerMessage { body: Some(body) };
            // Hello first, then the task and the model (all zeros).
            let mut chunks = 0;
            let mut started = false;
            while let Some(Ok(message)) = inbound.next().await {
                let done = completes_upload(&message, &mut chunks);
                recorded.lock().unwrap().messages.push(message);
                if !started {
                    started = true;
                    let _ = tx
                        .send(Ok(send(server_message::Body::Task(task.clone()))))
                        .await;
                    for chunk in fl_proto::encode_chunks(1, &[0.0; PARAMS]) {
                        let _ = tx
                            .send(Ok(send(server_message::Body::ModelChunk(chunk))))
                            .await;
                    }
                }
                if done {
                    let shutdown = Shutdown {
                        round: 1,
                        reason: "recorded".into(),
                        ..Shutdown::default()
                    };
                    let _ = tx
                        .send(Ok(send(server_message::Body::Shutdown(shutdown))))
                        .await;
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn assign_partition(
        &self,
        _request: Request<PartitionRequest>,
    ) -> Result<Response<PartitionReply>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

/// A synthetic dataset of `n` examples, its features drawn with `salt` (different salts give
/// different data).
fn data(n: usize, salt: u64) -> LocalData {
    let features = ndarray::Array2::from_shape_fn((n, FEATURES), |(i, j)| {
        let h = (i as u64 * 7919 + j as u64 * 104_729 + salt * 1_000_003) % 1009;
        h as f32 / 1009.0 - 0.5
    });
    let labels = (0..n)
        .map(|i| ((i as u64 + salt) % CLASSES as u64) as u32)
        .collect();
    let dataset = Dataset::new(features, labels, CLASSES).unwrap();
    LocalData {
        data: Arc::new(dataset),
        indices: (0..n).collect(),
    }
}

/// Runs one real client with seed 1 against a fake curator; returns what it sent.
async fn record(mechanism: LocalPrivacy, local: LocalData) -> Recorded {
    let recorded = Arc::new(Mutex::new(Recorded::default()));
    let curator = FakeCurator {
        mechanism,
        recorded: recorded.clone(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(FederationServer::new(curator))
            .serve_with_incoming(incoming),
    );
    let opts = ClientOptions {
        token: "token".into(),
        name: "site".into(),
        seed: Some(1),
        connect_timeout: Duration::from_secs(10),
        ..ClientOptions::new(&endpoint)
    };
    let report = tokio::time::timeout(Duration::from_secs(60), run_client(opts, local))
        .await
        .expect("the client finishes")
        .expect("the client completes its round");
    assert_eq!(report.rounds_trained, 1);
    server.abort();
    std::mem::take(&mut *recorded.lock().unwrap())
}

/// The upload's values, decoded from its chunks.
fn payload(messages: &[ClientMessage]) -> Vec<f32> {
    messages
        .iter()
        .filter_map(|m| match &m.body {
            Some(client_message::Body::UpdateChunk(c)) => Some(c.data.clone()),
            _ => None,
        })
        .flat_map(|data| {
            data.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `message` with its payload (chunk data, SignDS sign and indices) blanked.
fn without_payload(message: &ClientMessage) -> ClientMessage {
    let mut m = message.clone();
    match &mut m.body {
        Some(client_message::Body::UpdateChunk(c)) => c.data.clear(),
        Some(client_message::Body::SigndsUpload(u)) => {
            u.sign = 0;
            u.indices.clear();
        }
        _ => {}
    }
    m
}

/// Runs both clients of a mode and checks that only the payload differs; returns both records.
async fn differ_only_in_payload(
    mechanism: LocalPrivacy,
    a: LocalData,
    b: LocalData,
) -> (Recorded, Recorded) {
    let (ra, rb) = (
        record(mechanism.clone(), a).await,
        record(mechanism, b).await,
    );
    assert_eq!(ra.joins, rb.joins, "Join requests differ with the data");
    assert_eq!(ra.messages.len(), rb.messages.len());
    for (x, y) in ra.messages.iter().zip(&rb.messages) {
        assert_eq!(
            without_payload(x),
            without_payload(y),
            "a field beside the mechanism's payload differs with the data"
        );
    }
    let uploads = |r: &Recorded| {
        r.messages
            .iter()
            .filter(|m| {
                matches!(
                    m.body,
                    Some(client_message::Body::ReleaseHeader(_))
                        | Some(client_message::Body::SigndsUpload(_))
                )
            })
            .count()
    };
    assert_eq!(uploads(&ra), 1, "one release per client: {:?}", ra.messages);
    (ra, rb)
}

/// The release a record claims.
fn claimed(r: &Recorded) -> fl_proto::v1::LocalRelease {
    r.messages
        .iter()
        .find_map(|m| match &m.body {
            Some(client_message::Body::ReleaseHeader(h)) => h.release.clone(),
            Some(client_message::Body::SigndsUpload(u)) => u.release.clone(),
            _ => None,
        })
        .expect("a release")
}

/// The mechanism `name` with its `parameters`, as a server writes it on the wire.
fn named(name: &str, parameters: &[(&str, f64)]) -> LocalPrivacy {
    LocalPrivacy {
        mechanism: name.into(),
        parameters: parameters.iter().map(|&(k, v)| (k.into(), v)).collect(),
    }
}

/// The root mean square of `values`.
fn rms(values: &[f32]) -> f64 {
    (values.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / values.len() as f64).sqrt()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ldp_gaussian_sends_nothing_but_its_release() {
    let mechanism = named(
        "ldp-gaussian",
        &[("epsilon", 8.0), ("delta", 1e-5), ("clip_bound", 1.0)],
    );
    let (ra, rb) = differ_only_in_payload(mechanism, data(600, 1), data(437, 2)).await;
    let sigma = claimed(&ra).noise;
    for r in [&ra, &rb] {
        let values = payload(&r.messages);
        assert_eq!(values.len(), PARAMS);
        // values = clip(u, C) + N(0, sigma^2): the clipped update adds at most C^2 / d to the
        // mean square, and the sample RMS of d normals is within 5 sqrt(1 / (2d)) of sigma.
        let tolerance = 5.0 * (1.0 / (2.0 * PARAMS as f64)).sqrt() + 1.0 / PARAMS as f64;
        let ratio = rms(&values) / sigma;
        assert!((ratio - 1.0).abs() < tolerance, "noise {ratio} x the claim");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ldp_laplace_sends_nothing_but_its_release() {
    let mechanism = named(
        "ldp-laplace",
        &[("epsilon", 8.0), ("clip_bound", 1.0), ("steps", 3.0)],
    );
    // Different data of different sizes: the header (noise b, sensitivity Delta) is the same.
    let (ra, rb) = differ_only_in_payload(mechanism, data(600, 1), data(437, 2)).await;
    let b = claimed(&ra).noise;
    for r in [&ra, &rb] {
        let values = payload(&r.messages);
        // Laplace(b) has variance 2 b^2 and kurtosis 6: the sample mean square is within
        // 5 sqrt(5 / d) of 2 b^2, relative (the trained update itself is far below the noise).
        let ratio = rms(&values).powi(2) / (2.0 * b * b);
        let tolerance = 5.0 * (5.0 / PARAMS as f64).sqrt();
        assert!(
            (ratio - 1.0).abs() < tolerance,
            "noise variance {ratio} x the claim"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signds_sends_nothing_but_its_release() {
    let mechanism = named("signds", &[("epsilon", 2.0), ("k", 100.0), ("h", 10.0)]);
    let (ra, _) = differ_only_in_payload(mechanism, data(600, 1), data(437, 2)).await;
    let upload = ra
        .messages
        .iter()
        .find_map(|m| match &m.body {
            Some(client_message::Body::SigndsUpload(u)) => Some(u.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(upload.indices.len(), 10);
    assert!(upload.sign == 1 || upload.sign == -1);
}
