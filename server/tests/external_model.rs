//! A model the server does not know (`model.kind = "external"`): its tensors' names and shapes
//! come from the user's `model.init` file, clients train it with their own code, federated
//! evaluation gives its figures, and the run's `model.safetensors` keeps the user's names and
//! shapes.

use crate::support;

use fl_client::{ClientOptions, Evaluation, TrainRequest, Trained, Trainer, run};
use fl_model::Model;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::sync::Arc;
use std::time::Duration;

const K: usize = 3;
const ROUNDS: u64 = 3;

/// The user's starting tensors, written in an order other than the names' byte order.
fn user_tensors() -> Vec<(&'static str, Vec<usize>, Vec<f32>)> {
    vec![
        (
            "fc.weight",
            vec![2, 3],
            (0..6).map(|i| i as f32 / 4.0).collect(),
        ),
        ("conv.bias", vec![2], vec![-1.0, 1.5]),
    ]
}

/// The starting `state_dict` as a safetensors file.
fn write_init(path: &std::path::Path) {
    let tensors = user_tensors();
    let bytes: Vec<Vec<u8>> = (tensors.iter())
        .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views = (tensors.iter().zip(&bytes)).map(|((name, shape, _), b)| {
        (
            *name,
            TensorView::new(Dtype::F32, shape.clone(), b).unwrap(),
        )
    });
    std::fs::write(path, safetensors::tensor::serialize(views, None).unwrap()).unwrap();
}

/// Adds 1 to every weight; reports a fixed evaluation on 10 examples.
struct AddOne;

impl Trainer for AddOne {
    fn train(&self, request: &TrainRequest, global: &[f32]) -> Result<Trained, String> {
        let Model::External(model) = &request.model else {
            return Err("expected an external model".into());
        };
        let names: Vec<&str> = model.tensors().iter().map(|t| t.name.as_str()).collect();
        if names != ["conv.bias", "fc.weight"] {
            return Err(format!("unexpected tensors {names:?}"));
        }
        Ok(Trained {
            weights: global.iter().map(|w| w + 1.0).collect(),
            loss: None,
            examples: 10,
        })
    }

    fn evaluate(&self, _: &Model, _: &[f32]) -> Result<Evaluation, String> {
        Ok(Evaluation {
            loss: 0.25,
            accuracy: 0.5,
            examples: 10,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_model_trains_and_is_written_back_under_the_users_names() {
    let out = std::env::temp_dir().join(format!("fl-external-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let init = out.join("init.safetensors");
    write_init(&init);
    let mut c = support::small_config(&out.join("run"), K, K as f64, ROUNDS);
    c.model.kind = "external".parse().unwrap();
    c.model.init = Some(init);
    c.eval.federated = true;
    // The data is ignored: the server cannot run an external model.
    let server = support::start_server(c, Arc::new(support::blobs(10)), None, None).await;
    let clients: Vec<_> = (0..K)
        .map(|i| {
            let opts = ClientOptions {
                name: format!("add-one-{i}"),
                connect_timeout: Duration::from_secs(10),
                ..ClientOptions::new(&server.endpoint)
            };
            tokio::spawn(run(opts, AddOne))
        })
        .collect();
    let summary = support::finished(server.handle).await;
    for c in clients {
        let report = c.await.unwrap().expect("the client finishes normally");
        assert_eq!((report.rounds_trained, report.tasks_refused), (ROUNDS, 0));
    }
    assert_eq!(summary.rounds_completed, ROUNDS);
    assert_eq!((summary.test_accuracy, summary.test_loss), (None, None));
    assert_eq!(summary.model, "external: 2 tensors, 8 parameters");
    for m in support::read_metrics(&out.join("run")) {
        assert_eq!((m.test_accuracy, m.completed), (None, K), "{m:?}");
        let fed = m.federated_eval.expect("every round is evaluated");
        assert_eq!((fed.clients, fed.examples), (K, 10 * K as u64));
        assert_eq!((fed.accuracy, fed.loss), (0.5, 0.25));
    }
    // Each round's FedAvg of (w + 1) adds 1 exactly (small binary fractions).
    let bytes = std::fs::read(out.join("run/model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    for (name, shape, start) in user_tensors() {
        let view = file.tensor(name).unwrap();
        assert_eq!((view.dtype(), view.shape()), (Dtype::F32, shape.as_slice()));
        let values: Vec<f32> = (view.data().chunks_exact(4))
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let expected: Vec<f32> = start.iter().map(|w| w + ROUNDS as f32).collect();
        assert_eq!(values, expected, "{name}");
    }
    std::fs::remove_dir_all(&out).unwrap();
}

/// The built-in trainer cannot train a model it does not know: it refuses the round, saying so,
/// and the server releases nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_built_in_trainer_refuses_an_external_model() {
    let out = std::env::temp_dir().join(format!("fl-external-sgd-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let init = out.join("init.safetensors");
    write_init(&init);
    let mut c = support::small_config(&out.join("run"), 1, 1.0, 1);
    c.model.kind = "external".parse().unwrap();
    c.model.init = Some(init);
    let data = Arc::new(support::blobs(10));
    let server = support::start_server(c, data.clone(), None, None).await;
    let local = fl_client::LocalData {
        data,
        indices: (0..10).collect(),
    };
    let opts = ClientOptions {
        connect_timeout: Duration::from_secs(10),
        ..ClientOptions::new(&server.endpoint)
    };
    let client = tokio::spawn(run(opts, fl_client::SgdTrainer::new(local)));
    let summary = support::finished(server.handle).await;
    let report = client.await.unwrap().expect("the client finishes normally");
    assert_eq!((report.rounds_trained, report.tasks_refused), (0, 1));
    let reason = report.last_refusal.expect("a reason");
    assert!(
        reason.contains("built-in trainer trains only the built-in models"),
        "{reason}"
    );
    assert_eq!(summary.rounds_completed, 0);
    std::fs::remove_dir_all(&out).unwrap();
}
