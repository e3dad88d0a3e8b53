//! Clipping of whole-model updates and the statistics the clip rules and the paper's diagnostics
//! need.
//!
//! The passes over an update (its norm, the scaling, the moments) are compiled per x86-64 SIMD
//! level with `multiversion`, as `crate::model::aggregate`'s sum is, and for the same reason.

use crate::model::{CheckedUpdate, add_weighted};
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

/// The median of `values` (mean of the middle two for an even count); `None` when empty. Used
/// by the paper's non-private clip rule S = median of the round's update norms.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The moments of a round's updates that give the between-clients variance V_c and update scale
/// U_s of Geyer et al. (Sec. 3):
/// mu_ij = 1/n sum_k u^k_ij; V_c = 1/P sum_ij (1/n sum_k (u^k_ij - mu_ij)^2); U_s = 1/P sum_ij mu_ij^2.
///
/// Summed over the parameters, 1/n sum_k (u^k_ij - mu_ij)^2 = 1/n sum_k (u^k_ij)^2 - mu_ij^2, so
/// V_c = 1/P (1/n sum_k ||u^k||^2 - ||mu||^2): one running sum per parameter and one of squared
/// norms suffice (a second per-parameter sum of squares would double the server's memory traffic
/// per update), and the squared norm is the one measured when the update was checked.
#[derive(Debug, Clone)]
pub struct UpdateMoments {
    /// sum_k u^k, per parameter.
    sum: Vec<f64>,
    /// sum_k ||u^k||^2.
    sum_sq_norms: f64,
    n: usize,
}

impl UpdateMoments {
    /// Empty moments over `len` parameters.
    pub fn new(len: usize) -> Self {
        Self {
            sum: vec![0.0; len],
            sum_sq_norms: 0.0,
            n: 0,
        }
    }

    /// Adds one update (same length as the model).
    pub fn add(&mut self, u: &CheckedUpdate) {
        add_weighted(&mut self.sum, 1.0, u);
        self.sum_sq_norms += u.squared_norm();
        self.n += 1;
    }

    /// (V_c, U_s), or `None` before any update.
    pub fn v_c_and_u_s(&self) -> Option<(f64, f64)> {
        if self.n == 0 || self.sum.is_empty() {
            return None;
        }
        let n = self.n as f64;
        let p = self.sum.len() as f64;
        // ||mu||^2 = sum_ij (sum_k u^k_ij / n)^2
        let mu_sq: f64 = self.sum.iter().map(|s| (s / n) * (s / n)).sum();
        // A variance: non-negative but for rounding.
        let v_c = (self.sum_sq_norms / n - mu_sq).max(0.0);
        Some((v_c / p, mu_sq / p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(values: Vec<f32>) -> CheckedUpdate {
        CheckedUpdate::new(values).unwrap()
    }

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
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn moments_give_the_papers_v_c_and_u_s() {
        let mut m = UpdateMoments::new(2);
        m.add(&checked(vec![1.0, 0.0]));
        m.add(&checked(vec![3.0, 2.0]));
        // mu = (2, 1); per-parameter variances (1, 1); V_c = 1; U_s = (4 + 1) / 2.
        assert_eq!(m.v_c_and_u_s(), Some((1.0, 2.5)));
    }

    /// On updates longer than the lanes, with a remainder, equal to the per-parameter definition.
    #[test]
    fn moments_equal_their_definition_per_parameter() {
        let (p, n) = (37, 5);
        let updates: Vec<Vec<f32>> = (0..n)
            .map(|k| {
                (0..p)
                    .map(|i| ((i * 7 + k * 13) % 11) as f32 / 4.0 - 1.0)
                    .collect()
            })
            .collect();
        let mut m = UpdateMoments::new(p);
        updates.iter().for_each(|u| m.add(&checked(u.clone())));
        let (mut v_c, mut u_s) = (0.0, 0.0);
        for i in 0..p {
            let column = updates.iter().map(|u| f64::from(u[i]));
            let mu = column.clone().sum::<f64>() / n as f64;
            v_c += column.map(|v| (v - mu) * (v - mu)).sum::<f64>() / n as f64;
            u_s += mu * mu;
        }
        let (got_v, got_u) = m.v_c_and_u_s().unwrap();
        assert!(
            (got_v - v_c / p as f64).abs() < 1e-12,
            "{got_v} vs {}",
            v_c / p as f64
        );
        assert!(
            (got_u - u_s / p as f64).abs() < 1e-12,
            "{got_u} vs {}",
            u_s / p as f64
        );
    }
}
