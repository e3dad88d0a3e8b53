//! Models on the wire: a built-in network's layer list or an external model's tensor shapes,
//! checked when read, and the local training settings.

use crate::v1;
use fl_model::sequential::MAX_LAYERS;
use fl_model::{
    ExternalModel, LayerSpec, LocalConfig, Model, ModelError, ModelSpec, Shape, TensorShape,
};

impl From<&ModelSpec> for v1::ModelSpec {
    fn from(spec: &ModelSpec) -> Self {
        if let Some(widths) = spec.dense_widths() {
            return v1::ModelSpec {
                layer_sizes: widths.iter().map(|&w| w as u32).collect(),
                ..Default::default()
            };
        }
        let layers = spec.layers().layers();
        let input = layers[0].input;
        v1::ModelSpec {
            layer_sizes: Vec::new(),
            input: Some(v1::ImageShape {
                height: input.height as u32,
                width: input.width as u32,
                channels: input.channels as u32,
            }),
            layers: layers.iter().map(|l| l.spec.to_string()).collect(),
            tensors: Vec::new(),
        }
    }
}

impl From<&Model> for v1::ModelSpec {
    fn from(model: &Model) -> Self {
        match model {
            Model::Network(spec) => spec.into(),
            Model::External(external) => v1::ModelSpec {
                tensors: (external.tensors().iter())
                    .map(|t| v1::NamedShape {
                        name: t.name.clone(),
                        shape: t.shape.iter().map(|&d| d as u64).collect(),
                    })
                    .collect(),
                ..Default::default()
            },
        }
    }
}

impl TryFrom<&v1::ModelSpec> for Model {
    type Error = ModelError;

    /// A built-in network as [`ModelSpec`]'s conversion reads it, or an external model's
    /// tensors, validated by [`ExternalModel::new`] (a peer's spec is untrusted).
    fn try_from(wire: &v1::ModelSpec) -> Result<Self, Self::Error> {
        if wire.tensors.is_empty() {
            return ModelSpec::try_from(wire).map(Model::Network);
        }
        let bad = |why: &str| ModelError::BadTensors(why.into());
        if !wire.layer_sizes.is_empty() || !wire.layers.is_empty() || wire.input.is_some() {
            return Err(bad("both tensors and a built-in network"));
        }
        if wire.tensors.len() > fl_model::MAX_TENSORS {
            return Err(bad("too many tensors"));
        }
        let tensors = (wire.tensors.iter())
            .map(|t| {
                let shape = (t.shape.iter())
                    .map(|&d| usize::try_from(d).map_err(|_| bad("a dimension beyond usize")))
                    .collect::<Result<_, _>>()?;
                Ok(TensorShape {
                    name: t.name.clone(),
                    shape,
                })
            })
            .collect::<Result<_, ModelError>>()?;
        ExternalModel::new(tensors).map(Model::External)
    }
}

impl TryFrom<&v1::ModelSpec> for ModelSpec {
    type Error = ModelError;

    /// Validates the architecture as [`ModelSpec::new`] and [`ModelSpec::sequential`] do (a peer's
    /// spec is untrusted).
    fn try_from(wire: &v1::ModelSpec) -> Result<Self, Self::Error> {
        if !wire.tensors.is_empty() {
            return Err(ModelError::BadLayers("an external model's tensors".into()));
        }
        if wire.layers.is_empty() {
            return ModelSpec::new(wire.layer_sizes.iter().map(|&w| w as usize).collect());
        }
        let bad = |why: String| ModelError::BadLayers(why);
        if !wire.layer_sizes.is_empty() {
            return Err(bad("both layer widths and layers".into()));
        }
        if wire.layers.len() > MAX_LAYERS {
            return Err(bad(format!("more than {MAX_LAYERS} layers")));
        }
        let i = wire
            .input
            .ok_or_else(|| bad("layers without an input shape".into()))?;
        let input = Shape {
            height: i.height as usize,
            width: i.width as usize,
            channels: i.channels as usize,
        };
        let layers = (wire.layers.iter().enumerate())
            .map(|(n, text)| {
                text.parse()
                    .map_err(|e| bad(format!("layer {n} ({text:?}): {e}")))
            })
            .collect::<Result<Vec<LayerSpec>, _>>()?;
        ModelSpec::sequential(input, &layers)
    }
}

impl From<LocalConfig> for v1::LocalConfig {
    fn from(c: LocalConfig) -> Self {
        v1::LocalConfig {
            epochs: c.epochs,
            batch_size: c.batch_size,
            learning_rate: c.learning_rate,
            random_shift: c.random_shift,
        }
    }
}

impl From<v1::LocalConfig> for LocalConfig {
    fn from(c: v1::LocalConfig) -> Self {
        LocalConfig {
            epochs: c.epochs,
            batch_size: c.batch_size,
            learning_rate: c.learning_rate,
            random_shift: c.random_shift,
        }
    }
}
