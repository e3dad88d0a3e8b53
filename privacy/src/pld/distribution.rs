//! A discrete privacy-loss distribution on a grid, with its mass at +infinity, and its
//! composition by FFT convolution (the composition half of the PLD accountant; module
//! documentation of `pld` for the error bounds).

use super::TAIL;
use realfft::RealFftPlanner;
use realfft::num_complex::Complex;
use std::sync::{LazyLock, Mutex, PoisonError};

/// A discrete privacy-loss distribution: mass `pmf[i]` at loss (offset + i) h, plus mass at +inf.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Pld {
    /// Grid step: the accountant's step times a power of two.
    pub(super) h: f64,
    pub(super) offset: i64,
    pub(super) pmf: Vec<f64>,
    pub(super) infinity: f64,
}

impl Pld {
    /// The PLD of no mechanism: all mass at loss 0.
    pub(super) fn identity(h: f64) -> Self {
        Self {
            h,
            offset: 0,
            pmf: vec![1.0],
            infinity: 0.0,
        }
    }

    pub(super) fn loss(&self, i: usize) -> f64 {
        (self.offset + i as i64) as f64 * self.h
    }

    /// Variance of the finite losses.
    pub(super) fn variance(&self) -> f64 {
        let mass: f64 = self.pmf.iter().sum();
        let moment = |k: i32| -> f64 {
            let weighted = self.pmf.iter().enumerate();
            weighted.map(|(i, p)| p * self.loss(i).powi(k)).sum::<f64>() / mass
        };
        let mean = moment(1);
        (moment(2) - mean * mean).max(0.0)
    }

    /// Losses from the lowest point to the highest.
    pub(super) fn width(&self) -> f64 {
        self.pmf.len() as f64 * self.h
    }

    /// The PLD of two independent mechanisms: losses add, so the masses convolve (on the
    /// coarser of the two grids).
    pub(super) fn compose(&self, other: &Pld) -> Pld {
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
    pub(super) fn on_grid(&self, h: f64) -> Pld {
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
    pub(super) fn power(&self, mut count: u64) -> Pld {
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
    pub(super) fn truncate(&mut self) {
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
    pub(super) fn delta(&self, epsilon: f64) -> f64 {
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
    pub(super) fn epsilon(&self, delta: f64) -> f64 {
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
pub(super) fn convolve(a: &[f64], b: &[f64]) -> Vec<f64> {
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

/// ln(e^a + e^b).
pub(super) fn log_add_exp(a: f64, b: f64) -> f64 {
    let (hi, lo) = if a > b { (a, b) } else { (b, a) };
    if lo == f64::NEG_INFINITY {
        hi
    } else {
        hi + (lo - hi).exp().ln_1p()
    }
}
