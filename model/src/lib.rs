//! Models as flat parameter vectors: the architecture ([`ModelSpec`]), the forward and backward
//! passes, local SGD training, evaluation, and the aggregation of client updates. A [`Model`] is
//! either such a built-in network or an [`ExternalModel`], one the clients' own code trains.
//!
//! A model is a fully connected network with ReLU between layers (two layer widths make
//! multinomial logistic regression), or any list of layers, convolutions included
//! ([`sequential`]). Parameters live in one `Vec<f32>` in a stable order: for each layer `l`
//! with parameters, its weight matrix W_l (row-major, fan-in x outputs), then its bias b_l.
//!
//! **Owns** parameters, training, evaluation, norms and clips ([`norms`]), a checked upload
//! ([`CheckedUpdate`]) and weighted sums. **Imports** fl-datasets (what it trains on) and
//! fl-common (the core budget); nothing of privacy or protocols, which build on it.

#![deny(missing_docs)]

mod aggregate;
mod checked;
mod external;
#[cfg(test)]
mod gradcheck;
mod matmul;
mod network;
pub mod norms;
mod pass;
pub mod sequential;
mod training;

pub use aggregate::add_weighted;
pub use aggregate::{
    ModelFault, UpdateError, WeightedMean, all_finite, apply_update, check_model, subtract_global,
};
pub use checked::CheckedUpdate;
pub use external::{ExternalModel, MAX_DIMS, MAX_NAME_BYTES, MAX_TENSORS, TensorShape};
pub use matmul::{mat_mul, times_transposed_weights};
pub use network::{Workspace, logits_in, loss_and_grad, loss_and_grad_in, loss_and_step_in};
pub use sequential::{LayerSpec, Sequential, Shape};
pub use training::{
    Evaluation, GradientRule, LocalConfig, clipped_gradient_sum, evaluate, train_local,
};

use rand::Rng;
use rand_distr::{Distribution, Uniform};

/// Why a model specification is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelError {
    /// Fewer than two layer widths, a zero width, or too many parameters.
    #[error("invalid layer sizes {0:?}: need inputs, optional hidden widths, classes, all > 0")]
    BadSizes(Vec<usize>),
    /// A convolutional network whose layers do not fit together (the message names the layer).
    #[error("invalid network: {0}")]
    BadLayers(String),
    /// An external model's tensor list that is empty, too large, or badly named or shaped.
    #[error("invalid external model: {0}")]
    BadTensors(String),
}

/// The model a run trains: a built-in network, or one only the clients' code knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Model {
    /// A network the built-in trainer and the server's test evaluation run.
    Network(ModelSpec),
    /// Named tensors the clients train with their own code (`model.kind = "external"`).
    External(ExternalModel),
}

impl Model {
    /// Length of the flat parameter vector.
    pub fn num_params(&self) -> usize {
        match self {
            Model::Network(spec) => spec.num_params(),
            Model::External(model) => model.num_params(),
        }
    }

    /// The built-in network, unless the model is external.
    pub fn network(&self) -> Option<&ModelSpec> {
        match self {
            Model::Network(spec) => Some(spec),
            Model::External(_) => None,
        }
    }

    /// The named tensors of `params`, in order, as (name, shape, values).
    pub fn named_tensors<'a>(&self, params: &'a [f32]) -> Vec<(String, Vec<usize>, &'a [f32])> {
        match self {
            Model::Network(spec) => spec.named_tensors(params),
            Model::External(model) => model.named_tensors(params),
        }
    }
}

/// The network's text, or `external: N tensors, P parameters`.
impl std::fmt::Display for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Model::Network(spec) => spec.fmt(f),
            Model::External(model) => model.fmt(f),
        }
    }
}

impl From<ModelSpec> for Model {
    fn from(spec: ModelSpec) -> Self {
        Model::Network(spec)
    }
}

/// The shape of one dense layer inside the flat parameter vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layer {
    /// Input width.
    pub inputs: usize,
    /// Output width.
    pub outputs: usize,
    /// Offset of W (inputs x outputs, row-major).
    pub weight_offset: usize,
    /// Offset of b (outputs).
    pub bias_offset: usize,
}

/// What a model is: its layers from the input to the class logits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Architecture {
    /// A fully connected ReLU network: widths from inputs through hidden layers to classes.
    Dense(Vec<usize>),
    /// A list of layers (convolutions, pooling, activations, dense), placed after the input's
    /// shape.
    Layers(Sequential),
}

/// A validated architecture: every constructor checks it, so the passes can trust it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    architecture: Architecture,
}

/// One weight matrix W and its bias b in the flat parameter vector.
struct Block {
    /// Position of the layer in the architecture's list.
    layer: usize,
    /// W's shape as it is named: (fan-in, outputs), or (k, k, C_in, C_out) for a convolution.
    shape: Vec<usize>,
    /// Rows of W.
    fan_in: usize,
    weight_offset: usize,
    bias_offset: usize,
    end: usize,
}

/// Largest model accepted: 2^28 parameters (1 GiB of f32), far above anything trained here; it
/// bounds what a peer can make us allocate.
pub const MAX_PARAMS: usize = 1 << 28;

impl ModelSpec {
    /// A fully connected network with these widths (inputs, hidden..., classes).
    pub fn new(layer_sizes: Vec<usize>) -> Result<Self, ModelError> {
        let ok = layer_sizes.len() >= 2
            && layer_sizes.iter().all(|&w| w > 0 && w <= MAX_PARAMS)
            && layer_sizes
                .windows(2)
                .try_fold(0usize, |acc, w| {
                    w[0].checked_mul(w[1])
                        .and_then(|p| p.checked_add(w[1]))
                        .and_then(|p| acc.checked_add(p))
                })
                .is_some_and(|n| n <= MAX_PARAMS);
        if ok {
            Ok(ModelSpec {
                architecture: Architecture::Dense(layer_sizes),
            })
        } else {
            Err(ModelError::BadSizes(layer_sizes))
        }
    }

    /// Multinomial logistic regression.
    pub fn logistic(inputs: usize, classes: usize) -> Result<Self, ModelError> {
        Self::new(vec![inputs, classes])
    }

    /// A multi-layer perceptron with the given hidden widths.
    pub fn mlp(inputs: usize, hidden: &[usize], classes: usize) -> Result<Self, ModelError> {
        let mut sizes = vec![inputs];
        sizes.extend_from_slice(hidden);
        sizes.push(classes);
        Self::new(sizes)
    }

    /// A network of `layers` (convolutional or not) over inputs of shape `input`.
    pub fn sequential(input: Shape, layers: &[LayerSpec]) -> Result<Self, ModelError> {
        Ok(ModelSpec {
            architecture: Architecture::Layers(
                Sequential::new(input, layers).map_err(ModelError::BadLayers)?,
            ),
        })
    }

    /// The architecture.
    pub fn architecture(&self) -> &Architecture {
        &self.architecture
    }

    /// Values per input example.
    pub fn inputs(&self) -> usize {
        match &self.architecture {
            Architecture::Dense(sizes) => sizes[0],
            Architecture::Layers(net) => net.inputs(),
        }
    }

    /// Number of classes (output width).
    pub fn classes(&self) -> usize {
        match &self.architecture {
            Architecture::Dense(sizes) => sizes[sizes.len() - 1],
            Architecture::Layers(net) => net.classes(),
        }
    }

    /// Length of the flat parameter vector.
    pub fn num_params(&self) -> usize {
        match &self.architecture {
            Architecture::Dense(sizes) => sizes.windows(2).map(|w| w[0] * w[1] + w[1]).sum(),
            Architecture::Layers(net) => net.num_params(),
        }
    }

    /// Every weight matrix and bias, in parameter order.
    fn blocks(&self) -> Vec<Block> {
        match &self.architecture {
            Architecture::Dense(sizes) => dense_layers(sizes)
                .enumerate()
                .map(|(l, layer)| Block {
                    layer: l,
                    shape: vec![layer.inputs, layer.outputs],
                    fan_in: layer.inputs,
                    weight_offset: layer.weight_offset,
                    bias_offset: layer.bias_offset,
                    end: layer.bias_offset + layer.outputs,
                })
                .collect(),
            Architecture::Layers(net) => (net.layers().iter().enumerate())
                .filter(|(_, p)| p.outputs_per_position() > 0)
                .map(|(l, p)| Block {
                    layer: l,
                    shape: match p.spec {
                        LayerSpec::Conv { kernel, .. } => {
                            vec![kernel, kernel, p.input.channels, p.output.channels]
                        }
                        _ => vec![p.fan_in(), p.outputs_per_position()],
                    },
                    fan_in: p.fan_in(),
                    weight_offset: p.weight_offset,
                    bias_offset: p.bias_offset,
                    end: p.end(),
                })
                .collect(),
        }
    }

    /// Fresh parameters: He-uniform weights, U(-sqrt(6/n_in), sqrt(6/n_in)) with n_in the fan-in
    /// (He et al. 2015), and zero biases.
    pub fn init(&self, rng: &mut impl Rng) -> Vec<f32> {
        let mut params = vec![0.0f32; self.num_params()];
        for block in self.blocks() {
            let limit = (6.0 / block.fan_in as f32).sqrt();
            let dist = Uniform::new_inclusive(-limit, limit).expect("finite, ordered bounds");
            for p in &mut params[block.weight_offset..block.bias_offset] {
                *p = dist.sample(rng);
            }
        }
        params
    }

    /// The named tensors of `params`, in order, as (name, shape, values): `layers.{l}.weight`
    /// and `layers.{l}.bias`, `l` the layer's position in the architecture's list (for a
    /// convolutional network, counting the layers without parameters too). A dense weight's shape
    /// is (fan-in, outputs), a convolution's (k, k, C_in, C_out), both row-major.
    pub fn named_tensors<'a>(&self, params: &'a [f32]) -> Vec<(String, Vec<usize>, &'a [f32])> {
        self.blocks()
            .into_iter()
            .flat_map(|b| {
                [
                    (
                        format!("layers.{}.weight", b.layer),
                        b.shape,
                        &params[b.weight_offset..b.bias_offset],
                    ),
                    (
                        format!("layers.{}.bias", b.layer),
                        vec![b.end - b.bias_offset],
                        &params[b.bias_offset..b.end],
                    ),
                ]
            })
            .collect()
    }
}

/// The layers of a fully connected network of widths `sizes`, in parameter order.
pub(crate) fn dense_layers(sizes: &[usize]) -> impl Iterator<Item = Layer> + '_ {
    let mut offset = 0;
    sizes.windows(2).map(move |w| {
        let layer = Layer {
            inputs: w[0],
            outputs: w[1],
            weight_offset: offset,
            bias_offset: offset + w[0] * w[1],
        };
        offset += w[0] * w[1] + w[1];
        layer
    })
}

/// `784-600-100-10` for a fully connected network; `28x28x1 conv:32:5:pad2 relu ... dense:10`
/// for a convolutional one.
impl std::fmt::Display for ModelSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.architecture {
            Architecture::Dense(sizes) => {
                let widths: Vec<String> = sizes.iter().map(usize::to_string).collect();
                write!(f, "{}", widths.join("-"))
            }
            Architecture::Layers(net) => {
                let i = net.layers()[0].input;
                write!(f, "{}x{}x{}", i.height, i.width, i.channels)?;
                net.layers()
                    .iter()
                    .try_for_each(|layer| write!(f, " {}", layer.spec))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_mlp_has_the_expected_layout() {
        let spec = ModelSpec::mlp(784, &[600, 100], 10).unwrap();
        assert_eq!(
            spec.num_params(),
            784 * 600 + 600 + 600 * 100 + 100 + 100 * 10 + 10
        );
        let layers: Vec<Layer> = dense_layers(&[784, 600, 100, 10]).collect();
        assert_eq!(layers[1].weight_offset, 784 * 600 + 600);
        assert_eq!(spec.to_string(), "784-600-100-10");
        let params = vec![0.0; spec.num_params()];
        let names: Vec<String> = spec
            .named_tensors(&params)
            .into_iter()
            .map(|t| t.0)
            .collect();
        assert_eq!(names[0], "layers.0.weight");
        assert_eq!(names[5], "layers.2.bias");
    }

    #[test]
    fn refuses_degenerate_and_oversized_specs() {
        assert!(ModelSpec::new(vec![784]).is_err());
        assert!(ModelSpec::new(vec![784, 0, 10]).is_err());
        assert!(ModelSpec::new(vec![1 << 20, 1 << 20]).is_err());
        assert!(ModelSpec::new(vec![usize::MAX, 2]).is_err());
    }
}
