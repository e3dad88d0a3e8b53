//! Banded matrix-factorization DP-FTRL's noise on the released sums (Choquette-Choo et al. 2023),
//! a [`CorrelatedNoise`]: step t's sum gets w_t = (C^{-1} Z)_t ([`BandedNoise`]).
//!
//! A step the stream skipped (a round that ended before its noise, with nothing released) is
//! drawn and discarded, so the stream stays aligned with the policy's steps: that step's sums are
//! zero in C X, and nothing of it is released. A round withheld after its noise keeps its w_t in
//! the stream: whatever is released is still a function of C X + Z.

use super::correlated_noise::{CorrelatedNoise, StepMismatch};
use fl_privacy::{BandedFactorization, BandedNoise};
use rand::rngs::StdRng;

/// The noise of the current banded stream.
#[derive(Debug)]
pub(crate) struct BandedStream(BandedNoise);

impl BandedStream {
    /// A stream of `factorization` over `dim` coordinates.
    pub(crate) fn new(factorization: &BandedFactorization, dim: usize) -> Self {
        Self(BandedNoise::new(factorization, dim))
    }
}

impl CorrelatedNoise for BandedStream {
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
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// Steps must move forward; a skipped step is drawn, so the next one is the stream's own.
    #[test]
    fn steps_move_forward_and_skipped_steps_are_drawn() {
        let mut stream = BandedStream::new(&BandedFactorization::square_root(2), 3);
        let mut rng = StdRng::seed_from_u64(2);
        let mut sum = vec![0.0f32; 3];
        stream.add(&mut sum, 1, 1.0, &mut rng).unwrap();
        assert!(sum.iter().all(|v| *v != 0.0));
        stream.add(&mut sum, 4, 1.0, &mut rng).unwrap();
        assert_eq!(stream.0.step(), 4);
        let again = stream.add(&mut sum, 4, 1.0, &mut rng);
        assert_eq!(
            again,
            Err(StepMismatch {
                stream: 4,
                round: 4
            })
        );
    }
}
