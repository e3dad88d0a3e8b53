//! Planning a private run: epsilon or delta after T rounds, the smallest noise multiplier that
//! meets a budget, the most rounds a budget allows. All answers err on the safe side: a returned
//! sigma meets the target, a returned round count stays within it.

use super::accountant::{Accountant, check_delta, check_epsilon};
use super::accountant_kind::AccountantKind;
use super::event::PrivacyEvent;
use super::sampled_gaussian::{AccountingError, GaussianRound, Sampling};

/// A budget: epsilon at a target delta, or delta below a threshold at fixed epsilon (the Geyer
/// et al. rule).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Budget {
    /// epsilon(delta) must stay at most `epsilon`.
    Epsilon {
        /// Largest epsilon.
        epsilon: f64,
        /// The delta it is stated at.
        delta: f64,
    },
    /// delta(epsilon) must stay at most `delta` (the paper's Q).
    Delta {
        /// The fixed epsilon.
        epsilon: f64,
        /// Largest delta, Q.
        delta: f64,
    },
}

impl Budget {
    /// Validates the numbers.
    pub fn check(&self) -> Result<(), AccountingError> {
        let (Budget::Epsilon { epsilon, delta } | Budget::Delta { epsilon, delta }) = *self;
        check_epsilon(epsilon)?;
        check_delta(delta)
    }

    /// Whether the accountant's rounds are within this budget.
    pub fn allows(&self, accountant: &dyn Accountant) -> bool {
        match *self {
            Budget::Epsilon { epsilon, delta } => accountant.epsilon(delta) <= epsilon,
            Budget::Delta { epsilon, delta } => accountant.delta(epsilon) <= delta,
        }
    }
}

/// An accountant of `kind` after `rounds` rounds of `event`.
pub fn after_rounds(
    kind: AccountantKind,
    event: &PrivacyEvent,
    rounds: u64,
) -> Box<dyn Accountant> {
    let mut acc = kind.accountant();
    acc.compose(event, rounds);
    acc
}

/// The smallest sigma (to 0.1% relative) such that `rounds` rounds at rate `q` stay within
/// `budget`; bisection on a log scale, returning the upper end so the answer always meets it.
pub fn min_sigma(
    kind: AccountantKind,
    q: f64,
    rounds: u64,
    budget: &Budget,
    sampling: Sampling,
) -> Result<f64, AccountingError> {
    budget.check()?;
    let fits = |sigma: f64| -> Result<bool, AccountingError> {
        let event = GaussianRound::new(q, sigma, sampling)?;
        Ok(budget.allows(after_rounds(kind, &event.into(), rounds).as_ref()))
    };
    let (mut lo, mut hi) = (1e-2, 1e-2);
    while !fits(hi)? {
        lo = hi;
        hi *= 2.0;
        if hi > 1e6 {
            return Err(AccountingError::BadSigma(f64::INFINITY));
        }
    }
    if lo == hi {
        return Ok(hi);
    }
    while hi / lo > 1.001 {
        let mid = (lo * hi).sqrt();
        if fits(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi)
}

/// The most rounds of `event` that stay within `budget` (0 when even one round exceeds it), up to
/// `cap`.
pub fn max_rounds(
    kind: AccountantKind,
    event: &PrivacyEvent,
    budget: &Budget,
    cap: u64,
) -> Result<u64, AccountingError> {
    budget.check()?;
    let fits = |t: u64| budget.allows(after_rounds(kind, event, t).as_ref());
    if !fits(1) {
        return Ok(0);
    }
    let (mut lo, mut hi) = (1u64, 2u64);
    while hi <= cap && fits(hi) {
        lo = hi;
        hi *= 2;
    }
    if hi > cap {
        if fits(cap) {
            return Ok(cap);
        }
        hi = cap;
    }
    // Invariant: fits(lo), !fits(hi).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}
