//! A round's task as a client receives it, in the domain's terms: what to train, how, and how to
//! protect the result. `fl_proto`'s conversion builds it from the wire, refusing malformed tasks.

use crate::Quantizer;
use fl_model::{LocalConfig, Model};
use fl_privacy::LocalMechanism;
use sha2::{Digest, Sha256};

/// What a round asks of a sampled client.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// t.
    pub round: u64,
    /// The model.
    pub model: Model,
    /// E, B, eta.
    pub config: LocalConfig,
    /// The mechanism every upload must be protected with, under a client-side mode.
    pub local: Option<LocalMechanism>,
    /// The secure-aggregation round that follows training, if any.
    pub secure: Option<SecureTask>,
    /// The verified upload that follows training, if any: the update's shares and the proof of
    /// its norm bound, for two aggregators ([`crate::verified`]).
    pub verified: Option<VerifiedTask>,
    /// The inexact-ADMM step to take instead of FedAvg's local SGD, if any.
    pub admm: Option<AdmmStep>,
    /// Federated evaluation: the client evaluates the received model on its own examples before
    /// training and reports the figures with a plain update (never with a protected one).
    pub evaluate: bool,
}

/// How a client enters a secure-aggregation round with its update.
#[derive(Debug, Clone, PartialEq)]
pub struct SecureTask {
    /// The fixed-point code: clip to S, scale by gamma, round into the ring.
    pub quantizer: Quantizer,
    /// sigma_i^2: the discrete Gaussian noise each client adds to its code (0: none).
    pub noise_variance: u64,
    /// The round is signed (the malicious-server variant): every client signs its keys with a
    /// certified identity, and survivors sign U1 and U3 before any share is revealed.
    pub signed: bool,
    /// The federation's id (its policy's; empty without a policy).
    pub federation: String,
    /// The server process's run id: with the federation and the round, the attempt.
    pub run: u64,
    /// n_min: the fewest survivors whose noise the round's accounting counts; a client refuses
    /// a round that admits (U1) or keeps (U3) fewer.
    pub min_survivors: u64,
}

/// How a client makes a verified upload: the bound it proves, and what names the attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifiedTask {
    /// S: the L2 bound every contribution is clipped to and proved within.
    pub clip: f64,
    /// The federation's id (its policy's; empty without a policy).
    pub federation: String,
    /// The server process's run id: with the federation and the round, the attempt.
    pub run: u64,
    /// The fewest contributions the aggregators sum; the helper refuses a smaller batch.
    pub min_clients: u64,
}

/// One inexact-ADMM primal step's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdmmStep {
    /// rho.
    pub rho: f64,
    /// I: examples over all clients.
    pub total_examples: u64,
}

impl Task {
    /// The length of the tensor the task carries: the model, or for IADMM the anchor followed
    /// by the point.
    pub fn tensor_len(&self) -> usize {
        let d = self.model.num_params();
        match self.admm {
            Some(_) => 2 * d,
            None => d,
        }
    }
}

/// H(task): SHA-256 of a secure round's task and the model its client received, the
/// model-and-task binding of secure aggregation. It enters every key derivation and every signed
/// payload of the round, so that clients sent different models or settings derive keys that do
/// not match and refuse each other's signatures: the round fails before anything is shared.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskDigest(pub [u8; 32]);

impl std::fmt::Debug for TaskDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TaskDigest({})", hex::encode(self.0))
    }
}

/// Domain string of a task digest.
const TASK_DIGEST_DOMAIN: &[u8] = b"flp.v1 task";

impl Task {
    /// The digest of a secure or verified round's task and its `tensor` (the global model as
    /// received); `None` for a task with neither ([`TaskDigest::of`], [`TaskDigest::of_verified`]).
    pub fn secure_digest(&self, tensor: &[f32]) -> Option<TaskDigest> {
        match (&self.secure, &self.verified) {
            (Some(secure), _) => Some(TaskDigest::of(self, secure, tensor)),
            (None, Some(verified)) => Some(TaskDigest::of_verified(self, verified, tensor)),
            (None, None) => None,
        }
    }
}

/// A string with its u32 length first.
fn text(h: &mut Sha256, s: &str) {
    h.update((s.len() as u32).to_be_bytes());
    h.update(s.as_bytes());
}

/// The domain, the round, the model's text and tensors' names and shapes, E, B, eta and s: what
/// both digests start with. The task is destructured in full, so a field added to it does not
/// compile until it is hashed or said not to be.
fn common(task: &Task, domain: &[u8], tensor: &[f32]) -> Sha256 {
    let Task {
        round,
        model,
        config,
        // A client refuses a secure round with a local mechanism, an IADMM step or
        // federated evaluation under a policy (its admission): none changes what it sends.
        local: _,
        // The part of the round's kind: hashed after this by the digest of that kind.
        secure: _,
        verified: _,
        admm: _,
        evaluate: _,
    } = task;
    let LocalConfig {
        epochs,
        batch_size,
        learning_rate,
        random_shift,
    } = *config;
    let mut h = Sha256::new();
    h.update(domain);
    h.update(round.to_be_bytes());
    text(&mut h, &model.to_string());
    // The model's tensors; their values come last.
    let tensors = model.named_tensors(tensor);
    h.update((tensors.len() as u32).to_be_bytes());
    for (name, shape, _) in &tensors {
        text(&mut h, name);
        h.update((shape.len() as u32).to_be_bytes());
        shape
            .iter()
            .for_each(|&n| h.update((n as u64).to_be_bytes()));
    }
    for v in [epochs, batch_size, learning_rate.to_bits(), random_shift] {
        h.update(v.to_be_bytes());
    }
    h
}

/// The tensor's count u64, then its values as little-endian f32: what both digests end with.
fn finish(mut h: Sha256, tensor: &[f32]) -> TaskDigest {
    h.update((tensor.len() as u64).to_be_bytes());
    let mut bytes = Vec::with_capacity(4 * 4096);
    for block in tensor.chunks(4096) {
        bytes.clear();
        block
            .iter()
            .for_each(|v| bytes.extend_from_slice(&v.to_le_bytes()));
        h.update(&bytes);
    }
    TaskDigest(h.finalize().into())
}

/// Domain string of a verified task's digest.
const VERIFIED_DIGEST_DOMAIN: &[u8] = b"flp.v1 verified task";

impl TaskDigest {
    /// H(task) of `task`, whose secure part is `secure`, and its `tensor` (the global model as
    /// received). Byte by byte (big-endian integers, strings and lists with a u32 length first;
    /// docs/src/reference/protocol.md, "Task digest"): `"flp.v1 task"`, round u64, the
    /// model's text, its tensors (name, then the shape's u64 dimensions), E u32, B u32, the
    /// bits of eta (f32) u32, s u32, the ring's b u32, the bits of S and of gamma (f64) u64
    /// each, sigma_i^2 u64, signed u8 (0 or 1), the federation id (a string), the run id u64,
    /// n_min u64, then the tensor's values as little-endian f32 after their count u64. The task
    /// and its secure part are destructured in full, so a field added to either does not
    /// compile until it is hashed or said not to be.
    pub fn of(task: &Task, secure: &SecureTask, tensor: &[f32]) -> Self {
        let SecureTask {
            quantizer,
            noise_variance,
            signed,
            federation,
            run,
            min_survivors,
        } = secure;
        let mut h = common(task, TASK_DIGEST_DOMAIN, tensor);
        let Quantizer { ring, clip, scale } = *quantizer;
        h.update(ring.bits().to_be_bytes());
        for v in [clip.to_bits(), scale.to_bits(), *noise_variance] {
            h.update(v.to_be_bytes());
        }
        h.update([u8::from(*signed)]);
        text(&mut h, federation);
        h.update(run.to_be_bytes());
        h.update(min_survivors.to_be_bytes());
        finish(h, tensor)
    }

    /// H(task) of a verified round: as [`TaskDigest::of`] up to s, under the domain
    /// `"flp.v1 verified task"`, then the bits of S (f64) u64, the federation id, the run id u64,
    /// the fewest clients u64, and the tensor.
    pub fn of_verified(task: &Task, verified: &VerifiedTask, tensor: &[f32]) -> Self {
        let VerifiedTask {
            clip,
            federation,
            run,
            min_clients,
        } = verified;
        let mut h = common(task, VERIFIED_DIGEST_DOMAIN, tensor);
        h.update(clip.to_bits().to_be_bytes());
        text(&mut h, federation);
        h.update(run.to_be_bytes());
        h.update(min_clients.to_be_bytes());
        finish(h, tensor)
    }
}
