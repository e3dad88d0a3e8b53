//! Helpers shared by the in-process federation tests (each test binary uses some of them).

#![allow(dead_code)]

use fl_client::{ClientError, ClientOptions, ClientPrivacy, ClientReport, LocalData, run_client};
use fl_common::data::Dataset;
use fl_common::secagg::PlainInputs;
use fl_proto::v1::federation_client::FederationClient;
use fl_proto::v1::{ClientMessage, Hello, JoinRequest, ServerMessage, client_message};
use fl_server::output::RoundMetrics;
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
    let slots = Arc::new(tokio::sync::Semaphore::new(2));
    (0..count)
        .map(|i| {
            let opts = ClientOptions {
                endpoint: endpoint.to_string(),
                token: String::new(),
                name: format!("client-{i}"),
                seed: Some(i as u64),
                connect_timeout: Duration::from_secs(10),
                training_slots: slots.clone(),
                oracle: oracle.clone(),
                privacy: ClientPrivacy::default(),
            };
            let local = LocalData {
                data: data.clone(),
                indices: (i * 100..(i + 1) * 100).collect(),
            };
            tokio::spawn(run_client(opts, local))
        })
        .collect()
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
    let mut grpc = FederationClient::connect(endpoint.to_string())
        .await
        .unwrap();
    let joined = grpc
        .join(JoinRequest {
            token: String::new(),
            name: name.into(),
            num_examples: 100,
        })
        .await
        .unwrap()
        .into_inner();
    let id = joined.client_id.parse().unwrap();
    let (tx, rx) = mpsc::channel(64);
    let hello = client_message::Body::Hello(Hello {
        client_id: joined.client_id,
        session_key: joined.session_key,
    });
    tx.send(ClientMessage { body: Some(hello) }).await.unwrap();
    let inbound = grpc
        .session(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (id, tx, inbound)
}

/// The lines of a run folder's `metrics.jsonl`.
pub fn read_metrics(out: &Path) -> Vec<RoundMetrics> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
