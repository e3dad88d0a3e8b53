//! Why a client does not do a round's task, or leaves it: one variant per reason. The message is
//! what the client logs and what its `TaskFailed` tells the server.
//!
//! Two kinds, kept apart by [`Refusal::Computation`]: a refusal of the task itself is decided by
//! the task, the client's own settings and what it has spent, never by its examples; a
//! [`ComputationError`] may depend on the examples, so under a protected round it never reaches
//! the server (the client sends the zero update instead, `round::compute`).

use crate::state::StateError;
use fl_authority::policy::PolicyMode;
use fl_model::{LocalConfig, Model};
use fl_privacy::{AccountingError, LocalPrivacyError, ProtectError};
use fl_secagg::SecAggError;

/// Why the client refuses a round's task or leaves its secure round.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    /// The received tensor's length is not the model's.
    #[error("model {model} has {params} parameters but {sent} values were sent")]
    TensorLength {
        /// The task's model.
        model: Model,
        /// Its parameter count.
        params: usize,
        /// The values received.
        sent: usize,
    },
    /// A received value is not finite or beyond the bound on a model's values.
    #[error(
        "the received model's value {index} is {value} (not finite, or beyond the bound {bound} \
         on a model's values): refused before training"
    )]
    ValueOutOfBounds {
        /// Its index.
        index: usize,
        /// The value.
        value: f32,
        /// The bound.
        bound: f64,
    },
    /// The trainer cannot take the task's model (its own reason).
    #[error("{0}")]
    Trainer(String),
    /// The model is not the one of the first task accepted.
    #[error(
        "the model changed mid-run from {first} to {now}: a server cannot change what this \
         client uploads"
    )]
    ModelChanged {
        /// The first task's model.
        first: Box<Model>,
        /// This task's.
        now: Box<Model>,
    },
    /// The task's local training settings are unusable.
    #[error("unusable local config {config:?}: {reason}")]
    LocalConfig {
        /// The settings.
        config: LocalConfig,
        /// What is wrong.
        reason: String,
    },
    /// The client requires a local mechanism and the round asks for another.
    #[error("this client uploads only with {required}; the round asks for {asked}")]
    OtherMechanism {
        /// The mechanism this client requires.
        required: &'static str,
        /// The round's (`none` without one).
        asked: &'static str,
    },
    /// The policy does not allow rounds of this kind.
    #[error(
        "federation {federation:?} policy does not allow {mode} rounds (it allows {allowed}): \
         refused"
    )]
    NotAllowed {
        /// The federation.
        federation: String,
        /// The round's kind.
        mode: PolicyMode,
        /// The kinds it allows.
        allowed: String,
    },
    /// Federated evaluation asked of a client under a policy.
    #[error(
        "federation {federation:?} policy: federated evaluation's figures (loss, accuracy, \
         examples) are not sent under a policy: refused"
    )]
    EvaluationUnderPolicy {
        /// The federation.
        federation: String,
    },
    /// A secure round whose charge at the policy's noise floor is above its per-release cap.
    #[error(
        "federation {federation:?} policy: a secure round at its noise floor costs epsilon \
         {epsilon:.4}, above max_release_epsilon = {max}: refused"
    )]
    SecureRoundTooCostly {
        /// The federation.
        federation: String,
        /// The round's charge.
        epsilon: f64,
        /// The policy's max_release_epsilon.
        max: f64,
    },
    /// Secure aggregation combined with what it cannot take.
    #[error("{0}")]
    Combination(&'static str),
    /// The round's federation is not this client's policy's.
    #[error("the round is of federation {round:?}, this client's policy is of {ours:?}")]
    OtherFederation {
        /// The round's federation.
        round: String,
        /// This client's.
        ours: String,
    },
    /// A client with an identity asked into an unsigned secure round.
    #[error(
        "this client takes part only in signed secure rounds, and the server runs unsigned ones \
         (it has no secagg.authority)"
    )]
    UnsignedRound,
    /// A verified round asked of a client that has no helper key to seal its share to.
    #[error(
        "the round is verified and this client has no helper key to seal the helper's share to \
         (give it --helper-key)"
    )]
    NoHelperKey,
    /// A verified round whose shape gives no circuit.
    #[error("the verified round cannot be proved: {0}")]
    Verified(String),
    /// A signed secure round asked of a client without an identity.
    #[error(
        "the round is signed and this client has no identity to sign with (give it \
         --authority, --identity and --certificate)"
    )]
    NoIdentity,
    /// The round's local mechanism is out of range.
    #[error(transparent)]
    Mechanism(#[from] LocalPrivacyError),
    /// The round's local mechanism cannot be accounted.
    #[error(transparent)]
    Accounting(#[from] AccountingError),
    /// The round's local mechanism cannot protect the result.
    #[error(transparent)]
    Protect(#[from] ProtectError),
    /// The round needs the built-in trainer (named: what needs it) and the client runs another.
    #[error(
        "{0} needs per-example L1 clipping inside training, which only the built-in trainer \
         (fl_client::SgdTrainer) does: this client's trainer cannot take part"
    )]
    NeedsBuiltIn(&'static str),
    /// A local mechanism's release asked into secure aggregation.
    #[error("a local release cannot enter secure aggregation")]
    LocalReleaseInSecure,
    /// The client's remembered state refuses (budget spent, attempt taken, file unwritable).
    #[error(transparent)]
    State(#[from] StateError),
    /// The secure-aggregation protocol refused a stage message.
    #[error(transparent)]
    Secure(#[from] SecAggError),
    /// The task or a secure-aggregation stage message did not read (the wire's reason).
    #[error("the server's message did not read: {0}")]
    Unreadable(String),
    /// The round's computation failed.
    #[error(transparent)]
    Computation(#[from] ComputationError),
}

/// Why a round's computation failed: possibly decided by the client's examples, so reported
/// only to a trusted curator.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ComputationError {
    /// The trainer failed; its own reason may describe the data, so it stays in the client's
    /// log.
    #[error("the client's trainer failed (its reason stays on the client)")]
    TrainerFailed,
    /// The trainer returned a model of another size.
    #[error("the trainer returned {returned} values for a model of {params} parameters")]
    TrainerLength {
        /// The values returned.
        returned: usize,
        /// The model's parameters.
        params: usize,
    },
    /// An IADMM task without its anchor and point.
    #[error("an IADMM task carries 2 x {params} values (anchor and point), not {sent}")]
    AdmmTensor {
        /// The model's parameters.
        params: usize,
        /// The values received.
        sent: usize,
    },
    /// Training produced a value that is not finite.
    #[error("local training diverged (non-finite parameters)")]
    Diverged,
}
