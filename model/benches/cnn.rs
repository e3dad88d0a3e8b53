//! One local epoch of McMahan et al. 2017's FedAvg CNN (two 5x5 convolutions of 32 and 64
//! channels with 2x2 max pooling, dense 512, dense 10) and of LeNet-5 on 600 MNIST examples,
//! against the same epoch's matrix products alone (im2col patch matrices and dense inputs
//! preallocated), by the kernel training uses, on one core.
//!
//! Throughput is in floating-point operations ("elem/s" is FLOP/s), counted from the layers:
//! for a layer with parameters over R rows of fan-in F and O outputs, the forward product, the
//! weight gradient and (but for the first layer) the input delta are 2 R F O each.
//!
//! `cargo bench -p fl-model --bench cnn`; report medians with the machine's core count.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fl_datasets::{Split, load_mnist};
use fl_model::mat_mul;
use fl_model::sequential::{FEDAVG_CNN, LENET5, LayerSpec, Sequential, Shape, Workspace};
use ndarray::Array2;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Uniform};
use std::path::Path;

/// Examples per epoch.
const EXAMPLES: usize = 600;

fn network(layers: &[&str]) -> Sequential {
    let layers: Vec<LayerSpec> = layers.iter().map(|s| s.parse().unwrap()).collect();
    let input = Shape {
        height: 28,
        width: 28,
        channels: 1,
    };
    Sequential::new(input, &layers).unwrap()
}

/// (rows per example, fan-in, outputs, whether the input delta is formed) of each layer with
/// parameters.
fn products(cnn: &Sequential) -> Vec<(usize, usize, usize, bool)> {
    cnn.layers()
        .iter()
        .enumerate()
        .filter(|(_, l)| l.outputs_per_position() > 0)
        .map(|(i, l)| {
            let rows = l.output.len() / l.outputs_per_position();
            (rows, l.fan_in(), l.outputs_per_position(), i > 0)
        })
        .collect()
}

fn epoch_flops(cnn: &Sequential) -> u64 {
    let per_example: usize = products(cnn)
        .iter()
        .map(|&(r, f, o, delta)| 2 * r * f * o * (2 + usize::from(delta)))
        .sum();
    (per_example * EXAMPLES) as u64
}

fn cnn_epoch(c: &mut Criterion) {
    epochs(
        c,
        "cnn_epoch_600_examples_fedavg_cnn",
        &FEDAVG_CNN,
        &[10, 50],
    );
    epochs(c, "cnn_epoch_600_examples_lenet5", &LENET5, &[20]);
}

/// The epoch and its products for `layers` at each batch size, as group `name`.
fn epochs(c: &mut Criterion, name: &str, layers: &[&str], batches: &[usize]) {
    let cnn = network(layers);
    let mnist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    let data = load_mnist(&mnist, Split::Train).expect("shipped MNIST");
    let x = data.rows(0..EXAMPLES).into_owned();
    let y = &data.labels()[..EXAMPLES];
    let mut rng = StdRng::seed_from_u64(0);
    let dist = Uniform::new(-0.05f32, 0.05).unwrap();
    let init: Vec<f32> = (0..cnn.num_params())
        .map(|_| dist.sample(&mut rng))
        .collect();
    let mut group = c.benchmark_group(name);
    group.sample_size(10);
    group.throughput(Throughput::Elements(epoch_flops(&cnn)));
    for &batch in batches {
        let mut params = init.clone();
        let mut ws = Workspace::default();
        group.bench_function(format!("local_epoch/B={batch}"), |b| {
            b.iter(|| {
                for start in (0..EXAMPLES).step_by(batch) {
                    let rows = start..start + batch;
                    let xb = x.slice(ndarray::s![rows.clone(), ..]);
                    cnn.loss_and_step(&mut params, 0.01, xb, &y[rows], &mut ws);
                }
            })
        });
        let mats: Vec<_> = products(&cnn)
            .into_iter()
            .map(|(r, f, o, delta)| {
                let rows = r * batch;
                let a = Array2::<f32>::from_elem((rows, f), 0.5);
                let w = Array2::<f32>::from_elem((f, o), 0.01);
                let z = Array2::<f32>::zeros((rows, o));
                // A dense layer's (one row per example) input delta is formed transposed, as
                // training does.
                let dense = r == 1;
                let da = if dense {
                    Array2::zeros((f, rows))
                } else {
                    a.clone()
                };
                (a, w, z, da, delta.then_some(dense))
            })
            .collect();
        let mut mats = mats;
        group.bench_function(format!("matmul_reference/B={batch}"), |b| {
            b.iter(|| {
                for _ in 0..EXAMPLES / batch {
                    for (a, w, z, da, delta) in &mut mats {
                        mat_mul(1.0, &a.view(), &w.view(), 0.0, &mut z.view_mut());
                        mat_mul(1.0, &a.t(), &z.view(), 1.0, &mut w.view_mut());
                        let mut da = da.view_mut();
                        match delta {
                            None => {}
                            Some(false) => mat_mul(1.0, &z.view(), &w.t(), 0.0, &mut da),
                            Some(true) => mat_mul(1.0, &w.view(), &z.t(), 0.0, &mut da),
                        }
                    }
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, cnn_epoch);
criterion_main!(benches);
