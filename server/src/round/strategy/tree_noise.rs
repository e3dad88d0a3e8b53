//! DP-FTRL's tree noise on the released sums (Kairouz et al. 2021, Alg. 1 with restarts), a
//! [`CorrelatedNoise`].
//!
//! Round t of a tree releases the prefix sum S_t = sum_{i <= t} g_i + N_t, N_t the tree's noise
//! ([`TreeNoise`]); the model moves by differences of released prefix sums, so the noise in the
//! global model is always N of the last released round of the tree: the round's sum g_t gets
//! N_t - N_applied.

use super::correlated_noise::{CorrelatedNoise, StepMismatch};
use fl_privacy::TreeNoise;
use rand::rngs::StdRng;

/// The tree of the current DP-FTRL run segment and the noise already in the model.
#[derive(Debug)]
pub(crate) struct FtrlNoise {
    tree: TreeNoise,
    /// N_applied: the tree noise in the global model (zero at the tree's start).
    applied: Vec<f32>,
    /// N_t of the round awaiting the coordinator's release decision.
    pending: Option<Vec<f32>>,
}

impl FtrlNoise {
    /// An empty tree over `dim` coordinates.
    pub(crate) fn new(dim: usize) -> Self {
        Self {
            tree: TreeNoise::new(dim),
            applied: vec![0.0; dim],
            pending: None,
        }
    }
}

impl CorrelatedNoise for FtrlNoise {
    /// Adds N_t - N_applied to the round's sum, N_t drawn at node standard deviation `std`,
    /// round t being step `step` of its tree (1 starts a new one).
    fn add(
        &mut self,
        sum: &mut [f32],
        step: u64,
        std: f64,
        rng: &mut StdRng,
    ) -> Result<(), StepMismatch> {
        if step == 1 {
            *self = Self::new(sum.len());
        }
        if step != self.tree.step() + 1 {
            return Err(StepMismatch {
                stream: self.tree.step(),
                round: step,
            });
        }
        let noise = self.tree.advance(std, rng);
        for ((s, n), a) in sum.iter_mut().zip(noise).zip(&self.applied) {
            *s += n - a;
        }
        self.pending = Some(noise.to_vec());
        Ok(())
    }

    /// A released round's N_t is now in the model.
    fn released(&mut self, applied: bool) {
        if let (true, Some(noise)) = (applied, self.pending.take()) {
            self.applied = noise;
        }
        self.pending = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// Zero sums through three rounds with the second not released: the model's noise (the sum
    /// of what was applied) is always the tree's N_t of the last released round, and the tree
    /// accepts only the next step or a restart.
    #[test]
    fn the_model_carries_the_noise_of_the_last_released_prefix() {
        let (dim, std) = (8, 1.0);
        let mut noise = FtrlNoise::new(dim);
        let mut rng = StdRng::seed_from_u64(3);
        let mut model = vec![0.0f32; dim];
        for (step, release) in [(1, true), (2, false), (3, true)] {
            let mut sum = vec![0.0f32; dim];
            noise.add(&mut sum, step, std, &mut rng).unwrap();
            let n_t = noise.pending.clone().unwrap();
            noise.released(release);
            if release {
                model.iter_mut().zip(&sum).for_each(|(m, s)| *m += s);
                for (m, n) in model.iter().zip(&n_t) {
                    assert!((m - n).abs() < 1e-5, "step {step}: {m} vs {n}");
                }
            }
        }
        let mut sum = vec![0.0f32; dim];
        let skipped = noise.add(&mut sum, 5, std, &mut rng);
        assert_eq!(
            skipped,
            Err(StepMismatch {
                stream: 3,
                round: 5
            })
        );
        noise.add(&mut sum, 1, std, &mut rng).unwrap();
        assert!(noise.applied.iter().all(|a| *a == 0.0), "a new tree");
    }
}
