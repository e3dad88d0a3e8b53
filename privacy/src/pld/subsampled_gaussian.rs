//! One round of the Poisson-subsampled Gaussian as a discrete privacy-loss distribution, by
//! "connect the dots" (Doroshenko et al. 2022): the discretisation half of the PLD accountant.

use super::distribution::{Pld, log_add_exp};

/// z with P(N(0,1) > z) below [`TAIL`]: the single round's loss is discretised over x in
/// mu +- Z_TAIL sigma.
pub(super) const Z_TAIL: f64 = 8.0;

/// P(s < Z <= t) for Z ~ N(0, 1), from whichever tail keeps precision.
pub(super) fn normal_mass(s: f64, t: f64) -> f64 {
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

/// One direction of the add/remove pair of a Poisson-subsampled Gaussian round with rate q and
/// noise multiplier sigma (sensitivity 1): `remove` compares P = (1-q) N(0, s^2) + q N(1, s^2)
/// with Q = N(0, s^2); the other direction swaps them.
#[derive(Debug, Clone, Copy)]
pub(super) struct SubsampledGaussian {
    pub(super) q: f64,
    pub(super) sigma: f64,
    pub(super) remove: bool,
}

impl SubsampledGaussian {
    /// ln of the mixture's density ratio, ln(1 - q + q e^{(2x - 1) / (2 sigma^2)}).
    pub(super) fn log_mixture_ratio(&self, x: f64) -> f64 {
        let t = (2.0 * x - 1.0) / (2.0 * self.sigma * self.sigma);
        log_add_exp((-self.q).ln_1p(), self.q.ln() + t)
    }

    /// L(x) = ln(P(x) / Q(x)): increasing in x for `remove`, decreasing otherwise.
    pub(super) fn loss(&self, x: f64) -> f64 {
        let r = self.log_mixture_ratio(x);
        if self.remove { r } else { -r }
    }

    /// The x where the mixture's log ratio equals `r`: sigma^2 (ln(e^r - (1 - q)) - ln q) + 1/2,
    /// or -inf where r <= ln(1 - q) (never reached).
    pub(super) fn inverse_ratio(&self, r: f64) -> f64 {
        let inner = -(1.0 - self.q) * (-r).exp();
        if inner <= -1.0 {
            return f64::NEG_INFINITY;
        }
        self.sigma * self.sigma * (r + inner.ln_1p() - self.q.ln()) + 0.5
    }

    /// (P, Q) masses of the x interval (a, b].
    pub(super) fn masses(&self, a: f64, b: f64) -> (f64, f64) {
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
    pub(super) fn loss_masses(&self, lo: f64, hi: f64) -> (f64, f64) {
        if self.remove {
            self.masses(self.inverse_ratio(lo), self.inverse_ratio(hi))
        } else {
            // L = -ratio: L in (lo, hi] iff ratio in [-hi, -lo), an x interval [x(-hi), x(-lo)).
            self.masses(self.inverse_ratio(-hi), self.inverse_ratio(-lo))
        }
    }

    /// The connect-the-dots PLD on the grid of step `h`.
    pub(super) fn pld(&self, h: f64) -> Pld {
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
