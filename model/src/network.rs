//! Forward and backward passes of the fully connected ReLU network over a flat parameter vector.
//!
//! For layer l with input A_{l-1}: Z_l = A_{l-1} W_l + b_l, A_l = ReLU(Z_l), and the last layer's
//! Z_L are the logits. The loss is the mean softmax cross-entropy over the batch. Backward
//! (standard backpropagation): dZ_L = (softmax(Z_L) - onehot(y)) / B; dW_l = A_{l-1}^T dZ_l;
//! db_l = sum over the batch of dZ_l; dZ_{l-1} = (dZ_l W_l^T) * [A_{l-1} > 0].
//!
//! The public passes take any [`ModelSpec`] and hand a list of layers to [`super::sequential`].

use super::pass::{Target, output_delta, prefix, set_len};
use super::sequential::SequentialWorkspace;
use super::{Architecture, Layer, ModelSpec, dense_layers, mat_mul, times_transposed_weights};
use ndarray::{ArrayView2, ArrayViewMut2};

/// Buffers of a forward and backward pass, kept from step to step so that training allocates
/// nothing per batch once the first batch has sized them: each layer's output and the
/// backpropagated deltas dZ_l, dZ_{l-1} and dZ_{l-1}^T (a layer list's in `sequential`).
#[derive(Debug, Default)]
pub struct Workspace {
    layers: Vec<Layer>,
    outs: Vec<Vec<f32>>,
    delta: Vec<f32>,
    prev: Vec<f32>,
    prev_t: Vec<f32>,
    sequential: SequentialWorkspace,
}

/// Writes every layer's output for the batch `x` into `outs`: hidden layers after ReLU, the last
/// one the logits, each row-major (examples x outputs).
fn forward_into(
    layers: &[Layer],
    params: &[f32],
    x: ArrayView2<'_, f32>,
    outs: &mut Vec<Vec<f32>>,
) {
    let rows = x.nrows();
    outs.resize_with(layers.len(), Vec::new);
    for (l, layer) in layers.iter().enumerate() {
        let (done, rest) = outs.split_at_mut(l);
        let input = match l {
            0 => x,
            _ => ArrayView2::from_shape((rows, layers[l - 1].outputs), &done[l - 1][..])
                .expect("outputs sized by the layer"),
        };
        let w = ArrayView2::from_shape(
            (layer.inputs, layer.outputs),
            &params[layer.weight_offset..layer.bias_offset],
        )
        .expect("layer shape matches its slice");
        let b = &params[layer.bias_offset..layer.bias_offset + layer.outputs];
        let out = &mut rest[0];
        out.clear();
        (0..rows).for_each(|_| out.extend_from_slice(b));
        let mut z = ArrayViewMut2::from_shape((rows, layer.outputs), &mut out[..])
            .expect("outputs sized by the layer");
        mat_mul(1.0, &input, &w, 1.0, &mut z);
        if l + 1 < layers.len() {
            z.mapv_inplace(|v| v.max(0.0));
        }
    }
}

/// The logits of the batch `x` (examples x classes), in the workspace.
pub fn logits_in<'w>(
    spec: &ModelSpec,
    params: &[f32],
    x: ArrayView2<'_, f32>,
    workspace: &'w mut Workspace,
) -> ArrayView2<'w, f32> {
    assert_eq!(params.len(), spec.num_params(), "parameter vector length");
    let logits: &[f32] = match spec.architecture() {
        Architecture::Dense(sizes) => {
            let Workspace { layers, outs, .. } = workspace;
            layers.clear();
            layers.extend(dense_layers(sizes));
            forward_into(layers, params, x, outs);
            &outs[layers.len() - 1]
        }
        Architecture::Layers(net) => net.logits(params, x, &mut workspace.sequential),
    };
    ArrayView2::from_shape((x.nrows(), spec.classes()), logits).expect("one row per example")
}

/// Mean cross-entropy loss of the batch (`x`, `y`) and its gradient with respect to `params`,
/// written into `grad` (same length as `params`).
pub fn loss_and_grad(
    spec: &ModelSpec,
    params: &[f32],
    x: ArrayView2<'_, f32>,
    y: &[u32],
    grad: &mut [f32],
) -> f32 {
    loss_and_grad_in(spec, params, x, y, grad, &mut Workspace::default())
}

/// [`loss_and_grad`] with its buffers in `workspace`.
pub fn loss_and_grad_in(
    spec: &ModelSpec,
    params: &[f32],
    x: ArrayView2<'_, f32>,
    y: &[u32],
    grad: &mut [f32],
    workspace: &mut Workspace,
) -> f32 {
    assert_eq!(grad.len(), params.len(), "gradient buffer length");
    match spec.architecture() {
        Architecture::Dense(sizes) => {
            backprop(sizes, Target::Gradient { params, grad }, x, y, workspace)
        }
        Architecture::Layers(net) => {
            net.loss_and_grad(params, x, y, grad, &mut workspace.sequential)
        }
    }
}

/// Mean cross-entropy loss of the batch (`x`, `y`) at `params`, and one SGD step on it,
/// w <- w - eta grad (McMahan et al. 2017, ClientUpdate), fused into the backward pass: each
/// layer's gradient goes straight into its parameters through the matrix product, so no gradient
/// vector is written and read back.
pub fn loss_and_step_in(
    spec: &ModelSpec,
    params: &mut [f32],
    eta: f32,
    x: ArrayView2<'_, f32>,
    y: &[u32],
    workspace: &mut Workspace,
) -> f32 {
    match spec.architecture() {
        Architecture::Dense(sizes) => {
            backprop(sizes, Target::Step { params, eta }, x, y, workspace)
        }
        Architecture::Layers(net) => {
            net.loss_and_step(params, eta, x, y, &mut workspace.sequential)
        }
    }
}

/// The forward pass, the loss, and the backward pass with each layer's gradient sent to `target`.
/// dZ_{l-1} is formed from W_l before W_l's gradient is sent, so a step uses the gradient at the
/// parameters the forward pass saw.
fn backprop(
    sizes: &[usize],
    mut target: Target<'_>,
    x: ArrayView2<'_, f32>,
    y: &[u32],
    workspace: &mut Workspace,
) -> f32 {
    assert_eq!(x.nrows(), y.len(), "one label per example");
    let rows = x.nrows();
    let Workspace {
        layers,
        outs,
        delta,
        prev,
        prev_t,
        ..
    } = workspace;
    layers.clear();
    layers.extend(dense_layers(sizes));
    assert_eq!(
        target.params().len(),
        layers.last().map_or(0, |l| l.bias_offset + l.outputs),
        "parameter vector length"
    );
    forward_into(layers, target.params(), x, outs);
    let last = layers.len() - 1;
    set_len(delta, outs[last].len());
    let loss = output_delta(&outs[last], layers[last].outputs, y, delta);
    for (l, layer) in layers.iter().enumerate().rev() {
        let shape = |l: usize| (rows, layers[l].outputs);
        let dz = ArrayView2::from_shape(shape(l), &delta[..]).expect("delta sized by the layer");
        let input = match l {
            0 => x,
            _ => ArrayView2::from_shape(shape(l - 1), &outs[l - 1][..])
                .expect("outputs sized by the layer"),
        };
        let weights = layer.weight_offset..layer.bias_offset;
        if l > 0 {
            let w = ArrayView2::from_shape(
                (layer.inputs, layer.outputs),
                &target.params()[weights.clone()],
            )
            .expect("layer shape matches its slice");
            // dZ_{l-1} = (dZ_l W_l^T) * [A_{l-1} > 0]
            set_len(prev, rows * layer.inputs);
            let scratch = prefix(prev_t, rows * layer.inputs);
            times_transposed_weights(&dz, &w, scratch, prev);
            // Over the contiguous buffers, branch-free, so that it vectorises.
            for (d, &a) in prev.iter_mut().zip(&outs[l - 1]) {
                *d = if a > 0.0 { *d } else { 0.0 };
            }
        }
        let (dest, alpha, beta) = target.sink();
        let (gw, gb) = dest[weights.start..layer.bias_offset + layer.outputs]
            .split_at_mut(layer.inputs * layer.outputs);
        let mut gw = ArrayViewMut2::from_shape((layer.inputs, layer.outputs), gw)
            .expect("layer shape matches its slice");
        // dW_l = A_{l-1}^T dZ_l
        mat_mul(alpha, &input.t(), &dz, beta, &mut gw);
        // db_l = sum_batch dZ_l
        if beta == 0.0 {
            gb.fill(0.0);
        }
        for row in delta.chunks_exact(layer.outputs) {
            gb.iter_mut().zip(row).for_each(|(g, d)| *g += alpha * d);
        }
        if l > 0 {
            std::mem::swap(delta, prev);
        }
    }
    loss
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A small MLP with biases, its parameters from `seed`, and a batch of 6 examples.
    fn small_problem(seed: u64) -> (ModelSpec, Vec<f32>, Array2<f32>, Vec<u32>) {
        let spec = ModelSpec::mlp(5, &[7, 4], 3).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let params = spec.init(&mut rng);
        let x = Array2::from_shape_fn((6, 5), |_| rng.random_range(-1.0f32..1.0));
        let y: Vec<u32> = (0..6).map(|i| i % 3).collect();
        (spec, params, x, y)
    }

    /// Central finite differences in f64 of the f32 loss, against the analytic gradient, on a
    /// small MLP with biases; every parameter is checked.
    #[test]
    fn backward_matches_finite_differences() {
        let (spec, params, x, y) = small_problem(11);
        let mut grad = vec![0.0; params.len()];
        loss_and_grad(&spec, &params, x.view(), &y, &mut grad);

        let loss_at = |p: &[f32]| {
            let mut g = vec![0.0; p.len()];
            f64::from(loss_and_grad(&spec, p, x.view(), &y, &mut g))
        };
        let worst = crate::gradcheck::worst_relative_error(&params, &grad, loss_at);
        // f32 forward passes: differences of O(1e-7) relative loss over h = 1e-3 give ~1e-3
        // absolute noise; a wrong gradient is off by O(1).
        assert!(worst < 2e-2, "worst relative error {worst}");
    }

    /// A fused step equals the gradient followed by w <- w - eta g.
    #[test]
    fn a_fused_step_equals_gradient_then_update() {
        let (spec, params, x, y) = small_problem(12);
        let eta = 0.3;
        let mut grad = vec![0.0; params.len()];
        let loss = loss_and_grad(&spec, &params, x.view(), &y, &mut grad);
        let mut stepped = params.clone();
        let mut workspace = Workspace::default();
        let fused_loss = loss_and_step_in(&spec, &mut stepped, eta, x.view(), &y, &mut workspace);
        assert_eq!(loss, fused_loss);
        crate::gradcheck::assert_step(&stepped, &params, &grad, eta);
    }

    #[test]
    fn logistic_regression_gradient_has_closed_form() {
        // For one example and zero weights, p is uniform: dW = x (p - onehot)^T.
        let spec = ModelSpec::logistic(2, 2).unwrap();
        let params = vec![0.0; spec.num_params()];
        let x = Array2::from_shape_vec((1, 2), vec![1.0, 2.0]).unwrap();
        let mut grad = vec![0.0; params.len()];
        let loss = loss_and_grad(&spec, &params, x.view(), &[1], &mut grad);
        assert!((loss - std::f32::consts::LN_2).abs() < 1e-6);
        assert_eq!(grad, vec![0.5, -0.5, 1.0, -1.0, 0.5, -0.5]);
    }
}
