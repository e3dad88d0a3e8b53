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

/// log C(n, k) for every k in 0..=n, by the recurrence C(n, k+1) = C(n, k) (n - k) / (k + 1).
fn log_binomials(n: u64) -> Vec<f64> {
    let mut out = Vec::with_capacity(n as usize + 1);
    let mut acc = 0.0;
    out.push(acc);
    for k in 0..n {
        acc += ((n - k) as f64).ln() - ((k + 1) as f64).ln();
        out.push(acc);
    }
    out
}

/// log A_alpha for integer alpha, Poisson rate 0 < q < 1 (Mironov, Talwar, Zhang 2019, Sec. 3.2):
/// A_alpha = sum_{i=0..alpha} C(alpha, i) (1-q)^(alpha-i) q^i exp((i^2 - i) / (2 sigma^2)).
fn log_a_poisson_int(q: f64, sigma: f64, alpha: u64) -> f64 {
    let (log_q, log_1mq) = (q.ln(), (-q).ln_1p());
    let two_s2 = 2.0 * sigma * sigma;
    log_binomials(alpha)
        .iter()
        .enumerate()
        .map(|(i, lc)| {
            let i = i as f64;
            lc + i * log_q + (alpha as f64 - i) * log_1mq + (i * i - i) / two_s2
        })
        .fold(f64::NEG_INFINITY, log_add)
}

/// log A_alpha for any alpha > 1 by quadrature (Mironov, Talwar, Zhang 2019, eq. (3)):
/// A_alpha = E_{z ~ N(0, sigma^2)} [(1 - q + q exp((2z - 1) / (2 sigma^2)))^alpha].
/// The integrand is smooth and positive (no cancellation); its mass lies between the two mixture
/// components' centres 0 and alpha, so composite Simpson over [-40 sigma, alpha + 40 sigma] with
/// step sigma/200 is accurate far beyond the 1e-6 relative this accountant needs (checked against
/// the exact binomial sum at integer orders in the tests).
fn log_a_poisson_quadrature(q: f64, sigma: f64, alpha: f64) -> f64 {
    let (log_q, log_1mq) = (q.ln(), (-q).ln_1p());
    let two_s2 = 2.0 * sigma * sigma;
    let log_norm = -(sigma * (2.0 * std::f64::consts::PI).sqrt()).ln();
    let (lo, hi) = (-40.0 * sigma, alpha + 40.0 * sigma);
    let mut n = ((hi - lo) / (sigma / 200.0)).ceil() as usize;
    n += n % 2; // Simpson needs an even number of intervals
    let h = (hi - lo) / n as f64;
    let log_f = |z: f64| {
        let mix = log_add(log_1mq, log_q + (2.0 * z - 1.0) / two_s2);
        log_norm - z * z / two_s2 + alpha * mix
    };
    let values: Vec<f64> = (0..=n).map(|k| log_f(lo + k as f64 * h)).collect();
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = values
        .iter()
        .enumerate()
        .map(|(k, v)| {
            let w = if k == 0 || k == n {
                1.0
            } else if k % 2 == 1 {
                4.0
            } else {
                2.0
            };
            w * (v - max).exp()
        })
        .sum();
    max + (sum * h / 3.0).ln()
}

/// RDP at order `alpha` of one Poisson-sampled Gaussian round with rate `q` and noise multiplier
/// `sigma`: ln(A_alpha) / (alpha - 1).
pub fn rdp_poisson(q: f64, sigma: f64, alpha: f64) -> f64 {
    if q == 0.0 {
        return 0.0;
    }
    if q >= 1.0 {
        // No sampling: the Gaussian mechanism's RDP, alpha / (2 sigma^2) (Mironov 2017, Prop. 7).
        return alpha / (2.0 * sigma * sigma);
    }
    let log_a = if alpha.fract() == 0.0 {
        log_a_poisson_int(q, sigma, alpha as u64)
    } else {
        log_a_poisson_quadrature(q, sigma, alpha)
    };
    // A_alpha >= 1 mathematically; rounding must not make RDP negative.
    (log_a / (alpha - 1.0)).max(0.0)
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

/// log A_alpha of WBK19 Theorem 27 (sampling without replacement, rate q = m/K, Gaussian with
/// multiplier `sigma`, eps(l) = l / (2 sigma^2)), integer alpha >= 2:
/// A = 1 + q^2 C(a,2) min{4 (e^{eps(2)} - 1), 2 e^{eps(2)}}
///       + sum_{j=3..a} q^j C(a,j) min{4 sqrt(|D^{2 floor(j/2)}| |D^{2 ceil(j/2)}|), 2 e^{(j-1) eps(j)}},
/// with D^k the k-th forward difference at 0 of e^{(l-1) eps(l)}. Above order 256 the cheaper
/// term 2 e^{(j-1) eps(j)} alone is used (a valid, looser bound).
fn log_a_without_replacement_int(q: f64, sigma: f64, alpha: u64) -> f64 {
    const EXACT_UP_TO: u64 = 256;
    if alpha <= 1 {
        return 0.0;
    }
    let two_s2 = 2.0 * sigma * sigma;
    let eps = |l: f64| l / two_s2;
    let log_q = q.ln();
    let lc = log_binomials(alpha);
    let diffs = (alpha <= EXACT_UP_TO).then(|| log_forward_differences(sigma, alpha as usize + 1));
    let mut log_a = 0.0f64; // the leading 1
    let e2 = eps(2.0);
    let second = (4.0f64.ln() + e2 + (-(-e2).exp()).ln_1p()).min(2.0f64.ln() + e2);
    log_a = log_add(log_a, 2.0 * log_q + lc[2] + second);
    for j in 3..=alpha {
        let jf = j as f64;
        let cap = 2.0f64.ln() + (jf - 1.0) * eps(jf);
        let term = match &diffs {
            Some(d) => {
                let lo = d[2 * (j as usize / 2)];
                let hi = d[2 * (j as usize).div_ceil(2)];
                (4.0f64.ln() + 0.5 * (lo + hi)).min(cap)
            }
            None => cap,
        };
        log_a = log_add(log_a, jf * log_q + lc[j as usize] + term);
    }
    log_a
}

/// Upper bound on the RDP at order `alpha` of one round that samples exactly m = qK of K clients
/// without replacement, for a Gaussian of multiplier `sigma` on the replace-one sensitivity
/// (pass sigma/2 for a sum of updates clipped to S, see the module doc).
pub fn rdp_without_replacement(q: f64, sigma: f64, alpha: f64) -> f64 {
    if q == 0.0 {
        return 0.0;
    }
    if q >= 1.0 {
        return alpha / (2.0 * sigma * sigma);
    }
    let lo = alpha.floor();
    let hi = alpha.ceil();
    let value = if lo == hi {
        log_a_without_replacement_int(q, sigma, lo as u64)
    } else {
        // WBK19 Corollary 10: log A is convex in alpha, so interpolating the integer orders'
        // values bounds it from above.
        let t = alpha - lo;
        (1.0 - t) * log_a_without_replacement_int(q, sigma, lo as u64)
            + t * log_a_without_replacement_int(q, sigma, hi as u64)
    };
    (value / (alpha - 1.0)).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quadrature_matches_the_binomial_sum_at_integer_orders() {
        for (q, sigma) in [(0.01, 0.7), (0.1, 1.0), (0.3, 2.0), (1e-5, 0.8)] {
            for alpha in [2u64, 5, 11, 40] {
                let exact = log_a_poisson_int(q, sigma, alpha);
                let quad = log_a_poisson_quadrature(q, sigma, alpha as f64);
                let rel = (exact - quad).abs() / exact.abs().max(1e-300);
                assert!(
                    rel < 1e-6,
                    "q={q} sigma={sigma} a={alpha}: {exact} vs {quad}"
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
        let orders = default_orders();
        let curve: Vec<f64> = orders.iter().map(|&a| rdp_poisson(0.05, 1.1, a)).collect();
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
        for alpha in [2.0, 3.5, 10.0, 32.0] {
            assert!(rdp_without_replacement(0.1, 1.0, alpha) >= rdp_poisson(0.1, 1.0, alpha));
        }
    }
}
