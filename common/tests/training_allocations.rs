//! Local SGD allocates nothing per step: a run of ten times as many mini-batches makes no more
//! allocations than the matrix-multiply library's own, one packing buffer per product
//! (matrixmultiply allocates it on each call; that is outside this project). Everything of ours
//! is sized by the first batch and reused.
//!
//! Its own test binary, because it installs a counting global allocator.

use fl_common::data::Dataset;
use fl_common::model::{GradientRule, LocalConfig, ModelSpec, train_local};
use ndarray::Array2;
use ndarray::linalg::general_mat_mul;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting allocations.
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above, that is from the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by one call of `train_local` over `examples` examples in batches of 10 (the
/// last batch of each shorter, so a second batch size is met too).
fn allocations_of_training(data: &Dataset, examples: usize) -> usize {
    let spec = ModelSpec::mlp(data.num_features(), &[16, 8], 3).unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    let mut params = spec.init(&mut rng);
    let indices: Vec<usize> = (0..examples).collect();
    let config = LocalConfig {
        epochs: 2,
        batch_size: 10,
        learning_rate: 0.1,
    };
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    train_local(
        &spec,
        &mut params,
        data,
        &indices,
        &config,
        GradientRule::Mean,
        &mut rng,
    );
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

#[test]
fn local_sgd_allocates_nothing_per_step() {
    let n = 1_000;
    let features = Array2::from_shape_fn((n, 12), |(i, j)| ((i * 7 + j * 5) % 13) as f32 / 13.0);
    let labels = (0..n).map(|i| (i % 3) as u32).collect();
    let data = Dataset::new(features, labels, 3).unwrap();
    let few = allocations_of_training(&data, 95);
    let many = allocations_of_training(&data, 995);
    assert!(few > 0, "the counter counts");
    // 2 epochs of 10 and of 100 batches; 3 layers: 3 forward products, 3 for the weight
    // gradients, 2 for the deltas.
    let (extra_steps, products_per_step) = (2 * (100 - 10), 3 + 3 + 2);
    let (a, b) = (Array2::<f32>::ones((10, 12)), Array2::<f32>::ones((12, 16)));
    let mut c = Array2::<f32>::zeros((10, 16));
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    general_mat_mul(1.0, &a, &b, 0.0, &mut c);
    let per_product = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(
        many - few,
        extra_steps * products_per_step * per_product,
        "allocations beyond the products' packing buffers"
    );
}
