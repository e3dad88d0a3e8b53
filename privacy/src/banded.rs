//! Banded matrix-factorization DP-FTRL (Choquette-Choo, Ganesh, McKenna, McMahan, Rush,
//! Thakurta, Xu 2023, "(Amplified) Banded Matrix Factorization: A unified approach to private
//! training", NeurIPS 2023): the factorization, the noise and its accounting.
//!
//! **Mechanism.** The clipped sums x_1, ..., x_T (the rows of X) are released as
//! A C^{-1} (C X + Z) = A (X + C^{-1} Z), A the workload (the model is a weighted prefix sum of
//! the released steps) and C lower triangular with p bands: the Toeplitz matrix of coefficients
//! c_0, ..., c_{p-1} (C_ij = c_{i-j} for 0 <= i - j < p). Step t's sum gets w_t = (C^{-1} Z)_t,
//! by forward substitution w_t = (z_t - sum_{j=1}^{p-1} c_j w_{t-j}) / c_0 ([`BandedNoise`],
//! which keeps the last p - 1 vectors and no more); the server then treats x_t + w_t as it would
//! x_t, which is post-processing of C X + Z.
//!
//! **Accounting.** Each client contributes at most once every b steps, b >= p (min separation),
//! and at most k times; neighbours are zero-out (DP-FTRL's, Kairouz et al. 2021). Columns i and
//! j of C with |i - j| >= p have disjoint supports, so contributions g_l at steps i_1 < ... < i_n
//! move C X by ||sum_l C_{:,i_l} g_l^T||_F^2 = sum_l ||C_{:,i_l}||^2 ||g_l||^2 <= n S^2
//! max_i ||C_{:,i}||^2 (Choquette-Choo et al. 2023, Thm 2). The coefficients are normalised to
//! sum_j c_j^2 = 1, and Z ~ N(0, z^2 S^2): the release is the Gaussian mechanism of multiplier
//! z / sqrt(n), which is n Gaussian mechanisms of multiplier z composed (Gaussian DP composes
//! exactly: Dong, Roth, Su 2022, Cor. 3.3; RDP adds up: Mironov 2017, Prop. 1 and 7). Among steps
//! 1..t a client has contributed at most ceil(t / b) times: step t charges one such mechanism
//! when t = 1 (mod b), up to k charges ([`BandedRound::charge`]), so the ledger's events after
//! any step bound that prefix's cost from above. The stream is adaptive (later sums depend on
//! earlier releases); for lower-triangular C that costs nothing more (Denisov, McMahan, Rush,
//! Smith, Thakurta 2022, Thm 2.1).
//!
//! **Factorization.** For the prefix-sum workload, C = A^{1/2} has coefficients
//! binom(2j, j) / 4^j (Fichtenberger, Henzinger, Upadhyay 2023, Lemma 3); its banded square root
//! keeps the first p (Kalinin and Lampert 2024). [`BandedFactorization::optimised`] starts there
//! and lowers the expected squared error of the released models, ||A C^{-1}||_F^2 max_i
//! ||C_{:,i}||^2 (Choquette-Choo et al. 2023, Sec. 3), by a coordinate search over the
//! coefficients for the run's steps T and server momentum beta (A = prefix sums of heavy-ball
//! momentum). No maintained crate offers banded factorizations; the search is a few lines over
//! Toeplitz recurrences.

use super::ddg::Neighbours;
use super::gaussian::add_gaussian_noise;
use super::ledger_event::{LedgerEvent, gaussian_curve};
use super::sampled_gaussian::{GaussianRound, Sampling};
use rand::{CryptoRng, Rng};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// The most steps the factorization's error is evaluated over: beyond them a longer run changes
/// the optimised coefficients by less than the search's resolution.
const MAX_OPTIMISED_STEPS: u64 = 4096;

/// The Toeplitz coefficients c_0, ..., c_{p-1} of a banded C, normalised to unit column norm.
#[derive(Debug, Clone, PartialEq)]
pub struct BandedFactorization {
    coefficients: Vec<f64>,
}

impl BandedFactorization {
    /// The banded square root of the prefix-sum matrix with p = `bands` (at least 1):
    /// c_j = binom(2j, j) / 4^j, normalised (Kalinin and Lampert 2024).
    pub fn square_root(bands: usize) -> Self {
        let mut c = vec![1.0f64; bands.max(1)];
        for j in 1..c.len() {
            // binom(2j, j) / 4^j = c_{j-1} (2j - 1) / (2j).
            c[j] = c[j - 1] * (2 * j - 1) as f64 / (2 * j) as f64;
        }
        Self::normalised(c)
    }

    /// The p-banded factorization of least [`loss`](Self::loss) found by a coordinate search from
    /// the banded square root, for `steps` steps (at most 4096 are evaluated) and server momentum
    /// `momentum` in [0, 1).
    pub fn optimised(bands: usize, steps: u64, momentum: f64) -> Self {
        let steps = steps.clamp(1, MAX_OPTIMISED_STEPS) as usize;
        let mut best = Self::square_root(bands).coefficients;
        let mut loss = error(&best, steps, momentum);
        let mut step = 0.1;
        while step > 1e-4 {
            let mut improved = false;
            for j in 1..best.len() {
                for sign in [1.0, -1.0] {
                    let mut candidate = best.clone();
                    candidate[j] += sign * step * candidate[0];
                    let l = error(&candidate, steps, momentum);
                    if l < loss {
                        (best, loss, improved) = (candidate, l, true);
                    }
                }
            }
            if !improved {
                step /= 2.0;
            }
        }
        Self::normalised(best)
    }

    /// The factorization with coefficients `c`, scaled to unit column norm.
    fn normalised(mut c: Vec<f64>) -> Self {
        let norm = c.iter().map(|v| v * v).sum::<f64>().sqrt();
        c.iter_mut().for_each(|v| *v /= norm);
        Self { coefficients: c }
    }

    /// c_0, ..., c_{p-1}.
    pub fn coefficients(&self) -> &[f64] {
        &self.coefficients
    }

    /// p.
    pub fn bands(&self) -> usize {
        self.coefficients.len()
    }

    /// ||A C^{-1}||_F^2 max_i ||C_{:,i}||^2 over `steps` steps with server momentum `momentum`:
    /// the summed variance of the noise in the released models at a fixed privacy, up to a
    /// factor that does not depend on C.
    pub fn loss(&self, steps: u64, momentum: f64) -> f64 {
        error(&self.coefficients, steps.max(1) as usize, momentum)
    }
}

/// ||A C^{-1}||_F^2 sum_j c_j^2 for the Toeplitz C of `c` over `steps` steps. A C^{-1} is
/// lower-triangular Toeplitz; its coefficients e are those of C^{-1} (forward substitution)
/// filtered by heavy-ball momentum m_t = beta m_{t-1} + d_t and summed (A = prefix sums of the
/// momentum), and the Frobenius norm of a Toeplitz matrix is sum_t (T - t) e_t^2.
fn error(c: &[f64], steps: usize, momentum: f64) -> f64 {
    let mut d = vec![0.0f64; steps];
    let (mut velocity, mut prefix, mut total) = (0.0, 0.0, 0.0);
    for t in 0..steps {
        let fed: f64 = (1..c.len().min(t + 1)).map(|j| c[j] * d[t - j]).sum();
        d[t] = (f64::from(u8::from(t == 0)) - fed) / c[0];
        velocity = momentum * velocity + d[t];
        prefix += velocity;
        total += (steps - t) as f64 * prefix * prefix;
    }
    total * c.iter().map(|v| v * v).sum::<f64>()
}

/// One step of banded DP-FTRL, as the accountant sees it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct BandedRound {
    /// z: the noise standard deviation of Z over the clip bound S (unit column norm).
    pub noise_multiplier: f64,
    /// t: the step in its stream, from 1 (1 starts a new stream and a new factorization).
    pub step: u64,
    /// p: the factorization's bands.
    pub bands: u64,
    /// b: the fewest steps between two contributions of one client.
    pub min_separation: u64,
    /// k: the most contributions of one client in a stream (`None`: only b limits them).
    pub max_participations: Option<u64>,
    /// The neighbouring relation (zero-out; replace-one doubles the sensitivity).
    pub neighbours: Neighbours,
}

impl BandedRound {
    /// The Gaussian mechanism this step adds to a client's worst case: multiplier z over the
    /// relation's sensitivity factor, without sampling, when t = 1 (mod b) and fewer than k
    /// charges came before it; nothing otherwise (module documentation).
    pub fn charge(&self) -> Option<GaussianRound> {
        let (b, before) = (self.min_separation.max(1), self.step.max(1) - 1);
        let charged = before % b == 0 && self.max_participations.is_none_or(|k| before / b < k);
        charged.then_some(GaussianRound {
            q: 1.0,
            noise_multiplier: self.noise_multiplier / self.neighbours.sensitivity(1.0),
            sampling: Sampling::Poisson,
        })
    }

    /// The charges among steps 1..=`steps` of one stream, as [`charge`](Self::charge) makes
    /// them: one at each t = 1 (mod b), at most k.
    pub fn charges_in(&self, steps: u64) -> u64 {
        let charges = steps.div_ceil(self.min_separation.max(1));
        self.max_participations.map_or(charges, |k| charges.min(k))
    }

    /// The most steps of one stream, at most `cap`, whose [`charges_in`](Self::charges_in) are
    /// at most `charges` (all `cap` once `charges` reaches k).
    pub fn steps_covered(&self, charges: u64, cap: u64) -> u64 {
        match self.max_participations {
            Some(k) if charges >= k => cap,
            Some(_) | None => charges.saturating_mul(self.min_separation.max(1)).min(cap),
        }
    }

    /// Whether the bands fit the separation (p <= b), which the bound of [`charge`](Self::charge)
    /// needs: overlapping bands are no mechanism this accounting covers.
    pub fn separated(&self) -> bool {
        self.bands >= 1 && self.bands <= self.min_separation
    }
}

/// The noise of one banded stream, online: w_t = (C^{-1} Z)_t from the last p - 1 of them.
#[derive(Debug, Clone, PartialEq)]
pub struct BandedNoise {
    coefficients: Vec<f64>,
    dim: usize,
    /// t: the steps taken.
    step: u64,
    /// w_{t}, w_{t-1}, ..., at most p - 1 of them, the latest first.
    history: VecDeque<Vec<f32>>,
    /// w_t of the last step.
    current: Vec<f32>,
}

impl BandedNoise {
    /// A stream of `factorization` over `dim` coordinates before its first step.
    pub fn new(factorization: &BandedFactorization, dim: usize) -> Self {
        Self {
            coefficients: factorization.coefficients.clone(),
            dim,
            step: 0,
            history: VecDeque::new(),
            current: vec![0.0; dim],
        }
    }

    /// t.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Takes step t + 1 and returns w_{t+1}: fresh z_{t+1} ~ N(0, std^2) less the earlier w's
    /// through C's bands, over c_0. `rng` must be a CSPRNG.
    pub fn advance<R: Rng + CryptoRng>(&mut self, std: f64, rng: &mut R) -> &[f32] {
        let mut z = vec![0.0f32; self.dim];
        add_gaussian_noise(&mut z, std, rng);
        self.substitute(z)
    }

    /// Takes step t + 1 with noise `z`: w_{t+1} = (z - sum_{j>=1} c_j w_{t+1-j}) / c_0.
    fn substitute(&mut self, mut z: Vec<f32>) -> &[f32] {
        self.step += 1;
        let c = &self.coefficients;
        for (i, w) in z.iter_mut().enumerate() {
            let fed: f64 = (self.history.iter().zip(&c[1..]))
                .map(|(past, cj)| cj * f64::from(past[i]))
                .sum();
            *w = ((f64::from(*w) - fed) / c[0]) as f32;
        }
        if c.len() > 1 {
            if self.history.len() == c.len() - 1 {
                self.history.pop_back();
            }
            self.history.push_front(z.clone());
        }
        self.current = z;
        &self.current
    }
}

impl LedgerEvent for BandedRound {
    /// Its charge's curve, or infinite when the bands overlap (no bound covers that).
    fn rdp_curve(&self, orders: &[f64]) -> Vec<f64> {
        match self.separated() {
            true => gaussian_curve(self.charge(), orders),
            false => vec![f64::INFINITY; orders.len()],
        }
    }

    /// Its charge, when the bands are separated.
    fn as_gaussian(&self) -> Option<Option<GaussianRound>> {
        self.separated().then(|| self.charge())
    }

    /// Correlated noise in memory only: a restarted server starts a new stream.
    fn reruns_after_crash(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests;
