//! Simulation only: a compromised client, to measure what a defence stops (`fl sim`'s
//! `server.sim_attackers`, `scripts/poisoning-compare.sh`). It replaces its update by the
//! model-replacement attack's (Bagdasaryan et al. 2020, Sec. 4.2): X = gamma (w_target - w_t),
//! here with the all-zero model as the target, and skips the clip its round asks for: a secure
//! round's quantiser is given no bound, a verified upload is sharded unclipped with a proof that
//! claims the bound. An honest client never has one.

use fl_secagg::Quantizer;

/// See the module documentation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Attack {
    /// gamma: the scale, m / eta to replace the model in one round of m clients.
    pub scale: f64,
}

impl Attack {
    /// gamma (0 - w_t): the update that, scaled up by the others' mean, replaces w_t by zero.
    /// Logged once per use, so that a simulation can count the poisoned uploads it sent.
    pub(crate) fn update(&self, global: &[f32]) -> Vec<f32> {
        tracing::warn!(scale = self.scale, "simulated attack: poisoned upload");
        global
            .iter()
            .map(|&w| (-self.scale * f64::from(w)) as f32)
            .collect()
    }

    /// A secure round's input: the attack's update, and the round's code without its bound.
    pub(crate) fn secure_input(
        &self,
        quantizer: Quantizer,
        global: &[f32],
    ) -> (Quantizer, Vec<f32>) {
        let unbounded = Quantizer {
            clip: f64::INFINITY,
            ..quantizer
        };
        (unbounded, self.update(global))
    }
}
