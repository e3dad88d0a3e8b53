//! Server optimizers end to end: FedAdam's moments and the average of its iterates survive a
//! SIGKILL of the server and its `--resume`, and an optimizer leaves the privacy ledger as FedAvg
//! writes it.

use crate::procs;
use crate::support;

use fl_client::{ClientOptions, Evaluation, TrainRequest, Trained, Trainer, run};
use fl_model::Model;
use fl_server::checkpoint::Checkpoint;
use fl_server::config::{ModelKind, PrivacyMode, ServerOptimizerKind};
use procs::{start_server, wait};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const ROUNDS: u64 = 8;
const D: usize = 4;
const ETA: f64 = 0.1;
const BETA1: f64 = 0.9;
const BETA2: f64 = 0.99;
const TAU: f64 = 1e-3;
/// beta of the average of the released models.
const DECAY: f64 = 0.5;

/// c_t: what every client adds to the model in round t, so that the round's pseudo-gradient is
/// known in advance whatever happens to the server.
fn c(t: u64) -> [f32; D] {
    [
        0.5,
        -0.25,
        1.0 / t as f32,
        if t.is_multiple_of(2) { 1.0 } else { -1.0 },
    ]
}

/// Adds c_t to the model it receives, once the test allows round t.
struct AddsC {
    allowed: Arc<AtomicU64>,
}

impl Trainer for AddsC {
    fn train(&self, request: &TrainRequest, global: &[f32]) -> Result<Trained, String> {
        while request.round > self.allowed.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(Trained {
            weights: global
                .iter()
                .zip(c(request.round))
                .map(|(w, c)| w + c)
                .collect(),
            loss: None,
            examples: 1,
        })
    }

    fn evaluate(&self, _: &Model, _: &[f32]) -> Result<Evaluation, String> {
        Err("not evaluated".into())
    }
}

/// A FedAdam run of an external 4-parameter model (starting at 0), 2 clients, all per round,
/// averaging its iterates.
fn write_config(dir: &Path) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let zeros = [0u8; 4 * D];
    let view = TensorView::new(Dtype::F32, vec![D], &zeros).unwrap();
    let init = dir.join("init.safetensors");
    std::fs::write(
        &init,
        safetensors::tensor::serialize([("w", view)], None).unwrap(),
    )
    .unwrap();
    let config = dir.join("run.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nclients = 2\nclients_per_round = 2\nrounds = {ROUNDS}\n\
             round_timeout_secs = 30\njoin_timeout_secs = 60\n\
             [model]\nkind = \"external\"\ninit = \"{}\"\n\
             [train]\nserver_optimizer = \"fedadam\"\nserver_learning_rate = {ETA}\n\
             server_momentum = {BETA1}\nserver_beta2 = {BETA2}\nserver_tau = {TAU}\n\
             average_decay = {DECAY}\n",
            init.display()
        ),
    )
    .unwrap();
    config.display().to_string()
}

/// Lines of the run's metrics.jsonl so far.
fn rounds_recorded(run: &Path) -> usize {
    std::fs::read_to_string(run.join("metrics.jsonl")).map_or(0, |m| m.lines().count())
}

/// (m_T, v_T, x_T, a_T) of FedAdam after rounds 1..=T of pseudo-gradients c_t, computed in f64
/// from Reddi et al. 2021, Algorithm 2 (v_{-1} = tau^2), and the average of its iterates (a_1 =
/// x_1, a_t = beta_t a_{t-1} + (1 - beta_t) x_t, beta_t = min(beta, (1 + t) / (10 + t))).
fn fedadam_by_hand() -> [[f64; D]; 4] {
    let (mut m, mut v, mut x, mut a) = ([0.0; D], [TAU * TAU; D], [0.0; D], [0.0; D]);
    for t in 1..=ROUNDS {
        let beta = if t == 1 {
            0.0
        } else {
            DECAY.min((1.0 + t as f64) / (10.0 + t as f64))
        };
        for i in 0..D {
            let delta = f64::from(c(t)[i]);
            m[i] = BETA1 * m[i] + (1.0 - BETA1) * delta;
            v[i] = BETA2 * v[i] + (1.0 - BETA2) * delta * delta;
            x[i] += ETA * m[i] / (v[i].sqrt() + TAU);
            a[i] = beta * a[i] + (1.0 - beta) * x[i];
        }
    }
    [m, v, x, a]
}

/// The parameters of the run's `model.safetensors` (one tensor).
fn written_model(run: &Path) -> Vec<f32> {
    let bytes = std::fs::read(run.join("model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (_, tensor) = file.tensors().pop().unwrap();
    (tensor.data().chunks_exact(4))
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The server is killed (SIGKILL) after a random round from 2 to 7 (its clients are held in the
/// next round, so the kill lands there) and resumed with `--resume` on the same address; the
/// clients reconnect. The final checkpoint's moments and model are
/// FedAdam's over all eight rounds, and the written model is the average of its eight iterates:
/// a resume that lost or re-applied the moments or the average would be off by far more than f32
/// rounding (each step moves a coordinate by about eta = 0.1).
#[test]
fn fedadam_survives_a_kill_and_resume() {
    let base = std::env::temp_dir().join(format!("fl-fedadam-{}", std::process::id()));
    let config = write_config(&base.join("config"));
    let run_dir = base.join("run");
    let out = run_dir.display().to_string();
    let listen = procs::reusable_address();
    let (mut server, addr) = start_server(
        "fedadam",
        &["--config", &config, "--listen", &listen, "--out", &out],
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut rng = StdRng::seed_from_u64(28);
    let recorded = rng.random_range(2..ROUNDS);
    let allowed = Arc::new(AtomicU64::new(recorded));
    let clients: Vec<_> = (0..2)
        .map(|i| {
            let opts = ClientOptions {
                name: format!("adds-c-{i}"),
                connect_timeout: Duration::from_secs(60),
                ..ClientOptions::new(&format!("http://{addr}"))
            };
            let trainer = AddsC {
                allowed: allowed.clone(),
            };
            runtime.spawn(run(opts, trainer))
        })
        .collect();
    // Round `recorded` is checkpointed before its metrics line is written.
    let deadline = Instant::now() + Duration::from_secs(60);
    while rounds_recorded(&run_dir) < recorded as usize {
        assert!(Instant::now() < deadline, "{recorded} rounds not recorded");
        std::thread::sleep(Duration::from_millis(5));
    }
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    let killed_at = Checkpoint::read(&run_dir).unwrap().progress.round;
    assert_eq!(
        killed_at,
        recorded,
        "the clients hold round {}",
        recorded + 1
    );
    allowed.store(ROUNDS, Ordering::SeqCst);
    let mut server = start_server("fedadam-resumed", &["--resume", &out, "--listen", &addr]).0;
    assert!(wait(&mut server, Duration::from_secs(120)).success());
    for client in clients {
        let report = runtime
            .block_on(client)
            .unwrap()
            .expect("the client finishes");
        assert_eq!(report.tasks_refused, 0);
    }
    let checkpoint = Checkpoint::read(&run_dir).unwrap();
    assert_eq!(
        checkpoint.progress.rounds_completed, ROUNDS,
        "killed at {killed_at}"
    );
    let state = checkpoint.strategy_state();
    let tensor = |name: &str| {
        let (_, t) = state.tensors.iter().find(|(n, _)| n == name).unwrap();
        t.clone()
    };
    let [m, v, x, a] = fedadam_by_hand();
    let close = |got: &[f32], want: &[f64], what: &str| {
        for (g, w) in got.iter().zip(want) {
            // f32 storage between rounds: a relative error of a few 1e-7 per round.
            assert!(
                (f64::from(*g) - w).abs() <= 1e-5 * w.abs().max(1e-3),
                "{what} (killed after round {killed_at}): {got:?} vs {want:?}"
            );
        }
    };
    close(&tensor("server_optimizer.m"), &m, "m_T");
    close(&tensor("server_optimizer.v"), &v, "v_T");
    close(&checkpoint.model, &x, "x_T");
    close(&written_model(&run_dir), &a, "a_T");
    std::fs::remove_dir_all(&base).unwrap();
}

/// An optimizer is post-processing of the released aggregate: a central DP run with FedAdam
/// writes the ledger a FedAvg run of the same settings writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_optimizer_leaves_the_ledger_unchanged() {
    let mut ledgers = Vec::new();
    for optimizer in [ServerOptimizerKind::FedAvg, ServerOptimizerKind::FedAdam] {
        let out = std::env::temp_dir().join(format!(
            "fl-opt-ledger-{optimizer:?}-{}",
            std::process::id()
        ));
        let mut c = support::small_config(&out, 4, 2.0, 3);
        c.model.kind = ModelKind::Logistic;
        c.privacy.mode = PrivacyMode::Central;
        c.privacy.noise_multiplier = 1.0.into();
        c.privacy.epsilon = 50.0;
        c.train.server_optimizer = optimizer;
        c.train.server_learning_rate = 0.01.into();
        let data = Arc::new(support::blobs(400));
        let server = support::start_server(c, data.clone(), None, None).await;
        support::spawn_clients(&server.endpoint, &data, 4, None);
        let summary = support::finished(server.handle).await;
        assert_eq!(summary.rounds_completed, 3, "{optimizer:?}");
        let entries = fl_server::ledger::read(&out.join("ledger.jsonl")).unwrap();
        ledgers.push(
            (entries.into_iter())
                .map(|e| (e.round, e.event))
                .collect::<Vec<_>>(),
        );
        std::fs::remove_dir_all(&out).unwrap();
    }
    assert_eq!(ledgers[0].len(), 3);
    assert_eq!(ledgers[0], ledgers[1]);
}
