//! Helpers shared by the in-process federation tests.

use fl_client::{ClientError, ClientOptions, ClientReport, LocalData, run_client};
use fl_common::data::Dataset;
use fl_common::secagg::PlainInputs;
use fl_server::output::RoundMetrics;
use ndarray::Array2;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

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
            };
            let local = LocalData {
                data: data.clone(),
                indices: (i * 100..(i + 1) * 100).collect(),
            };
            tokio::spawn(run_client(opts, local))
        })
        .collect()
}

/// The lines of a run folder's `metrics.jsonl`.
pub fn read_metrics(out: &Path) -> Vec<RoundMetrics> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
