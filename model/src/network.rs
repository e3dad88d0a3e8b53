//! The passes of any [`ModelSpec`], which all run its list of layers ([`super::sequential`]).
//!
//! For a fully connected network, layer l with input A_{l-1} computes Z_l = A_{l-1} W_l + b_l,
//! A_l = ReLU(Z_l), and the last layer's Z_L are the logits. The loss is the mean softmax
//! cross-entropy over the batch. Backward (standard backpropagation): dZ_L = (softmax(Z_L) -
//! onehot(y)) / B; dW_l = A_{l-1}^T dZ_l; db_l = sum over the batch of dZ_l; dZ_{l-1} =
//! (dZ_l W_l^T) * [A_{l-1} > 0].

use super::{ModelSpec, Workspace};
use ndarray::ArrayView2;

/// The logits of the batch `x` (examples x classes), in the workspace.
pub fn logits_in<'w>(
    spec: &ModelSpec,
    params: &[f32],
    x: ArrayView2<'_, f32>,
    workspace: &'w mut Workspace,
) -> ArrayView2<'w, f32> {
    let logits = spec.layers().logits(params, x, workspace);
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
    spec.layers().loss_and_grad(params, x, y, grad, workspace)
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
    spec.layers().loss_and_step(params, eta, x, y, workspace)
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
