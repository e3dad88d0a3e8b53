//! Models as flat parameter vectors: the architecture ([`ModelSpec`]), the forward and backward
//! passes, local SGD training, evaluation, and the aggregation of client updates.
//!
//! Every model is a fully connected network with ReLU between layers; two layer widths make
//! multinomial logistic regression. Parameters live in one `Vec<f32>` in a stable order: for each
//! layer `l`, its weight matrix W_l (row-major, inputs x outputs), then its bias b_l.

mod aggregate;
pub mod cnn;
#[cfg(test)]
mod gradcheck;
mod matmul;
mod network;
mod training;

pub use aggregate::{
    ModelFault, UpdateError, WeightedMean, apply_update, check_model, check_update,
};
pub use matmul::mat_mul;
pub use network::{Workspace, forward, loss_and_grad, loss_and_grad_in, loss_and_step_in};
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

/// Architecture of a fully connected ReLU network: widths from inputs through hidden layers to
/// classes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ModelSpec {
    layer_sizes: Vec<usize>,
}

/// Largest model accepted: 2^28 parameters (1 GiB of f32), far above anything trained here; it
/// bounds what a peer can make us allocate.
pub const MAX_PARAMS: usize = 1 << 28;

impl ModelSpec {
    /// A network with these widths (inputs, hidden..., classes).
    pub fn new(layer_sizes: Vec<usize>) -> Result<Self, ModelError> {
        let spec = ModelSpec {
            layer_sizes: layer_sizes.clone(),
        };
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
            Ok(spec)
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

    /// The widths, inputs first.
    pub fn layer_sizes(&self) -> &[usize] {
        &self.layer_sizes
    }

    /// Input width.
    pub fn inputs(&self) -> usize {
        self.layer_sizes[0]
    }

    /// Number of classes (output width).
    pub fn classes(&self) -> usize {
        *self.layer_sizes.last().expect("at least two widths")
    }

    /// The layers in parameter order.
    pub fn layers(&self) -> Vec<Layer> {
        self.layer_iter().collect()
    }

    /// The layers in parameter order, without allocating.
    pub(crate) fn layer_iter(&self) -> impl Iterator<Item = Layer> + '_ {
        let mut offset = 0;
        self.layer_sizes.windows(2).map(move |w| {
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

    /// Length of the flat parameter vector.
    pub fn num_params(&self) -> usize {
        self.layer_sizes
            .windows(2)
            .map(|w| w[0] * w[1] + w[1])
            .sum()
    }

    /// Fresh parameters: He-uniform weights, U(-sqrt(6/n_in), sqrt(6/n_in)) (He et al. 2015),
    /// and zero biases.
    pub fn init(&self, rng: &mut impl Rng) -> Vec<f32> {
        let mut params = vec![0.0f32; self.num_params()];
        for layer in self.layers() {
            let limit = (6.0 / layer.inputs as f32).sqrt();
            let dist = Uniform::new_inclusive(-limit, limit).expect("finite, ordered bounds");
            for p in &mut params[layer.weight_offset..layer.bias_offset] {
                *p = dist.sample(rng);
            }
        }
        params
    }

    /// The named tensors of `params`, in order, as (name, shape, values); names follow the
    /// `layers.{l}.weight` / `layers.{l}.bias` convention.
    pub fn named_tensors<'a>(&self, params: &'a [f32]) -> Vec<(String, Vec<usize>, &'a [f32])> {
        self.layers()
            .iter()
            .enumerate()
            .flat_map(|(l, layer)| {
                [
                    (
                        format!("layers.{l}.weight"),
                        vec![layer.inputs, layer.outputs],
                        &params[layer.weight_offset..layer.bias_offset],
                    ),
                    (
                        format!("layers.{l}.bias"),
                        vec![layer.outputs],
                        &params[layer.bias_offset..layer.bias_offset + layer.outputs],
                    ),
                ]
            })
            .collect()
    }
}

impl std::fmt::Display for ModelSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let widths: Vec<String> = self.layer_sizes.iter().map(usize::to_string).collect();
        write!(f, "{}", widths.join("-"))
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
        let layers = spec.layers();
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
