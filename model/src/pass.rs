//! What the passes of both architectures share: buffers reused from step to step at varying
//! lengths, the output layer's softmax cross-entropy and its delta dZ_L = (softmax(Z_L) -
//! onehot(y)) / B, and where backpropagation sends each layer's gradient.

use ndarray::ArrayViewMut2;

/// Sets `buf` to `len` values, reusing its memory; the values are to be overwritten.
pub(super) fn set_len(buf: &mut Vec<f32>, len: usize) {
    if buf.len() != len {
        buf.resize(len, 0.0);
    }
}

/// The first `len` values of `buf`, a buffer reused at varying lengths: it grows (zeroing only
/// what it adds) and never shrinks, so a pass whose layers take turns at a small and a large
/// length does not zero the large one again at every step. The values are to be overwritten.
pub(super) fn prefix(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

/// Turns logits into probabilities in place (row-wise softmax, max-shifted for stability) and
/// returns the mean cross-entropy -1/B sum_i log p_i[y_i].
fn softmax_cross_entropy(mut logits: ArrayViewMut2<'_, f32>, y: &[u32]) -> f32 {
    let mut total = 0.0f64;
    for (mut row, &label) in logits.rows_mut().into_iter().zip(y) {
        let max = row.fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        row.mapv_inplace(|v| (v - max).exp());
        let sum: f32 = row.sum();
        row.mapv_inplace(|v| v / sum);
        total -= f64::from(row[label as usize].max(f32::MIN_POSITIVE).ln());
    }
    (total / y.len() as f64) as f32
}

/// The mean cross-entropy of `logits` (examples x `classes`, row-major) for labels `y`, and
/// its gradient with respect to the logits written into `delta`: dZ_L = (softmax(Z_L) -
/// onehot(y)) / B. `delta` is as long as `logits`.
pub(super) fn output_delta(logits: &[f32], classes: usize, y: &[u32], delta: &mut [f32]) -> f32 {
    delta.copy_from_slice(logits);
    let probabilities = ArrayViewMut2::from_shape((y.len(), classes), &mut *delta)
        .expect("one row of logits per label");
    let loss = softmax_cross_entropy(probabilities, y);
    let scale = 1.0 / y.len() as f32;
    for (row, &label) in delta.chunks_exact_mut(classes).zip(y) {
        row[label as usize] -= 1.0;
        row.iter_mut().for_each(|v| *v *= scale);
    }
    loss
}

/// What backpropagation does with each layer's gradient (dW_l, db_l).
pub(super) enum Target<'a> {
    /// Writes it into `grad`, laid out like `params`.
    Gradient {
        params: &'a [f32],
        grad: &'a mut [f32],
    },
    /// Subtracts eta times it from `params`.
    Step { params: &'a mut [f32], eta: f32 },
}

impl Target<'_> {
    pub(super) fn params(&self) -> &[f32] {
        match self {
            Target::Gradient { params, .. } => params,
            Target::Step { params, .. } => params,
        }
    }

    /// Where gradients go, as dest <- alpha g + beta dest.
    pub(super) fn sink(&mut self) -> (&mut [f32], f32, f32) {
        match self {
            Target::Gradient { grad, .. } => (grad, 1.0, 0.0),
            Target::Step { params, eta } => (params, -*eta, 1.0),
        }
    }
}
