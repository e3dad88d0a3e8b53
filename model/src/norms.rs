//! Norms of a flat vector and the clips that bound them: L2 for whole-model updates (the
//! central and distributed mechanisms' sensitivity, and the check of every upload), L1 for
//! per-example gradients (the local Laplace mechanism's sensitivity).
//!
//! The L2 passes (the norm, the scaling) are compiled per x86-64 SIMD level with `multiversion`,
//! as [`crate::WeightedMean`]'s sum is, and for the same reason: every upload crosses them.

use multiversion::multiversion;
use std::cell::Cell;

/// Independent partial sums of [`l2_norm`]: one running sum makes every add wait for the last
/// and does not vectorise; eight lanes do (the norm is in every clip and every update check).
const LANES: usize = 8;

/// ||u||_2, accumulated in f64 over `LANES` partial sums.
pub fn l2_norm(u: &[f32]) -> f64 {
    squared_l2_norm(u).sqrt()
}

/// ||u||_2^2, accumulated in f64 over [`LANES`] partial sums.
#[multiversion(targets = "simd")]
pub(crate) fn squared_l2_norm(u: &[f32]) -> f64 {
    lane_squares(u, |v: &f32| *v)
}

/// sum_i value(u_i)^2 in f64 over [`LANES`] partial sums (the lanes vectorise, one running sum
/// does not). [`l2_norm`] and the scaling of [`scale_into_bound`] share it, so the norm the
/// clip re-measures in its scaling pass is the norm [`l2_norm`] gives. Inlined into each
/// multiversioned caller, so that it is compiled for that caller's SIMD level.
#[inline(always)]
fn lane_squares<T>(u: &[T], value: impl Fn(&T) -> f32) -> f64 {
    // `value` is called once per value: it may write it.
    let square = |v: &T| {
        let x = f64::from(value(v));
        x * x
    };
    let chunks = u.chunks_exact(LANES);
    let tail: f64 = chunks.remainder().iter().map(square).sum();
    let mut lanes = [0.0f64; LANES];
    for chunk in chunks {
        for (lane, v) in lanes.iter_mut().zip(chunk) {
            *lane += square(v);
        }
    }
    lanes.iter().sum::<f64>() + tail
}

/// Clips in place to L2 norm at most `bound` (Geyer et al., Alg. 1):
/// u <- u / max(1, ||u||_2 / S). Returns ||u||_2 before clipping.
pub fn clip_l2(u: &mut [f32], bound: f64) -> f64 {
    let norm = l2_norm(u);
    scale_into_bound(u, bound, norm);
    norm
}

/// u <- u / max(1, `norm` / S) for `u` of norm `norm`.
///
/// f32 rounding could leave the result a few ulps above S, which would break the sensitivity
/// bound; so the factor is shrunk by 1e-6 relative and the norm re-checked until it is within S.
/// The scaling pass measures the scaled values as it writes them: one pass over the update, not
/// two. Returns the norm after.
pub(crate) fn scale_into_bound(u: &mut [f32], bound: f64, norm: f64) -> f64 {
    const SAFETY: f64 = 1.0 - 1e-6;
    let mut norm = norm;
    while norm > bound {
        norm = scale_and_measure(u, (bound / norm * SAFETY) as f32);
    }
    norm
}

/// u <- factor u; returns ||u||_2 of the scaled values, measured as they are written.
#[multiversion(targets = "simd")]
fn scale_and_measure(u: &mut [f32], factor: f32) -> f64 {
    let cells = Cell::from_mut(u).as_slice_of_cells();
    lane_squares(cells, |v: &Cell<f32>| {
        v.set(v.get() * factor);
        v.get()
    })
    .sqrt()
}

/// The L1 norm of `u`.
pub fn l1_norm(u: &[f32]) -> f64 {
    u.iter().map(|&v| f64::from(v).abs()).sum()
}

/// u <- u / max(1, ||u||_1 / C), re-checked so rounding never leaves it above C; returns the
/// original norm.
pub fn clip_l1(u: &mut [f32], bound: f64) -> f64 {
    const SAFETY: f64 = 1.0 - 1e-6;
    let original = l1_norm(u);
    let mut norm = original;
    while norm > bound {
        let factor = (bound / norm * SAFETY) as f32;
        u.iter_mut().for_each(|v| *v *= factor);
        norm = l1_norm(u);
    }
    original
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn clipping_scales_long_updates_and_keeps_short_ones() {
        let mut u = vec![3.0f32, 4.0];
        assert_eq!(clip_l2(&mut u, 1.0), 5.0);
        assert!(l2_norm(&u) <= 1.0);
        assert!((l2_norm(&u) - 1.0).abs() < 2e-6);
        let mut short = vec![0.3f32, 0.4];
        clip_l2(&mut short, 1.0);
        assert_eq!(short, vec![0.3, 0.4]);
    }

    /// 2000 random updates of norms spread over six orders of magnitude and several lengths:
    /// none exceeds S after clipping, and those inside S are untouched.
    #[test]
    fn no_clipped_update_exceeds_the_bound() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        for i in 0..2000 {
            let len = [1, 7, 100, 10_000][i % 4];
            let scale = 10f32.powf(rng.random_range(-3.0..3.0));
            let mut u: Vec<f32> = (0..len).map(|_| rng.random_range(-scale..scale)).collect();
            let original = u.clone();
            let bound = rng.random_range(0.01..10.0);
            let norm = clip_l2(&mut u, bound);
            assert!(l2_norm(&u) <= bound, "norm {} > S = {bound}", l2_norm(&u));
            if norm <= bound {
                assert_eq!(u, original);
            } else {
                assert!(l2_norm(&u) > bound * (1.0 - 1e-5), "over-clipped");
            }
        }
    }

    /// The lanes' norm against one running sum in f64, over lengths around the lane count.
    #[test]
    fn the_norm_matches_a_single_running_sum() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for len in [0, 1, 7, 8, 9, 17, 1000, 532_110] {
            let u: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
            let reference = u.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
            // Both sums of positive terms in f64: relative error at most len * 2^-53 each.
            let tolerance = 2.0 * len as f64 * f64::EPSILON * reference;
            assert!((l2_norm(&u) - reference).abs() <= tolerance, "len {len}");
        }
    }

    #[test]
    fn l1_clipping_bounds_the_norm() {
        let mut rng = StdRng::seed_from_u64(8);
        for _ in 0..500 {
            let mut u: Vec<f32> = (0..50).map(|_| rng.random_range(-3.0..3.0)).collect();
            let before = u.clone();
            let norm = clip_l1(&mut u, 1.5);
            assert!(l1_norm(&u) <= 1.5);
            if norm <= 1.5 {
                assert_eq!(u, before);
            }
        }
    }
}
