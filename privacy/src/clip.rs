//! The statistics the clip rules and the paper's diagnostics need: the median of the round's
//! norms and the moments of its updates. The clip itself is [`fl_model::norms`].

use fl_model::{CheckedUpdate, add_weighted};

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
