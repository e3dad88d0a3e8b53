//! The CNN's passes against their definitions: a direct convolution and pooling, finite
//! differences of every parameter, and the fused step.

use super::*;
use ndarray::Array2;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn layers(list: &[&str]) -> Vec<LayerSpec> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

fn random(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// A small CNN with padding, stride, pooling, flatten, tanh and dense layers (272 parameters), its
/// parameters and a batch of 3 examples of 8 x 8 x 2.
fn small_problem(seed: u64) -> (Sequential, Vec<f32>, Array2<f32>, Vec<u32>) {
    let input = Shape {
        height: 8,
        width: 8,
        channels: 2,
    };
    let cnn = Sequential::new(
        input,
        &layers(&[
            "conv:3:3:pad1",
            "relu",
            "maxpool:2",
            "conv:4:3:stride2:pad1",
            "relu",
            "flatten",
            "dense:5",
            "tanh",
            "dense:3",
        ]),
    )
    .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let params = random(&mut rng, cnn.num_params());
    let x = Array2::from_shape_vec((3, input.len()), random(&mut rng, 3 * input.len())).unwrap();
    (cnn, params, x, vec![0, 2, 1])
}

#[test]
fn the_small_problem_has_the_layout_of_its_layers() {
    let (cnn, ..) = small_problem(1);
    // conv 3*3*2*3 + 3, conv 3*3*3*4 + 4, dense 16*5 + 5, dense 5*3 + 3
    assert_eq!(cnn.num_params(), 57 + 112 + 85 + 18);
    assert_eq!(
        cnn.layers()[3].output,
        Shape {
            height: 2,
            width: 2,
            channels: 4
        }
    );
}

/// Layer `l`'s outputs for a batch of `batch` against the convolution written from its
/// definition, with kernel k, stride s and padding p; its input is `input`.
fn assert_convolution_by_definition(
    (cnn, l, batch): (&Sequential, usize, usize),
    params: &[f32],
    input: &[f32],
    output: &[f32],
    (k, s, p): (usize, usize, usize),
) {
    let conv = cnn.layers()[l];
    let (i, o) = (conv.input, conv.output);
    for b in 0..batch {
        for (oy, ox, co) in itertools_product(o.height, o.width, o.channels) {
            // z[b, oy, ox, co] = b_co + sum_{ky, kx, ci} W[(ky, kx, ci), co] a[b, oy s + ky - p, ox s + kx - p, ci]
            let mut z = params[conv.bias_offset + co];
            for (ky, kx, ci) in itertools_product(k, k, i.channels) {
                let (y, x) = (
                    (oy * s + ky) as isize - p as isize,
                    (ox * s + kx) as isize - p as isize,
                );
                if y < 0 || x < 0 || y >= i.height as isize || x >= i.width as isize {
                    continue;
                }
                let a =
                    input[((b * i.height + y as usize) * i.width + x as usize) * i.channels + ci];
                let w = params
                    [conv.weight_offset + ((ky * k + kx) * i.channels + ci) * o.channels + co];
                z += w * a;
            }
            let got = output[((b * o.height + oy) * o.width + ox) * o.channels + co];
            assert!(
                (got - z).abs() < 1e-5,
                "conv at {b},{oy},{ox},{co}: {got} vs {z}"
            );
        }
    }
}

/// The first layers' outputs against a convolution and a ReLU and pooling written from their
/// definitions (the network runs the pooling first: [`pool_before_relu`]).
#[test]
fn forward_is_convolution_then_pooling_by_definition() {
    let (cnn, params, x, _) = small_problem(2);
    let mut ws = Workspace::default();
    cnn.forward(&params, x.view(), &mut ws);
    let (input, output) = (&ws.outs[2], &ws.outs[3]);
    assert_convolution_by_definition((&cnn, 3, 3), &params, input, output, (3, 2, 1));
    let pool = cnn.layers()[2];
    let (i, o) = (pool.input, pool.output);
    for b in 0..3 {
        for (oy, ox, c) in itertools_product(o.height, o.width, o.channels) {
            let at = |dy: usize, dx: usize| {
                let z = ws.outs[0]
                    [((b * i.height + 2 * oy + dy) * i.width + 2 * ox + dx) * i.channels + c];
                z.max(0.0)
            };
            let max = at(0, 0).max(at(0, 1)).max(at(1, 0)).max(at(1, 1));
            assert_eq!(
                ws.outs[2][((b * o.height + oy) * o.width + ox) * o.channels + c],
                max
            );
        }
    }
}

/// Running each ReLU after the max pooling that follows it changes nothing: the FedAvg CNN,
/// LeNet-5 and the small CNN give the same loss, gradient and fused step, bit for bit, as the
/// same networks run in their stated order.
#[test]
fn pooling_before_relu_computes_the_stated_network() {
    let mnist = Shape {
        height: 28,
        width: 28,
        channels: 1,
    };
    let (small, ..) = small_problem(3);
    let networks = [
        Sequential::new(mnist, &layers(&FEDAVG_CNN)).unwrap(),
        Sequential::new(mnist, &layers(&LENET5)).unwrap(),
        small,
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    for cnn in networks {
        assert_ne!(cnn.steps, cnn.layers, "a ReLU before pooling is moved");
        let stated = Sequential {
            steps: cnn.layers.clone(),
            ..cnn.clone()
        };
        // Small weights, so that many windows have a non-positive maximum.
        let params: Vec<f32> = random(&mut rng, cnn.num_params())
            .iter()
            .map(|v| 0.1 * v)
            .collect();
        let batch = 3;
        let x = Array2::from_shape_vec(
            (batch, cnn.inputs()),
            random(&mut rng, batch * cnn.inputs()),
        )
        .unwrap();
        let y: Vec<u32> = (0..batch as u32)
            .map(|i| i % cnn.classes() as u32)
            .collect();
        let mut ws = Workspace::default();
        let run = |net: &Sequential, ws: &mut Workspace| {
            let mut grad = vec![0.0; params.len()];
            let loss = net.loss_and_grad(&params, x.view(), &y, &mut grad, ws);
            let mut stepped = params.clone();
            net.loss_and_step(&mut stepped, 0.1, x.view(), &y, ws);
            (loss, grad, stepped)
        };
        assert_eq!(run(&cnn, &mut ws), run(&stated, &mut ws));
    }
}

/// Convolutions of a one-channel image (a first layer's, which im2col gathers a row of k values
/// at a time: k = 3 and 5 at a length known when compiled, k = 4 not) against their definition,
/// with and without padding, and at stride 2 (the general im2col).
#[test]
fn a_one_channel_convolution_is_its_definition() {
    let input = Shape {
        height: 7,
        width: 6,
        channels: 1,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for (spec, geometry) in [
        ("conv:4:3:pad1", (3, 1, 1)),
        ("conv:3:5:pad2", (5, 1, 2)),
        ("conv:2:5", (5, 1, 0)),
        ("conv:2:4:pad3", (4, 1, 3)),
        ("conv:2:3:stride2:pad1", (3, 2, 1)),
    ] {
        let cnn = Sequential::new(input, &layers(&[spec, "dense:2"])).unwrap();
        let params = random(&mut rng, cnn.num_params());
        let x =
            Array2::from_shape_vec((2, input.len()), random(&mut rng, 2 * input.len())).unwrap();
        let mut ws = Workspace::default();
        cnn.forward(&params, x.view(), &mut ws);
        let image = x.as_slice().unwrap();
        assert_convolution_by_definition((&cnn, 0, 2), &params, image, &ws.outs[0], geometry);
    }
}

/// Every (a, b, c) with a < n0, b < n1, c < n2, in row-major order.
fn itertools_product(
    n0: usize,
    n1: usize,
    n2: usize,
) -> impl Iterator<Item = (usize, usize, usize)> {
    (0..n0).flat_map(move |a| (0..n1).flat_map(move |b| (0..n2).map(move |c| (a, b, c))))
}

/// Central finite differences of the f32 loss against the analytic gradient, for every
/// parameter of the small CNN.
#[test]
fn backward_matches_finite_differences() {
    let (cnn, params, x, y) = small_problem(11);
    let mut ws = Workspace::default();
    let mut grad = vec![0.0; params.len()];
    cnn.loss_and_grad(&params, x.view(), &y, &mut grad, &mut ws);
    let loss_at = |p: &[f32], ws: &mut Workspace| {
        let mut g = vec![0.0; p.len()];
        f64::from(cnn.loss_and_grad(p, x.view(), &y, &mut g, ws))
    };
    let worst = crate::gradcheck::worst_relative_error(&params, &grad, |p| loss_at(p, &mut ws));
    // As for the MLP: f32 losses differenced over h = 1e-3 carry ~1e-3 absolute noise; a wrong
    // gradient is off by O(1).
    assert!(worst < 2e-2, "worst relative error {worst}");
}

/// A fused step equals the gradient followed by w <- w - eta g.
#[test]
fn a_fused_step_equals_gradient_then_update() {
    let (cnn, params, x, y) = small_problem(12);
    let eta = 0.3;
    let mut ws = Workspace::default();
    let mut grad = vec![0.0; params.len()];
    let loss = cnn.loss_and_grad(&params, x.view(), &y, &mut grad, &mut ws);
    let mut stepped = params.clone();
    let fused = cnn.loss_and_step(&mut stepped, eta, x.view(), &y, &mut ws);
    assert_eq!(loss, fused);
    crate::gradcheck::assert_step(&stepped, &params, &grad, eta);
}

/// A batch whose convolutions run in several blocks of examples (the first convolution's patches
/// take 19,600 values per example, the second's 39,200: blocks of 6 and 3 examples of the 7): its
/// loss and gradient are the means of its examples' (each a single block), and its fused step is
/// the gradient followed by the update.
#[test]
fn a_batch_in_several_blocks_is_the_mean_of_its_examples() {
    let input = Shape {
        height: 28,
        width: 28,
        channels: 1,
    };
    let list = [
        "conv:8:5:pad2",
        "relu",
        "maxpool:2",
        "conv:4:5:pad2",
        "relu",
        "maxpool:2",
        "dense:3",
    ];
    let cnn = Sequential::new(input, &layers(&list)).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let params: Vec<f32> = random(&mut rng, cnn.num_params())
        .iter()
        .map(|v| 0.2 * v)
        .collect();
    let batch = 7;
    let x = Array2::from_shape_vec((batch, input.len()), random(&mut rng, batch * input.len()))
        .unwrap();
    let y: Vec<u32> = (0..batch as u32).map(|i| i % 3).collect();
    let mut ws = Workspace::default();
    // A stale buffer: the first block must overwrite it, the later ones add.
    let mut grad = vec![7.0; params.len()];
    let loss = cnn.loss_and_grad(&params, x.view(), &y, &mut grad, &mut ws);
    let (mut mean_loss, mut mean_grad) = (0.0f64, vec![0.0f64; params.len()]);
    let mut one = vec![0.0; params.len()];
    for b in 0..batch {
        let xb = x.slice(ndarray::s![b..b + 1, ..]);
        mean_loss += f64::from(cnn.loss_and_grad(&params, xb, &y[b..b + 1], &mut one, &mut ws));
        mean_grad
            .iter_mut()
            .zip(&one)
            .for_each(|(m, &g)| *m += f64::from(g));
    }
    let n = batch as f64;
    assert!(
        (f64::from(loss) - mean_loss / n).abs() < 1e-5,
        "{loss} vs {}",
        mean_loss / n
    );
    let scale = mean_grad.iter().fold(0.0f64, |m, g| m.max(g.abs() / n));
    let worst = grad
        .iter()
        .zip(&mean_grad)
        .map(|(&g, m)| (f64::from(g) - m / n).abs())
        .fold(0.0, f64::max);
    // f32 sums over up to 784 rows in another order: rounding far below 1e-4 of the largest.
    assert!(
        worst < 1e-4 * scale,
        "worst difference {worst}, largest {scale}"
    );
    let mut stepped = params.clone();
    cnn.loss_and_step(&mut stepped, 0.3, x.view(), &y, &mut ws);
    crate::gradcheck::assert_step(&stepped, &params, &grad, 0.3);
}

#[test]
fn a_network_must_end_in_logits() {
    let input = Shape::flat(4);
    let e = Sequential::new(input, &layers(&["dense:3", "relu"])).unwrap_err();
    assert!(e.contains("last layer must be dense"), "{e}");
}

/// A refused layer is named where the network states it, not where it runs: the pooling that
/// does not fit comes second in the list, though it runs before the ReLU.
#[test]
fn a_refusal_names_the_layer_as_stated() {
    let input = Shape {
        height: 4,
        width: 4,
        channels: 1,
    };
    let e = Sequential::new(input, &layers(&["relu", "maxpool:8", "dense:2"])).unwrap_err();
    assert!(e.starts_with("layer 1 (maxpool:8)"), "{e}");
}

/// Units in the last place of f32 between `got` and the exact `want`.
fn ulps(got: f32, want: f64) -> f64 {
    let rounded = want as f32;
    let ulp = f64::from(f32::from_bits(rounded.abs().to_bits() + 1) - rounded.abs());
    (f64::from(got) - want).abs() / ulp
}

/// The vectorised tanh against f64's on every f32 in [2^-20, 12] with the low eight bits of its
/// significand zero (about 230,000 values, both signs), and at 0, the infinities and NaN.
#[test]
fn tanh_is_within_three_ulps_of_its_definition() {
    // Error budget of the (1 - e) / (1 + e) branch, the worse one: e = exp(-2a) within about
    // 2 ulps (reduction, Horner, scaling), 1 - e >= 0.39 magnifies that by e / (1 - e) <= 1.55,
    // the division adds half an ulp: under 3 ulps of the result.
    let (lo, hi) = (2f32.powi(-20).to_bits(), 12f32.to_bits());
    let mut worst = (0.0, 0.0);
    for bits in (lo..=hi).step_by(256) {
        for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
            let err = ulps(kernels::tanh_f32(x), f64::from(x).tanh());
            if err > worst.0 {
                worst = (err, x);
            }
        }
    }
    assert!(worst.0 <= 3.0, "{} ulps at x = {}", worst.0, worst.1);
    assert_eq!(kernels::tanh_f32(0.0).to_bits(), 0f32.to_bits());
    assert_eq!(kernels::tanh_f32(-0.0).to_bits(), (-0f32).to_bits());
    assert_eq!(kernels::tanh_f32(f32::INFINITY), 1.0);
    assert_eq!(kernels::tanh_f32(f32::NEG_INFINITY), -1.0);
    assert!(kernels::tanh_f32(f32::NAN).is_nan());
    let (input, mut out) = ([-30.0, -0.1, 0.0, 0.3, 2.5], [0.0; 5]);
    kernels::tanh(&input, &mut out);
    assert_eq!(out, input.map(kernels::tanh_f32));
}
