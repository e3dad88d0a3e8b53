//! Inexact ADMM (APPFL; seed 004, Example 2) as a server strategy. The server keeps every client's
//! last released primal z_p and its dual lambda_p, so clients hold no state between rounds: each
//! sampled client gets its anchor a_p = w + lambda_p / rho and its point z_p (2d values), and
//! answers with its new z_p. At the round's end the server applies the dual step
//! lambda_p += rho (w - z_p) for the clients that answered, then the consensus step
//! w <- (1/P) sum_p (z_p - lambda_p / rho) over every client seen so far (absent clients keep
//! their last state), and optionally rebalances rho.

use super::{
    ClientTensors, RestoreError, RoundContext, RoundInstructions, RoundOutcome, Strategy,
    StrategyError, StrategyState, Upload, Views,
};
use crate::identity::ids::ClientId;
use fl_privacy::admm::{ClientState, anchor, balance_rho, consensus, dual_step};
use std::collections::BTreeMap;

/// Residual balancing's parameters (Boyd et al. 2011, Sec. 3.4.1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ResidualBalancing {
    /// mu.
    pub mu: f64,
    /// tau.
    pub tau: f64,
}

/// The IADMM server.
#[derive(Debug)]
pub(crate) struct Iadmm {
    dim: usize,
    rho: f64,
    balancing: Option<ResidualBalancing>,
    /// I: the examples of all clients, which every client's primal step needs.
    total_examples: u64,
    /// Every client's (z_p, lambda_p) by client id; ids survive restarts (see
    /// [`crate::edge::registry`]), so a client that answers after a resume continues its own state.
    states: BTreeMap<ClientId, ClientState>,
    /// This round's released z_p, applied at the round's end.
    received: Vec<(ClientId, Vec<f32>)>,
}

impl Iadmm {
    /// IADMM over `dim` parameters with penalty `rho`, optionally rebalanced each round, for
    /// clients holding `total_examples` examples in all.
    pub(crate) fn new(
        dim: usize,
        rho: f64,
        balancing: Option<ResidualBalancing>,
        total_examples: u64,
    ) -> Self {
        Self {
            dim,
            rho,
            balancing,
            total_examples,
            states: BTreeMap::new(),
            received: Vec::new(),
        }
    }
}

impl Strategy for Iadmm {
    fn configure_round(&mut self, _ctx: &RoundContext) -> RoundInstructions {
        RoundInstructions {
            admm: Some(fl_secagg::task::AdmmStep {
                rho: self.rho,
                total_examples: self.total_examples,
            }),
            local: None,
        }
    }

    fn views(&self) -> Views<'_> {
        Views {
            client_tensors: Some(self),
            ..Views::default()
        }
    }

    fn state(&self) -> StrategyState {
        let mut tensors = Vec::new();
        for (id, s) in &self.states {
            // In name order, as a checkpoint reads them back: ids zero-padded, lambda before z.
            tensors.push((format!("{id:020}.lambda"), s.lambda.clone()));
            tensors.push((format!("{id:020}.z"), s.z.clone()));
        }
        StrategyState {
            scalars: serde_json::json!({ "rho": self.rho }),
            tensors,
            ..StrategyState::default()
        }
    }

    fn restore(&mut self, state: StrategyState) -> Result<(), RestoreError> {
        self.rho = state.scalars["rho"]
            .as_f64()
            .filter(|r| *r > 0.0 && r.is_finite())
            .ok_or(RestoreError("rho"))?;
        let bad = || RestoreError("IADMM state ((ID.lambda, ID.z) pairs of the model's size)");
        self.states = state
            .tensors
            .chunks(2)
            .map(|pair| match pair {
                [(ln, lambda), (zn, z)] if z.len() == self.dim && lambda.len() == self.dim => {
                    let id = ln.strip_suffix(".lambda").ok_or_else(bad)?;
                    if zn.strip_suffix(".z") != Some(id) {
                        return Err(bad());
                    }
                    let id: ClientId = id.parse().map_err(|_| bad())?;
                    let state = ClientState {
                        z: z.clone(),
                        lambda: lambda.clone(),
                    };
                    Ok((id, state))
                }
                _ => Err(bad()),
            })
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    fn absorb(&mut self, _ctx: &RoundContext, upload: Upload) -> Result<(), StrategyError> {
        let update = upload.dense()?;
        update.values.check_len(self.dim)?;
        self.received
            .push((update.client, update.values.into_values()));
        Ok(())
    }

    fn finish_round(&mut self, _ctx: &RoundContext, global: &[f32]) -> RoundOutcome {
        if self.received.is_empty() {
            return RoundOutcome::default();
        }
        let rho = self.rho;
        // r = (sum_p ||w - z_p||^2)^(1/2) over this round's clients.
        let mut primal = 0.0f64;
        for (client, z) in std::mem::take(&mut self.received) {
            primal += global
                .iter()
                .zip(&z)
                .map(|(w, z)| f64::from(w - z).powi(2))
                .sum::<f64>();
            let state = self
                .states
                .entry(client)
                .or_insert_with(|| ClientState::start(global));
            dual_step(&mut state.lambda, global, &z, rho);
            state.z = z;
        }
        let next = consensus(self.states.values(), global.len(), rho);
        if let Some(b) = self.balancing {
            // s = rho sqrt(P) ||w_{t+1} - w_t||.
            let moved: f64 = next
                .iter()
                .zip(global)
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum::<f64>()
                .sqrt();
            let clients = self.states.len();
            let dual = rho * (clients as f64).sqrt() * moved;
            self.rho = balance_rho(rho, primal.sqrt(), dual, b.mu, b.tau);
        }
        RoundOutcome {
            model: Some(next),
            rho: Some(self.rho),
            ..RoundOutcome::default()
        }
    }
}

impl ClientTensors for Iadmm {
    fn client_tensor(&self, client: ClientId, global: &[f32]) -> Vec<f32> {
        let (mut tensor, point) = match self.states.get(&client) {
            Some(s) => (anchor(global, &s.lambda, self.rho), &s.z[..]),
            // A client's first round: lambda_p = 0, z_p = w.
            None => (global.to_vec(), global),
        };
        tensor.extend_from_slice(point);
        tensor
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::round::strategy::testing::{ctx, update};
    use fl_privacy::admm::primal_step;

    fn plan(round: u64) -> RoundContext {
        ctx(round, 2.0, None)
    }

    /// The strategy, driven by clients that follow the protocol on f_i(w) = (w - c_p)^2 / 2,
    /// reaches the weighted optimum, as the sans-IO steps do.
    #[test]
    fn clients_following_the_protocol_reach_the_consensus_optimum() {
        let (c, n) = ([1.0f32, 5.0], [30u64, 10]);
        let mut s = Iadmm::new(1, 2.0, None, 40);
        let mut w = vec![0.0f32];
        for round in 1..=500 {
            let cx = plan(round);
            let step = s.configure_round(&cx).admm.unwrap();
            for p in 0..2 {
                let sent = s.client_tensor(p as u64, &w);
                let (a, z) = sent.split_at(1);
                let grad = [n[p] as f32 * (z[0] - c[p])];
                let values = primal_step(a, &grad, step.rho, step.total_examples);
                s.absorb(&cx, update(p as u64, n[p], values).into())
                    .unwrap();
            }
            w = s.finish_round(&cx, &w).model.unwrap();
        }
        assert!((w[0] - 2.0).abs() < 1e-3, "{w:?}");
        let bad = update(0, 1, vec![0.0, 0.0]);
        assert!(s.absorb(&plan(501), bad.into()).is_err());
    }

    /// A restored strategy keeps every client's state, by id, and the same rho: with a new client
    /// and a known one answering, both give the same next model.
    #[test]
    fn state_survives_a_restart() {
        let balancing = Some(ResidualBalancing { mu: 1.5, tau: 2.0 });
        let mut s = Iadmm::new(2, 0.5, balancing, 40);
        let mut w = vec![0.0f32, 1.0];
        for round in 1..=3 {
            let c = plan(round);
            for p in 0..3u64 {
                let values = vec![p as f32 + round as f32, -(p as f32)];
                s.absorb(&c, update(p, 1, values).into()).unwrap();
            }
            w = s.finish_round(&c, &w).model.unwrap();
        }
        let mut restored = Iadmm::new(2, 1.0, balancing, 40);
        restored.restore(s.state()).unwrap();
        let c = plan(4);
        assert_eq!(
            restored.configure_round(&c).admm.unwrap().rho,
            s.configure_round(&c).admm.unwrap().rho
        );
        let answer = |client| update(client, 1, vec![0.5, 0.5]).into();
        for client in [9, 1] {
            s.absorb(&c, answer(client)).unwrap();
            restored.absorb(&c, answer(client)).unwrap();
        }
        assert_eq!(s.finish_round(&c, &w), restored.finish_round(&c, &w));
        assert_eq!(restored.states.len(), 4);
        let mut bad = s.state();
        bad.tensors.pop();
        assert!(Iadmm::new(2, 1.0, None, 40).restore(bad).is_err());
    }
}
