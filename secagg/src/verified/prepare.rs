//! The aggregators' side of a verified upload (Prio3's preparation for two aggregators): each
//! queries its share of the input and the proof, recomputes its own parts of the seeds, and the
//! two exchange what they found; an upload counts only if the proof verifies on the sum of their
//! verifier shares and each aggregator's recomputed parts are those the client gave the other.
//!
//! The query randomness comes from a verify key the two aggregators share and the clients never
//! see; whatever a client sends, an aggregator learns from the exchange only whether its upload is
//! valid (the FLP is zero-knowledge for a valid input).

use super::circuit::F;
use super::derive::{Usage, combine, expand};
use super::report::{HelperShare, LeaderShare, Parts};
use super::seal::{HelperKey, Sealed};
use super::shape::{Binder, Shape, ShapeError};
use prio::field::FieldElement;
use prio::flp::Flp;

/// Which aggregator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The round's server: gets its share in the clear and publishes the sum.
    Leader,
    /// The second aggregator: gets its share sealed, through the leader.
    Helper,
}

/// Why an upload is excluded from the sum; each is counted in the round's metrics.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Exclusion {
    /// A share or a proof of the wrong length, or a value outside the field.
    #[error("malformed: {0}")]
    Malformed(String),
    /// The helper's part does not open (sealed to another key, round or client, or altered).
    #[error("the helper's share does not open")]
    Sealed,
    /// An aggregator's recomputed part differs from the one the client gave the other: shares
    /// made for another round or client, or mixed from two uploads.
    #[error("the shares do not match the seeds the proof was made with")]
    Binding,
    /// The proof does not verify: above the norm bound, or forged.
    #[error("the proof of the norm bound does not verify")]
    Proof,
}

impl Exclusion {
    /// Its name in a round's metrics: `malformed`, `sealed`, `binding` or `proof`.
    pub fn kind(&self) -> &'static str {
        match self {
            Exclusion::Malformed(_) => "malformed",
            Exclusion::Sealed => "sealed",
            Exclusion::Binding => "binding",
            Exclusion::Proof => "proof",
        }
    }
}

/// One aggregator's share of an upload, in the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputShare {
    /// Its share of the input.
    pub input: Vec<F>,
    /// Its share of the proof.
    pub proof: Vec<F>,
    /// Its blind.
    pub blind: [u8; 32],
    /// The other aggregator's parts, as the client gave them.
    pub peer_parts: Parts,
}

impl From<LeaderShare> for InputShare {
    fn from(share: LeaderShare) -> Self {
        Self {
            input: share.input,
            proof: share.proof,
            blind: share.blind,
            peer_parts: share.helper_parts,
        }
    }
}

impl InputShare {
    /// The helper's share: `sealed` opened with its key and expanded from its seed.
    pub fn open(
        shape: &Shape,
        binder: &Binder,
        key: &HelperKey,
        sealed: &Sealed,
    ) -> Result<Self, Exclusion> {
        let bytes = key.open(binder, sealed).map_err(|_| Exclusion::Sealed)?;
        let share = HelperShare::from_bytes(&bytes).ok_or(Exclusion::Sealed)?;
        let circuit = shape.circuit([0; 32]).map_err(malformed)?;
        let expand_as = |usage, len| expand(&share.seed, usage, binder, len);
        Ok(Self {
            input: expand_as(Usage::InputShare, circuit.input_len()),
            proof: expand_as(Usage::ProofShare, circuit.proof_len()),
            blind: share.blind,
            peer_parts: share.leader_parts,
        })
    }
}

/// What one aggregator sends the other about one upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepShare {
    /// Its share of the verifier.
    pub verifier: Vec<F>,
    /// Its parts, recomputed from its share.
    pub parts: Parts,
}

/// What an aggregator keeps of an upload until both prep shares are in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// Its share of X: what it adds to its sum if the upload is valid.
    pub x: Vec<F>,
    /// The other's parts as the client gave them.
    peer_parts: Parts,
}

/// A shape error as an exclusion (it cannot come from the client, but an aggregator never panics).
fn malformed(e: ShapeError) -> Exclusion {
    Exclusion::Malformed(e.to_string())
}

/// `role`'s prep share of the upload `binder` names, and what it keeps until the other's comes.
pub fn prepare(
    shape: &Shape,
    role: Role,
    binder: &Binder,
    verify_key: &[u8; 32],
    share: InputShare,
) -> Result<(PrepShare, Pending), Exclusion> {
    let scratch = shape.circuit([0; 32]).map_err(malformed)?;
    let (want_input, want_proof) = (scratch.input_len(), scratch.proof_len());
    if share.input.len() != want_input || share.proof.len() != want_proof {
        return Err(Exclusion::Malformed(format!(
            "{} input and {} proof values, the circuit has {want_input} and {want_proof}",
            share.input.len(),
            share.proof.len()
        )));
    }
    let own = Parts::of(&share.blind, binder, &share.input, shape.dim);
    let [leader, helper] = match role {
        Role::Leader => [own, share.peer_parts],
        Role::Helper => [share.peer_parts, own],
    };
    let z_seed = combine(
        Usage::WraparoundSeed,
        binder,
        [&leader.wraparound, &helper.wraparound],
    );
    let circuit = shape.circuit(z_seed).map_err(malformed)?;
    let seed = combine(
        Usage::JointRandSeed,
        binder,
        [&leader.joint_rand, &helper.joint_rand],
    );
    let joint_rand = expand(&seed, Usage::JointRand, binder, circuit.joint_rand_len());
    let query_rand = expand(
        verify_key,
        Usage::QueryRand,
        binder,
        circuit.query_rand_len(),
    );
    let verifier = circuit
        .query(&share.input, &share.proof, &query_rand, &joint_rand, 2)
        .map_err(|e| Exclusion::Malformed(e.to_string()))?;
    let mut x = share.input;
    x.truncate(shape.dim);
    let pending = Pending {
        x,
        peer_parts: share.peer_parts,
    };
    Ok((
        PrepShare {
            verifier,
            parts: own,
        },
        pending,
    ))
}

/// The upload's share of X if it is valid: the other's recomputed parts are those the client gave
/// this aggregator, and the proof verifies on the sum of both verifier shares.
pub fn decide(
    shape: &Shape,
    mine: &PrepShare,
    theirs: &PrepShare,
    pending: Pending,
) -> Result<Vec<F>, Exclusion> {
    if theirs.parts != pending.peer_parts {
        return Err(Exclusion::Binding);
    }
    let circuit = shape.circuit([0; 32]).map_err(malformed)?;
    let want = circuit.verifier_len();
    if mine.verifier.len() != want || theirs.verifier.len() != want {
        return Err(Exclusion::Malformed(format!(
            "a verifier share of {} values, the circuit's has {want}",
            theirs.verifier.len()
        )));
    }
    let verifier: Vec<F> = (mine.verifier.iter().zip(&theirs.verifier))
        .map(|(&a, &b)| a + b)
        .collect();
    match circuit.decide(&verifier) {
        Ok(true) => Ok(pending.x),
        Ok(false) | Err(_) => Err(Exclusion::Proof),
    }
}

/// The sum of the valid uploads' shares of X, as one aggregator holds it.
pub fn sum_shares<'a>(dim: usize, shares: impl IntoIterator<Item = &'a [F]>) -> Vec<F> {
    let mut sum = vec![F::zero(); dim];
    for share in shares {
        for (s, &v) in sum.iter_mut().zip(share) {
            *s += v;
        }
    }
    sum
}
