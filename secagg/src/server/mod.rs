//! The server's side of one secure-aggregation round, as typed phases (the shape of xaynet's
//! `state_machine/phases/`): each phase takes its own stage's messages and, once closed, consumes
//! itself into its single successor with the messages that start the next stage. A message of
//! another stage is refused by [`Phase::receive`]; a closed phase cannot be reached again.
//!
//! [`AdvertiseKeys`] → [`ShareKeys`] → [`CheckShares`] → [`MaskedInput`] → ([`Consistency`], in
//! a signed round) → [`Unmasking`] → [`RoundResult`]. Closing a phase with too few answers
//! aborts the round ([`SecAggError::Aborted`]).

mod check;
mod consistency;
mod keys;
mod masked;
mod shares;
mod unmask;

pub use check::{CheckShares, Checked};
pub use consistency::Consistency;
pub use keys::AdvertiseKeys;
pub use masked::MaskedInput;
pub use shares::ShareKeys;
pub use unmask::Unmasking;

use super::SecAggError;
use super::binding::Verifier;
use super::graph::GraphKind;
use super::keys::{RoundTag, SecretKind};
use super::messages::{AdvertisedKeys, Stage, StageMessage};
use super::ring::Ring;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// What a server's round is set up with.
#[derive(Debug, Clone)]
pub struct RoundSetup {
    /// The round and H(task), the digest of the task and model its clients were sent.
    pub tag: RoundTag,
    /// Z_{2^b}.
    pub ring: Ring,
    /// d.
    pub dim: usize,
    /// The neighbour graph.
    pub graph: GraphKind,
    /// t as a fraction of a client's neighbours (raised to what the clients accept).
    pub threshold_fraction: f64,
    /// Fewest answers per stage (raised to 2).
    pub min_survivors: usize,
    /// A signed round: the checks of the clients' certificates and signatures.
    pub verifier: Option<Arc<Verifier>>,
}

/// What a completed round yields.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundResult {
    /// sum_{u in U3} x_u mod 2^b.
    pub sum: Vec<u64>,
    /// U3: the clients whose inputs are in the sum.
    pub survivors: Vec<u64>,
    /// |U2 \ U3|: clients that shared keys, then dropped, and whose masks were removed.
    pub dropouts_recovered: usize,
}

/// One phase of the server's round.
pub trait Phase {
    /// The stage whose messages this phase takes.
    const STAGE: Stage;
    /// The clients still expected to answer this stage.
    fn pending(&self) -> BTreeSet<u64>;
    /// Takes one client's message of this stage; a message of another stage is refused.
    fn receive(&mut self, from: u64, message: StageMessage) -> Result<(), SecAggError>;
    /// The round.
    fn round(&self) -> u64;
}

/// A message of `message`'s stage, which is not `expected`.
fn wrong_stage(round: u64, expected: Stage, message: &StageMessage) -> SecAggError {
    SecAggError::WrongStage {
        round,
        expected,
        got: message.stage(),
    }
}

/// What every phase of a round knows from the start.
#[derive(Debug, Clone)]
struct Base {
    tag: RoundTag,
    verifier: Option<Arc<Verifier>>,
    ring: Ring,
    dim: usize,
    /// Fewest answers per stage (at least 2).
    min_survivors: usize,
}

impl Base {
    /// Ends the round during `stage`.
    fn abort(&self, stage: Stage, reason: String) -> SecAggError {
        SecAggError::Aborted {
            round: self.tag.round,
            stage,
            reason,
        }
    }

    /// Aborts the round during `stage` when fewer than the minimum answered.
    fn enough(&self, stage: Stage, answered: usize) -> Result<(), SecAggError> {
        if answered < self.min_survivors {
            let need = self.min_survivors;
            let reason = format!("{answered} clients answered, at least {need} are needed");
            return Err(self.abort(stage, reason));
        }
        Ok(())
    }
}

/// What the keys phase fixed: U1's keys, the neighbour graph and the threshold t.
#[derive(Debug, Clone)]
struct Graph {
    /// H(U1).
    members: [u8; 32],
    keys: BTreeMap<u64, AdvertisedKeys>,
    neighbours: BTreeMap<u64, BTreeSet<u64>>,
    threshold: usize,
}

/// What the shares phase fixed: U2 and the commitment of every share.
#[derive(Debug, Clone)]
struct Sharing {
    /// U2: the clients whose shares are held.
    sharers: BTreeSet<u64>,
    commitments: HashMap<(u64, u64, SecretKind), [u8; 32]>,
}

/// What the check fixed: who refused whose shares, and who is out.
#[derive(Debug, Clone, Default)]
struct Pairing {
    /// For each client that answered the check, the neighbours whose shares it refused.
    refused: BTreeMap<u64, BTreeSet<u64>>,
    /// Clients of U2 too few of whose shares could be opened: out, as if they never shared.
    excluded: BTreeSet<u64>,
}

impl Pairing {
    /// Whether `holder` refused `owner`'s shares (unknown, so no, for a client that never
    /// answered the check).
    fn refused(&self, holder: u64, owner: u64) -> bool {
        self.refused
            .get(&holder)
            .is_some_and(|r| r.contains(&owner))
    }

    /// Whether u and v both masked with each other: neither refused the other's shares.
    fn paired(&self, u: u64, v: u64) -> bool {
        !self.refused(u, v) && !self.refused(v, u)
    }
}

impl Sharing {
    /// U2 without the excluded clients: those whose shares are held and whose masks count.
    fn counted<'a>(&'a self, pairing: &'a Pairing) -> impl Iterator<Item = u64> + 'a {
        (self.sharers.iter().copied()).filter(|v| !pairing.excluded.contains(v))
    }
}

/// What the masked-input phase collects and the unmasking phase works from.
#[derive(Debug, Clone)]
struct Collected {
    base: Base,
    graph: Graph,
    sharing: Sharing,
    pairing: Pairing,
    /// U3 so far.
    masked: BTreeSet<u64>,
    /// sum_{u in U3} y_u mod 2^b.
    sum: Vec<u64>,
}

/// `pool` without `answered`.
fn waiting_for(pool: &BTreeSet<u64>, answered: &BTreeSet<u64>) -> BTreeSet<u64> {
    pool.difference(answered).copied().collect()
}
