//! Local SGD allocates nothing per step: a run of ten times as many mini-batches makes no more
//! allocations than the matrix-multiply library's own (gemm allocates packing buffers on each
//! call, how many depending on the shapes; that is outside this project). Everything of ours
//! is sized by the first batch and reused.
//!
//! Its own test binary, because it installs a counting global allocator.

use fl_datasets::Dataset;
use fl_model::{GradientRule, LocalConfig, ModelSpec, mat_mul, train_local};
use ndarray::Array2;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counting allocations.
struct Counting;

thread_local! {
    /// Allocations made by this thread: the test harness's own threads allocate at times of
    /// their choosing (its output capture, its timers), which a process-wide count would add.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

/// Allocations made so far by the calling thread.
fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // A const-initialised thread local without a destructor: reading it never allocates.
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by one call of `train_local` over `examples` examples in batches of 10 (the
/// last batch of each epoch shorter, so a second batch size is met too).
fn allocations_of_training(data: &Dataset, examples: usize) -> usize {
    let spec = ModelSpec::mlp(data.num_features(), &[16, 8], 3).unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    let mut params = spec.init(&mut rng);
    let indices: Vec<usize> = (0..examples).collect();
    let config = LocalConfig {
        epochs: 2,
        batch_size: 10,
        learning_rate: 0.1,
        random_shift: 0,
    };
    let before = allocations();
    train_local(
        &spec,
        &mut params,
        data,
        &indices,
        &config,
        GradientRule::Mean,
        &mut rng,
    );
    allocations() - before
}

/// Allocations the matrix-multiply library makes in the products of one step of batch size `b`
/// on the 12-16-8-3 network, with the layouts training uses: Z_l = A_{l-1} W_l, dW_l = A_{l-1}^T
/// dZ_l and, for l > 1, dZ_{l-1} = dZ_l W_l^T (gemm decides per shape whether to pack, so the
/// count is taken on the very shapes).
fn allocations_of_one_steps_products(b: usize) -> usize {
    let widths = [12, 16, 8, 3];
    let acts: Vec<Array2<f32>> = widths.iter().map(|&d| Array2::ones((b, d))).collect();
    let weights: Vec<Array2<f32>> = widths
        .windows(2)
        .map(|w| Array2::ones((w[0], w[1])))
        .collect();
    let out = |r: usize, c: usize| Array2::<f32>::zeros((r, c));
    let before = allocations();
    let mut buffers = Vec::new();
    for l in 1..widths.len() {
        buffers.push(out(b, widths[l]));
        buffers.push(out(widths[l - 1], widths[l]));
        if l > 1 {
            buffers.push(out(b, widths[l - 1]));
        }
    }
    let allocated_buffers = allocations() - before;
    let mut buffers = buffers.iter_mut();
    let mut next = || buffers.next().expect("one buffer per product").view_mut();
    for l in 1..widths.len() {
        let (a, w) = (acts[l - 1].view(), weights[l - 1].view());
        mat_mul(1.0, &a, &w, 1.0, &mut next());
        mat_mul(-0.1, &a.t(), &acts[l].view(), 1.0, &mut next());
        if l > 1 {
            mat_mul(1.0, &acts[l].view(), &w.t(), 0.0, &mut next());
        }
    }
    allocations() - before - allocated_buffers
}

#[test]
fn local_sgd_allocates_nothing_per_step() {
    let n = 1_000;
    let features = Array2::from_shape_fn((n, 12), |(i, j)| ((i * 7 + j * 5) % 13) as f32 / 13.0);
    let labels = (0..n).map(|i| (i % 3) as u32).collect();
    let data = Dataset::new(features, labels, 3).unwrap();
    // The first product on a thread sets up gemm's per-thread state (hundreds of allocations, once).
    allocations_of_training(&data, 10);
    let few = allocations_of_training(&data, 95);
    let many = allocations_of_training(&data, 995);
    assert!(few > 0, "the counter counts");
    // 2 epochs of 9 and of 99 full batches of 10, each epoch ending with a batch of 5.
    let extra_steps = 2 * (99 - 9);
    assert_eq!(
        many - few,
        extra_steps * allocations_of_one_steps_products(10),
        "allocations beyond the products' packing buffers"
    );
}
