//! A [`Trainer`] that is a Python callable: `train(weights, config)` returns the new flat
//! float32 weights (or `(weights, loss)`), `evaluate(weights)` returns `(loss, accuracy, n)`.
//! What it returns is only checked for shape and type here; the library computes the update,
//! checks it is finite and as long as the model, and protects it.

use fl_client::{Evaluation, TrainRequest, Trained, Trainer};
use fl_model::Model;
use numpy::{AllowTypeChange, PyArray1, PyArrayLike1};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// The user's training code.
pub(crate) struct PyTrainer {
    /// `train(weights: np.ndarray, config: dict) -> np.ndarray | (np.ndarray, float)`.
    pub train: Py<PyAny>,
    /// `evaluate(weights: np.ndarray) -> (loss, accuracy, n)`, if given.
    pub evaluate: Option<Py<PyAny>>,
    /// n_k: the examples `train` trains on (the update's FedAvg weight, for a trusted curator).
    pub examples: u64,
}

impl Trainer for PyTrainer {
    fn train(&self, request: &TrainRequest, global: &[f32]) -> Result<Trained, String> {
        Python::attach(|py| {
            let config = config(py, request, global.len()).map_err(|e| described(py, e))?;
            let weights = PyArray1::from_slice(py, global);
            let out = (self.train.bind(py).call1((weights, config)))
                .map_err(|e| format!("train raised {}", described(py, e)))?;
            let (weights, loss) = trained(&out).map_err(|e| described(py, e))?;
            Ok(Trained {
                weights,
                loss,
                examples: self.examples,
            })
        })
    }

    fn evaluate(&self, _model: &Model, global: &[f32]) -> Result<Evaluation, String> {
        let Some(evaluate) = &self.evaluate else {
            return Err("this client was started without an evaluate function".into());
        };
        Python::attach(|py| {
            let weights = PyArray1::from_slice(py, global);
            let out = (evaluate.bind(py).call1((weights,)))
                .map_err(|e| format!("evaluate raised {}", described(py, e)))?;
            let (loss, accuracy, examples): (f64, f64, u64) = out.extract().map_err(|_| {
                "evaluate must return (loss: float, accuracy: float, n: int)".to_string()
            })?;
            Ok(Evaluation {
                loss,
                accuracy,
                examples,
            })
        })
    }
}

/// The `config` dict `train` receives: the round t, E, B, eta, the random shift s of training
/// images the server asks for (0: none), a seed for the order of local examples, the model's
/// description and its parameter count.
fn config<'py>(
    py: Python<'py>,
    request: &TrainRequest,
    num_params: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let c = PyDict::new(py);
    c.set_item("round", request.round)?;
    c.set_item("epochs", request.config.epochs)?;
    c.set_item("batch_size", request.config.batch_size)?;
    c.set_item("learning_rate", request.config.learning_rate)?;
    c.set_item("random_shift", request.config.random_shift)?;
    c.set_item("seed", request.seed)?;
    c.set_item("model", request.model.to_string())?;
    c.set_item("num_params", num_params)?;
    Ok(c)
}

/// The weights (and loss, if given) `train` returned.
fn trained(out: &Bound<'_, PyAny>) -> PyResult<(Vec<f32>, Option<f32>)> {
    let (weights, loss) = match out.cast::<PyTuple>() {
        Ok(pair) if pair.len() == 2 => (pair.get_item(0)?, Some(pair.get_item(1)?.extract()?)),
        _ => (out.clone(), None),
    };
    let flat: PyArrayLike1<'_, f32, AllowTypeChange> = weights.extract().map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err(
            "train must return the new weights as a flat (1-D) float32 array, or (weights, loss)",
        )
    })?;
    let values = flat.as_array().iter().copied().collect();
    Ok((values, loss))
}

/// A Python exception as one line for the server and the client's report; its traceback goes to
/// stderr, where the user looks for it.
fn described(py: Python<'_>, e: PyErr) -> String {
    let line = format!("{}: {}", type_name(py, &e), e.value(py));
    e.print(py);
    line
}

/// The exception's class name.
fn type_name(py: Python<'_>, e: &PyErr) -> String {
    (e.get_type(py).name())
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".into())
}
