//! Secure aggregation: the server learns only the sum of the round's quantised updates.
//!
//! The protocol is Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine
//! Learning" (CCS 2017), with the sparse neighbour graph of SecAgg+ (Bell et al., CCS 2020); with
//! [`Credentials`] its malicious-server variant (signed keys and a consistency check, Sec. 6;
//! `binding.rs`). Every key is bound to the round and H(task) ([`RoundTag`]). t is the paper's
//! Shamir threshold (the book writes tau, as its t is the round). Per round:
//!
//! 0. AdvertiseKeys: client u sends (c_pk_u, s_pk_u), signed in a signed round; the server sends
//!    each u U1, its neighbours' keys and the Shamir threshold t; u checks that its neighbours are
//!    those of the graph derived from U1. U1 = who advertised.
//! 1. ShareKeys: u draws the self-mask seed b_u, Shamir-shares s_sk_u and b_u among its neighbours
//!    (t of them recover either) and sends each share AEAD-encrypted to its holder, plus a hash
//!    commitment per share that the server keeps. U2 = who shared.
//! 2. MaskedInput: u sends y_u = x_u + PRG(b_u) + sum_{v in N(u) ∩ U2} ±PRG(s_{u,v}) mod 2^b
//!    (+ when u < v, − when u > v, so p_uv = −p_vu). U3 = who sent y.
//! 3. Unmasking: the server sends U3 (in a signed round, each survivor signs it and waits for t of
//!    its neighbours' signatures on the same set); each survivor reveals, for every neighbour v that shared,
//!    its share of b_v if v is in U3 and of s_sk_v otherwise (never both). The server checks each
//!    share against its commitment, recovers the secrets and removes every mask: the exact sum of
//!    the survivors' x_u.
//!
//! Everything here is sans-IO: [`ClientRound`] and the server's phases ([`AdvertiseKeys`] onwards) consume and produce the stage
//! messages; the server and client crates only carry them.
//!
//! The crate also owns the round's [`task`]: H(task) is what every key of a secure round is
//! bound to, and a task's secure part carries the [`Quantizer`].
//!
//! **Owns** the protocol's state machines, its keys, shares, masks and checks. **Imports**
//! fl-model (what a task trains), fl-privacy (the distributed noise's calibration) and
//! fl-authority (signed identities and the policy a client enforces).

#![deny(missing_docs)]

mod binding;
mod calibration;
mod client;
mod graph;
mod keys;
mod messages;
mod oracle;
mod prg;
mod quantize;
mod ring;
mod server;
mod shamir;
pub mod task;
pub mod verified;

pub use binding::{
    CertificateError, Credentials, IdentityError, Verifier, keys_payload, members_digest,
    survivors_payload,
};
pub use calibration::{
    Calibration, CalibrationError, MAX_DISCRETE_SIGMA, RoundShape, fewest_survivors,
};
pub use client::{ClientRound, min_threshold};
pub use graph::{GraphKind, auto_degree, derive as derive_graph};
pub use keys::{
    KeyError, KeyPair, RoundTag, SecretKind, check_public, pair_seed, share_commitment,
};
pub use messages::{
    AdvertisedKeys, Endorsements, Member, Neighbourhood, Proceed, RevealedShare, SealedShares,
    ServerStage, Signed, Stage, StageMessage,
};
pub use oracle::PlainInputs;
pub use prg::{Sign, apply_mask, expand};
pub use quantize::{QuantizeError, Quantizer};
pub use ring::Ring;
pub use server::{
    AdvertiseKeys, CheckShares, Checked, Consistency, MaskedInput, Phase, RoundResult, RoundSetup,
    ShareKeys, Unmasking,
};
pub use shamir::{SHARE_BYTES, ShamirError, Share};

/// Secure aggregation sums plain FedAvg updates: it takes no local mechanism and no inexact-ADMM
/// step. Every client's admission of a task applies this one rule.
pub fn check_combination(local_mechanism: bool, admm: bool) -> Result<(), &'static str> {
    match local_mechanism || admm {
        true => Err("secure aggregation with local privacy or IADMM is not supported"),
        false => Ok(()),
    }
}

/// Why a stage message is refused or a round cannot go on.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SecAggError {
    /// A message for a stage that is not the current one (replayed, stale or early).
    #[error("round {round}: a {got} message arrived during {expected}")]
    WrongStage {
        /// The round.
        round: u64,
        /// The stage in progress.
        expected: Stage,
        /// The stage the message belongs to.
        got: Stage,
    },
    /// A server message the client did not expect now: sent twice, early or late.
    #[error("round {round}: a {message} message arrived while this client is at {stage}")]
    OutOfOrder {
        /// The round.
        round: u64,
        /// The kind of the server's message.
        message: &'static str,
        /// Where this client is in the round.
        stage: Stage,
    },
    /// The sender is not a participant of this stage.
    #[error("client {0} is not taking part in this stage of the round")]
    NotParticipant(u64),
    /// The sender already answered this stage.
    #[error("client {0} already answered this stage")]
    Duplicate(u64),
    /// A share addressed to someone who is not a neighbour, or a neighbour left out.
    #[error("client {from}'s shares must go to exactly its {expected} neighbours: {problem}")]
    WrongRecipients {
        /// Sender.
        from: u64,
        /// How many neighbours it has.
        expected: usize,
        /// What is wrong.
        problem: String,
    },
    /// A share ciphertext that does not decrypt, or decrypts to the wrong round or parties.
    #[error("the share from client {from} is forged, altered or not addressed to this client")]
    BadShare {
        /// Claimed sender.
        from: u64,
    },
    /// A revealed share that does not match its commitment.
    #[error("client {holder}'s share of client {owner}'s {kind:?} does not match its commitment")]
    ForgedShare {
        /// Who revealed it.
        holder: u64,
        /// Whose secret.
        owner: u64,
        /// Which secret.
        kind: SecretKind,
    },
    /// A reveal that is not the one the protocol asks for.
    #[error("client {holder}'s reveal is wrong: {problem}")]
    WrongReveal {
        /// Who revealed.
        holder: u64,
        /// What is wrong.
        problem: String,
    },
    /// A masked input of the wrong length or with values outside the ring.
    #[error("masked input from client {from}: {problem}")]
    BadMaskedInput {
        /// Sender.
        from: u64,
        /// What is wrong.
        problem: String,
    },
    /// A check that names a client that sent the checker no share, or names one twice.
    #[error("client {from}'s share check is wrong: {problem}")]
    BadCheck {
        /// Who checked.
        from: u64,
        /// What is wrong.
        problem: String,
    },
    /// A client whose keys or signature cannot be trusted: unsigned, uncertified, revoked, or
    /// signed over other keys, another round or another task.
    #[error("client {client} is not authenticated: {reason}")]
    Unauthenticated {
        /// The client.
        client: u64,
        /// Why.
        reason: String,
    },
    /// A server message the client refuses (it would break the protocol's guarantees).
    #[error("refused: {0}")]
    Refused(String),
    /// A round outside the federation's policy, which the client holds from its authority.
    #[error("refused: {0}")]
    OutsidePolicy(#[from] fl_authority::policy::OutsidePolicy),
    /// Too few clients survived a stage: the round ends with no update and nothing revealed.
    #[error("round {round} aborted during {stage}: {reason}")]
    Aborted {
        /// The round.
        round: u64,
        /// The stage that could not complete.
        stage: Stage,
        /// Why.
        reason: String,
    },
    /// A key agreement failed.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A secret could not be shared or recovered.
    #[error(transparent)]
    Shamir(#[from] ShamirError),
}

#[cfg(test)]
mod staged_tests;
#[cfg(test)]
mod tests;

#[cfg(test)]
mod signed_tests;

#[cfg(test)]
mod vectors;
