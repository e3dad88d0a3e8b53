//! The client engine, without I/O: domain inputs in (a task and its tensor, what the round
//! computed, the server's stage messages), what to send out. It checks each task against the
//! client's trainer and its own privacy requirements, keeps the secure-aggregation round and the
//! client's local privacy ledger, and never sends a result with less protection than the client
//! requires. `crate::session` drives it over gRPC; nothing here knows the wire.

use crate::ClientPrivacy;
use crate::admission::{Ours, Protection, admit};
use crate::refusal::Refusal;
use crate::round::{Computed, Work, compute};
use crate::round_log::RoundLog;
use crate::secure::{SecureContext, SecureInput, SecureRound, Step};
use crate::state::ClientState;
use crate::trainer::Trainer;
use crate::verified::verified_upload;
use fl_authority::policy::FederationPolicy;
use fl_model::Model;
use fl_secagg::task::Task;
use fl_secagg::verified::{Binder, Report};
use fl_secagg::{Credentials, PlainInputs, Ring, RoundTag, ServerStage, StageMessage};
use rand::Rng;
use rand::rngs::StdRng;
use std::sync::Arc;

/// What the engine asks its driver to send.
#[derive(Debug)]
pub(crate) enum Outgoing {
    /// A round's result: plain (for a trusted curator) or a local mechanism's release.
    Upload {
        /// t.
        round: u64,
        /// The result.
        computed: Computed,
    },
    /// A secure-aggregation stage message.
    Stage {
        /// t.
        round: u64,
        /// The ring the round's masked input is in.
        ring: Ring,
        /// The message.
        message: StageMessage,
    },
    /// A verified upload: the leader's share in the clear, the helper's sealed.
    Verified {
        /// t.
        round: u64,
        /// The upload.
        report: Box<Report>,
    },
    /// The client cannot do round `round`'s task.
    Failed {
        /// t.
        round: u64,
        /// Why.
        reason: String,
    },
}

/// A round's job done: what the round computed, ready to send.
pub(crate) struct Prepared {
    /// t.
    round: u64,
    /// The upload or the started secure round, or why there is neither.
    ready: Result<Ready, Refusal>,
    /// Seconds the job took.
    pub(crate) seconds: f64,
    /// The trainer's mean loss, when the round's upload is plain (a local mechanism's release
    /// carries none); for this client's own log only.
    loss: Option<f32>,
}

/// What a computed round sends.
enum Ready {
    /// A plain upload or a local mechanism's release.
    Upload(Computed),
    /// The secure round, started, and its first stage message (the public keys).
    Secure(Box<SecureRound>, StageMessage),
    /// The verified upload, sharded and proved.
    Verified(Box<Report>),
}

/// A stage message's job done: the secure round's state and its next step.
pub(crate) struct Stepped {
    state: SecureRound,
    step: Result<Step, Refusal>,
}

/// The slot's half of a computed round (no engine state): under secure aggregation, quantise,
/// noise and start the protocol as client `me`, bound to H(task) of the task and model received.
fn prepare(
    me: u64,
    work: &Work,
    computed: Result<Computed, Refusal>,
    context: &SecureContext,
) -> Prepared {
    let round = work.task.round;
    let loss = match &computed {
        Ok(Computed::Plain { loss, .. }) => *loss,
        Ok(Computed::Protected(_)) | Err(_) => None,
    };
    let ready = match (computed, &work.protection) {
        (
            Ok(Computed::Plain { values, .. }),
            &Protection::Secure {
                quantizer,
                noise_variance,
                digest,
                min_survivors,
                ..
            },
        ) => {
            let tag = RoundTag { round, digest };
            let attacked = (context.attack).map(|a| a.secure_input(quantizer, &work.received));
            let (quantizer, values) = attacked.unwrap_or((quantizer, values));
            let input = SecureInput {
                quantizer,
                noise_variance,
                min_survivors,
                update: &values,
            };
            let (state, keys) = SecureRound::start((me, tag), input, context);
            Ok(Ready::Secure(Box::new(state), keys))
        }
        (
            Ok(Computed::Plain { values, .. }),
            &Protection::Verified {
                shape,
                digest,
                helper,
            },
        ) => {
            let binder = Binder::new(&RoundTag { round, digest }, me);
            let attack = context.attack.map(|a| a.update(&work.received));
            verified_upload(&shape, &binder, &helper, (&values, attack)).map(Ready::Verified)
        }
        (Ok(Computed::Protected(_)), Protection::Secure { .. } | Protection::Verified { .. }) => {
            Err(Refusal::LocalReleaseInSecure)
        }
        (Ok(computed), Protection::Plain { .. } | Protection::Local { .. }) => {
            Ok(Ready::Upload(computed))
        }
        (Err(reason), _) => Err(reason),
    };
    Prepared {
        round,
        ready,
        seconds: 0.0,
        loss,
    }
}

/// A client's state across its sessions; see the module documentation.
pub(crate) struct Engine {
    trainer: Arc<dyn Trainer>,
    privacy: ClientPrivacy,
    /// Its identity and, in simulations, the plain-input oracle.
    secure_context: SecureContext,
    /// Local shuffling (seeded in reproducible experiments).
    shuffle: StdRng,
    /// The secure-aggregation round this client is in.
    secure: Option<SecureRound>,
    /// The model of the first task accepted: later tasks must carry the same.
    model: Option<Model>,
    /// Rounds trained, tasks refused and the last refusal's reason.
    pub(crate) rounds_trained: u64,
    pub(crate) tasks_refused: u64,
    pub(crate) last_refusal: Option<String>,
    /// What this client's local releases have cost it, and the secure attempts it took part
    /// in (on disk when it has a state file).
    pub(crate) state: ClientState,
    /// The federation's rules, when the authority signed a policy.
    policy: Option<Arc<FederationPolicy>>,
    /// This client's name and its process's round log, when the process says rounds for all
    /// its clients.
    round_log: Option<(String, RoundLog)>,
}

impl Engine {
    /// A client training with `trainer` under its own `privacy`; `seed` fixes the local examples'
    /// order (reproducible experiments only).
    pub(crate) fn new(
        trainer: Arc<dyn Trainer>,
        privacy: ClientPrivacy,
        oracle: Option<Arc<PlainInputs>>,
        seed: Option<u64>,
    ) -> Self {
        Self {
            trainer,
            privacy,
            secure_context: SecureContext {
                credentials: None,
                oracle,
                policy: None,
                attack: None,
            },
            shuffle: fl_common::rng::reproducible(seed),
            secure: None,
            model: None,
            rounds_trained: 0,
            tasks_refused: 0,
            last_refusal: None,
            state: ClientState::in_memory(),
            policy: None,
            round_log: None,
        }
    }

    /// The engine of client `name`, saying its rounds in its process's `round_log` (if any)
    /// rather than on a line of its own.
    pub(crate) fn reporting_to(mut self, name: &str, round_log: Option<RoundLog>) -> Self {
        self.round_log = round_log.map(|log| (name.to_owned(), log));
        self
    }

    /// The engine of a client of the federation whose `policy` it holds (if any), remembering
    /// what it spent and took part in in `state`.
    pub(crate) fn remembering(
        mut self,
        policy: Option<Arc<FederationPolicy>>,
        state: ClientState,
    ) -> Self {
        self.secure_context.policy = policy.clone();
        self.policy = policy;
        self.state = state;
        self
    }

    /// Simulation only: the engine of a compromised client ([`crate::Attack`]).
    pub(crate) fn attacking(mut self, attack: Option<crate::Attack>) -> Self {
        self.secure_context.attack = attack;
        self
    }

    /// The engine of a client that signs secure rounds with `credentials` (and takes part in no
    /// other), or of one that takes part only in unsigned rounds (`None`).
    pub(crate) fn signing_with(mut self, credentials: Option<Arc<Credentials>>) -> Self {
        self.secure_context.credentials = credentials;
        self
    }

    /// The round of the secure-aggregation round this client is in, if any.
    pub(crate) fn secure_round(&self) -> Option<u64> {
        self.secure.as_ref().map(|s| s.round)
    }

    /// A new session: a secure round of the old one is over.
    pub(crate) fn new_session(&mut self) {
        self.secure = None;
    }

    /// A task and the tensor it carries arrived: the work to compute, or the refusal to send.
    pub(crate) fn task(&mut self, task: Task, received: Vec<f32>) -> Result<Work, Outgoing> {
        let round = task.round;
        match self.plan(task, received) {
            Ok(work) => Ok(work),
            Err(reason) => Err(self.refuse(round, reason)),
        }
    }

    /// The client cannot do round `round`: the refusal to send.
    pub(crate) fn refuse(&mut self, round: u64, refusal: Refusal) -> Outgoing {
        let reason = refusal.to_string();
        tracing::warn!(round, %reason, "cannot do this round's task");
        self.tasks_refused += 1;
        self.last_refusal = Some(reason.clone());
        Outgoing::Failed { round, reason }
    }

    /// Admits a task ([`admit`]: the client never uploads with less protection than it and
    /// its policy require), then, every check passed, pins the first model and takes part in
    /// a secure round, its charge recorded with it, before anything of the round leaves.
    fn plan(&mut self, task: Task, received: Vec<f32>) -> Result<Work, Refusal> {
        let ours = Ours {
            privacy: &self.privacy,
            policy: self.policy.as_deref(),
            signing: self.secure_context.credentials.is_some(),
            pinned: self.model.as_ref(),
            trainer: &*self.trainer,
            state: &self.state,
        };
        let protection = admit(&task, &received, &ours)?;
        if let (Some(secure), Protection::Secure { charge, .. }) = (&task.secure, &protection) {
            self.state
                .take_part(secure.run, task.round, charge.as_ref())?;
        }
        self.model.get_or_insert_with(|| task.model.clone());
        let seed = self.shuffle.random();
        Ok(Work {
            task,
            protection,
            received,
            seed,
        })
    }

    /// Round `work`'s computation as one job for a training slot, needing nothing of the
    /// engine: the trainer's work and the round's mechanism, then under secure aggregation the
    /// quantising, noising and first stage of the protocol as client `me`.
    pub(crate) fn job(&self, me: u64, work: Work) -> impl FnOnce() -> Prepared + Send + 'static {
        let (trainer, context) = (self.trainer.clone(), self.secure_context.clone());
        move || {
            let started = std::time::Instant::now();
            let prepared = prepare(me, &work, compute(&work, &*trainer), &context);
            Prepared {
                seconds: started.elapsed().as_secs_f64(),
                ..prepared
            }
        }
    }

    /// What the client sends once a round's job is done: the upload, the first stage message of
    /// the secure round, or the reason it could not.
    pub(crate) fn computed(&mut self, prepared: Prepared) -> Outgoing {
        self.rounds_trained += 1;
        let round = prepared.round;
        match (&prepared.ready, &self.round_log) {
            (Err(_), _) => {}
            (Ok(_), Some((name, log))) => {
                log.trained(round, name, prepared.seconds, prepared.loss.map(f64::from))
            }
            (Ok(_), None) => {
                let loss = prepared.loss.map(|l| format!("{l:.4}"));
                let seconds = format!("{:.2}", prepared.seconds);
                tracing::info!(round, seconds, loss, "trained for the round");
            }
        }
        match prepared.ready {
            Ok(Ready::Verified(report)) => Outgoing::Verified { round, report },
            Ok(Ready::Secure(state, keys)) => {
                let ring = state.ring;
                self.secure = Some(*state);
                Outgoing::Stage {
                    round,
                    ring,
                    message: keys,
                }
            }
            Ok(Ready::Upload(computed)) => match self.record(round, &computed) {
                Ok(()) => Outgoing::Upload { round, computed },
                Err(reason) => self.refuse(round, reason),
            },
            Err(reason) => self.refuse(round, reason),
        }
    }

    /// A secure-aggregation stage message of round `round` (or why it did not read) as a job
    /// for a training slot (expanding masks is heavy), which takes the round's state along
    /// until [`Engine::stepped`]. `None`: the message is outside the client's secure round and
    /// is ignored.
    pub(crate) fn stage_job(
        &mut self,
        round: u64,
        stage: Result<ServerStage, Refusal>,
    ) -> Option<impl FnOnce() -> Stepped + Send + 'static> {
        let mut state = self.secure.take_if(|s| s.round == round)?;
        Some(move || {
            let step = stage.and_then(|s| Ok(state.step(s)?));
            Stepped { state, step }
        })
    }

    /// The answer to a stage message, once its job is done.
    pub(crate) fn stepped(&mut self, Stepped { state, step }: Stepped) -> Outgoing {
        let (round, ring) = (state.round, state.ring);
        match step {
            Ok(Step::Send(message)) => {
                self.secure = Some(state);
                Outgoing::Stage {
                    round,
                    ring,
                    message,
                }
            }
            Ok(Step::Done(message)) => Outgoing::Stage {
                round,
                ring,
                message,
            },
            Err(reason) => self.refuse(round, reason),
        }
    }

    /// Adds a result's local release, if any, to what this client has spent (refused past its
    /// cap; remembered on disk before the release is sent).
    fn record(&mut self, round: u64, computed: &Computed) -> Result<(), Refusal> {
        let Some(release) = computed.release() else {
            return Ok(());
        };
        self.state.record(release)?;
        tracing::info!(
            round,
            mechanism = release.kind.name(),
            epsilon = release.epsilon,
            releases = self.state.releases(),
            composed_epsilon = self.state.epsilon(),
            "local privacy spent"
        );
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::trainer::SgdTrainer;
    use crate::{ClientPrivacy, LocalData};
    use fl_datasets::Dataset;
    use fl_model::{LocalConfig, Model, ModelSpec};
    use fl_privacy::{ClientLimits, GaussianLdp, LaplaceLdp, LocalKind, LocalMechanism, Release};

    /// Six examples of 3 features and 2 classes, all this client's.
    pub(crate) fn local() -> LocalData {
        let features = ndarray::Array2::from_shape_fn((6, 3), |(i, j)| (i + j) as f32);
        let data = Dataset::new(features, vec![0, 1, 0, 1, 0, 1], 2).unwrap();
        LocalData {
            data: Arc::new(data),
            indices: (0..6).collect(),
        }
    }

    /// Round 1 of logistic regression 3 -> 2 under `local`, nothing else asked.
    pub(crate) fn task(local: Option<LocalMechanism>) -> Task {
        Task {
            round: 1,
            model: ModelSpec::logistic(3, 2).unwrap().into(),
            config: LocalConfig {
                epochs: 1,
                batch_size: 2,
                learning_rate: 0.1,
                random_shift: 0,
            },
            local,
            secure: None,
            verified: None,
            admm: None,
            evaluate: false,
        }
    }

    fn gaussian(epsilon: f64) -> Option<LocalMechanism> {
        Some(LocalMechanism::Gaussian(GaussianLdp {
            epsilon,
            delta: 1e-5,
            clip_bound: 1.0,
        }))
    }

    fn engine(privacy: ClientPrivacy) -> Engine {
        Engine::new(Arc::new(SgdTrainer::new(local())), privacy, None, Some(1))
    }

    fn refusal(outcome: Result<Work, Outgoing>) -> String {
        match outcome {
            Err(Outgoing::Failed { reason, .. }) => reason,
            other => panic!("not refused: {other:?}"),
        }
    }

    /// A server cannot change the model mid-run (to enlarge what a client uploads): the client
    /// refuses a task whose model differs from the first one it trained, and goes on with the
    /// first.
    #[test]
    fn a_model_changed_mid_run_is_refused() {
        let mut e = engine(ClientPrivacy::default());
        e.task(task(gaussian(1.0)), vec![0.0; 8]).unwrap();
        let mut bigger = task(gaussian(1.0));
        bigger.round = 2;
        bigger.model = ModelSpec::mlp(3, &[4], 2).unwrap().into();
        let d = bigger.model.num_params();
        let err = refusal(e.task(bigger, vec![0.0; d]));
        assert!(err.contains("changed mid-run"), "{err}");
        let mut same = task(gaussian(1.0));
        same.round = 3;
        e.task(same, vec![0.0; 8]).unwrap();
    }

    #[test]
    fn a_client_refuses_rounds_below_its_requirements_and_tightens_the_rest() {
        let mut follow = engine(ClientPrivacy::default());
        let err = refusal(follow.task(task(gaussian(0.0)), vec![0.0; 8]));
        assert!(err.contains("local epsilon = 0"), "{err}");
        let laplace_only = ClientPrivacy {
            require: Some(LocalKind::Laplace),
            ..ClientPrivacy::default()
        };
        let err = refusal(engine(laplace_only).task(task(gaussian(2.0)), vec![0.0; 8]));
        assert!(err.contains("uploads only with ldp-laplace"));
        let err = refusal(engine(laplace_only).task(task(None), vec![0.0; 8]));
        assert!(err.contains("the round asks for none"));
        let strict = ClientPrivacy {
            require: Some(LocalKind::Laplace),
            limits: ClientLimits {
                epsilon: Some(0.5),
                ..ClientLimits::default()
            },
            max_total_epsilon: None,
            helper_key: None,
        };
        let laplace = Some(LocalMechanism::Laplace(LaplaceLdp {
            epsilon: 2.0,
            clip_bound: 1.0,
            steps: 1,
        }));
        let mut strict = engine(strict);
        let work = strict.task(task(laplace), vec![0.0; 8]).unwrap();
        assert!(work.task.secure.is_none());
        assert_eq!(
            work.protection.local().copied(),
            Some(LocalMechanism::Laplace(LaplaceLdp {
                epsilon: 0.5,
                clip_bound: 1.0,
                steps: 1
            }))
        );
        // The upload carries the tightened loss, which the round admits.
        let computed = compute(&work, &*strict.trainer).unwrap();
        let release: &Release = computed.release().unwrap();
        assert_eq!(release.epsilon, 0.5);
        let round = LocalMechanism::Laplace(LaplaceLdp {
            epsilon: 2.0,
            clip_bound: 1.0,
            steps: 1,
        });
        round.admits(release).unwrap();
    }

    /// A trainer whose error describes its data.
    struct Leaky;

    impl crate::Trainer for Leaky {
        fn train(&self, _: &crate::TrainRequest, _: &[f32]) -> Result<crate::Trained, String> {
            Err("patient 4711 has label 1".into())
        }

        fn evaluate(&self, _: &Model, _: &[f32]) -> Result<crate::Evaluation, String> {
            Err("patient 4711 has label 1".into())
        }
    }

    /// To a trusted curator a failing trainer's refusal is a fixed text (what the trainer says
    /// stays on the client); where the server is the adversary (a local mechanism) nothing is
    /// refused: the zero update goes through the mechanism, a release like any other.
    #[test]
    fn a_trainer_failure_sends_a_fixed_reason_or_the_protected_zero_update() {
        for local in [None, gaussian(2.0)] {
            let mut engine = Engine::new(Arc::new(Leaky), ClientPrivacy::default(), None, None);
            let work = engine.task(task(local), vec![0.0; 8]).unwrap();
            let prepared = engine.job(1, work)();
            match (local, engine.computed(prepared)) {
                (None, Outgoing::Failed { reason, .. }) => {
                    assert!(!reason.contains("4711"), "{reason}");
                    assert!(reason.contains("trainer failed"), "{reason}");
                }
                (Some(_), Outgoing::Upload { computed, .. }) => {
                    assert_eq!(computed.release().unwrap().epsilon, 2.0);
                    assert_eq!(engine.state.releases(), 1);
                }
                (_, other) => panic!("{local:?}: {other:?}"),
            }
        }
    }

    /// A server probing a client's largest label with models of 1, 2, 3 and 4 classes (its
    /// labels are 0, 1 and 2) gets the same answer to each under a local mechanism: a release
    /// of the same epsilon. The class count is the model's declaration; a label beyond it
    /// fails training after admission, and the protected zero update goes out instead.
    #[test]
    fn class_count_probing_gets_identical_answers() {
        let features = ndarray::Array2::from_shape_fn((6, 3), |(i, j)| (i + j) as f32);
        let data = Dataset::new(features, vec![0, 1, 2, 0, 1, 2], 3).unwrap();
        let local = LocalData {
            data: Arc::new(data),
            indices: (0..6).collect(),
        };
        for classes in 1..=4 {
            let mut e = Engine::new(
                Arc::new(SgdTrainer::new(local.clone())),
                ClientPrivacy::default(),
                None,
                Some(1),
            );
            let probe = Task {
                model: ModelSpec::logistic(3, classes).unwrap().into(),
                ..task(gaussian(2.0))
            };
            let d = probe.model.num_params();
            let work = e.task(probe, vec![0.0; d]).unwrap();
            let prepared = e.job(1, work)();
            match e.computed(prepared) {
                Outgoing::Upload { computed, .. } => {
                    let release = computed.release().unwrap();
                    assert_eq!(release.epsilon, 2.0, "{classes} classes");
                }
                other => panic!("{classes} classes: {other:?}"),
            }
        }
    }
}
