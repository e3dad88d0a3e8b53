//! The coordinate-wise trimmed mean (Yin et al. 2018, "Byzantine-robust distributed learning",
//! Def. 2): for each coordinate j, drop the b = floor(beta m) largest and b smallest of the m
//! clients' values and average the rest. Unweighted: a client's example count is its own claim.
//! It must hold the round's updates (m d values) until the round ends.

use super::{RoundContext, RoundOutcome, Strategy, StrategyError, Upload, moved};

/// w_{t+1} = w_t + trmean_beta{u_1, ..., u_m}.
#[derive(Debug)]
pub(crate) struct TrimmedMean {
    num_params: usize,
    beta: f64,
    updates: Vec<Vec<f32>>,
}

impl TrimmedMean {
    /// Over models of `num_params` parameters, trimming a fraction `beta` in [0, 1/2) at each end.
    pub(crate) fn new(num_params: usize, beta: f64) -> Self {
        Self {
            num_params,
            beta,
            updates: Vec::new(),
        }
    }

    /// trmean_beta of the held updates, or `None` when trimming leaves nothing.
    fn trimmed_mean(&self) -> Option<Vec<f32>> {
        let m = self.updates.len();
        // b = floor(beta m) dropped at each end (Yin et al. 2018, Def. 2).
        let b = (self.beta * m as f64).floor() as usize;
        let kept = m.checked_sub(2 * b).filter(|&k| k > 0)?;
        let mut column = Vec::with_capacity(m);
        let mean = (0..self.num_params)
            .map(|j| {
                column.clear();
                column.extend(self.updates.iter().map(|u| u[j]));
                column.sort_unstable_by(f32::total_cmp);
                let sum: f64 = column[b..m - b].iter().map(|&v| f64::from(v)).sum();
                (sum / kept as f64) as f32
            })
            .collect();
        Some(mean)
    }
}

impl Strategy for TrimmedMean {
    fn absorb(&mut self, _ctx: &RoundContext, upload: Upload) -> Result<(), StrategyError> {
        let update = upload.dense()?;
        update.values.check_len(self.num_params)?;
        self.updates.push(update.values.into_values());
        Ok(())
    }

    fn finish_round(&mut self, _ctx: &RoundContext, global: &[f32]) -> RoundOutcome {
        let model = self.trimmed_mean().map(|mean| moved(global, &mean));
        self.updates.clear();
        RoundOutcome {
            model,
            ..RoundOutcome::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::round::strategy::ClientUpdate;
    use crate::round::strategy::testing::{ctx, update};

    fn strategy(beta: f64) -> TrimmedMean {
        TrimmedMean::new(2, beta)
    }

    fn absorb_all(s: &mut TrimmedMean, updates: &[[f32; 2]]) {
        for (client, u) in updates.iter().enumerate() {
            let update = ClientUpdate {
                num_examples: 1 + client as u64 * 1000,
                ..update(client as u64, 0, u.to_vec())
            };
            s.absorb(&ctx(1, 10.0, None), update.into()).unwrap();
        }
    }

    #[test]
    fn drops_the_extremes_of_each_coordinate_and_ignores_weights() {
        let mut s = strategy(0.2);
        // m = 5, b = 1: per coordinate the largest and smallest go.
        let updates = [
            [1.0, -1e30],
            [2.0, 4.0],
            [3e30, 5.0],
            [3.0, 6.0],
            [-7.0, 1e30],
        ];
        absorb_all(&mut s, &updates);
        assert_eq!(
            s.finish_round(&ctx(1, 1.0, None), &[10.0, 0.0]).model,
            Some(vec![12.0, 5.0])
        );
        // The round's updates are gone.
        assert_eq!(s.finish_round(&ctx(2, 1.0, None), &[10.0, 0.0]).model, None);
    }

    /// m = 10, beta = 0.1: one client sending an honest update scaled by 1e6 leaves every
    /// coordinate of the aggregate within the honest clients' range.
    #[test]
    fn one_update_scaled_by_a_million_stays_out_of_the_aggregate() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let d = 1000;
        let mut s = TrimmedMean::new(d, 0.1);
        let honest: Vec<Vec<f32>> = (0..9)
            .map(|_| (0..d).map(|_| rng.random_range(-1.0..1.0)).collect())
            .collect();
        let hostile: Vec<f32> = honest[0].iter().map(|v| v * 1e6).collect();
        for (client, values) in honest.iter().cloned().chain([hostile]).enumerate() {
            let update = update(client as u64, 1, values);
            s.absorb(&ctx(1, 10.0, None), update.into()).unwrap();
        }
        let model = s
            .finish_round(&ctx(1, 1.0, None), &vec![0.0; d])
            .model
            .unwrap();
        for (j, w) in model.iter().enumerate() {
            let column = honest.iter().map(|u| u[j]);
            let (lo, hi) = column.fold((f32::MAX, f32::MIN), |(l, h), v| (l.min(v), h.max(v)));
            assert!(
                (lo..=hi).contains(w),
                "coordinate {j}: {w} outside [{lo}, {hi}]"
            );
        }
    }

    #[test]
    fn with_no_trimming_it_is_the_plain_mean() {
        let mut s = strategy(0.0);
        absorb_all(&mut s, &[[1.0, 2.0], [3.0, 6.0]]);
        assert_eq!(
            s.finish_round(&ctx(1, 1.0, None), &[0.0, 0.0]).model,
            Some(vec![2.0, 4.0])
        );
    }

    #[test]
    fn refuses_malformed_updates() {
        let mut s = strategy(0.1);
        let bad = update(0, 1, vec![0.0, 0.0, 0.0]);
        assert!(s.absorb(&ctx(1, 1.0, None), bad.into()).is_err());
        assert_eq!(s.finish_round(&ctx(1, 1.0, None), &[0.0, 0.0]).model, None);
    }
}
