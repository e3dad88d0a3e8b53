//! The matrix product every model runs on: C <- alpha A B + beta C, with ndarray's
//! `general_mat_mul` semantics, computed by the `gemm` crate.
//!
//! Why `gemm` rather than ndarray's own kernel (matrixmultiply): `gemm` chooses at run time
//! between AVX-512 and AVX2/FMA micro-kernels, matrixmultiply has no AVX-512 kernel. On the
//! products of one local epoch of the 784-600-100-10 MLP, on one core of a 2-core Intel Xeon with
//! AVX-512, `gemm` ran 76 to 96, 54 to 68 and 40 to 45 GFLOP/s at B = 50, 20 and 10 in two runs,
//! against matrixmultiply's 42 to 53, 40 to 44 and 33 to 37 (`cargo bench -p fl-model --bench
//! training -- matmul_reference`; docs/src/results/speed.md, "Training kernels").
//! ndarray's `general_mat_mul` stays the straightforward reference the tests compare against.
//!
//! gemm copies ("packs") the whole operand that runs along C's contiguous dimension before every
//! product whose extent there is not a multiple of its SIMD width (16 f32 lanes with AVX-512, 8
//! with AVX2): the MLP's forward product X W_1 (B x 784 by 784 x 600) packed all 470,400 weights
//! per step, a quarter of the epoch on an AVX-512 core (2-core AMD EPYC, 2026-11-27).
//! `mat_mul` therefore splits that dimension into a part that is a multiple of 16, which gemm
//! reads in place, and a remainder of fewer than 16, when the operand is large enough for its copy
//! to cost more than a second call of gemm (LeNet-5's products, below [`PACKED_IN_PLACE`], ran 9%
//! slower split).

use ndarray::{ArrayView2, ArrayViewMut2, Axis};

/// The widest SIMD vector gemm uses, in f32 lanes (AVX-512): a contiguous extent that is a
/// multiple of it is read in place.
const LANES: usize = 16;

/// The size (in values) from which the operand along C's contiguous dimension is multiplied in
/// place rather than packed: 256 KiB of f32, past what a core's L1 and most of its L2 hold.
const PACKED_IN_PLACE: usize = 1 << 16;

/// C <- alpha A B + beta C on one core, for any strides of A, B and C (transposed views
/// included). With beta = 0, C's previous values are not read (NaN in C does not propagate).
///
/// # Panics
/// If the shapes do not agree: A is m x k, B k x n, C m x n.
pub fn mat_mul(
    alpha: f32,
    a: &ArrayView2<'_, f32>,
    b: &ArrayView2<'_, f32>,
    beta: f32,
    c: &mut ArrayViewMut2<'_, f32>,
) {
    let (m, k) = a.dim();
    let (k2, n) = b.dim();
    assert!(
        k == k2 && c.dim() == (m, n),
        "matrix shapes: ({m} x {k}) ({k2} x {n}) into {:?}",
        c.dim()
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // An empty sum: C <- beta C.
        match beta {
            0.0 => c.fill(0.0),
            _ => c.mapv_inplace(|v| beta * v),
        }
        return;
    }
    // gemm runs along C's contiguous dimension (it transposes a row-major C): for a column-major
    // C, the same product as C^T = B^T A^T, whose C^T is row-major.
    if c.strides()[0].unsigned_abs() < c.strides()[1].unsigned_abs() {
        let mut c_t = c.view_mut().reversed_axes();
        return mat_mul(alpha, &b.t(), &a.t(), beta, &mut c_t);
    }
    // Along the columns of B and C: a head that is a multiple of LANES, and the rest.
    let head = n / LANES * LANES;
    if head > 0 && head < n && n * k >= PACKED_IN_PLACE {
        let (b_head, b_tail) = b.view().split_at(Axis(1), head);
        let (mut c_head, mut c_tail) = c.view_mut().split_at(Axis(1), head);
        gemm_in_place(alpha, a, &b_head, beta, &mut c_head);
        gemm_in_place(alpha, a, &b_tail, beta, &mut c_tail);
    } else {
        gemm_in_place(alpha, a, b, beta, c);
    }
}

/// dA <- dZ W^T for a batch of few rows (dZ: rows x outputs, W: fan-in x outputs, `da`: rows x
/// fan-in, row-major), formed as its transpose dA^T = W dZ^T in the first rows x fan-in values
/// of `scratch` and then transposed into `da`.
/// With a batch's few rows, the direct product had gemm pack all of W into panels for every step
/// (fan-in x outputs values moved for batch times as many multiply-adds): 9 GFLOP/s for the
/// FedAvg CNN's 3136 x 512 layer at B = 10, against 68 for the transposed form, where W^T is a
/// right-hand side gemm reads in place (2-core AMD EPYC, 2026-11-25).
/// The transpose is the `transpose` crate's tiled copy: ndarray's `assign` from a transposed
/// view went a value at a time through a strided iterator, 1.3% of the Geyer round's samples
/// (2-core AMD EPYC, 2026-11-28; test `times_transposed_weights_equals_the_reference`).
///
/// # Panics
/// If the shapes do not agree, or `scratch` or `da` is shorter than rows x fan-in.
pub fn times_transposed_weights(
    dz: &ArrayView2<'_, f32>,
    w: &ArrayView2<'_, f32>,
    scratch: &mut [f32],
    da: &mut [f32],
) {
    let (rows, fan_in) = (dz.nrows(), w.nrows());
    let da_t = &mut scratch[..rows * fan_in];
    let mut da_t_view =
        ArrayViewMut2::from_shape((fan_in, rows), &mut *da_t).expect("fan-in x rows");
    mat_mul(1.0, w, &dz.t(), 0.0, &mut da_t_view);
    // dA^T is fan_in rows of `rows` values; dA is its transpose.
    transpose::transpose(da_t, &mut da[..rows * fan_in], rows, fan_in);
}

/// One call of gemm for C <- alpha A B + beta C, shapes already checked and non-empty.
fn gemm_in_place(
    alpha: f32,
    a: &ArrayView2<'_, f32>,
    b: &ArrayView2<'_, f32>,
    beta: f32,
    c: &mut ArrayViewMut2<'_, f32>,
) {
    let (m, k) = a.dim();
    let n = b.ncols();
    let (a_rs, a_cs) = (a.strides()[0], a.strides()[1]);
    let (b_rs, b_cs) = (b.strides()[0], b.strides()[1]);
    let (c_rs, c_cs) = (c.strides()[0], c.strides()[1]);
    // SAFETY: each pointer is the first element of an ndarray view whose shape and strides (in
    // elements) are passed with it, so every element gemm reads or writes lies inside its view.
    // C is borrowed mutably, so it overlaps neither A nor B. gemm's own convention is
    // dst <- alpha dst + beta lhs rhs, with dst not read when read_dst is false.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            c_cs,
            c_rs,
            beta != 0.0,
            a.as_ptr(),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            beta,
            alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;
    use ndarray::linalg::general_mat_mul;
    use proptest::prelude::*;

    /// A matrix of `rows` x `cols` values from `seed`, in [-1, 1).
    fn matrix(rows: usize, cols: usize, seed: u64) -> Array2<f32> {
        Array2::from_shape_fn((rows, cols), |(i, j)| {
            let h = (i as u64 * 7919 + j as u64 * 104_729 + seed * 15_485_863) % 2001;
            h as f32 / 1000.0 - 1.0
        })
    }

    /// The rounding bound of alpha times a k-term f32 sum of products of magnitude <= 1, plus
    /// that of beta C: |error| <= (k + 2) eps32 (|alpha| k + 1), doubled for margin.
    fn tolerance(k: usize, alpha: f32) -> f32 {
        (k as f32 + 2.0) * f32::EPSILON * (alpha.abs() * k as f32 + 1.0) * 2.0
    }

    proptest! {
        /// Equal to ndarray's general_mat_mul (the reference) for every transposition of A and
        /// B, shapes from empty to past the micro-kernels' blocks, and alpha, beta in use or 0:
        /// each entry within the rounding of a k-term f32 sum of products of magnitude <= 1.
        #[test]
        fn equals_the_reference(
            m in 0usize..70, n in 0usize..70, k in 0usize..300,
            ta in any::<bool>(), tb in any::<bool>(),
            alpha in prop::sample::select(vec![1.0f32, -0.05, 2.5]),
            beta in prop::sample::select(vec![0.0f32, 1.0, -0.5]),
            seed in 0u64..1000,
        ) {
            let a_store = if ta { matrix(k, m, seed) } else { matrix(m, k, seed) };
            let b_store = if tb { matrix(n, k, seed + 1) } else { matrix(k, n, seed + 1) };
            let a = if ta { a_store.t() } else { a_store.view() };
            let b = if tb { b_store.t() } else { b_store.view() };
            let start = matrix(m, n, seed + 2);
            let mut expected = start.clone();
            general_mat_mul(alpha, &a, &b, beta, &mut expected);
            let mut got = start.clone();
            mat_mul(alpha, &a, &b, beta, &mut got.view_mut());
            let tol = tolerance(k, alpha);
            for (g, e) in got.iter().zip(&expected) {
                prop_assert!((g - e).abs() <= tol, "{g} vs {e} (tolerance {tol})");
            }
        }
    }

    /// Products large enough to be split along C's contiguous dimension (rows of a column-major
    /// C, columns of a row-major one; extents a multiple of 16 or not) equal the reference.
    #[test]
    fn split_products_equal_the_reference() {
        for (m, k, n, c_column_major) in [
            (20, 784, 600, false),
            (600, 784, 20, true),
            (20, 784, 592, false),
            (9, 4100, 17, false),
            (17, 4100, 9, true),
        ] {
            assert!(m.max(n) * k >= PACKED_IN_PLACE);
            let (a, b) = (matrix(m, k, 3), matrix(k, n, 4));
            let start = matrix(m, n, 5);
            let mut expected = start.clone();
            general_mat_mul(-0.1, &a, &b, 1.0, &mut expected);
            let mut store = if c_column_major {
                start.t().to_owned()
            } else {
                start.clone()
            };
            let mut got = if c_column_major {
                store.view_mut().reversed_axes()
            } else {
                store.view_mut()
            };
            mat_mul(-0.1, &a.view(), &b.view(), 1.0, &mut got);
            let tol = tolerance(k, 0.1);
            for (g, e) in got.iter().zip(&expected) {
                assert!((g - e).abs() <= tol, "{m}x{k}x{n}: {g} vs {e}");
            }
        }
    }

    /// dZ W^T through the transposed form equals the direct reference, over stale scratch and a
    /// stale output, at a small shape and at the MLP's and the FedAvg CNN's (whose transposes
    /// take the `transpose` crate's tiled paths).
    #[test]
    fn times_transposed_weights_equals_the_reference() {
        for (rows, outputs, fan_in) in [(3, 5, 7), (20, 100, 600), (10, 512, 3136)] {
            let (dz, w) = (matrix(rows, outputs, 6), matrix(fan_in, outputs, 7));
            let mut expected = Array2::zeros((rows, fan_in));
            general_mat_mul(1.0, &dz, &w.t(), 0.0, &mut expected);
            let mut scratch = vec![f32::NAN; rows * fan_in + 9];
            let mut got = vec![f32::NAN; rows * fan_in];
            times_transposed_weights(&dz.view(), &w.view(), &mut scratch, &mut got);
            let tol = tolerance(outputs, 1.0);
            for (g, e) in got.iter().zip(&expected) {
                assert!((g - e).abs() <= tol, "{rows}x{fan_in}: {g} vs {e}");
            }
        }
    }

    /// With beta = 0 the previous contents of C are not read: NaN there does not survive.
    #[test]
    fn beta_zero_overwrites() {
        let (a, b) = (matrix(3, 4, 1), matrix(4, 5, 2));
        let mut c = Array2::from_elem((3, 5), f32::NAN);
        mat_mul(1.0, &a.view(), &b.view(), 0.0, &mut c.view_mut());
        let mut expected = Array2::zeros((3, 5));
        general_mat_mul(1.0, &a, &b, 0.0, &mut expected);
        assert!(c.iter().all(|v| v.is_finite()));
        assert!((c - expected).iter().all(|d| d.abs() < 1e-5));
    }
}
