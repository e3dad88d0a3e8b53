//! The run's model before the first round: what it is, its starting weights, and whether the
//! server can evaluate it on a test set.
//!
//! A built-in network's layout comes from `[model]` and the test set's shape and classes; its
//! weights from `model.init` or a fresh draw. An external model (`model.kind = "external"`) is
//! its `model.init` file: the tensors' names and shapes are the model, their values the start.
//! The server cannot run an external model, so it has no test evaluation (federated evaluation,
//! `[eval] federated`, gives its figures).

use crate::config::{ConfigError, RunConfig};
use crate::error::ServerError;
use crate::records::checkpoint::Checkpoint;
use crate::records::model_file;
use fl_datasets::Dataset;
use fl_model::{Evaluation, Model, ModelSpec, evaluate};
use std::path::Path;
use std::sync::Arc;

/// The server's test set and the network it evaluates.
#[derive(Clone)]
pub(crate) struct TestSet {
    spec: ModelSpec,
    data: Arc<Dataset>,
}

impl TestSet {
    /// The test evaluation of `params`.
    pub(crate) fn evaluate(&self, params: &[f32]) -> Evaluation {
        evaluate(&self.spec, params, &self.data)
    }
}

/// What the run starts with.
pub(crate) struct StartingModel {
    /// The model.
    pub model: Model,
    /// The test evaluation, for a built-in network.
    pub test: Option<TestSet>,
    /// Given starting weights (`model.init`), for a run that does not resume.
    pub initial: Option<Vec<f32>>,
}

/// The model `config` describes. `test` is needed for a built-in network and ignored for an
/// external one. A resumed run takes its weights from `checkpoint`, but an external model's
/// layout still from its `model.init` file.
pub(crate) fn starting_model(
    config: &RunConfig,
    test: Option<Arc<Dataset>>,
    checkpoint: Option<&Checkpoint>,
) -> Result<StartingModel, ServerError> {
    let start = model(config, test, checkpoint)?;
    if let Some(c) = checkpoint
        && c.model.len() != start.model.num_params()
    {
        return Err(invalid(format!(
            "the checkpoint holds {} parameters, the model ({}) has {}: was model.init changed?",
            c.model.len(),
            start.model,
            start.model.num_params()
        )));
    }
    Ok(start)
}

/// [`starting_model`] before the check against the checkpoint.
fn model(
    config: &RunConfig,
    test: Option<Arc<Dataset>>,
    checkpoint: Option<&Checkpoint>,
) -> Result<StartingModel, ServerError> {
    let init = config.model.init.as_deref();
    if config.model.is_external() {
        let path =
            init.ok_or_else(|| invalid("model.kind = \"external\" needs model.init".into()))?;
        let bytes = read(path)?;
        let (layout, buffers) =
            model_file::external_layout(&bytes).map_err(|e| refused(path, e))?;
        if !buffers.is_empty() {
            tracing::info!(
                file = %path.display(),
                ?buffers,
                "integer buffers are not parameters: left out of the model, each client keeps its own"
            );
        }
        let model = Model::External(layout);
        let initial = match checkpoint {
            Some(_) => None,
            None => Some(model_file::decode(&model, &bytes).map_err(|e| refused(path, e))?),
        };
        return Ok(StartingModel {
            model,
            test: None,
            initial,
        });
    }
    let data = test.ok_or_else(|| {
        invalid(format!(
            "model.kind = {:?} is a built-in network: the server needs the test set",
            config.model.kind
        ))
    })?;
    let shape = data.example_shape();
    if config.train.random_shift > 0 && shape.height == 1 && shape.width == 1 {
        return Err(invalid(
            "train.random_shift translates images, and the data are flat vectors".into(),
        ));
    }
    let spec = (config.model).spec(shape, data.num_classes())?;
    let model = Model::Network(spec.clone());
    let initial = match (init, checkpoint) {
        (Some(path), None) => {
            Some(model_file::decode(&model, &read(path)?).map_err(|e| refused(path, e))?)
        }
        _ => None,
    };
    Ok(StartingModel {
        model,
        test: Some(TestSet { spec, data }),
        initial,
    })
}

fn invalid(why: String) -> ServerError {
    ServerError::Config(ConfigError::Invalid(why))
}

/// `model.init`'s file refused, and why.
fn refused(path: &Path, why: String) -> ServerError {
    invalid(format!("model.init {}: {why}", path.display()))
}

fn read(path: &Path) -> Result<Vec<u8>, ServerError> {
    std::fs::read(path).map_err(|e| refused(path, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fl_model::Shape;
    use ndarray::Array2;

    /// A random shift needs images: flat test data refuses it, the same data as 2 x 2 images
    /// take it.
    #[test]
    fn a_random_shift_needs_image_data() {
        let mut config = RunConfig::default();
        config.train.random_shift = 1;
        let data = || Dataset::new(Array2::zeros((3, 4)), vec![0, 1, 0], 2).unwrap();
        let flat = starting_model(&config, Some(Arc::new(data())), None);
        assert!(
            flat.as_ref()
                .is_err_and(|e| e.to_string().contains("train.random_shift")),
            "{:?}",
            flat.err()
        );
        let square = Shape {
            height: 2,
            width: 2,
            channels: 1,
        };
        let images = data().with_shape(square).unwrap();
        starting_model(&config, Some(Arc::new(images)), None).unwrap();
    }
}
