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
//!
//! **Participation.** [`BandedStream`] keeps each enrolled identity's last step and count, and
//! lets it contribute only as the accounting assumes. The stream and the records start again
//! with the server process (its noise is never written down), and the new stream is accounted
//! from its own first step.

mod round;

pub use round::BandedRound;

use super::{Charges, CorrelatedNoise, NoiseStream, StepMismatch, StreamError, StreamRun};
use crate::ddg::Neighbours;
use crate::gaussian::add_gaussian_noise;
use crate::planning::max_rounds;
use crate::sampled_gaussian::GaussianRound;
use rand::rngs::StdRng;
use rand::{CryptoRng, Rng};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};

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

/// `[privacy.noise.banded]`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct BandedSettings {
    /// b, the fewest steps between two contributions of one client; unset: K / m_1 (K / M
    /// asynchronously), the most that keeps every step full.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_separation: Option<u64>,
    /// p, the factorization's bands, at most b; unset: b.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bands: Option<u64>,
    /// k, the most contributions of one client in a stream; unset: b alone limits them (and the
    /// budget ends training).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_participations: Option<u64>,
}

/// Banded DP-FTRL as a run's stream: its rule (b, k), its bands, the factorization's horizon,
/// and each identity's last step and contributions (module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct BandedStream {
    /// The event of the current step (its z, t, p, b and k).
    round: BandedRound,
    /// T: the steps the factorization is optimised for (the run's, or fewer when the budget
    /// ends it first).
    horizon: u64,
    /// beta: the server momentum the factorization is optimised for.
    momentum: f64,
    /// Each identity's last step and contributions in this stream.
    seen: HashMap<u64, (u64, u64)>,
}

impl BandedStream {
    /// A stream of `round`'s rule (its step is ignored: the stream starts before its first),
    /// its factorization optimised for `horizon` steps at server momentum `momentum`.
    pub fn new(round: BandedRound, horizon: u64, momentum: f64) -> Self {
        Self {
            round: BandedRound { step: 0, ..round },
            horizon,
            momentum,
            seen: HashMap::new(),
        }
    }

    /// C, optimised for the run's steps and server momentum.
    pub fn factorization(&self) -> BandedFactorization {
        BandedFactorization::optimised(self.round.bands as usize, self.horizon, self.momentum)
    }
}

impl NoiseStream for BandedStream {
    type Settings = BandedSettings;
    type Event = BandedRound;

    /// p <= b bands, b one pass by default, the factorization optimised for the steps the run
    /// can take (its rounds, or fewer when the budget ends it first).
    fn plan(settings: &BandedSettings, run: &StreamRun) -> Result<Self, StreamError> {
        let b = run.period("min_separation", settings.min_separation)?;
        let bands = settings.bands.unwrap_or(b);
        if bands == 0 || bands > b {
            return Err(StreamError(format!(
                "bands ({bands}) must be between 1 and min_separation ({b}): the accounting \
                 needs a client's contributions in distinct bands"
            )));
        }
        if settings.max_participations == Some(0) {
            return Err(StreamError("max_participations must be at least 1".into()));
        }
        run.check_fills("min_separation", b)?;
        let charge = BandedRound {
            noise_multiplier: run.noise_multiplier,
            step: 1,
            bands,
            min_separation: b,
            max_participations: None,
            neighbours: Neighbours::ZeroOut,
        };
        let stream = BandedRound {
            max_participations: settings.max_participations,
            ..charge
        };
        let horizon = match &run.ledger {
            Some((accountant, budget)) => {
                let charges = max_rounds(*accountant, &charge.into(), budget, run.rounds)
                    .map_err(|e| StreamError(e.to_string()))?;
                stream.steps_covered(charges, run.rounds)
            }
            None => run.rounds,
        };
        Ok(Self::new(stream, horizon, run.momentum))
    }

    fn noise_multiplier(&self) -> f64 {
        self.round.noise_multiplier
    }

    fn step(&self) -> u64 {
        self.round.step
    }

    fn advance(&mut self) {
        self.round.step += 1;
    }

    fn event(&self) -> BandedRound {
        self.round
    }

    fn may_contribute(&self, identity: u64) -> bool {
        let (step, b) = (self.round.step, self.round.min_separation);
        self.seen.get(&identity).is_none_or(|&(last, count)| {
            step >= last + b && self.round.max_participations.is_none_or(|k| count < k)
        })
    }

    fn contributes(&mut self, identity: u64) -> bool {
        let may = self.may_contribute(identity);
        if may {
            let entry = self.seen.entry(identity).or_insert((0, 0));
            *entry = (self.round.step, entry.1 + 1);
        }
        may
    }

    fn noise(&self, dim: usize) -> Box<dyn CorrelatedNoise> {
        Box::new(AlignedNoise(BandedNoise::new(&self.factorization(), dim)))
    }

    /// One Gaussian of multiplier z at each t = 1 (mod b), at most k.
    fn charges(&self, steps: u64) -> Charges {
        Charges {
            charge: GaussianRound::unsampled(self.round.noise_multiplier),
            count: self.round.charges_in(steps),
        }
    }

    fn steps_within(&self, count: u64, cap: u64) -> u64 {
        self.round.steps_covered(count, cap)
    }
}

/// The stream's noise kept aligned with its steps: step t's sum gets w_t.
///
/// A step the stream skipped (a round that ended before its noise, with nothing released) is
/// drawn and discarded, so the noise stays aligned with the stream's steps: that step's sums are
/// zero in C X, and nothing of it is released. A round withheld after its noise keeps its w_t in
/// the stream: whatever is released is still a function of C X + Z.
#[derive(Debug)]
struct AlignedNoise(BandedNoise);

impl CorrelatedNoise for AlignedNoise {
    fn add(
        &mut self,
        sum: &mut [f32],
        step: u64,
        std: f64,
        rng: &mut StdRng,
    ) -> Result<(), StepMismatch> {
        if step <= self.0.step() {
            return Err(StepMismatch {
                stream: self.0.step(),
                round: step,
            });
        }
        while self.0.step() + 1 < step {
            self.0.advance(std, rng);
        }
        for (s, w) in sum.iter_mut().zip(self.0.advance(std, rng)) {
            *s += w;
        }
        Ok(())
    }

    fn released(&mut self, _applied: bool) {}
}

#[cfg(test)]
mod tests;
