//! Rényi DP of one round of the sampled Gaussian mechanism, on a grid of orders.
//!
//! Written by hand: no maintained Rust crate computes subsampled-Gaussian RDP (the reference
//! implementations are Python: Google's dp_accounting and Opacus). Everything is in log space so
//! that tiny sampling rates and large orders neither underflow nor overflow.
//!
//! - Poisson sampling (each client independently with probability q; add/remove-one neighbours):
//!   the exact RDP of Mironov, Talwar, Zhang 2019. Integer orders by the binomial expansion,
//!   fractional orders by quadrature of the defining integral.
//! - Sampling exactly m of K without replacement (replace-one neighbours): the upper bound of
//!   Wang, Balle, Kasiviswanathan 2019, Theorem 27, with Corollary 10's interpolation between
//!   integer orders. The caller passes sigma/2, because replacing one clipped client moves the
//!   sum by up to 2S.
//!
//! A whole curve is computed at once ([`poisson_curve`], [`without_replacement_curve`]): the
//! quadrature grid, the log-factorials and WBK19's forward differences are shared by every order,
//! so a curve of the 156 default orders costs well under a millisecond.

/// The orders alpha at which RDP is tracked: 1.1 to 10.9 by 0.1, 11 to 63, 128, 256, 512, 1024
/// (the grid of Google's dp_accounting, so results compare one to one).
pub fn default_orders() -> Vec<f64> {
    let mut orders: Vec<f64> = (11..=109).map(|i| f64::from(i) / 10.0).collect();
    orders.extend((11..=63).map(f64::from));
    orders.extend([128.0, 256.0, 512.0, 1024.0]);
    orders
}

/// log(e^a + e^b) without overflow.
pub(crate) fn log_add(a: f64, b: f64) -> f64 {
    let (lo, hi) = if a < b { (a, b) } else { (b, a) };
    if lo == f64::NEG_INFINITY {
        return hi;
    }
    hi + (lo - hi).exp().ln_1p()
}

/// e^-40: a term this far below the largest adds less than rounding to their sum.
const NEGLIGIBLE: f64 = 4.248354255291589e-18;

/// log sum_i e^{x_i}, shifting by the largest term: one exponential per term, and the others'
/// share added by ln_1p, exact to rounding even when they are 1e-12 of the largest. A term more
/// than 40 below the largest counts as e^-40 (skipping the exponential; an upper bound).
fn log_sum_exp(terms: impl Iterator<Item = f64> + Clone) -> f64 {
    let (top, max) = terms
        .clone()
        .enumerate()
        .fold((0, f64::NEG_INFINITY), |best, (i, t)| {
            if t > best.1 { (i, t) } else { best }
        });
    if max == f64::NEG_INFINITY {
        return max;
    }
    let rest: f64 = terms
        .enumerate()
        .filter(|&(i, _)| i != top)
        .map(|(_, t)| {
            let d = t - max;
            if d < -40.0 { NEGLIGIBLE } else { d.exp() }
        })
        .sum();
    max + rest.ln_1p()
}

/// A real number as (sign, log |x|), for differences of huge numbers.
#[derive(Debug, Clone, Copy)]
struct Signed {
    positive: bool,
    log_abs: f64,
}

impl Signed {
    /// x - y.
    fn sub(self, y: Signed) -> Signed {
        let neg_y = Signed {
            positive: !y.positive,
            ..y
        };
        self.add(neg_y)
    }

    /// x + y.
    fn add(self, y: Signed) -> Signed {
        if self.positive == y.positive {
            return Signed {
                positive: self.positive,
                log_abs: log_add(self.log_abs, y.log_abs),
            };
        }
        let (big, small) = if self.log_abs >= y.log_abs {
            (self, y)
        } else {
            (y, self)
        };
        if big.log_abs == small.log_abs {
            return Signed {
                positive: true,
                log_abs: f64::NEG_INFINITY,
            };
        }
        Signed {
            positive: big.positive,
            log_abs: big.log_abs + (-(small.log_abs - big.log_abs).exp()).ln_1p(),
        }
    }
}

/// ln k, from a table for the orders of the default grid.
fn ln_int(k: u64) -> f64 {
    static TABLE: std::sync::LazyLock<Vec<f64>> =
        std::sync::LazyLock::new(|| (0..=1025u32).map(|k| f64::from(k).ln()).collect());
    TABLE
        .get(k as usize)
        .copied()
        .unwrap_or_else(|| (k as f64).ln())
}

/// log C(n, k) for every k in 0..=n, by the recurrence C(n, k+1) = C(n, k) (n - k) / (k + 1).
fn log_binomials(n: u64) -> impl Iterator<Item = f64> + Clone {
    let next = move |acc: &mut f64, k: u64| {
        *acc += ln_int(n - k) - ln_int(k + 1);
        Some(*acc)
    };
    std::iter::once(0.0).chain((0..n).scan(0.0, next))
}

/// log A_alpha for integer alpha, Poisson rate 0 < q < 1 (Mironov, Talwar, Zhang 2019, Sec. 3.2):
/// A_alpha = sum_{i=0..alpha} C(alpha, i) (1-q)^(alpha-i) q^i exp((i^2 - i) / (2 sigma^2)).
fn log_a_poisson_int(q: f64, sigma: f64, alpha: u64) -> f64 {
    let (log_q, log_1mq) = (q.ln(), (-q).ln_1p());
    let two_s2 = 2.0 * sigma * sigma;
    log_sum_exp(log_binomials(alpha).enumerate().map(|(i, lc)| {
        let i = i as f64;
        lc + i * log_q + (alpha as f64 - i) * log_1mq + (i * i - i) / two_s2
    }))
}

/// The defining integral of A_alpha for Poisson sampling (Mironov, Talwar, Zhang 2019, eq. (3)),
/// A_alpha = E_{z ~ N(0, sigma^2)} [(1 - q + q exp((2z - 1) / (2 sigma^2)))^alpha]
///         = integral of exp(g(z) + alpha m(z)) dz (g the log density, m the log mixture ratio),
/// by the trapezoid rule on one grid of z shared by every fractional order.
///
/// Error analysis, for the slack added to log A so that the result is an upper bound:
/// - truncation: the integrand lies below N(0, sigma^2) + 2^(alpha-1) q^alpha e^c N(alpha,
///   sigma^2) (convexity of x^alpha), so outside [-10 sigma, alpha + 10 sigma] it holds less than
///   2^alpha e^-50 of the total, below 1e-15 for the orders this is used for (alpha < 11);
/// - discretisation: the integrand is analytic in the strip |Im z| < min(2 sigma, 0.9 pi
///   sigma^2) (m has its singularities at Im z = pi sigma^2), where it grows at most e^2-fold,
///   so the trapezoid rule with step min(sigma/3, sigma^2/2) errs by at most about
///   e^2 e^(-2 pi d / h) < 1e-14 relative (Trefethen, Weideman 2014, Thm 5.1);
/// - rounding: each exponent g + alpha m carries an error below 4 eps (|g| + alpha |m|), and
///   the sum of n terms n eps.
struct PoissonQuadrature {
    /// z of the first grid point.
    lo: f64,
    /// Grid step.
    h: f64,
    sigma: f64,
    /// g(z_k) + ln h: the log density times the step.
    log_weight: Vec<f64>,
    /// m(z_k) = ln(1 - q + q exp((2 z_k - 1) / (2 sigma^2))).
    log_mixture: Vec<f64>,
}

/// Half-width of the integration range beyond the mixture's centres, in sigmas.
const TAIL_SIGMAS: f64 = 10.0;

impl PoissonQuadrature {
    /// The grid for every order up to `max_alpha`.
    fn new(q: f64, sigma: f64, max_alpha: f64) -> Self {
        let (log_q, log_1mq) = (q.ln(), (-q).ln_1p());
        let two_s2 = 2.0 * sigma * sigma;
        let h = (sigma / 3.0).min(sigma * sigma / 2.0);
        let lo = -TAIL_SIGMAS * sigma;
        let n = ((max_alpha + TAIL_SIGMAS * sigma - lo) / h).ceil() as usize + 1;
        let log_norm = h.ln() - (sigma * (2.0 * std::f64::consts::PI).sqrt()).ln();
        let z = |k: usize| lo + k as f64 * h;
        Self {
            lo,
            h,
            sigma,
            log_weight: (0..n).map(|k| log_norm - z(k) * z(k) / two_s2).collect(),
            log_mixture: (0..n)
                .map(|k| log_add(log_1mq, log_q + (2.0 * z(k) - 1.0) / two_s2))
                .collect(),
        }
    }

    /// An upper bound on log A_alpha, within about 1e-14 relative plus the rounding slack.
    fn log_a(&self, alpha: f64) -> f64 {
        let end = (((alpha + TAIL_SIGMAS * self.sigma - self.lo) / self.h).ceil() as usize + 1)
            .min(self.log_weight.len());
        let (g, m) = (&self.log_weight[..end], &self.log_mixture[..end]);
        let exponents = g.iter().zip(m).map(|(g, m)| g + alpha * m);
        let scale = g
            .iter()
            .zip(m)
            .map(|(g, m)| g.abs() + alpha * m.abs())
            .fold(0.0, f64::max);
        let slack = f64::EPSILON * (end as f64 + 4.0 * scale) + 1e-14;
        log_sum_exp(exponents) + slack
    }
}

/// RDP of one Poisson-sampled Gaussian round with rate `q` and noise multiplier `sigma` at
/// every order of `orders` (each > 1): ln(A_alpha) / (alpha - 1).
pub fn poisson_curve(q: f64, sigma: f64, orders: &[f64]) -> Vec<f64> {
    if q == 0.0 {
        return vec![0.0; orders.len()];
    }
    if q >= 1.0 {
        // No sampling: the Gaussian mechanism's RDP, alpha / (2 sigma^2) (Mironov 2017, Prop. 7).
        return orders.iter().map(|a| a / (2.0 * sigma * sigma)).collect();
    }
    let max_fractional = orders
        .iter()
        .copied()
        .filter(|a| a.fract() != 0.0)
        .fold(0.0, f64::max);
    let quadrature =
        (max_fractional > 0.0).then(|| PoissonQuadrature::new(q, sigma, max_fractional));
    orders
        .iter()
        .map(|&alpha| {
            let log_a = match &quadrature {
                Some(quad) if alpha.fract() != 0.0 => quad.log_a(alpha),
                _ => log_a_poisson_int(q, sigma, alpha as u64),
            };
            // A_alpha >= 1 mathematically; rounding must not make RDP negative.
            (log_a / (alpha - 1.0)).max(0.0)
        })
        .collect()
}

/// RDP at one order `alpha` of a Poisson-sampled Gaussian round (see [`poisson_curve`]).
pub fn rdp_poisson(q: f64, sigma: f64, alpha: f64) -> f64 {
    poisson_curve(q, sigma, &[alpha])[0]
}

/// log |Delta^k g(0)| for k = 0..=n, where g(l) = exp((l - 1) l / (2 sigma^2)) is the moment
/// function e^{(l-1) eps(l)} of the Gaussian (WBK19, Thm 27), by repeated differencing in
/// sign-and-log form.
fn log_forward_differences(sigma: f64, n: usize) -> Vec<f64> {
    let two_s2 = 2.0 * sigma * sigma;
    let mut row: Vec<Signed> = (0..=n + 1)
        .map(|l| {
            let l = l as f64;
            Signed {
                positive: true,
                log_abs: (l - 1.0) * l / two_s2,
            }
        })
        .collect();
    let mut out = Vec::with_capacity(n + 1);
    out.push(row[0].log_abs);
    for _ in 1..=n {
        row = row.windows(2).map(|w| w[1].sub(w[0])).collect();
        out.push(row[0].log_abs);
    }
    out
}

/// Orders up to which WBK19's tighter term (from forward differences) is used; above it the
/// cheaper term 2 e^{(j-1) eps(j)} alone (a valid, looser bound).
const EXACT_UP_TO: u64 = 256;

/// log A_alpha of WBK19 Theorem 27 (sampling without replacement, rate q = m/K, Gaussian with
/// multiplier `sigma`, eps(l) = l / (2 sigma^2)), integer alpha >= 2:
/// A = 1 + q^2 C(a,2) min{4 (e^{eps(2)} - 1), 2 e^{eps(2)}}
///       + sum_{j=3..a} q^j C(a,j) min{4 sqrt(|D^{2 floor(j/2)}| |D^{2 ceil(j/2)}|), 2 e^{(j-1) eps(j)}},
/// with D^k the k-th forward difference at 0 of e^{(l-1) eps(l)}: `diffs` from
/// [`log_forward_differences`] up to alpha + 1, or `None` above [`EXACT_UP_TO`].
fn log_a_without_replacement_int(q: f64, sigma: f64, alpha: u64, diffs: Option<&[f64]>) -> f64 {
    if alpha <= 1 {
        return 0.0;
    }
    let two_s2 = 2.0 * sigma * sigma;
    let eps = |l: f64| l / two_s2;
    let log_q = q.ln();
    let lc: Vec<f64> = log_binomials(alpha).collect();
    let e2 = eps(2.0);
    let second = (4.0f64.ln() + e2 + (-(-e2).exp()).ln_1p()).min(2.0f64.ln() + e2);
    let higher = (3..=alpha).map(|j| {
        let jf = j as f64;
        let cap = 2.0f64.ln() + (jf - 1.0) * eps(jf);
        let term = match diffs {
            Some(d) => {
                let lo = d[2 * (j as usize / 2)];
                let hi = d[2 * (j as usize).div_ceil(2)];
                (4.0f64.ln() + 0.5 * (lo + hi)).min(cap)
            }
            None => cap,
        };
        jf * log_q + lc[j as usize] + term
    });
    // The leading 1, the j = 2 term, then j = 3..=alpha.
    log_sum_exp(
        [0.0, 2.0 * log_q + lc[2] + second]
            .into_iter()
            .chain(higher),
    )
}

/// Upper bound on the RDP at every order of `orders` of one round that samples exactly m = qK
/// of K clients without replacement, for a Gaussian of multiplier `sigma` on the replace-one
/// sensitivity (pass sigma/2 for a sum of updates clipped to S, see the module doc).
pub fn without_replacement_curve(q: f64, sigma: f64, orders: &[f64]) -> Vec<f64> {
    if q == 0.0 {
        return vec![0.0; orders.len()];
    }
    if q >= 1.0 {
        return orders.iter().map(|a| a / (2.0 * sigma * sigma)).collect();
    }
    let max_exact = orders
        .iter()
        .map(|a| a.ceil() as u64)
        .filter(|&a| a <= EXACT_UP_TO)
        .max()
        .unwrap_or(0);
    let diffs = log_forward_differences(sigma, max_exact as usize + 1);
    let mut memo = std::collections::HashMap::new();
    let mut log_a = |j: u64| {
        *memo.entry(j).or_insert_with(|| {
            let d = (j <= EXACT_UP_TO).then_some(diffs.as_slice());
            log_a_without_replacement_int(q, sigma, j, d)
        })
    };
    orders
        .iter()
        .map(|&alpha| {
            let (lo, hi) = (alpha.floor(), alpha.ceil());
            // WBK19 Corollary 10: log A is convex in alpha, so interpolating the integer orders'
            // values bounds it from above.
            let t = alpha - lo;
            let value = if lo == hi {
                log_a(lo as u64)
            } else {
                (1.0 - t) * log_a(lo as u64) + t * log_a(hi as u64)
            };
            (value / (alpha - 1.0)).max(0.0)
        })
        .collect()
}

/// Upper bound on the RDP at one order `alpha` of a round that samples exactly m of K (see
/// [`without_replacement_curve`]).
pub fn rdp_without_replacement(q: f64, sigma: f64, alpha: f64) -> f64 {
    without_replacement_curve(q, sigma, &[alpha])[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The straightforward reference: composite Simpson over [-40 sigma, alpha + 40 sigma] with
    /// step sigma/200, one order at a time.
    fn reference_log_a_quadrature(q: f64, sigma: f64, alpha: f64) -> f64 {
        let (log_q, log_1mq) = (q.ln(), (-q).ln_1p());
        let two_s2 = 2.0 * sigma * sigma;
        let log_norm = -(sigma * (2.0 * std::f64::consts::PI).sqrt()).ln();
        let (lo, hi) = (-40.0 * sigma, alpha + 40.0 * sigma);
        let mut n = ((hi - lo) / (sigma / 200.0)).ceil() as usize;
        n += n % 2;
        let h = (hi - lo) / n as f64;
        let log_f = |z: f64| {
            log_norm - z * z / two_s2 + alpha * log_add(log_1mq, log_q + (2.0 * z - 1.0) / two_s2)
        };
        let weight = |k: usize| match k {
            0 => 1.0,
            k if k == n => 1.0,
            k if k % 2 == 1 => 4.0,
            _ => 2.0,
        };
        let logs: Vec<f64> = (0..=n).map(|k| log_f(lo + k as f64 * h)).collect();
        let max = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = (0..=n).map(|k| weight(k) * (logs[k] - max).exp()).sum();
        max + (sum * h / 3.0).ln()
    }

    /// (q, sigma) pairs from tiny rates to nearly no sampling, small to large noise.
    const CASES: [(f64, f64); 9] = [
        (1e-6, 1.0),
        (1e-5, 0.8),
        (0.001, 0.3),
        (0.01, 0.5),
        (0.01, 0.7),
        (0.1, 1.0),
        (0.3, 2.0),
        (0.9, 0.6),
        (0.05, 10.0),
    ];

    #[test]
    fn the_shared_grid_quadrature_bounds_the_binomial_sum_at_integer_orders() {
        for (q, sigma) in CASES {
            let quad = PoissonQuadrature::new(q, sigma, 11.0);
            for alpha in [2u64, 3, 5, 8, 11] {
                let exact = log_a_poisson_int(q, sigma, alpha);
                let ours = quad.log_a(alpha as f64);
                assert!(
                    ours >= exact,
                    "q={q} sigma={sigma} a={alpha}: {ours} < {exact}"
                );
                let err = ours - exact;
                assert!(
                    err < 1e-9 * exact + 1e-12,
                    "q={q} sigma={sigma} a={alpha}: {ours} vs {exact}"
                );
            }
        }
    }

    #[test]
    fn the_shared_grid_quadrature_matches_the_reference_at_fractional_orders() {
        for (q, sigma) in CASES {
            let quad = PoissonQuadrature::new(q, sigma, 10.9);
            for alpha in [1.1, 1.5, 2.7, 6.3, 10.9] {
                let reference = reference_log_a_quadrature(q, sigma, alpha);
                let ours = quad.log_a(alpha);
                let close = (ours - reference).abs() < 1e-9 * reference.abs() + 1e-12;
                assert!(
                    close,
                    "q={q} sigma={sigma} a={alpha}: {ours} vs {reference}"
                );
            }
        }
    }

    #[test]
    fn poisson_rdp_limits() {
        // No sampling gives the Gaussian mechanism alpha / (2 sigma^2).
        assert_eq!(rdp_poisson(1.0, 2.0, 8.0), 1.0);
        assert_eq!(rdp_poisson(0.0, 2.0, 8.0), 0.0);
        // Order 2 in closed form: A_2 = 1 + q^2 (e^{1/sigma^2} - 1).
        let r = rdp_poisson(1e-4, 4.0, 2.0);
        let exact = (1e-8 * (1.0f64 / 16.0).exp_m1()).ln_1p();
        assert!((r / exact - 1.0).abs() < 1e-9, "{r} vs {exact}");
        // Monotone in the order.
        let curve = poisson_curve(0.05, 1.1, &default_orders());
        assert!(curve.windows(2).all(|w| w[1] >= w[0] - 1e-12));
    }

    #[test]
    fn forward_differences_match_direct_sums() {
        // Delta^k g(0) = sum_i (-1)^(k-i) C(k,i) g(i), evaluated directly for a mild sigma.
        let sigma: f64 = 3.0;
        let g = |l: f64| ((l - 1.0) * l / (2.0 * sigma * sigma)).exp();
        let d = log_forward_differences(sigma, 6);
        for (k, log_d) in d.iter().enumerate() {
            let direct: f64 = (0..=k)
                .map(|i| {
                    let c = (1..=i).fold(1.0, |acc, j| acc * (k - j + 1) as f64 / j as f64);
                    let sign = if (k - i) % 2 == 0 { 1.0 } else { -1.0 };
                    sign * c * g(i as f64)
                })
                .sum();
            let log_direct = direct.abs().ln();
            let same = log_direct == *log_d || (log_direct - log_d).abs() < 1e-9;
            assert!(same, "k={k}: {log_direct} vs {log_d}");
        }
    }

    #[test]
    fn without_replacement_bound_is_at_least_the_poisson_value() {
        // Replace-one fixed-size sampling is never cheaper than add/remove Poisson at the same
        // multiplier; the bound must respect that.
        let orders = [2.0, 3.5, 10.0, 32.0];
        let fixed = without_replacement_curve(0.1, 1.0, &orders);
        let poisson = poisson_curve(0.1, 1.0, &orders);
        assert!(fixed.iter().zip(&poisson).all(|(f, p)| f >= p));
    }

    /// A curve computed at once equals its orders computed one at a time.
    #[test]
    fn curves_equal_their_orders_one_by_one() {
        let orders = default_orders();
        let (q, sigma) = (0.02, 0.9);
        for (curve, one) in [
            (
                poisson_curve(q, sigma, &orders),
                rdp_poisson as fn(f64, f64, f64) -> f64,
            ),
            (
                without_replacement_curve(q, sigma, &orders),
                rdp_without_replacement,
            ),
        ] {
            for (&alpha, &r) in orders.iter().zip(&curve) {
                let single = one(q, sigma, alpha);
                assert!(
                    (r - single).abs() <= 1e-12 * r,
                    "a={alpha}: {r} vs {single}"
                );
            }
        }
    }
}
