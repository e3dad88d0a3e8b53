//! Clients that bring their own training code: a `Trainer` written here (a closed-form
//! least-squares fit, no SGD) trains against a real `fl-server` through the client library under
//! each update-level mode, and a mode whose sensitivity needs the built-in trainer's per-example
//! clipping refuses it.

use crate::support;

use fl_client::{ClientOptions, ClientReport, Evaluation, TrainRequest, Trained, Trainer, run};
use fl_datasets::Dataset;
use fl_model::Model;
use fl_server::config::{ModelKind, PrivacyMode, RunConfig};
use fl_server::output::{RoundMetrics, Summary};
use std::sync::Arc;
use std::time::Duration;

const K: usize = 3;
const ROUNDS: u64 = 3;

/// Ridge regression of the one-hot labels (as +-1) on the features and a constant, solved in
/// closed form: theta = (A^T A + lambda I)^-1 A^T Y, read as the logistic model's W and b.
struct LeastSquares {
    data: Dataset,
}

impl LeastSquares {
    /// theta, (features + 1) x classes, row-major: W's rows, then b.
    fn fit(&self, classes: usize) -> Vec<f64> {
        let (n, d) = (self.data.len(), self.data.num_features());
        let p = d + 1;
        let row = |i: usize| {
            let mut a: Vec<f64> = self
                .data
                .rows(i..i + 1)
                .iter()
                .map(|&v| f64::from(v))
                .collect();
            a.push(1.0);
            a
        };
        // [A^T A + lambda I | A^T Y].
        let mut m = vec![vec![0.0; p + classes]; p];
        for i in 0..n {
            let (a, label) = (row(i), self.data.labels()[i] as usize);
            for r in 0..p {
                for c in 0..p {
                    m[r][c] += a[r] * a[c];
                }
                for k in 0..classes {
                    m[r][p + k] += a[r] * if k == label { 1.0 } else { -1.0 };
                }
            }
        }
        (0..p).for_each(|r| m[r][r] += 1e-3);
        gauss_jordan(&mut m, p);
        (0..p)
            .flat_map(|r| (0..classes).map(move |k| (r, k)))
            .map(|(r, k)| m[r][p + k])
            .collect()
    }
}

/// Solves the system in place by Gauss-Jordan elimination with partial pivoting: the columns
/// after the first `p` become the solution.
fn gauss_jordan(m: &mut [Vec<f64>], p: usize) {
    for col in 0..p {
        let pivot = (col..p)
            .max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))
            .unwrap();
        m.swap(col, pivot);
        let lead = m[col][col];
        m[col].iter_mut().for_each(|v| *v /= lead);
        for r in (0..p).filter(|&r| r != col) {
            let factor = m[r][col];
            let pivot_row = m[col].clone();
            m[r].iter_mut()
                .zip(&pivot_row)
                .for_each(|(v, q)| *v -= factor * q);
        }
    }
}

impl Trainer for LeastSquares {
    fn train(&self, request: &TrainRequest, global: &[f32]) -> Result<Trained, String> {
        let network = request.model.network().ok_or("a built-in network only")?;
        let weights: Vec<f32> = (self.fit(network.classes()).iter())
            .map(|&v| v as f32)
            .collect();
        if weights.len() != global.len() {
            return Err(format!("the fit has {} values", weights.len()));
        }
        Ok(Trained {
            weights,
            loss: None,
            examples: self.data.len() as u64,
        })
    }

    fn evaluate(&self, model: &Model, global: &[f32]) -> Result<Evaluation, String> {
        let network = model.network().ok_or("a built-in network only")?;
        let e = fl_model::evaluate(network, global, &self.data);
        Ok(Evaluation {
            loss: e.loss,
            accuracy: e.accuracy,
            examples: self.data.len() as u64,
        })
    }
}

/// K clients of [`LeastSquares`] on blobs against a logistic-regression server in `mode`, 3
/// rounds; returns the run's summary, its metrics lines and the clients' reports.
async fn federate(
    name: &str,
    configure: impl FnOnce(&mut RunConfig),
) -> (Summary, Vec<RoundMetrics>, Vec<ClientReport>) {
    let out = std::env::temp_dir().join(format!("fl-trainer-{name}-{}", std::process::id()));
    let data = support::blobs(100 * K);
    let mut c = RunConfig::default();
    c.server.clients = K;
    c.server.clients_per_round = (K as f64).into();
    c.server.rounds = ROUNDS;
    c.server.round_timeout_secs = 20.0;
    c.server.join_timeout_secs = 20.0;
    c.server.out = out.clone();
    c.model.kind = ModelKind::Logistic;
    configure(&mut c);
    let test = Arc::new(data.clone());
    let server = support::start_server(c, test, None, None).await;
    let clients: Vec<_> = (0..K)
        .map(|i| {
            let mine: Vec<usize> = (i * 100..(i + 1) * 100).collect();
            let trainer = LeastSquares {
                data: data.subset(&mine),
            };
            let opts = ClientOptions {
                name: format!("least-squares-{i}"),
                connect_timeout: Duration::from_secs(10),
                ..ClientOptions::new(&server.endpoint)
            };
            tokio::spawn(run(opts, trainer))
        })
        .collect();
    let summary = support::finished(server.handle).await;
    let mut reports = Vec::new();
    for c in clients {
        reports.push(c.await.unwrap().expect("the client finishes normally"));
    }
    let metrics = support::read_metrics(&out);
    std::fs::remove_dir_all(&out).unwrap();
    (summary, metrics, reports)
}

/// Every round took every client's update, and every client trained every round.
fn assert_every_round_took_every_update(metrics: &[RoundMetrics], reports: &[ClientReport]) {
    assert_eq!(metrics.len() as u64, ROUNDS);
    for m in metrics {
        assert_eq!((m.completed, m.applied), (K, true), "{m:?}");
    }
    for r in reports {
        assert_eq!((r.rounds_trained, r.tasks_refused), (ROUNDS, 0), "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_trainer_trains_without_privacy() {
    let (summary, metrics, reports) = federate("none", |_| {}).await;
    assert_every_round_took_every_update(&metrics, &reports);
    // FedAvg of the clients' least-squares fits separates the blobs.
    assert!(summary.test_accuracy > Some(0.95), "{summary:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_trainer_trains_under_secure_aggregation() {
    let (summary, metrics, reports) =
        federate("secagg", |c| c.privacy.mode = PrivacyMode::SecAgg).await;
    assert_every_round_took_every_update(&metrics, &reports);
    for m in &metrics {
        assert_eq!(m.secagg.as_ref().unwrap().survivors, K, "{m:?}");
    }
    // The sum of the quantised, clipped fits moves the model as FedAvg would.
    assert!(summary.test_accuracy > Some(0.95), "{summary:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_trainer_trains_under_central_dp() {
    let (summary, metrics, reports) = federate("central", |c| {
        c.privacy.mode = PrivacyMode::Central;
        c.privacy.noise_multiplier = 0.5.into();
        c.privacy.epsilon = 50.0;
    })
    .await;
    for r in &reports {
        assert_eq!((r.rounds_trained, r.tasks_refused), (ROUNDS, 0), "{r:?}");
    }
    // Every round is released (central DP), noised and accounted.
    assert!(
        metrics
            .iter()
            .all(|m| m.applied && m.noise_std == Some(0.5))
    );
    assert!(summary.epsilon.is_some_and(|e| e > 0.0 && e <= 50.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_trainer_trains_under_gaussian_local_dp() {
    let (summary, metrics, reports) = federate("ldp", |c| {
        c.privacy.mode = PrivacyMode::Local(fl_privacy::LocalKind::Gaussian)
    })
    .await;
    assert_every_round_took_every_update(&metrics, &reports);
    for r in &reports {
        assert_eq!(r.local_releases, ROUNDS, "{r:?}");
    }
    let local = summary.local_privacy.expect("per-client accounts");
    assert_eq!((local.clients, local.max_releases), (K, ROUNDS));
}

/// The Laplace mechanism's sensitivity assumes per-example L1 clipping inside training, which
/// only the built-in trainer does: a custom trainer refuses every such round, saying why, and
/// the server releases nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_trainer_refuses_ldp_laplace() {
    let (summary, metrics, reports) = federate("laplace", |c| {
        c.privacy.mode = PrivacyMode::Local(fl_privacy::LocalKind::Laplace)
    })
    .await;
    assert_eq!(summary.rounds_completed, 0);
    assert!(metrics.iter().all(|m| m.completed == 0 && !m.applied));
    for r in &reports {
        assert_eq!((r.rounds_trained, r.tasks_refused), (0, ROUNDS), "{r:?}");
        let reason = r.last_refusal.as_deref().unwrap_or_default();
        assert!(
            reason.contains("ldp-laplace") && reason.contains("built-in trainer"),
            "{reason}"
        );
    }
}
