//! The training hook: a [`Trainer`] is the client's own training code, which the library calls
//! each round the client is sampled into; the library does everything else (the protocol, the
//! update u = w_k - w_t, clipping, the local mechanism, secure aggregation). [`SgdTrainer`] is
//! the built-in one: local SGD on the built-in models over a [`LocalData`].
//!
//! Two modes need more than a trained model: the Laplace mechanism's sensitivity assumes every
//! example's gradient was clipped in L1 inside training, and an IADMM step is a sum of such
//! gradients. Only the built-in trainer computes them ([`Trainer::built_in`]); a round of either
//! mode is refused for any other trainer.

use crate::LocalData;
use fl_model::{
    GradientRule, LocalConfig, Model, ModelSpec, clipped_gradient_sum, evaluate, train_local,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// What a round asks the trainer to do.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainRequest {
    /// t.
    pub round: u64,
    /// The model the weights belong to.
    pub model: Model,
    /// E, B, eta.
    pub config: LocalConfig,
    /// A seed for the order of local examples (fixed in reproducible experiments).
    pub seed: u64,
}

/// What a trainer returns.
#[derive(Debug, Clone, PartialEq)]
pub struct Trained {
    /// w_k: the model after local training, as many values as the global model.
    pub weights: Vec<f32>,
    /// The mean training loss, if the trainer knows it (sent only to a trusted curator).
    pub loss: Option<f32>,
    /// n_k: the examples trained on (sent only to a trusted curator, as the update's weight).
    pub examples: u64,
}

/// A model's figures on a client's data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Mean loss.
    pub loss: f64,
    /// Fraction classified correctly.
    pub accuracy: f64,
    /// Examples evaluated on.
    pub examples: u64,
}

/// A client's training code: what [`run`](crate::run) calls each round the client is sampled.
/// The client library does everything else (the protocol, clipping, noise, masks), so a trainer
/// only turns the global weights into local ones.
///
/// A trainer that pulls every weight halfway towards its site's target, as a stand-in for SGD:
///
/// ```
/// use fl_client::{Evaluation, TrainRequest, Trained, Trainer};
/// use fl_model::{LocalConfig, Model, ModelSpec};
///
/// struct Halfway {
///     target: Vec<f32>,
///     examples: u64,
/// }
///
/// impl Trainer for Halfway {
///     fn check(&self, model: &Model) -> Result<(), String> {
///         match model.num_params() == self.target.len() {
///             true => Ok(()),
///             false => Err(format!("this site trains {} weights", self.target.len())),
///         }
///     }
///
///     fn train(&self, _request: &TrainRequest, global: &[f32]) -> Result<Trained, String> {
///         let weights = (global.iter().zip(&self.target))
///             .map(|(w, t)| w + 0.5 * (t - w))
///             .collect();
///         Ok(Trained { weights, loss: None, examples: self.examples })
///     }
///
///     fn evaluate(&self, _model: &Model, global: &[f32]) -> Result<Evaluation, String> {
///         let loss = (global.iter().zip(&self.target))
///             .map(|(w, t)| f64::from((w - t).powi(2)))
///             .sum::<f64>();
///         Ok(Evaluation { loss, accuracy: 0.0, examples: self.examples })
///     }
/// }
///
/// // A logistic model of 2 features and 2 classes has 2 x 2 weights and 2 biases.
/// let model = Model::Network(ModelSpec::logistic(2, 2).unwrap());
/// let trainer = Halfway { target: vec![1.0; 6], examples: 10 };
/// trainer.check(&model).unwrap();
/// let config = LocalConfig { epochs: 1, batch_size: 10, learning_rate: 0.1, random_shift: 0 };
/// let request = TrainRequest { round: 1, model, config, seed: 7 };
/// let trained = trainer.train(&request, &[0.0; 6]).unwrap();
/// assert_eq!(trained.weights, vec![0.5; 6]);
/// ```
///
/// `fl_client::run(options, trainer)` then takes part in a federation with it; the Python
/// package's `Client.run(train, ...)` wraps a Python function the same way.
pub trait Trainer: Send + Sync + 'static {
    /// Checks that `model` fits this trainer's data (its features and classes); the error is
    /// the reason the client gives the server for not taking part.
    fn check(&self, _model: &Model) -> Result<(), String> {
        Ok(())
    }

    /// Trains from the global model `global` as `request` says; returns the local model.
    fn train(&self, request: &TrainRequest, global: &[f32]) -> Result<Trained, String>;

    /// Evaluates `global` on this client's data.
    fn evaluate(&self, model: &Model, global: &[f32]) -> Result<Evaluation, String>;

    /// The built-in trainer, when this is it: only it trains with per-example L1 clipping.
    fn built_in(&self) -> Option<&SgdTrainer> {
        None
    }
}

/// The built-in trainer: E epochs of mini-batch SGD on this client's examples.
#[derive(Debug, Clone)]
pub struct SgdTrainer {
    local: LocalData,
}

impl SgdTrainer {
    /// SGD on `local`.
    pub fn new(local: LocalData) -> Self {
        Self { local }
    }

    /// n: this client's examples.
    pub fn examples(&self) -> u64 {
        self.local.indices.len() as u64
    }

    /// `steps` steps of local SGD from `global` with every example's gradient clipped to L1
    /// norm `clip` ([`GradientRule::ClippedL1`]); returns the local model and the mean loss.
    pub fn train_clipped_l1(
        &self,
        request: &TrainRequest,
        global: &[f32],
        clip: f64,
        steps: u64,
    ) -> Result<(Vec<f32>, f32), String> {
        self.sgd(request, global, GradientRule::ClippedL1 { clip, steps })
    }

    /// The sum over this client's examples of the gradients at `point`, each clipped to L1
    /// norm `clip`, and the mean loss there (an IADMM step's ingredients).
    pub fn clipped_gradient_sum(
        &self,
        model: &Model,
        point: &[f32],
        clip: f64,
    ) -> Result<(Vec<f32>, f32), String> {
        let (data, indices) = (&self.local.data, &self.local.indices);
        let model = network(model)?;
        self.labels_fit(model)?;
        let (sum, loss_sum) = clipped_gradient_sum(model, point, data, indices, clip);
        Ok((sum, (loss_sum / indices.len().max(1) as f64) as f32))
    }

    /// Every label of this client's examples names one of `model`'s classes; checked inside
    /// each pass, after admission, since the answer depends on the data.
    fn labels_fit(&self, model: &ModelSpec) -> Result<(), String> {
        let labels = self.local.data.labels();
        match (self.local.indices.iter()).any(|&i| labels[i] as usize >= model.classes()) {
            true => Err(format!(
                "local data has labels beyond the model's {} classes",
                model.classes()
            )),
            false => Ok(()),
        }
    }

    /// Local SGD from `global` with gradients by `rule`.
    fn sgd(
        &self,
        request: &TrainRequest,
        global: &[f32],
        rule: GradientRule,
    ) -> Result<(Vec<f32>, f32), String> {
        let mut params = global.to_vec();
        let mut shuffle = StdRng::seed_from_u64(request.seed);
        let (data, indices) = (&self.local.data, &self.local.indices);
        let (model, config) = (network(&request.model)?, &request.config);
        self.labels_fit(model)?;
        let loss = train_local(
            model,
            &mut params,
            data,
            indices,
            config,
            rule,
            &mut shuffle,
        );
        Ok((params, loss))
    }
}

/// The built-in network of `model`: the built-in trainer runs no other.
fn network(model: &Model) -> Result<&ModelSpec, String> {
    model.network().ok_or_else(|| {
        format!(
            "the built-in trainer trains only the built-in models, not an external one ({model}); \
             run your own training code (e.g. the Python package fl_client)"
        )
    })
}

impl Trainer for SgdTrainer {
    /// The model's inputs against the data's features: the data's schema, public. Its labels
    /// are not looked at here (a refusal that depends on them would tell the server the
    /// largest label): the model's class count is the federation's declaration, and a label
    /// beyond it fails training, after admission ([`SgdTrainer`]'s passes), where under a
    /// protected round the zero update goes out instead.
    fn check(&self, model: &Model) -> Result<(), String> {
        let model = network(model)?;
        let data = &self.local.data;
        if model.inputs() != data.num_features() {
            return Err(format!(
                "model takes {} features, local data has {}",
                model.inputs(),
                data.num_features()
            ));
        }
        Ok(())
    }

    fn train(&self, request: &TrainRequest, global: &[f32]) -> Result<Trained, String> {
        let (weights, loss) = self.sgd(request, global, GradientRule::Mean)?;
        Ok(Trained {
            weights,
            loss: Some(loss),
            examples: self.examples(),
        })
    }

    fn evaluate(&self, model: &Model, global: &[f32]) -> Result<Evaluation, String> {
        self.check(model)?;
        let network = network(model)?;
        self.labels_fit(network)?;
        let mine = self.local.data.subset(&self.local.indices);
        let e = evaluate(network, global, &mine);
        Ok(Evaluation {
            loss: e.loss,
            accuracy: e.accuracy,
            examples: self.examples(),
        })
    }

    fn built_in(&self) -> Option<&SgdTrainer> {
        Some(self)
    }
}
