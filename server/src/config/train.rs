//! `[train]`: local training each round.

use fl_common::schedule::Schedule;
use fl_model::LocalConfig;
use serde::{Deserialize, Serialize};

/// The training algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// Federated averaging: E epochs of local SGD, the server averages the updates.
    FedAvg,
    /// Inexact ADMM (APPFL): one linearised primal step per round, duals kept by the server.
    Iadmm,
}

/// The server's step with the released aggregate (Reddi et al. 2021).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ServerOptimizerKind {
    /// x_{t+1} = x_t + eta_t Delta_t: the aggregate's model itself at eta = 1.
    FedAvg,
    /// Server momentum.
    FedAvgM,
    /// Adagrad on the pseudo-gradient.
    FedAdagrad,
    /// Adam on the pseudo-gradient (no bias correction, as Reddi et al.).
    FedAdam,
    /// Yogi on the pseudo-gradient.
    FedYogi,
}

/// `[train]`: local training each round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// `fedavg` or `iadmm` (which ignores epochs, batch size and learning rate: its step is
    /// 1/rho).
    pub algorithm: Algorithm,
    /// E: local epochs.
    pub epochs: u32,
    /// B: local mini-batch size.
    pub batch_size: u32,
    /// eta: local SGD learning rate.
    pub learning_rate: f32,
    /// s: each client translates every training image of a batch by offsets drawn uniformly
    /// from {-s, ..., s} on each axis (zeros shifted in), afresh per example and batch (Simard
    /// et al. 2003): the client's own computation, so no privacy cost. Image data and plain
    /// local SGD only (refused with flat data, `iadmm` and `ldp-laplace`); Python trainers get
    /// it as `config["random_shift"]`. 0, the default, does not shift.
    pub random_shift: u32,
    /// The server's step with the released aggregate's pseudo-gradient Delta_t = x' - x_t
    /// (Reddi et al. 2021, Algorithm 2). Post-processing of whatever the privacy mode released:
    /// no privacy cost, the ledger is unchanged; m_t and v_t are checkpointed (a resumed run
    /// continues them) and move only in released rounds. Not with `iadmm`.
    pub server_optimizer: ServerOptimizerKind,
    /// eta_g: the server learning rate (Reddi et al. tune it on a log grid; 1e-2 to 1e-1 is
    /// typical for FedAdam and FedYogi), a number or a per-round schedule (`{ steps = [[1, 1.0],
    /// [80, 0.3]] }`, or `{ linear = [1.0, 0.1] }` over `server.rounds`; for a run its budget
    /// ends, set `server.rounds` to what `fl privacy rounds` gives). Under noise a decaying
    /// eta_g lowers the noise the last rounds leave in the model.
    pub server_learning_rate: Schedule,
    /// beta_1: FedAvgM's momentum, the adaptive optimizers' first-moment decay; in [0, 1).
    pub server_momentum: f64,
    /// beta_2: FedAdam's and FedYogi's second-moment decay; in [0, 1).
    pub server_beta2: f64,
    /// tau: the adaptive optimizers' adaptivity (v_{-1} = tau^2); above 0.
    pub server_tau: f64,
    /// beta of an exponential moving average of the released models, a_t = beta_t a_{t-1} +
    /// (1 - beta_t) x_t with the warm-up beta_t = min(beta, (1 + t) / (10 + t)) (De et al.
    /// 2022); in [0, 1), 0 (the default) is off. The server evaluates and writes a_t
    /// (`test_accuracy`, `model.safetensors`) while the clients keep training from x_t.
    /// Post-processing: no privacy cost; a_t is checkpointed and moves only in released rounds.
    pub average_decay: f64,
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            algorithm: Algorithm::FedAvg,
            epochs: 1,
            batch_size: 10,
            learning_rate: 0.05,
            random_shift: 0,
            server_optimizer: ServerOptimizerKind::FedAvg,
            server_learning_rate: Schedule::Constant(1.0),
            server_momentum: 0.9,
            server_beta2: 0.99,
            server_tau: 1e-3,
            average_decay: 0.0,
        }
    }
}

impl TrainSection {
    /// Checks the server optimizer's settings.
    pub(super) fn validate_server_optimizer(&self) -> Result<(), String> {
        let unit = |x: f64| (0.0..1.0).contains(&x);
        let positive = |x: f64| x > 0.0 && x.is_finite();
        (self.server_learning_rate).check("train.server_learning_rate", positive, "> 0")?;
        if !unit(self.server_momentum) || !unit(self.server_beta2) || !unit(self.average_decay) {
            return Err(
                "train.server_momentum, train.server_beta2 and train.average_decay must be in [0, 1)"
                    .into(),
            );
        }
        if !positive(self.server_tau) {
            return Err("train.server_tau must be > 0".into());
        }
        Ok(())
    }

    /// The server optimizer's settings over `rounds` rounds (T of a linear schedule); `None`
    /// for FedAvg's step of 1, which takes the aggregate's model as it is.
    pub fn server_optimizer(&self, rounds: u64) -> Option<ServerOptimizerConfig> {
        let step = match self.server_optimizer {
            ServerOptimizerKind::FedAvg if self.server_learning_rate == Schedule::Constant(1.0) => {
                return None;
            }
            ServerOptimizerKind::FedAvg => ServerStep::Sgd,
            ServerOptimizerKind::FedAvgM => ServerStep::Momentum {
                momentum: self.server_momentum,
            },
            ServerOptimizerKind::FedAdagrad => ServerStep::Adagrad,
            ServerOptimizerKind::FedAdam => ServerStep::Adam,
            ServerOptimizerKind::FedYogi => ServerStep::Yogi,
        };
        Some(ServerOptimizerConfig {
            step,
            learning_rate: self.server_learning_rate.clone(),
            rounds,
            beta1: self.server_momentum,
            beta2: self.server_beta2,
            tau: self.server_tau,
        })
    }

    /// The per-round instructions for clients.
    pub fn local_config(&self) -> LocalConfig {
        LocalConfig {
            epochs: self.epochs,
            batch_size: self.batch_size,
            learning_rate: self.learning_rate,
            random_shift: self.random_shift,
        }
    }
}

/// Which step the server takes with the pseudo-gradient Delta_t.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ServerStep {
    /// FedAvg with a server learning rate: x_{t+1} = x_t + eta_t Delta_t (no state).
    Sgd,
    /// FedAvgM: m_t = beta m_{t-1} + Delta_t; x_{t+1} = x_t + eta m_t.
    Momentum {
        /// beta.
        momentum: f64,
    },
    /// FedAdagrad: v_t = v_{t-1} + Delta_t^2.
    Adagrad,
    /// FedAdam: v_t = beta_2 v_{t-1} + (1 - beta_2) Delta_t^2.
    Adam,
    /// FedYogi: v_t = v_{t-1} - (1 - beta_2) Delta_t^2 sign(v_{t-1} - Delta_t^2).
    Yogi,
}

impl ServerStep {
    /// Whether the step keeps a second moment v_t.
    pub(crate) fn is_adaptive(self) -> bool {
        !matches!(self, ServerStep::Sgd | ServerStep::Momentum { .. })
    }
}

/// The optimizer's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerOptimizerConfig {
    /// The step.
    pub step: ServerStep,
    /// eta_t: the server learning rate of round t.
    pub learning_rate: Schedule,
    /// T: the rounds a linear schedule spans.
    pub rounds: u64,
    /// beta_1 of the adaptive steps' first moment.
    pub beta1: f64,
    /// beta_2 of FedAdam's and FedYogi's second moment.
    pub beta2: f64,
    /// tau: the adaptivity (also v_{-1} = tau^2, as Reddi et al. initialise it).
    pub tau: f64,
}

#[cfg(test)]
mod tests {
    use crate::config::ServerStep;
    use crate::config::{Algorithm, RunConfig, ServerOptimizerKind};

    fn refused(c: &RunConfig) -> String {
        c.validate().unwrap_err().to_string()
    }

    #[test]
    fn server_optimizer_settings_are_checked() {
        let mut c = RunConfig::default();
        assert_eq!(c.train.server_optimizer(10), None);
        c.train.server_optimizer = ServerOptimizerKind::FedYogi;
        c.validate().unwrap();
        assert!(c.train.server_optimizer(10).is_some());
        for edit in [
            |c: &mut RunConfig| c.train.server_learning_rate = 0.0.into(),
            |c: &mut RunConfig| c.train.server_momentum = 1.0,
            |c: &mut RunConfig| c.train.server_beta2 = -0.1,
            |c: &mut RunConfig| c.train.server_tau = f64::NAN,
            |c: &mut RunConfig| c.train.average_decay = 1.0,
        ] {
            let mut bad = c.clone();
            edit(&mut bad);
            assert!(refused(&bad).contains("train.server_"), "{:?}", bad.train);
        }
        c.train.algorithm = Algorithm::Iadmm;
        assert!(refused(&c).contains("not with iadmm"));
    }

    /// A schedule of eta_g makes FedAvg take x_t + eta_t Delta_t; one that does not start at
    /// round 1 is refused with the key's name.
    /// A random shift is read from `[train]` and sent to the clients; the per-example clipped
    /// SGD of IADMM and of Laplace local DP refuses it.
    #[test]
    fn a_random_shift_reaches_the_clients_and_not_the_clipped_rules() {
        let mut c: RunConfig = toml::from_str("[train]\nrandom_shift = 2").unwrap();
        c.validate().unwrap();
        assert_eq!(c.train.local_config().random_shift, 2);
        c.train.algorithm = Algorithm::Iadmm;
        assert!(
            refused(&c).contains("train.random_shift"),
            "{}",
            refused(&c)
        );
        let mut c: RunConfig =
            toml::from_str("[train]\nrandom_shift = 1\n[privacy]\nmode = \"ldp-laplace\"").unwrap();
        assert!(
            refused(&c).contains("train.random_shift"),
            "{}",
            refused(&c)
        );
        c.train.random_shift = 0;
        assert!(
            !c.validate()
                .is_err_and(|e| e.to_string().contains("random_shift"))
        );
    }

    #[test]
    fn a_server_learning_rate_schedule_is_read_and_checked() {
        let c: RunConfig =
            toml::from_str("[train]\nserver_learning_rate = { steps = [[1, 2.0], [50, 0.5]] }")
                .unwrap();
        c.validate().unwrap();
        let opt = c.train.server_optimizer(100).unwrap();
        assert_eq!(opt.step, ServerStep::Sgd);
        assert_eq!(
            (opt.learning_rate.at(49, 100), opt.learning_rate.at(50, 100)),
            (2.0, 0.5)
        );
        let late: RunConfig =
            toml::from_str("[train]\nserver_learning_rate = { steps = [[2, 1.0]] }").unwrap();
        assert!(refused(&late).contains("train.server_learning_rate"));
    }
}
