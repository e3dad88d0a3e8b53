//! Server optimizers on the released aggregate (Reddi et al. 2021, "Adaptive Federated
//! Optimization", Algorithm 2; FedAvgM after Hsu et al. 2019 and McMahan et al. 2018's DP-FedAvg
//! with server momentum). The inner strategy's next model x' gives the pseudo-gradient
//! Delta_t = x' - x_t, and the layer takes an optimizer step with it instead of x_{t+1} = x'.
//! The server learning rate eta_t may follow a schedule: under noise, a decaying eta_t lowers the
//! noise the last rounds leave in the model (each round's noise enters x_{t+1} scaled by eta_t).
//!
//! Under central DP, secure aggregation and distributed noise, x' is already the mechanism's
//! output: the step is post-processing, with no privacy cost and no ledger entry. A round the
//! coordinator does not release leaves the optimizer's moments as they were
//! ([`Strategy::released`]).

use super::{Layer, RestoreError, RoundContext, RoundOutcome, Strategy, StrategyState};
use crate::config::{ServerOptimizerConfig, ServerStep};

/// The optimizer's moments m_t and, for the adaptive steps, v_t: kept in f32 as the model is
/// (a resumed run continues from exactly the checkpointed values); each step computes in f64.
#[derive(Debug, Clone, Default, PartialEq)]
struct Moments {
    m: Vec<f32>,
    v: Vec<f32>,
}

/// A server optimizer around an inner strategy.
#[derive(Debug)]
pub(crate) struct ServerOptimizer {
    config: ServerOptimizerConfig,
    /// The moments after the last released round (empty before the first).
    moments: Moments,
    /// The moments of the round just finished, kept only if the round is released.
    pending: Option<Moments>,
}

/// Checkpoint names of the moments.
const M: &str = "server_optimizer.m";
const V: &str = "server_optimizer.v";

impl ServerOptimizer {
    /// An optimizer with no history.
    pub(crate) fn new(config: ServerOptimizerConfig) -> Self {
        Self {
            config,
            moments: Moments::default(),
            pending: None,
        }
    }

    /// x_{t+1} from x_t = `global` and the inner strategy's `next` in round t = `round`; sets the
    /// pending moments.
    fn step(&mut self, round: u64, global: &[f32], next: &[f32]) -> Vec<f32> {
        let c = &self.config;
        let eta = c.learning_rate.at(round, c.rounds);
        let d = global.len();
        let mut m = self.moments.m.clone();
        let mut v = self.moments.v.clone();
        m.resize(d, 0.0);
        // v_{-1} = tau^2 (Reddi et al. 2021, Algorithm 2).
        v.resize(d, (c.tau * c.tau) as f32);
        let mut out = Vec::with_capacity(d);
        for i in 0..d {
            let x = f64::from(global[i]);
            // Delta_t = x' - x_t.
            let delta = f64::from(next[i]) - x;
            let (m_prev, v_prev) = (f64::from(m[i]), f64::from(v[i]));
            let update = match c.step {
                ServerStep::Sgd => delta,
                ServerStep::Momentum { momentum } => {
                    let m_t = momentum * m_prev + delta;
                    m[i] = m_t as f32;
                    m_t
                }
                adaptive => {
                    let m_t = c.beta1 * m_prev + (1.0 - c.beta1) * delta;
                    let d2 = delta * delta;
                    let v_t = match adaptive {
                        ServerStep::Adagrad => v_prev + d2,
                        ServerStep::Adam => c.beta2 * v_prev + (1.0 - c.beta2) * d2,
                        _ => v_prev - (1.0 - c.beta2) * d2 * sign(v_prev - d2),
                    };
                    (m[i], v[i]) = (m_t as f32, v_t as f32);
                    // x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau).
                    m_t / (v_t.sqrt() + c.tau)
                }
            };
            out.push((x + eta * update) as f32);
        }
        if c.step == ServerStep::Sgd {
            m.clear();
        }
        if !c.step.is_adaptive() {
            v.clear();
        }
        self.pending = Some(Moments { m, v });
        out
    }
}

/// sign(x) in {-1, 0, 1} (Yogi's; f64::signum has no 0).
fn sign(x: f64) -> f64 {
    if x == 0.0 { 0.0 } else { x.signum() }
}

impl<S: Strategy> Layer<S> for ServerOptimizer {
    const NAME: &'static str = "server_optimizer";

    fn finish_round(&mut self, inner: &mut S, ctx: &RoundContext, global: &[f32]) -> RoundOutcome {
        let mut outcome = inner.finish_round(ctx, global);
        self.pending = None;
        if let Some(next) = &outcome.model {
            outcome.model = Some(self.step(ctx.round, global, next));
        }
        outcome
    }

    fn released(&mut self, inner: &mut S, applied: bool) {
        if let (true, Some(moments)) = (applied, self.pending.take()) {
            self.moments = moments;
        }
        self.pending = None;
        inner.released(applied);
    }

    fn state(&self) -> StrategyState {
        let mut tensors = vec![(M.to_string(), self.moments.m.clone())];
        if !self.moments.v.is_empty() {
            tensors.push((V.to_string(), self.moments.v.clone()));
        }
        StrategyState {
            tensors,
            ..StrategyState::default()
        }
    }

    fn restore(&mut self, state: &StrategyState) -> Result<(), RestoreError> {
        let m = (state.tensor(M)).ok_or(RestoreError("server optimizer state"))?;
        let v = state.tensor(V).unwrap_or_default();
        if self.config.step.is_adaptive() && !m.is_empty() && v.len() != m.len() {
            return Err(RestoreError("server optimizer second moment"));
        }
        self.moments = Moments { m, v };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::round::strategy::layer::Decorated;
    use crate::round::strategy::testing::ctx;
    use crate::round::strategy::{StrategyError, Upload};
    use fl_common::schedule::Schedule;

    /// An inner strategy whose round t proposes x_t + Delta_t.
    struct Proposes(Vec<[f32; 2]>);

    impl Strategy for Proposes {
        fn absorb(&mut self, _: &RoundContext, _: Upload) -> Result<(), StrategyError> {
            Ok(())
        }

        fn finish_round(&mut self, ctx: &RoundContext, global: &[f32]) -> RoundOutcome {
            let delta = self.0[ctx.round as usize - 1];
            RoundOutcome {
                model: Some(global.iter().zip(delta).map(|(x, d)| x + d).collect()),
                ..RoundOutcome::default()
            }
        }
    }

    const X0: [f32; 2] = [1.0, -2.0];
    const DELTAS: [[f32; 2]; 2] = [[0.5, -0.25], [-0.5, 1.0]];

    fn optimizer(step: ServerStep) -> Decorated<ServerOptimizer, Proposes> {
        ServerOptimizer::new(ServerOptimizerConfig {
            step,
            learning_rate: Schedule::Constant(0.1),
            rounds: 2,
            beta1: 0.9,
            beta2: 0.99,
            tau: 1e-3,
        })
        .around(Proposes(DELTAS.to_vec()))
    }

    /// Runs rounds `from..=to` from `x`, each released; returns the models.
    fn rounds(s: &mut impl Strategy, x: &[f32], from: u64, to: u64) -> Vec<Vec<f32>> {
        let mut x = x.to_vec();
        (from..=to)
            .map(|t| {
                x = s.finish_round(&ctx(t, 1.0, None), &x).model.unwrap();
                s.released(true);
                x.clone()
            })
            .collect()
    }

    /// Each optimizer's two steps against values computed by hand (in f64, from Reddi et al.'s
    /// Algorithm 2 with eta = 0.1, beta_1 = 0.9, beta_2 = 0.99, tau = 1e-3, v_{-1} = tau^2; and
    /// m_t = 0.9 m_{t-1} + Delta_t, x_{t+1} = x_t + 0.1 m_t for FedAvgM; x_{t+1} = x_t + 0.1
    /// Delta_t for FedAvg with a server learning rate).
    #[test]
    fn each_optimizer_takes_the_hand_computed_steps() {
        let expected: [(ServerStep, [[f64; 2]; 2]); 5] = [
            (ServerStep::Sgd, [[1.05, -2.025], [1.0, -1.925]]),
            (
                ServerStep::Momentum { momentum: 0.9 },
                [[1.05, -2.025], [1.045, -1.9475]],
            ),
            (
                ServerStep::Adagrad,
                [[1.00998002, -2.00996008], [1.00927391, -2.00244877]],
            ),
            (
                ServerStep::Adam,
                [[1.09802019, -2.09608071], [1.09103115, -2.02159877]],
            ),
            (
                ServerStep::Yogi,
                [[1.09802000, -2.09607997], [1.09104822, -2.02161980]],
            ),
        ];
        for (step, want) in expected {
            let got = rounds(&mut optimizer(step), &X0, 1, 2);
            for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
                assert!(
                    (f64::from(*g) - w).abs() < 2e-6,
                    "{step:?}: {got:?} vs {want:?}"
                );
            }
        }
    }

    /// eta_t follows its schedule: FedAvg's step of 1 in round 1, then 0.5 from round 2 on
    /// (x_2 = x_1 + 0.5 Delta_2, by hand).
    #[test]
    fn the_learning_rate_follows_its_schedule() {
        let mut s = ServerOptimizer::new(ServerOptimizerConfig {
            step: ServerStep::Sgd,
            learning_rate: Schedule::Steps {
                steps: vec![(1, 1.0), (2, 0.5)],
            },
            rounds: 2,
            beta1: 0.9,
            beta2: 0.99,
            tau: 1e-3,
        })
        .around(Proposes(DELTAS.to_vec()));
        assert_eq!(rounds(&mut s, &X0, 1, 2), [[1.5, -2.25], [1.25, -1.75]]);
    }

    /// A round the coordinator does not release leaves the moments as they were.
    #[test]
    fn an_unreleased_round_does_not_move_the_moments() {
        let mut skipped = optimizer(ServerStep::Adam);
        skipped.finish_round(&ctx(1, 1.0, None), &X0);
        skipped.released(false);
        assert_eq!(skipped.state(), optimizer(ServerStep::Adam).state());
    }

    /// The moments survive a checkpoint: a resumed optimizer takes exactly the step the
    /// uninterrupted one takes.
    #[test]
    fn the_moments_survive_a_resume() {
        for step in [ServerStep::Momentum { momentum: 0.9 }, ServerStep::Yogi] {
            let mut whole = optimizer(step);
            let models = rounds(&mut whole, &X0, 1, 2);
            let mut first = optimizer(step);
            let x1 = rounds(&mut first, &X0, 1, 1).remove(0);
            let mut resumed = optimizer(step);
            resumed.restore(first.state()).unwrap();
            assert_eq!(rounds(&mut resumed, &x1, 2, 2)[0], models[1], "{step:?}");
            assert_eq!(resumed.state(), whole.state());
        }
        assert!(
            optimizer(ServerStep::Adam)
                .restore(StrategyState::default())
                .is_err()
        );
    }
}
