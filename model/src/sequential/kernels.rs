//! The convolutional network's own loops, outside its matrix products: im2col and col2im, the
//! activations and their gradients, max pooling.
//!
//! Why multiversioned: the workspace compiles for baseline x86-64 (SSE2, four f32 lanes), so that
//! one binary runs on any x86-64 host; gemm picks its AVX2 or AVX-512 kernels at run time, these
//! loops did not, and they were a quarter of the FedAvg CNN's epoch (`cargo bench -p fl-model
//! --bench cnn`, 2026-11-25). The `multiversion` crate compiles each function below once per x86-64 level (v2; v3 with
//! AVX2 and FMA; v4 with AVX-512: `targets = "simd"`) and calls the widest one the CPU has
//! (feature detection once, then a function pointer). Their bodies stay plain iterator code that
//! the compiler vectorises, checked against the definitions in `tests.rs`.

use super::{LayerSpec, Placed};
use multiversion::multiversion;

/// out = max(0, input), elementwise (ReLU).
#[multiversion(targets = "simd")]
pub(super) fn relu(input: &[f32], out: &mut [f32]) {
    out.iter_mut()
        .zip(input)
        .for_each(|(o, &v)| *o = v.max(0.0));
}

/// dA = dZ where the ReLU's output is positive, 0 elsewhere: the output is positive exactly where
/// its input is.
#[multiversion(targets = "simd")]
pub(super) fn relu_backward(delta: &[f32], outputs: &[f32], prev: &mut [f32]) {
    for ((p, &d), &o) in prev.iter_mut().zip(delta).zip(outputs) {
        *p = if o > 0.0 { d } else { 0.0 };
    }
}

/// out = tanh(input), elementwise.
///
/// Written here rather than calling `f32::tanh`: libm's `tanhf` is a scalar call per value that
/// no compiler vectorises, and it made a LeNet-5 round with tanh 1.7 times as long as with ReLU
/// (2-core Intel Xeon, 2026-11-26). [`tanh_f32`] is branch-free arithmetic that vectorises.
#[multiversion(targets = "simd")]
pub(super) fn tanh(input: &[f32], out: &mut [f32]) {
    out.iter_mut()
        .zip(input)
        .for_each(|(o, &v)| *o = tanh_f32(v));
}

/// tanh(x) within a few units in the last place of f32, from selects rather than branches.
///
/// With a = |x|: below 1/4 the odd Taylor series to a^11 (the next term, 21844/6081075 a^13, is
/// under 3e-10 a there); from 1/4 on (1 - e) / (1 + e) with e = exp(-2a) <= e^(-1/2), where
/// 1 - e >= 0.39 cancels at most a bit and a half. Past a = 10, tanh rounds to 1 in f32.
#[inline(always)]
pub(super) fn tanh_f32(x: f32) -> f32 {
    let a = x.abs().min(10.0);
    let a2 = a * a;
    // tanh a = a - a^3/3 + 2a^5/15 - 17a^7/315 + 62a^9/2835 - 1382a^11/155925 (Taylor series).
    let series = a + a
        * a2
        * (-1.0 / 3.0
            + a2 * (2.0 / 15.0
                + a2 * (-17.0 / 315.0 + a2 * (62.0 / 2835.0 + a2 * (-1382.0 / 155925.0)))));
    let e = exp_f32(-2.0 * a);
    // tanh a = (1 - e^(-2a)) / (1 + e^(-2a)).
    let ratio = (1.0 - e) / (1.0 + e);
    let t = if a < 0.25 { series } else { ratio }.copysign(x);
    if x.is_nan() { x } else { t }
}

/// e^y for y in [-20, 0]: y = n ln 2 + r with |r| <= ln 2 / 2 (Cody and Waite's reduction, ln 2
/// split in two so that n ln2_hi is exact), e^r by its Taylor series to r^7 (the next term is under
/// 6e-9 of it), times 2^n built from its exponent bits.
#[inline(always)]
fn exp_f32(y: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4; // 355 / 512: nine significant bits
    const LN2_LO: f32 = -2.121_944_4e-4; // ln 2 - LN2_HI
    let n = (y * std::f32::consts::LOG2_E).round();
    let r = (y - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (1.0 / 2.0
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // 2^n for n in [-29, 0]: a normal f32 with biased exponent n + 127.
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    p * scale
}

/// dA = dZ (1 - tanh(x)^2), with tanh(x) the layer's output: d tanh(x)/dx = 1 - tanh(x)^2.
#[multiversion(targets = "simd")]
pub(super) fn tanh_backward(delta: &[f32], outputs: &[f32], prev: &mut [f32]) {
    for ((p, &d), &o) in prev.iter_mut().zip(delta).zip(outputs) {
        *p = d * (1.0 - o * o);
    }
}

/// The convolution's geometry: (kernel, stride, pad).
fn geometry(layer: &Placed) -> (usize, usize, usize) {
    match layer.spec {
        LayerSpec::Conv {
            kernel,
            stride,
            pad,
            ..
        } => (kernel, stride, pad),
        _ => unreachable!("only convolutions have patches"),
    }
}

/// Calls `visit(patch_offset, input_offset, len)` for every run of values of the patch rows that
/// is contiguous in both the patch row and the input, with `None` for a run outside the input
/// (the padding's zeros). A kernel row's k positions of C_in channels lie side by side in an HWC
/// input, so a run is up to k C_in values long: one copy (im2col) or one vectorised add (col2im)
/// per kernel row rather than one per kernel position.
#[inline(always)]
fn for_each_run(layer: &Placed, batch: usize, mut visit: impl FnMut(usize, Option<usize>, usize)) {
    let (k, s, p) = geometry(layer);
    let (i, o) = (layer.input, layer.output);
    let c = i.channels;
    let mut patch = 0;
    for b in 0..batch {
        for oy in 0..o.height {
            for ox in 0..o.width {
                // Kernel columns kx in [lo, hi) fall inside the input: 0 <= ox s + kx - p < W.
                let lo = p.saturating_sub(ox * s).min(k);
                let hi = (i.width + p).saturating_sub(ox * s).clamp(lo, k);
                for ky in 0..k {
                    let iy = (oy * s + ky).checked_sub(p).filter(|&y| y < i.height);
                    match iy {
                        Some(y) if hi > lo => {
                            let x = ox * s + lo - p;
                            let from = ((b * i.height + y) * i.width + x) * c;
                            if lo > 0 {
                                visit(patch, None, lo * c);
                            }
                            visit(patch + lo * c, Some(from), (hi - lo) * c);
                            if hi < k {
                                visit(patch + hi * c, None, (k - hi) * c);
                            }
                        }
                        _ => visit(patch, None, k * c),
                    }
                    patch += k * c;
                }
            }
        }
    }
}

/// The patch matrix P of a convolution's input (im2col); every value is written once.
#[multiversion(targets = "simd")]
pub(super) fn im2col(layer: &Placed, batch: usize, input: &[f32], patches: &mut [f32]) {
    let (_, stride, _) = geometry(layer);
    if layer.input.channels == 1 && stride == 1 {
        return im2col_one_channel(layer, batch, input, patches);
    }
    for_each_run(layer, batch, |at, from, len| {
        let run = &mut patches[at..at + len];
        match from {
            Some(from) => run.copy_from_slice(&input[from..from + len]),
            None => run.fill(0.0),
        }
    });
}

/// im2col of a one-channel input at stride 1. The runs [`for_each_run`] visits are then a kernel
/// row of k values (5 for LeNet-5 and the FedAvg CNN), and a `memcpy` call per 20 bytes cost more
/// than the copy. Here each input row is laid once into a buffer with its padding's zeros, and
/// the k values of every window on it are copied at a length known when compiled.
#[inline(always)]
fn im2col_one_channel(layer: &Placed, batch: usize, input: &[f32], patches: &mut [f32]) {
    let (k, _, p) = geometry(layer);
    let (i, o) = (layer.input, layer.output);
    // padded[p + x] = the input row's x-th value, zeros on either side.
    let mut padded = vec![0.0; o.width + k - 1];
    let rows = patches.chunks_exact_mut(o.width * k * k);
    for ((b, oy), out_row) in (0..batch)
        .flat_map(|b| (0..o.height).map(move |oy| (b, oy)))
        .zip(rows)
    {
        for ky in 0..k {
            padded.fill(0.0);
            if let Some(y) = (oy + ky).checked_sub(p).filter(|&y| y < i.height) {
                let from = (b * i.height + y) * i.width;
                padded[p..p + i.width].copy_from_slice(&input[from..from + i.width]);
            }
            // Window ox of kernel row ky: P[(b, oy, ox), ky k .. ky k + k] = padded[ox .. ox + k].
            let windows = out_row
                .chunks_exact_mut(k * k)
                .map(|w| &mut w[ky * k..ky * k + k]);
            match k {
                3 => copy_windows::<3>(windows, &padded),
                5 => copy_windows::<5>(windows, &padded),
                _ => windows
                    .enumerate()
                    .for_each(|(ox, w)| w.copy_from_slice(&padded[ox..ox + k])),
            }
        }
    }
}

/// Copies `padded[ox .. ox + K]` into the ox-th of `windows`, K known when compiled.
#[inline(always)]
fn copy_windows<'a, const K: usize>(windows: impl Iterator<Item = &'a mut [f32]>, padded: &[f32]) {
    for (w, from) in windows.zip(padded.windows(K)) {
        let w: &mut [f32; K] = w.try_into().expect("a kernel row");
        *w = from.try_into().expect("a kernel row");
    }
}

/// Adds each row of dP back onto the input window it came from (col2im), into `da`.
#[multiversion(targets = "simd")]
pub(super) fn col2im(layer: &Placed, batch: usize, d_patches: &[f32], da: &mut [f32]) {
    da.fill(0.0);
    for_each_run(layer, batch, |at, to, len| {
        if let Some(to) = to {
            da[to..to + len]
                .iter_mut()
                .zip(&d_patches[at..at + len])
                .for_each(|(a, d)| *a += d);
        }
    });
}

/// Max pooling over size x size windows; records where each maximum came from (its index in its
/// example's input, below [`MAX_ACTIVATIONS`](super::MAX_ACTIVATIONS) and so a u32). The channels
/// of a position are contiguous, so each window position is compared with the best so far over C
/// values at once.
#[multiversion(targets = "simd")]
pub(super) fn max_pool(
    layer: &Placed,
    size: usize,
    batch: usize,
    input: &[f32],
    out: &mut [f32],
    argmax: &mut Vec<u32>,
) {
    let (i, o) = (layer.input, layer.output);
    let c = i.channels;
    argmax.clear();
    argmax.resize(out.len(), 0);
    // Plain loops over (b, oy, ox) and (dy, dx): nested `flat_map`s of ranges did not compile
    // to loops, and their `next` took 6% of a LeNet-5 round's samples.
    let mut runs = out.chunks_exact_mut(c).zip(argmax.chunks_exact_mut(c));
    for example in input.chunks_exact(i.len()).take(batch) {
        for oy in 0..o.height {
            for ox in 0..o.width {
                let (best, at) = runs.next().expect("a run of outputs per window");
                // The window's first position, then each later one where it is larger (ties keep
                // the first): selects rather than branches, so the loop over channels vectorises.
                for dy in 0..size {
                    for dx in 0..size {
                        let from = ((oy * size + dy) * i.width + ox * size + dx) * c;
                        let first = dy == 0 && dx == 0;
                        take_larger(best, at, &example[from..from + c], from, first);
                    }
                }
            }
        }
    }
}

/// best = max(best, run) and at = where each maximum is (`from` + channel), elementwise; `first`
/// takes the run whole.
#[inline(always)]
fn take_larger(best: &mut [f32], at: &mut [u32], run: &[f32], from: usize, first: bool) {
    for (ch, ((m, a), &v)) in best.iter_mut().zip(at.iter_mut()).zip(run).enumerate() {
        let take = first || v > *m;
        *m = if take { v } else { *m };
        *a = if take { (from + ch) as u32 } else { *a };
    }
}
