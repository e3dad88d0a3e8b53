//! The privacy-loss-distribution (PLD) accountant of the Poisson-subsampled Gaussian mechanism
//! (Koskela, Jälkö, Honkela 2020; Meiser, Mohammadi 2018), discretised by "connect the dots"
//! (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022) as Google's dp_accounting does, and
//! composed by FFT. Tighter than RDP: the same budget allows more rounds.
//!
//! Written here because no maintained Rust crate accounts PLDs (dp_accounting, Opacus and
//! prv_accountant are Python); the FFT is `realfft`'s.
//!
//! Every approximation errs towards a larger epsilon:
//! - discretisation: each grid bucket's P-mass is split between its two end points so that its
//!   P- and Q-masses are kept; the hockey-stick curve of the result is the chord interpolation of
//!   the true one in e^epsilon, which lies above it by convexity (Doroshenko et al. 2022, Thm 3.2),
//!   and dominance survives composition (Zhu, Dong, Wang 2022, Thm 10);
//! - the lower tail (mass at most [`TAIL`]) is moved up to the lowest grid point kept, the upper
//!   tail is moved to +infinity, where it counts fully in delta;
//! - FFT round-off is clipped at 0 and then handled as tails.
//!
//! Neighbours are add/remove one client: both directions are composed and the larger delta taken.

use super::accountant::{Accountant, PrivacyEvent};
use super::sampled_gaussian::{GaussianRound, Sampling};
use realfft::RealFftPlanner;
use realfft::num_complex::Complex;
use std::sync::{LazyLock, Mutex, PoisonError};

/// Grid step of the privacy loss (dp_accounting's default value_discretization_interval).
pub const GRID: f64 = 1e-4;

/// Probability mass dropped at each end of a distribution (moved to the end kept, or to +inf).
pub const TAIL: f64 = 1e-15;

/// z with P(N(0,1) > z) below [`TAIL`]: the single round's loss is discretised over x in
/// mu +- Z_TAIL sigma.
const Z_TAIL: f64 = 8.0;

/// A discrete privacy-loss distribution: mass `pmf[i]` at loss (offset + i) h, plus mass at +inf.
#[derive(Debug, Clone, PartialEq)]
struct Pld {
    /// Grid step: the accountant's step times a power of two.
    h: f64,
    offset: i64,
    pmf: Vec<f64>,
    infinity: f64,
}

impl Pld {
    /// The PLD of no mechanism: all mass at loss 0.
    fn identity(h: f64) -> Self {
        Self {
            h,
            offset: 0,
            pmf: vec![1.0],
            infinity: 0.0,
        }
    }

    fn loss(&self, i: usize) -> f64 {
        (self.offset + i as i64) as f64 * self.h
    }

    /// Variance of the finite losses.
    fn variance(&self) -> f64 {
        let mass: f64 = self.pmf.iter().sum();
        let moment = |k: i32| -> f64 {
            let weighted = self.pmf.iter().enumerate();
            weighted.map(|(i, p)| p * self.loss(i).powi(k)).sum::<f64>() / mass
        };
        let mean = moment(1);
        (moment(2) - mean * mean).max(0.0)
    }

    /// Losses from the lowest point to the highest.
    fn width(&self) -> f64 {
        self.pmf.len() as f64 * self.h
    }

    /// The PLD of two independent mechanisms: losses add, so the masses convolve (on the
    /// coarser of the two grids).
    fn compose(&self, other: &Pld) -> Pld {
        if self.h < other.h {
            return self.on_grid(other.h).compose(other);
        }
        if other.h < self.h {
            return self.compose(&other.on_grid(self.h));
        }
        let mut pld = Pld {
            h: self.h,
            offset: self.offset + other.offset,
            pmf: convolve(&self.pmf, &other.pmf),
            infinity: self.infinity + other.infinity - self.infinity * other.infinity,
        };
        pld.truncate();
        pld
    }

    /// This PLD on the coarser grid of step `h` (a power-of-two multiple of this one's), by
    /// connect-the-dots: a mass p at loss l between grid points a < l <= b goes to them as
    /// p (e^{b-l} - 1) / (e^{b-a} - 1) and the rest, which keeps its P- and Q-masses (p and
    /// p e^{-l}), so the result dominates this PLD (Doroshenko et al. 2022, Thm 3.2).
    fn on_grid(&self, h: f64) -> Pld {
        let factor = (h / self.h).round() as i64;
        if factor == 1 {
            return self.clone();
        }
        let lo = self.offset.div_euclid(factor);
        let hi = (self.offset + self.pmf.len() as i64 - 1).div_euclid(factor) + 1;
        let mut pmf = vec![0.0; (hi - lo + 1) as usize];
        // The share kept by the lower point, by the fine point's place r in its coarse interval.
        let lower_share: Vec<f64> = (0..factor)
            .map(|r| ((factor - r) as f64 * self.h).exp_m1() / h.exp_m1())
            .collect();
        for (i, &p) in self.pmf.iter().enumerate() {
            let fine = self.offset + i as i64;
            let (j, r) = (
                (fine.div_euclid(factor) - lo) as usize,
                fine.rem_euclid(factor),
            );
            let lower = p * lower_share[r as usize];
            pmf[j] += lower;
            pmf[j + 1] += p - lower;
        }
        let mut pld = Pld {
            h,
            offset: lo,
            pmf,
            infinity: self.infinity,
        };
        pld.truncate();
        pld
    }

    /// `count` rounds of this PLD, by repeated squaring.
    fn power(&self, mut count: u64) -> Pld {
        let mut result = Pld::identity(self.h);
        let mut base = self.clone();
        while count > 0 {
            if count & 1 == 1 {
                result = result.compose(&base);
            }
            count >>= 1;
            if count > 0 {
                base = base.compose(&base);
            }
        }
        result
    }

    /// Clips round-off below 0, moves the lowest mass (at most [`TAIL`]) up to the first point
    /// kept and the highest (at most [`TAIL`]) to +inf: both raise the loss.
    fn truncate(&mut self) {
        self.pmf.iter_mut().for_each(|p| *p = p.max(0.0));
        let mut low = 0;
        let mut below = 0.0;
        while low + 1 < self.pmf.len() && below + self.pmf[low] <= TAIL {
            below += self.pmf[low];
            low += 1;
        }
        let mut high = self.pmf.len();
        let mut above = 0.0;
        while high > low + 1 && above + self.pmf[high - 1] <= TAIL {
            above += self.pmf[high - 1];
            high -= 1;
        }
        self.pmf.truncate(high);
        self.pmf.drain(..low);
        self.pmf[0] += below;
        self.offset += low as i64;
        self.infinity += above;
    }

    /// delta(epsilon) = P(L = inf) + sum_{l > epsilon} p_l (1 - e^{epsilon - l}) (the
    /// hockey-stick divergence; Koskela et al. 2020, Eq. 5).
    fn delta(&self, epsilon: f64) -> f64 {
        let sum: f64 = self
            .pmf
            .iter()
            .enumerate()
            .map(|(i, &p)| (p, self.loss(i)))
            .filter(|&(_, l)| l > epsilon)
            .map(|(p, l)| -p * (epsilon - l).exp_m1())
            .sum();
        (self.infinity + sum).min(1.0)
    }

    /// The smallest epsilon >= 0 with delta(epsilon) <= `delta`. On [l_{k-1}, l_k) the
    /// hockey-stick divergence is A_k - e^epsilon B_k with A_k = P(inf) + sum_{i >= k} p_i and
    /// B_k = sum_{i >= k} p_i e^{-l_i}: walk down from the top and solve in the first interval
    /// whose lower end is already above `delta`.
    fn epsilon(&self, delta: f64) -> f64 {
        if self.infinity > delta {
            return f64::INFINITY;
        }
        // B in log space: e^{-l} underflows for the losses of long runs.
        let (mut a, mut log_b) = (self.infinity, f64::NEG_INFINITY);
        let solve = |a: f64, log_b: f64| (a - delta).ln() - log_b;
        for i in (0..self.pmf.len()).rev() {
            let l = self.loss(i);
            if l <= 0.0 {
                break;
            }
            if a - (l + log_b).exp() > delta {
                return solve(a, log_b);
            }
            a += self.pmf[i];
            log_b = log_add_exp(log_b, self.pmf[i].ln() - l);
        }
        // Every loss above 0 is in (A, B): delta(0) = A - B.
        if a - log_b.exp() <= delta {
            0.0
        } else {
            solve(a, log_b)
        }
    }
}

/// Full linear convolution: direct when small (exact), by real FFT otherwise.
fn convolve(a: &[f64], b: &[f64]) -> Vec<f64> {
    let n = a.len() + b.len() - 1;
    if a.len().min(b.len()) <= 64 || a.len() * b.len() <= 1 << 16 {
        let mut out = vec![0.0; n];
        for (i, &x) in a.iter().enumerate() {
            for (o, &y) in out[i..].iter_mut().zip(b) {
                *o += x * y;
            }
        }
        return out;
    }
    let len = n.next_power_of_two();
    let (forward, inverse) = {
        // Plans are kept: making one computes its twiddles, which cost more than the FFT.
        static PLANNER: LazyLock<Mutex<RealFftPlanner<f64>>> = LazyLock::new(Mutex::default);
        let mut planner = PLANNER.lock().unwrap_or_else(PoisonError::into_inner);
        (planner.plan_fft_forward(len), planner.plan_fft_inverse(len))
    };
    let spectrum = |x: &[f64]| {
        let mut input = vec![0.0; len];
        input[..x.len()].copy_from_slice(x);
        let mut out = forward.make_output_vec();
        forward
            .process(&mut input, &mut out)
            .expect("buffers sized by the plan");
        out
    };
    let (fa, fb) = (spectrum(a), spectrum(b));
    let mut product: Vec<Complex<f64>> = fa.iter().zip(&fb).map(|(x, y)| x * y).collect();
    // realfft needs the imaginary parts of the DC and Nyquist bins to be exactly 0.
    product[0].im = 0.0;
    if let Some(last) = product.last_mut() {
        last.im = 0.0;
    }
    let mut out = inverse.make_output_vec();
    inverse
        .process(&mut product, &mut out)
        .expect("buffers sized by the plan");
    out.truncate(n);
    let scale = 1.0 / len as f64;
    out.iter_mut().for_each(|v| *v *= scale);
    out
}

/// P(s < Z <= t) for Z ~ N(0, 1), from whichever tail keeps precision.
fn normal_mass(s: f64, t: f64) -> f64 {
    // P(Z > z) = erfc(z / sqrt 2) / 2.
    let upper = |z: f64| 0.5 * libm::erfc(z / std::f64::consts::SQRT_2);
    let mass = if s >= 0.0 {
        upper(s) - upper(t)
    } else if t <= 0.0 {
        upper(-t) - upper(-s)
    } else {
        1.0 - upper(-s) - upper(t)
    };
    mass.max(0.0)
}

/// ln(e^a + e^b).
fn log_add_exp(a: f64, b: f64) -> f64 {
    let (hi, lo) = if a > b { (a, b) } else { (b, a) };
    if lo == f64::NEG_INFINITY {
        hi
    } else {
        hi + (lo - hi).exp().ln_1p()
    }
}

/// One direction of the add/remove pair of a Poisson-subsampled Gaussian round with rate q and
/// noise multiplier sigma (sensitivity 1): `remove` compares P = (1-q) N(0, s^2) + q N(1, s^2)
/// with Q = N(0, s^2); the other direction swaps them.
#[derive(Debug, Clone, Copy)]
struct SubsampledGaussian {
    q: f64,
    sigma: f64,
    remove: bool,
}

impl SubsampledGaussian {
    /// ln of the mixture's density ratio, ln(1 - q + q e^{(2x - 1) / (2 sigma^2)}).
    fn log_mixture_ratio(&self, x: f64) -> f64 {
        let t = (2.0 * x - 1.0) / (2.0 * self.sigma * self.sigma);
        log_add_exp((-self.q).ln_1p(), self.q.ln() + t)
    }

    /// L(x) = ln(P(x) / Q(x)): increasing in x for `remove`, decreasing otherwise.
    fn loss(&self, x: f64) -> f64 {
        let r = self.log_mixture_ratio(x);
        if self.remove { r } else { -r }
    }

    /// The x where the mixture's log ratio equals `r`: sigma^2 (ln(e^r - (1 - q)) - ln q) + 1/2,
    /// or -inf where r <= ln(1 - q) (never reached).
    fn inverse_ratio(&self, r: f64) -> f64 {
        let inner = -(1.0 - self.q) * (-r).exp();
        if inner <= -1.0 {
            return f64::NEG_INFINITY;
        }
        self.sigma * self.sigma * (r + inner.ln_1p() - self.q.ln()) + 0.5
    }

    /// (P, Q) masses of the x interval (a, b].
    fn masses(&self, a: f64, b: f64) -> (f64, f64) {
        let s = self.sigma;
        let centred = normal_mass(a / s, b / s);
        let mixture = (1.0 - self.q) * centred + self.q * normal_mass((a - 1.0) / s, (b - 1.0) / s);
        if self.remove {
            (mixture, centred)
        } else {
            (centred, mixture)
        }
    }

    /// (P, Q) masses of the losses in (lo, hi].
    fn loss_masses(&self, lo: f64, hi: f64) -> (f64, f64) {
        if self.remove {
            self.masses(self.inverse_ratio(lo), self.inverse_ratio(hi))
        } else {
            // L = -ratio: L in (lo, hi] iff ratio in [-hi, -lo), an x interval [x(-hi), x(-lo)).
            self.masses(self.inverse_ratio(-hi), self.inverse_ratio(-lo))
        }
    }

    /// The connect-the-dots PLD on the grid of step `h`.
    fn pld(&self, h: f64) -> Pld {
        let span = Z_TAIL * self.sigma;
        let (x_lo, x_hi) = if self.remove {
            (-span, 1.0 + span)
        } else {
            (-span, span)
        };
        let (l1, l2) = (self.loss(x_lo), self.loss(x_hi));
        let (lo, hi) = (
            (l1.min(l2) / h).floor() as i64,
            (l1.max(l2) / h).ceil() as i64,
        );
        let points = (hi - lo + 1) as usize;
        let mut pmf = vec![0.0; points];
        // Losses at or below the lowest point: all to that point (the chord from e^eps = 0).
        pmf[0] = self.loss_masses(f64::NEG_INFINITY, lo as f64 * h).0;
        let growth = h.exp_m1();
        for i in 0..points - 1 {
            let (a, b) = ((lo + i as i64) as f64 * h, (lo + i as i64 + 1) as f64 * h);
            let (p, q) = self.loss_masses(a, b);
            if p <= 0.0 {
                continue;
            }
            // Keep P and Q: to the lower point (e^b Q - P) / (e^h - 1), the rest to the upper.
            let scaled_q = if q > 0.0 { (q.ln() + b).exp() } else { 0.0 };
            let lower = ((scaled_q - p) / growth).clamp(0.0, p);
            pmf[i] += lower;
            pmf[i + 1] += p - lower;
        }
        let infinity = self.loss_masses(hi as f64 * h, f64::INFINITY).0;
        let mut pld = Pld {
            h,
            offset: lo,
            pmf,
            infinity,
        };
        pld.truncate();
        pld
    }
}

/// Points a composed PLD may span before the accountant coarsens its grid (by powers of two):
/// bounds the cost of each convolution. On the 100,000-round bench run this moves epsilon up by
/// 0.34% (docs/performance.md).
const MAX_POINTS: f64 = 65_536.0;

/// Grid of the probe that estimates a batch's width (loss units per point).
const PROBE_GRID: f64 = 1e-2;

/// The PLD accountant: the composed PLDs of both directions of add/remove neighbours.
/// Events it cannot account (fixed-size sampling, distributed discrete Gaussian noise) make
/// its epsilon and delta infinite and 1, never smaller: use the RDP accountant for those.
#[derive(Debug, Clone)]
pub struct PldAccountant {
    /// The finest grid step; long runs use a power-of-two multiple of it.
    h: f64,
    remove: Pld,
    add: Pld,
    unsupported: bool,
    /// Single-round PLDs of events seen before, with their grid step (remove, add).
    cache: Vec<(GaussianRound, f64, Pld, Pld)>,
    /// The rounds composed so far, consecutive repeats merged.
    rounds: Vec<(GaussianRound, u64)>,
}

impl Default for PldAccountant {
    fn default() -> Self {
        Self::with_grid(GRID)
    }
}

impl PldAccountant {
    /// An empty accountant with loss grid step `h`.
    pub fn with_grid(h: f64) -> Self {
        Self {
            h,
            remove: Pld::identity(h),
            add: Pld::identity(h),
            unsupported: false,
            cache: Vec::new(),
            rounds: Vec::new(),
        }
    }

    /// Whether the accountant covers `event`: Poisson-subsampled Gaussian rounds, and tree
    /// aggregation's rounds (Gaussian nodes without sampling).
    pub fn supports(event: &PrivacyEvent) -> bool {
        Self::as_gaussian(event).is_some()
    }

    /// The Gaussian round `event` composes as (`Some(None)`: a tree step that adds no node), or
    /// `None` when this accountant cannot account it.
    fn as_gaussian(event: &PrivacyEvent) -> Option<Option<GaussianRound>> {
        match event {
            PrivacyEvent::SampledGaussian(
                round @ GaussianRound {
                    sampling: Sampling::Poisson,
                    ..
                },
            ) => Some(Some(*round)),
            PrivacyEvent::TreeAggregation(tree) => Some(tree.node()),
            _ => None,
        }
    }

    /// The single-round PLDs (remove, add) of `round` on the grid of step `h`.
    fn single(&mut self, round: &GaussianRound, h: f64) -> (Pld, Pld) {
        let mut seen = self.cache.iter().rev();
        if let Some((_, _, r, a)) = seen.find(|(e, g, _, _)| e == round && *g == h) {
            return (r.clone(), a.clone());
        }
        let direction = |remove| SubsampledGaussian {
            q: round.q,
            sigma: round.noise_multiplier,
            remove,
        };
        let (r, a) = (direction(true).pld(h), direction(false).pld(h));
        self.cache.push((*round, h, r.clone(), a.clone()));
        (r, a)
    }

    /// The grid for the rounds composed so far: the finest step doubled until the estimated
    /// width of their composition fits in [`MAX_POINTS`]. It depends only on which rounds were
    /// composed, never on the order or grouping of the `compose` calls, so a ledger replayed
    /// round by round and a planner composing all rounds at once report the same epsilon. Only
    /// speed and tightness depend on the estimate: every grid gives an upper bound.
    fn grid_for_rounds(&mut self) -> f64 {
        // Per direction: sum of n variance, sum of n w1, largest w1.
        let mut totals = [[0.0f64; 3]; 2];
        for (round, count) in self.rounds.clone() {
            let (r, a) = self.single(&round, PROBE_GRID.max(self.h));
            for (t, one) in totals.iter_mut().zip([&r, &a]) {
                let n = count as f64;
                t[0] += n * one.variance();
                t[1] += n * one.width();
                t[2] = t[2].max(one.width());
            }
        }
        // Losses of the composition: the sum of the widths at most; about the mean +- 8 sd
        // (tails of 1e-15), widened by one round's width, otherwise.
        let widest = totals
            .iter()
            .map(|t| t[1].min(16.0 * t[0].sqrt() + t[2]))
            .fold(0.0, f64::max);
        let mut h = self.h.max(self.remove.h);
        while widest / h > MAX_POINTS {
            h *= 2.0;
        }
        h
    }

    /// Composes `count` rounds of `round` onto the running PLDs, on their grid.
    fn apply(&mut self, round: &GaussianRound, count: u64) {
        let (r, a) = self.single(round, self.remove.h);
        // The two directions are independent: one on another core.
        let (remove, add) = std::thread::scope(|scope| {
            let add = scope.spawn(|| self.add.compose(&a.power(count)));
            let remove = self.remove.compose(&r.power(count));
            (remove, add.join().expect("PLD composition does not panic"))
        });
        self.remove = remove;
        self.add = add;
    }
}

impl Accountant for PldAccountant {
    fn name(&self) -> &'static str {
        "pld"
    }

    fn compose(&mut self, event: &PrivacyEvent, count: u64) {
        if count == 0 {
            return;
        }
        let round = match Self::as_gaussian(event) {
            Some(Some(round)) => round,
            Some(None) => return,
            None => {
                self.unsupported = true;
                return;
            }
        };
        let round = &round;
        match self.rounds.last_mut() {
            Some((last, n)) if last == round => *n += count,
            _ => self.rounds.push((*round, count)),
        }
        let h = self.grid_for_rounds();
        if h == self.remove.h {
            self.apply(round, count);
            return;
        }
        // A coarser grid: every round so far again, from the start, on it.
        self.remove = Pld::identity(h);
        self.add = Pld::identity(h);
        for (round, count) in self.rounds.clone() {
            self.apply(&round, count);
        }
    }

    fn epsilon(&self, delta: f64) -> f64 {
        if self.unsupported {
            return f64::INFINITY;
        }
        self.remove.epsilon(delta).max(self.add.epsilon(delta))
    }

    fn delta(&self, epsilon: f64) -> f64 {
        if self.unsupported {
            return 1.0;
        }
        self.remove.delta(epsilon).max(self.add.delta(epsilon))
    }

    fn boxed(&self) -> Box<dyn Accountant> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(q: f64, sigma: f64) -> PrivacyEvent {
        GaussianRound::new(q, sigma, Sampling::Poisson)
            .unwrap()
            .into()
    }

    /// A discretised round keeps its total mass, and its delta is never below the exact one
    /// (q = 1: the Gaussian mechanism, whose delta is Phi(-eps s + 1/(2s)) - e^eps
    /// Phi(-eps s - 1/(2s)); Balle, Wang 2018, Thm 8).
    #[test]
    fn one_gaussian_round_dominates_the_exact_curve() {
        let sigma: f64 = 1.3;
        let mut acc = PldAccountant::default();
        acc.compose(&round(1.0, sigma), 1);
        for pld in [&acc.remove, &acc.add] {
            let total: f64 = pld.pmf.iter().sum::<f64>() + pld.infinity;
            assert!((total - 1.0).abs() < 1e-12, "total mass {total}");
        }
        for eps in [0.0, 0.5, 1.0, 2.0, 4.0] {
            let cdf = |z: f64| normal_mass(f64::NEG_INFINITY, z);
            let exact =
                cdf(-eps * sigma + 0.5 / sigma) - f64::exp(eps) * cdf(-eps * sigma - 0.5 / sigma);
            let ours = acc.delta(eps);
            assert!(ours >= exact * (1.0 - 1e-9), "eps {eps}: {ours} < {exact}");
            assert!(
                ours <= exact * 1.001 + 1e-15,
                "eps {eps}: {ours} >> {exact}"
            );
        }
    }

    /// Composing by squaring equals composing one round at a time, and FFT convolution equals
    /// the direct sum.
    #[test]
    fn composition_paths_agree() {
        // A grid coarse enough that neither path coarsens it further.
        let event = round(0.1, 1.0);
        let mut once = PldAccountant::with_grid(1e-3);
        once.compose(&event, 6);
        assert_eq!(once.remove.h, 1e-3);
        let mut stepwise = PldAccountant::with_grid(1e-3);
        for _ in 0..6 {
            stepwise.compose(&event, 1);
        }
        let (a, b) = (once.epsilon(1e-5), stepwise.epsilon(1e-5));
        assert!((a - b).abs() < 1e-9 * a, "{a} vs {b}");
        let x: Vec<f64> = (0..300)
            .map(|i| ((i * 7919) % 101) as f64 / 101.0)
            .collect();
        let y: Vec<f64> = (0..500)
            .map(|i| ((i * 104729) % 97) as f64 / 97.0)
            .collect();
        let mut direct = vec![0.0; x.len() + y.len() - 1];
        for (i, a) in x.iter().enumerate() {
            for (j, b) in y.iter().enumerate() {
                direct[i + j] += a * b;
            }
        }
        for (d, f) in direct.iter().zip(convolve(&x, &y)) {
            assert!((d - f).abs() < 1e-9, "{d} vs {f}");
        }
    }

    /// Moving to a coarser grid keeps the mass and never lowers delta, and a long run, which
    /// coarsens its grid, never gets a smaller epsilon than the same run on the finest grid.
    #[test]
    fn coarser_grids_dominate() {
        let fine = SubsampledGaussian {
            q: 0.05,
            sigma: 0.9,
            remove: true,
        }
        .pld(GRID)
        .power(20);
        let coarse = fine.on_grid(GRID * 8.0);
        let mass = |p: &Pld| p.pmf.iter().sum::<f64>() + p.infinity;
        assert!((mass(&coarse) - mass(&fine)).abs() < 1e-12);
        for eps in [0.0, 0.3, 1.0, 2.0, 3.0] {
            assert!(coarse.delta(eps) >= fine.delta(eps), "eps {eps}");
        }
        let mut long = PldAccountant::default();
        long.compose(&round(0.01, 0.8), 20_000);
        assert!(long.remove.h > GRID, "the grid was coarsened");
        let mut finest = PldAccountant::default();
        let one = finest.single(
            &GaussianRound::new(0.01, 0.8, Sampling::Poisson).unwrap(),
            GRID,
        );
        let (r, a) = (one.0.power(20_000), one.1.power(20_000));
        let exact = r.epsilon(1e-5).max(a.epsilon(1e-5));
        let ours = long.epsilon(1e-5);
        assert!(ours >= exact && ours < exact * 1.001, "{ours} vs {exact}");
    }

    /// The grid depends on the rounds composed, not on how the calls grouped them: 20,000
    /// rounds at once and in 20 calls (crossing grid changes) give the same epsilon.
    #[test]
    fn grouping_of_rounds_does_not_change_epsilon() {
        let event = round(0.01, 0.8);
        let mut once = PldAccountant::default();
        once.compose(&event, 20_000);
        let mut grouped = PldAccountant::default();
        for _ in 0..20 {
            grouped.compose(&event, 1_000);
        }
        assert!(once.remove.h > GRID);
        let (a, b) = (once.epsilon(1e-5), grouped.epsilon(1e-5));
        assert!((a - b).abs() < 1e-9 * a, "{a} vs {b}");
    }

    #[test]
    fn epsilon_and_delta_invert_each_other() {
        let mut acc = PldAccountant::default();
        acc.compose(&round(0.05, 0.9), 50);
        let eps = acc.epsilon(1e-5);
        assert!(eps > 0.0 && eps.is_finite());
        let d = acc.delta(eps);
        assert!((d - 1e-5).abs() < 1e-9, "{d}");
        assert!(acc.delta(eps * 0.99) > 1e-5);
    }

    #[test]
    fn unsupported_events_never_lower_the_figure() {
        let mut acc = PldAccountant::default();
        let fixed = GaussianRound::new(0.1, 1.0, Sampling::Fixed).unwrap();
        acc.compose(&fixed.into(), 1);
        assert_eq!(acc.epsilon(1e-5), f64::INFINITY);
        assert_eq!(acc.delta(8.0), 1.0);
    }
}
