//! A convolutional network end to end under every privacy mode: each shipped mode's
//! configuration, shrunk to six clients and three rounds, trains a small CNN on image-shaped
//! data, and the released model file names the CNN's tensors; `model.init` starts from a given
//! file and refuses one for another network.

use crate::support;

use fl_datasets::Dataset;
use fl_model::{LayerSpec, ModelSpec, Shape};
use fl_server::config::{ModelKind, RunConfig};
use fl_server::model_file;
use fl_server::output::Summary;
use ndarray::Array2;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const K: usize = 6;
const ROUNDS: u64 = 3;
const IMAGE: Shape = Shape {
    height: 6,
    width: 6,
    channels: 1,
};
const LAYERS: [&str; 4] = ["conv:2:3:pad1", "relu", "maxpool:2", "dense:2"];

/// 6 x 6 images: class 1 bright in the top-left quadrant, class 0 in the bottom-right, with a
/// deterministic speckle; labels alternate.
fn images(n: usize) -> Dataset {
    let features = Array2::from_shape_fn((n, IMAGE.len()), |(i, p)| {
        let (y, x) = (p / IMAGE.width, p % IMAGE.width);
        let lit = if i % 2 == 1 {
            y < 3 && x < 3
        } else {
            y >= 3 && x >= 3
        };
        f32::from(u8::from(lit)) + ((i * 7 + p * 3) % 11) as f32 * 0.03
    });
    let labels = (0..n).map(|i| (i % 2) as u32).collect();
    Dataset::new(features, labels, 2)
        .unwrap()
        .with_shape(IMAGE)
        .unwrap()
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("fl-cnn-{name}-{}", std::process::id()))
}

/// The shipped `configs/{name}.toml`, shrunk to K clients all sampled, three rounds, the small
/// CNN, a fixed seed and its own run folder.
fn shipped(name: &str) -> RunConfig {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../configs/{name}.toml"));
    let mut c = RunConfig::load(&path).unwrap();
    c.server.clients = K;
    c.server.clients_per_round = (K as f64).into();
    c.server.rounds = ROUNDS;
    c.server.round_timeout_secs = 30.0;
    c.server.join_timeout_secs = 30.0;
    c.server.seed = Some(3);
    c.server.out = temp(name);
    c.model.kind = ModelKind::Cnn;
    c.model.layers = LAYERS.iter().map(|s| s.to_string()).collect();
    c.admm.total_examples = Some(K as u64 * 100);
    c
}

/// Runs K honest clients against a server with `config`.
async fn run(config: RunConfig) -> Result<Summary, fl_server::ServerError> {
    let data = Arc::new(images(K * 100));
    let server = support::start_server(config, data.clone(), None, None).await;
    support::spawn_clients(&server.endpoint, &data, K, None);
    tokio::time::timeout(Duration::from_secs(120), server.handle)
        .await
        .expect("server finishes")
        .unwrap()
}

fn small_cnn() -> ModelSpec {
    let layers: Vec<LayerSpec> = LAYERS.iter().map(|s| s.parse().unwrap()).collect();
    ModelSpec::sequential(IMAGE, &layers).unwrap()
}

/// The run's released model, read back as the small CNN's parameters.
fn released(out: &Path) -> Vec<f32> {
    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    model_file::decode(&small_cnn().into(), &bytes).unwrap()
}

async fn trains_under(name: &str) -> Summary {
    let config = shipped(name);
    let out = config.server.out.clone();
    let summary = run(config).await.unwrap();
    assert_eq!(summary.rounds_completed, ROUNDS, "{name}");
    assert!(summary.test_accuracy.is_some_and(f64::is_finite), "{name}");
    assert!(released(&out).iter().all(|v| v.is_finite()), "{name}");
    let _ = std::fs::remove_dir_all(out);
    summary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cnn_trains_without_privacy() {
    let summary = trains_under("quickstart-cnn").await;
    assert!(
        summary.test_accuracy > Some(0.95),
        "{:?}",
        summary.test_accuracy
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cnn_trains_under_central_dp() {
    trains_under("geyer-k100").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cnn_trains_under_secure_aggregation() {
    trains_under("secagg").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cnn_trains_under_local_dp() {
    trains_under("ldp-gaussian").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cnn_trains_under_signds() {
    trains_under("signds").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cnn_trains_under_iadmm() {
    trains_under("iadmm").await;
}

/// A run started from another run's model with a vanishing learning rate releases that model
/// (up to the steps' rounding); a file for another network stops the start, naming the tensor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_init_starts_from_the_file_and_refuses_another_network() {
    let mut first = shipped("quickstart-cnn");
    first.server.out = temp("init-first");
    let first_out = first.server.out.clone();
    run(first).await.unwrap();
    let trained = released(&first_out);

    let mut again = shipped("quickstart-cnn");
    again.server.out = temp("init");
    again.train.learning_rate = 1e-12;
    again.model.init = Some(first_out.join("model.safetensors"));
    let again_out = again.server.out.clone();
    run(again).await.unwrap();
    let restarted = released(&again_out);
    let furthest = (trained.iter().zip(&restarted))
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(furthest < 1e-6, "moved by {furthest}");

    let mut wrong = shipped("quickstart-cnn");
    wrong.server.out = temp("wrong-init");
    wrong.model.layers[0] = "conv:3:3:pad1".into();
    wrong.model.init = Some(first_out.join("model.safetensors"));
    let e = run(wrong).await.unwrap_err().to_string();
    assert!(
        e.contains("model.init") && e.contains("layers.0.weight"),
        "{e}"
    );
    for dir in [first_out, again_out, temp("wrong-init")] {
        let _ = std::fs::remove_dir_all(dir);
    }
}
