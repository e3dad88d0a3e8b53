//! Encoding a model into chunks and assembling it back: every model a client receives and every
//! update it sends goes through these, once per client and round. The tensor is the Geyer MLP's
//! (784-600-100-10, 532,110 values, 2.1 MB).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fl_proto::{TensorAssembler, chunk_count, encode_chunks};
use std::hint::black_box;

const VALUES: usize = 784 * 600 + 600 + 600 * 100 + 100 + 100 * 10 + 10;

fn chunks(c: &mut Criterion) {
    let values: Vec<f32> = (0..VALUES)
        .map(|i| (i % 1000) as f32 * 1e-3 - 0.5)
        .collect();
    let mut group = c.benchmark_group("mlp_784_600_100_10");
    group.throughput(Throughput::Bytes(4 * VALUES as u64));
    group.bench_function("encode", |b| {
        b.iter(|| encode_chunks(1, black_box(&values)).count())
    });
    let encoded: Vec<_> = encode_chunks(1, &values).collect();
    group.bench_function("assemble", |b| {
        b.iter(|| {
            let mut assembler =
                TensorAssembler::new(1, VALUES as u64, chunk_count(VALUES)).expect("valid header");
            let mut done = None;
            for chunk in encoded.iter().cloned() {
                done = assembler.push(chunk).expect("valid chunk");
            }
            done.expect("whole tensor")
        })
    });
    group.finish();
}

criterion_group!(benches, chunks);
criterion_main!(benches);
