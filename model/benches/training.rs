//! Benchmarks of the hot paths: one local epoch of the default MLP (784-600-100-10) on 600 MNIST
//! examples, and FedAvg aggregation of 100 updates of that model.
//!
//! Throughput is in floating-point operations ("elem/s" is FLOP/s): an epoch is [`EPOCH_FLOPS`],
//! and `matmul_reference` runs the same matrix products with nothing else, on one core, by the
//! kernel training uses (the rate local training is measured against) and by ndarray's own.
//!
//! `cargo bench -p fl-model --bench training`; report medians with the machine's core count.

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use fl_datasets::{Split, load_mnist};
use fl_model::{
    CheckedUpdate, GradientRule, LayerSpec, LocalConfig, ModelSpec, Shape, WeightedMean, mat_mul,
    train_local,
};
use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, ArrayView2, ArrayViewMut2};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

/// Widths of the default MLP's layers, input first.
const WIDTHS: [usize; 4] = [784, 600, 100, 10];

/// Examples per epoch.
const EXAMPLES: usize = 600;

/// Multiply-adds count 2 FLOPs. Forward: 2 n sum_l d_{l-1} d_l; the weight gradients as many;
/// the input gradients of every layer but the first 2 n sum_{l>1} d_{l-1} d_l.
const EPOCH_FLOPS: u64 = {
    let n = EXAMPLES as u64;
    let mut all = 0;
    let mut inner = 0;
    let mut l = 1;
    while l < WIDTHS.len() {
        let pair = (WIDTHS[l - 1] * WIDTHS[l]) as u64;
        all += pair;
        if l > 1 {
            inner += pair;
        }
        l += 1;
    }
    2 * n * (2 * all + inner)
};

/// A kernel of the form C <- alpha A B + beta C.
type Kernel = fn(f32, &ArrayView2<f32>, &ArrayView2<f32>, f32, &mut ArrayViewMut2<f32>);

/// The matrices one epoch's products work on at batch size `b`, filled with fixed values.
struct EpochOperands {
    b: usize,
    weights: Vec<Array2<f32>>,
    grads: Vec<Array2<f32>>,
    acts: Vec<Array2<f32>>,
    deltas: Vec<Array2<f32>>,
}

impl EpochOperands {
    fn new(b: usize) -> Self {
        let filled = |r: usize, c: usize| {
            Array2::from_shape_fn((r, c), |(i, j)| ((i * 7 + j * 3) % 11) as f32 * 0.01)
        };
        let layers = || WIDTHS.windows(2).map(|w| filled(w[0], w[1])).collect();
        let rows = || WIDTHS.iter().map(|&d| filled(b, d)).collect();
        Self {
            b,
            weights: layers(),
            grads: layers(),
            acts: rows(),
            deltas: rows(),
        }
    }

    /// The products of one epoch: per batch, Z_l = A_{l-1} W_l, dW_l = A_{l-1}^T dZ_l and, for
    /// l > 1, dA_{l-1} = dZ_l W_l^T.
    fn epoch(&mut self, kernel: Kernel) {
        let Self {
            b,
            weights,
            grads,
            acts,
            deltas,
        } = self;
        for _ in 0..EXAMPLES / *b {
            for l in 1..WIDTHS.len() {
                let (before, after) = acts.split_at_mut(l);
                let (a, w) = (before[l - 1].view(), weights[l - 1].view());
                kernel(1.0, &a, &w, 0.0, &mut after[0].view_mut());
            }
            for l in (1..WIDTHS.len()).rev() {
                let (a, dz) = (acts[l - 1].t(), deltas[l].view());
                kernel(1.0, &a, &dz, 0.0, &mut grads[l - 1].view_mut());
                if l > 1 {
                    let (before, after) = deltas.split_at_mut(l);
                    let w_t = weights[l - 1].t();
                    let dz = after[0].view();
                    kernel(1.0, &dz, &w_t, 0.0, &mut before[l - 1].view_mut());
                }
            }
        }
        black_box(&*grads);
    }
}

/// The matrix products of one epoch at batch sizes 10, 20 and 50, on preallocated matrices, on
/// one core, by the kernel training uses (`mat_mul`, the gemm crate) and by ndarray's own
/// (matrixmultiply).
fn matmul_reference(c: &mut Criterion) {
    let mut group = c.benchmark_group("matmul_reference_epoch_mlp_784_600_100_10");
    group.sample_size(20);
    group.throughput(Throughput::Elements(EPOCH_FLOPS));
    let kernels: [(&str, Kernel); 2] = [
        ("gemm", mat_mul),
        ("matrixmultiply", |alpha, a, b, beta, c| {
            general_mat_mul(alpha, a, b, beta, c)
        }),
    ];
    for (name, kernel) in kernels {
        for b in [10, 20, 50] {
            let mut operands = EpochOperands::new(b);
            group.bench_function(format!("{name}/B={b}"), |bench| {
                bench.iter(|| operands.epoch(kernel))
            });
        }
    }
    group.finish();
}

/// The same products (gemm, B = 20) run at once on every core, one epoch per core and thread,
/// each on its own matrices: the time of one iteration is what one epoch takes while every core
/// trains, so the machine's floor for n clients' epochs on c cores is n / c times it. Cores
/// that share caches and memory run slower together than one alone.
fn matmul_every_core(c: &mut Criterion) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut group = c.benchmark_group("matmul_reference_epoch_mlp_784_600_100_10");
    group.sample_size(20);
    group.throughput(Throughput::Elements(EPOCH_FLOPS * cores as u64));
    let mut operands: Vec<EpochOperands> = (0..cores).map(|_| EpochOperands::new(20)).collect();
    group.bench_function(format!("gemm/B=20/every-core/{cores}"), |bench| {
        bench.iter_custom(|iters| {
            let start = Instant::now();
            std::thread::scope(|scope| {
                for ops in &mut operands {
                    scope.spawn(move || (0..iters).for_each(|_| ops.epoch(mat_mul)));
                }
            });
            start.elapsed()
        })
    });
    group.finish();
}

/// The default MLP as `ModelSpec::mlp` (`mlp`) and as the layer list it stands for (`layers`:
/// dense:600, relu, dense:100, relu, dense:10): both run the same kernel, so the two must agree
/// within noise.
fn local_epoch(c: &mut Criterion) {
    let mnist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    let data = load_mnist(&mnist, Split::Train).expect("shipped MNIST");
    let layers: Vec<LayerSpec> = ["dense:600", "relu", "dense:100", "relu", "dense:10"]
        .iter()
        .map(|l| l.parse().expect("a layer"))
        .collect();
    let specs = [
        ("mlp", ModelSpec::mlp(784, &[600, 100], 10).unwrap()),
        (
            "layers",
            ModelSpec::sequential(Shape::flat(784), &layers).unwrap(),
        ),
    ];
    let mut rng = StdRng::seed_from_u64(0);
    let indices: Vec<usize> = (0..EXAMPLES).collect();
    let mut group = c.benchmark_group("local_epoch_600_examples_mlp_784_600_100_10");
    group.sample_size(20);
    group.throughput(Throughput::Elements(EPOCH_FLOPS));
    for (name, spec) in &specs {
        assert_eq!(
            spec.num_params(),
            specs[0].1.num_params(),
            "the same network"
        );
        let params = spec.init(&mut rng);
        for batch_size in [10, 20, 50] {
            let config = LocalConfig {
                epochs: 1,
                batch_size,
                learning_rate: 0.05,
                random_shift: 0,
            };
            group.bench_function(format!("{name}/B={batch_size}"), |b| {
                b.iter_batched(
                    || params.clone(),
                    |mut p| {
                        train_local(
                            spec,
                            &mut p,
                            &data,
                            &indices,
                            &config,
                            GradientRule::Mean,
                            &mut rng,
                        )
                    },
                    BatchSize::LargeInput,
                )
            });
        }
    }
    group.finish();
}

fn fedavg_100_updates(c: &mut Criterion) {
    let spec = ModelSpec::mlp(784, &[600, 100], 10).unwrap();
    let n = spec.num_params();
    let updates: Vec<CheckedUpdate> = (0..100)
        .map(|k| {
            let values = (0..n)
                .map(|i| ((i * 31 + k * 17) % 1000) as f32 * 1e-6)
                .collect();
            CheckedUpdate::new(values).unwrap()
        })
        .collect();
    let mut group = c.benchmark_group("fedavg");
    group.sample_size(20);
    group.bench_function("100_updates_mlp_784_600_100_10", |b| {
        b.iter(|| {
            let mut sum = WeightedMean::new(n);
            for (k, u) in updates.iter().enumerate() {
                sum.add(u, 500 + k as u64).unwrap();
            }
            black_box(sum.mean())
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    matmul_reference,
    matmul_every_core,
    local_epoch,
    fedavg_100_updates
);
criterion_main!(benches);
