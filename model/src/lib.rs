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
pub use network::{logits_in, loss_and_grad, loss_and_grad_in, loss_and_step_in};
pub use sequential::{LayerSpec, Sequential, Shape, Workspace};
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

/// A validated network: every constructor checks it, so the passes can trust it. Every network
/// runs as a list of layers ([`Sequential`]); a fully connected one keeps the widths it was
/// stated with, which are how it is shown and sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// The widths (inputs, hidden..., classes) of a network stated as fully connected.
    widths: Option<Vec<usize>>,
    /// The layers every pass runs.
    net: Sequential,
}

/// One weight matrix W and its bias b in the flat parameter vector.
struct Block {
    /// The index in the tensor names: the layer's position in the stated list.
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
    /// A fully connected network with these widths (inputs, hidden..., classes): dense layers
    /// with ReLU between them, Z_l = A_{l-1} W_l + b_l, A_l = ReLU(Z_l), the last Z the logits.
    pub fn new(widths: Vec<usize>) -> Result<Self, ModelError> {
        let refused = || ModelError::BadSizes(widths.clone());
        let (&inputs, outputs) = widths.split_first().ok_or_else(refused)?;
        if outputs.is_empty() || widths.contains(&0) {
            return Err(refused());
        }
        let layers: Vec<LayerSpec> = (outputs.iter())
            .flat_map(|&units| [LayerSpec::Relu, LayerSpec::Dense { units }])
            .skip(1)
            .collect();
        let net = Sequential::new(Shape::flat(inputs), &layers).map_err(|_| refused())?;
        Ok(ModelSpec {
            widths: Some(widths),
            net,
        })
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
            widths: None,
            net: Sequential::new(input, layers).map_err(ModelError::BadLayers)?,
        })
    }

    /// The widths (inputs, hidden..., classes) of a network stated as fully connected.
    pub fn dense_widths(&self) -> Option<&[usize]> {
        self.widths.as_deref()
    }

    /// The layers the network runs.
    pub fn layers(&self) -> &Sequential {
        &self.net
    }

    /// Values per input example.
    pub fn inputs(&self) -> usize {
        self.net.inputs()
    }

    /// Number of classes (output width).
    pub fn classes(&self) -> usize {
        self.net.classes()
    }

    /// Length of the flat parameter vector.
    pub fn num_params(&self) -> usize {
        self.net.num_params()
    }

    /// Every weight matrix and bias, in parameter order. A fully connected network names its
    /// dense layers 0, 1, ... as its widths count them, not counting the ReLUs between.
    fn blocks(&self) -> Vec<Block> {
        (self.net.layers().iter().enumerate())
            .filter(|(_, p)| p.outputs_per_position() > 0)
            .enumerate()
            .map(|(block, (l, p))| Block {
                layer: if self.widths.is_some() { block } else { l },
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
            .collect()
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

/// `784-600-100-10` for a fully connected network; `28x28x1 conv:32:5:pad2 relu ... dense:10`
/// for a list of layers.
impl std::fmt::Display for ModelSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(widths) = &self.widths {
            let widths: Vec<String> = widths.iter().map(usize::to_string).collect();
            return write!(f, "{}", widths.join("-"));
        }
        let i = self.net.layers()[0].input;
        write!(f, "{}x{}x{}", i.height, i.width, i.channels)?;
        (self.net.layers().iter()).try_for_each(|layer| write!(f, " {}", layer.spec))
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
        let second = &spec.layers().layers()[2];
        assert_eq!(second.weight_offset, 784 * 600 + 600);
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
