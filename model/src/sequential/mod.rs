//! Networks given as a list of layers over the flat parameter vector: 2-D convolution (stride,
//! padding), max pooling, ReLU, tanh, flatten and dense layers, with their forward and backward
//! passes. The convolutional networks (FedAvg's CNN, LeNet-5) are such lists.
//!
//! Activations are stored per example height-major with channels last (HWC), so a batch of B
//! examples at a layer is a (B * H * W) x C matrix. A convolution is then a dense layer over
//! patches (im2col): row (b, y, x) of the patch matrix P holds the k x k x C_in window whose
//! top-left corner is (y s - p, x s - p), zeros outside the input, and Z = P W + b with W of
//! shape (k k C_in) x C_out; its backward pass is dW = P^T dZ, db = sum_rows dZ, dP = dZ W^T,
//! and col2im adds each row of dP back onto the window it came from. Every product goes through
//! [`mat_mul`] (the `gemm` crate), a block of examples at a time, each block's P formed just
//! before its product (again for dW), so that it is read back from cache. Max pooling keeps the position of each window's maximum and
//! routes the gradient there. The last layer's outputs are the logits; the loss is the mean
//! softmax cross-entropy, as for the fully connected networks.
//!
//! Why by hand: measured against candle 0.9.1 on CPU (`candle-nn`'s conv2d, max_pool2d and
//! linear with its autograd and SGD) on one epoch of the FedAvg CNN's training steps, 600
//! examples, one core (`scripts/cnn-kernels`, run as its doc comment says; 2-core Xeon with
//! AVX-512): these layers took 0.575 s at B = 10 and 0.717 s at B = 50, candle 5.901 s and
//! 4.391 s. `cargo bench -p fl-model --bench cnn` puts the epoch at 86% (B = 10) and 90%
//! (B = 50) of the rate of its matrix products alone on a 2-core AMD EPYC with AVX-512
//! (2026-11-26; 78% and 83% on a 2-core Intel Xeon before im2col's one-channel path; current
//! figures in docs/src/results/speed.md, "Training kernels"). Both multiply by gemm; candle's backward pass of a convolution (a transposed convolution) is where it loses.
//! burn was not measured. The passes here also take the flat parameter vector and the fused SGD
//! step the rest of the code uses.
//!
//! Parameters lie in layer order: for each convolution or dense layer, W (row-major, fan-in x
//! outputs; a convolution's rows ordered by kernel row, kernel column, input channel), then b.

mod kernels;
mod layers;

pub use layers::{LayerSpec, MAX_ACTIVATIONS, MAX_LAYERS, Placed, Shape, place};

use super::pass::{Target, output_delta, prefix, set_len};
use super::{mat_mul, times_transposed_weights};
use ndarray::{ArrayView2, ArrayViewMut2};
use std::ops::Range;

/// McMahan et al. 2017's CNN for MNIST (Section 3): two 5x5 convolutions of 32 and 64 channels,
/// each followed by 2x2 max pooling, a 512-unit dense layer with ReLU, and the logits; 1,663,370
/// parameters on 28 x 28 x 1 inputs.
pub const FEDAVG_CNN: [&str; 9] = [
    "conv:32:5:pad2",
    "relu",
    "maxpool:2",
    "conv:64:5:pad2",
    "relu",
    "maxpool:2",
    "dense:512",
    "relu",
    "dense:10",
];

/// LeNet-5 (LeCun et al. 1998) as MindSpore Federated's LeNet trains it: 5x5 convolutions of 6
/// and 16 channels, each followed by ReLU and 2x2 max pooling, dense layers of 120 and 84 with
/// ReLU, and the logits. The first convolution pads by 2, so a 28 x 28 MNIST digit meets the
/// network as the original's 32 x 32 input does (16 x 5 x 5 values into the first dense layer);
/// 61,706 parameters.
pub const LENET5: [&str; 11] = [
    "conv:6:5:pad2",
    "relu",
    "maxpool:2",
    "conv:16:5",
    "relu",
    "maxpool:2",
    "dense:120",
    "relu",
    "dense:84",
    "relu",
    "dense:10",
];

/// A convolutional network: its layers placed after the input's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequential {
    /// The layers as stated.
    layers: Vec<Placed>,
    /// The layers as run: the same but for each ReLU before max pooling, run after it
    /// ([`pool_before_relu`]).
    steps: Vec<Placed>,
}

/// Buffers of a forward and backward pass, kept from step to step: each layer's output, a block
/// of a convolution's patch matrix, each pooling layer's argmax positions, and the deltas.
#[derive(Debug, Default)]
pub struct Workspace {
    outs: Vec<Vec<f32>>,
    patches: Vec<f32>,
    argmax: Vec<Vec<u32>>,
    delta: Vec<f32>,
    prev: Vec<f32>,
    scratch: Vec<f32>,
}

impl Sequential {
    /// `layers` after an input of shape `input`; the last layer must be dense (the logits).
    pub fn new(input: Shape, layers: &[LayerSpec]) -> Result<Self, String> {
        // The stated layers first, so that a refusal names the layer where the user wrote it;
        // the steps then place too (ReLU keeps its input's shape, and pooling first makes the
        // activations smaller).
        let steps = pool_before_relu(layers);
        let layers = place(input, layers)?;
        let steps = place(input, &steps)?;
        match layers.last() {
            Some(last) if matches!(last.spec, LayerSpec::Dense { .. }) => {
                Ok(Self { layers, steps })
            }
            _ => Err("the last layer must be dense: its outputs are the class logits".into()),
        }
    }

    /// The placed layers, in order.
    pub fn layers(&self) -> &[Placed] {
        &self.layers
    }

    /// Length of the flat parameter vector.
    pub fn num_params(&self) -> usize {
        self.layers.last().map_or(0, Placed::end)
    }

    /// Values per input example.
    pub fn inputs(&self) -> usize {
        self.layers[0].input.len()
    }

    /// Number of classes.
    pub fn classes(&self) -> usize {
        self.layers[self.layers.len() - 1].output.len()
    }

    /// The logits of the batch `x` (examples x classes, row-major), in the workspace.
    pub fn logits<'w>(
        &self,
        params: &[f32],
        x: ArrayView2<'_, f32>,
        ws: &'w mut Workspace,
    ) -> &'w [f32] {
        assert_eq!(params.len(), self.num_params(), "parameter vector length");
        self.forward(params, x, ws);
        &ws.outs[self.steps.len() - 1]
    }

    /// Values one example keeps over a pass: every layer's output and patch matrix.
    pub fn values_per_example(&self) -> usize {
        self.layers.iter().map(Placed::values_per_example).sum()
    }

    /// Mean cross-entropy of the batch (`x`, `y`) and its gradient with respect to `params`,
    /// written into `grad`.
    pub fn loss_and_grad(
        &self,
        params: &[f32],
        x: ArrayView2<'_, f32>,
        y: &[u32],
        grad: &mut [f32],
        ws: &mut Workspace,
    ) -> f32 {
        assert_eq!(grad.len(), params.len(), "gradient buffer length");
        self.backprop(Target::Gradient { params, grad }, x, y, ws)
    }

    /// Mean cross-entropy of the batch at `params`, and one SGD step w <- w - eta grad on it
    /// (McMahan et al. 2017, ClientUpdate), fused into the backward pass as for the MLP.
    pub fn loss_and_step(
        &self,
        params: &mut [f32],
        eta: f32,
        x: ArrayView2<'_, f32>,
        y: &[u32],
        ws: &mut Workspace,
    ) -> f32 {
        self.backprop(Target::Step { params, eta }, x, y, ws)
    }

    /// Writes every layer's output for the batch `x` into the workspace.
    fn forward(&self, params: &[f32], x: ArrayView2<'_, f32>, ws: &mut Workspace) {
        assert_eq!(x.ncols(), self.inputs(), "input width");
        let batch = x.nrows();
        let n = self.steps.len();
        ws.outs.resize_with(n, Vec::new);
        ws.argmax.resize_with(n, Vec::new);
        let x = x.as_standard_layout();
        for (l, layer) in self.steps.iter().enumerate() {
            let (done, rest) = ws.outs.split_at_mut(l);
            let input: &[f32] = match l {
                0 => x.as_slice().expect("standard layout"),
                _ => &done[l - 1],
            };
            let out = &mut rest[0];
            set_len(out, batch * layer.output.len());
            match layer.spec {
                LayerSpec::Conv { .. } => {
                    let (ins, outs) = (layer.input.len(), layer.output.len());
                    for block in blocks(layer, batch) {
                        let patches = block_patches(
                            layer,
                            &block,
                            &input[ins * block.start..],
                            &mut ws.patches,
                        );
                        affine(
                            layer,
                            params,
                            patches,
                            &mut out[outs * block.start..outs * block.end],
                        );
                    }
                }
                LayerSpec::Dense { .. } => affine(layer, params, input, out),
                LayerSpec::Relu => kernels::relu(input, out),
                LayerSpec::Tanh => kernels::tanh(input, out),
                LayerSpec::MaxPool { size } => {
                    kernels::max_pool(layer, size, batch, input, out, &mut ws.argmax[l]);
                }
                LayerSpec::Flatten => out.copy_from_slice(input),
            }
        }
    }

    /// The forward pass, the loss, and the backward pass with each layer's gradient sent to
    /// `target`; dA_{l-1} is formed from W_l before W_l's gradient is sent.
    fn backprop(
        &self,
        mut target: Target<'_>,
        x: ArrayView2<'_, f32>,
        y: &[u32],
        ws: &mut Workspace,
    ) -> f32 {
        assert_eq!(x.nrows(), y.len(), "one label per example");
        assert_eq!(
            target.params().len(),
            self.num_params(),
            "parameter vector length"
        );
        let batch = x.nrows();
        self.forward(target.params(), x, ws);
        let x = x.as_standard_layout();
        let logits = &ws.outs[self.steps.len() - 1];
        // `delta` and `prev` take turns as dZ_l and dA_{l-1}, each used up to its layer's
        // length (`delta_len`, `prev_len`) and never shrunk.
        let mut delta_len = logits.len();
        let loss = output_delta(logits, self.classes(), y, prefix(&mut ws.delta, delta_len));
        for (l, layer) in self.steps.iter().enumerate().rev() {
            let input: &[f32] = match l {
                0 => x.as_slice().expect("standard layout"),
                _ => &ws.outs[l - 1],
            };
            let wants_prev = l > 0;
            let prev_len = batch * layer.input.len();
            let prev = prefix(&mut ws.prev, prev_len);
            let delta = &ws.delta[..delta_len];
            match layer.spec {
                LayerSpec::Conv { .. } => {
                    let prev = wants_prev.then_some(prev);
                    conv_backward(
                        layer,
                        &mut target,
                        input,
                        delta,
                        prev,
                        &mut ws.patches,
                        &mut ws.scratch,
                    );
                }
                LayerSpec::Dense { .. } => {
                    if wants_prev {
                        let params = target.params();
                        dense_input_delta(layer, params, delta, &mut ws.scratch, prev);
                    }
                    send_gradient(layer, &mut target, input, delta);
                }
                LayerSpec::Relu => kernels::relu_backward(delta, &ws.outs[l], prev),
                LayerSpec::Tanh => kernels::tanh_backward(delta, &ws.outs[l], prev),
                LayerSpec::MaxPool { .. } => {
                    prev.fill(0.0);
                    let out = layer.output.len();
                    let examples = delta.chunks_exact(out).zip(ws.argmax[l].chunks_exact(out));
                    for (prev, (delta, argmax)) in
                        prev.chunks_exact_mut(layer.input.len()).zip(examples)
                    {
                        for (&d, &at) in delta.iter().zip(argmax) {
                            prev[at as usize] += d;
                        }
                    }
                }
                LayerSpec::Flatten => prev.copy_from_slice(delta),
            }
            std::mem::swap(&mut ws.delta, &mut ws.prev);
            delta_len = prev_len;
        }
        loss
    }
}

/// `layers` with each ReLU that comes just before max pooling moved after it: relu(max(z)) =
/// max(relu(z)) because ReLU never reorders values, and the gradients agree as well (when the
/// window's maximum is positive both send it to the same first maximal position; when it is not,
/// both send nothing), so the network computes what it states on a quarter of the values for
/// 2 x 2 pooling. Tanh is not moved: it rounds distinct inputs to equal outputs, and pooling's
/// tie-break would then pick differently.
fn pool_before_relu(layers: &[LayerSpec]) -> Vec<LayerSpec> {
    let mut steps = layers.to_vec();
    for i in 1..steps.len() {
        if let (LayerSpec::Relu, LayerSpec::MaxPool { .. }) = (steps[i - 1], steps[i]) {
            steps.swap(i - 1, i);
        }
    }
    steps
}

/// W and b of a layer with parameters, W as fan-in x outputs.
fn weights<'a>(layer: &Placed, params: &'a [f32]) -> (ArrayView2<'a, f32>, &'a [f32]) {
    let w = ArrayView2::from_shape(
        (layer.fan_in(), layer.outputs_per_position()),
        &params[layer.weight_offset..layer.bias_offset],
    )
    .expect("layer shape matches its slice");
    (w, &params[layer.bias_offset..layer.end()])
}

/// out = input W + b, `input` holding one row of fan-in values per output position.
fn affine(layer: &Placed, params: &[f32], input: &[f32], out: &mut [f32]) {
    let (w, b) = weights(layer, params);
    let rows = input.len() / layer.fan_in();
    let a = ArrayView2::from_shape((rows, layer.fan_in()), input).expect("rows of fan-in");
    for row in out.chunks_exact_mut(b.len()) {
        row.copy_from_slice(b);
    }
    let mut z = ArrayViewMut2::from_shape((rows, b.len()), out).expect("rows of outputs");
    mat_mul(1.0, &a, &w, 1.0, &mut z);
}

/// The delta of a convolution's patch rows: dP = dZ W^T.
fn patch_delta(layer: &Placed, params: &[f32], dz: &[f32], da: &mut [f32]) {
    let (w, b) = weights(layer, params);
    let rows = dz.len() / b.len();
    let dz = ArrayView2::from_shape((rows, b.len()), dz).expect("rows of outputs");
    let mut da = ArrayViewMut2::from_shape((rows, layer.fan_in()), da).expect("rows of fan-in");
    mat_mul(1.0, &dz, &w.t(), 0.0, &mut da);
}

/// The delta of a dense layer's inputs, dA = dZ W^T (batch x fan-in).
fn dense_input_delta(
    layer: &Placed,
    params: &[f32],
    dz: &[f32],
    scratch: &mut Vec<f32>,
    da: &mut [f32],
) {
    let (w, b) = weights(layer, params);
    let (rows, fan_in) = (dz.len() / b.len(), layer.fan_in());
    let dz = ArrayView2::from_shape((rows, b.len()), dz).expect("rows of outputs");
    times_transposed_weights(&dz, &w, prefix(scratch, rows * fan_in), da);
}

/// Sends an affine layer's gradient to `target`: dW = A^T dZ, db = sum_rows dZ.
fn send_gradient(layer: &Placed, target: &mut Target<'_>, input: &[f32], dz: &[f32]) {
    send_weight_gradient(layer, target, input, dz, true);
    send_bias_gradient(layer, target, dz);
}

/// Sends dW = A^T dZ over rows of A and dZ; for a later block of rows (`first` false) its share
/// adds to what the earlier blocks sent.
fn send_weight_gradient(
    layer: &Placed,
    target: &mut Target<'_>,
    input: &[f32],
    dz: &[f32],
    first: bool,
) {
    let (fan_in, outputs) = (layer.fan_in(), layer.outputs_per_position());
    let rows = dz.len() / outputs;
    let a = ArrayView2::from_shape((rows, fan_in), input).expect("rows of fan-in");
    let dz = ArrayView2::from_shape((rows, outputs), dz).expect("rows of outputs");
    let (dest, alpha, beta) = target.sink();
    let beta = if first { beta } else { 1.0 };
    let gw = &mut dest[layer.weight_offset..layer.bias_offset];
    let mut gw = ArrayViewMut2::from_shape((fan_in, outputs), gw).expect("layer's weights");
    mat_mul(alpha, &a.t(), &dz, beta, &mut gw);
}

/// Sends db = sum_rows dZ.
fn send_bias_gradient(layer: &Placed, target: &mut Target<'_>, dz: &[f32]) {
    let (dest, alpha, beta) = target.sink();
    let gb = &mut dest[layer.bias_offset..layer.end()];
    if beta == 0.0 {
        gb.fill(0.0);
    }
    for row in dz.chunks_exact(gb.len()) {
        gb.iter_mut().zip(row).for_each(|(g, d)| *g += alpha * d);
    }
}

/// Patch values per block of a convolution's products (512 KiB of f32): a block is as many whole
/// examples as fit, at least one. Formed just before its product, a block's patch rows are read
/// back from the core's cache; the whole batch's (31 MB for the FedAvg CNN's second convolution
/// at B = 50) went out to memory and back.
const BLOCK_VALUES: usize = 1 << 17;

/// The values of a convolution's patch matrix for `examples` examples: a row of fan-in values per
/// output position.
fn patch_values(layer: &Placed, examples: usize) -> usize {
    examples * layer.output.height * layer.output.width * layer.fan_in()
}

/// The batch's examples in blocks for a convolution's products.
fn blocks(layer: &Placed, batch: usize) -> impl Iterator<Item = Range<usize>> {
    let size = (BLOCK_VALUES / patch_values(layer, 1)).max(1);
    (0..batch)
        .step_by(size)
        .map(move |start| start..(start + size).min(batch))
}

/// The patch rows P of a block of examples (im2col), from `input` starting at the block's first
/// example, in `buf`.
fn block_patches<'b>(
    layer: &Placed,
    block: &Range<usize>,
    input: &[f32],
    buf: &'b mut Vec<f32>,
) -> &'b [f32] {
    let patches = prefix(buf, patch_values(layer, block.len()));
    kernels::im2col(layer, block.len(), input, patches);
    patches
}

/// A convolution's backward pass, block by block as its forward pass: first dA_{l-1} (when
/// `prev` is given), each block's dP = dZ W^T added back onto its windows by col2im, while W is
/// as the forward pass saw it; then dW = sum over blocks of P^T dZ (each block's P formed again)
/// and db.
fn conv_backward(
    layer: &Placed,
    target: &mut Target<'_>,
    input: &[f32],
    dz: &[f32],
    prev: Option<&mut [f32]>,
    patches: &mut Vec<f32>,
    scratch: &mut Vec<f32>,
) {
    let (ins, outs) = (layer.input.len(), layer.output.len());
    let batch = dz.len() / outs;
    let block_dz = |block: &Range<usize>| &dz[outs * block.start..outs * block.end];
    if let Some(prev) = prev {
        for block in blocks(layer, batch) {
            let d_patches = prefix(scratch, patch_values(layer, block.len()));
            patch_delta(layer, target.params(), block_dz(&block), d_patches);
            kernels::col2im(
                layer,
                block.len(),
                d_patches,
                &mut prev[ins * block.start..ins * block.end],
            );
        }
    }
    for block in blocks(layer, batch) {
        let first = block.start == 0;
        let patches = block_patches(layer, &block, &input[ins * block.start..], patches);
        send_weight_gradient(layer, target, patches, block_dz(&block), first);
    }
    send_bias_gradient(layer, target, dz);
}

#[cfg(test)]
mod tests;
