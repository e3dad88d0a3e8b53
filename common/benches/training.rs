//! Benchmarks of the hot paths: one local epoch of the default MLP (784-600-100-10) on 600 MNIST
//! examples, and FedAvg aggregation of 100 updates of that model.
//!
//! `cargo bench -p fl-common`; report medians with the machine's core count.

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use fl_common::data::{Split, load_mnist};
use fl_common::model::{GradientRule, LocalConfig, ModelSpec, WeightedMean, train_local};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::hint::black_box;
use std::path::Path;

fn local_epoch(c: &mut Criterion) {
    let mnist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    let data = load_mnist(&mnist, Split::Train).expect("shipped MNIST");
    let spec = ModelSpec::mlp(784, &[600, 100], 10).unwrap();
    let mut rng = StdRng::seed_from_u64(0);
    let params = spec.init(&mut rng);
    let indices: Vec<usize> = (0..600).collect();
    let mut group = c.benchmark_group("local_epoch_600_examples_mlp_784_600_100_10");
    group.sample_size(20);
    for batch_size in [10, 20, 50] {
        let config = LocalConfig {
            epochs: 1,
            batch_size,
            learning_rate: 0.05,
        };
        group.bench_function(format!("B={batch_size}"), |b| {
            b.iter_batched(
                || params.clone(),
                |mut p| {
                    train_local(
                        &spec,
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
    group.finish();
}

fn fedavg_100_updates(c: &mut Criterion) {
    let spec = ModelSpec::mlp(784, &[600, 100], 10).unwrap();
    let n = spec.num_params();
    let updates: Vec<Vec<f32>> = (0..100)
        .map(|k| {
            (0..n)
                .map(|i| ((i * 31 + k * 17) % 1000) as f32 * 1e-6)
                .collect()
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

criterion_group!(benches, local_epoch, fedavg_100_updates);
criterion_main!(benches);
