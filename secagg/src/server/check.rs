//! The check: each U2 client says which neighbours' shares it could not open. A client too few
//! of whose shares can be opened is excluded (its secrets could not be recovered); every pair
//! where one side refused the other's shares goes unmasked.
//!
//! A refusal comes without proof, and each one takes a holder from the refused client. So the
//! refusals of a client that refuses more than k_u - t of its k_u neighbours in U2 (more than a
//! t-of-k_u sharing can lose) are ignored: it must mask with every neighbour, as if it had
//! refused none, and one liar cannot push honest neighbours below the threshold t. If its
//! refusals were true, the shares it cannot open are missing at the unmasking and the round
//! aborts there, releasing nothing; it never yields a wrong sum.

use super::{Base, Graph, MaskedInput, Pairing, Phase, Sharing, Stage, waiting_for, wrong_stage};
use crate::SecAggError;
use crate::messages::{Proceed, StageMessage};
use std::collections::{BTreeMap, BTreeSet};

/// What closing the check decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    /// For every client that stays: what its masked input must leave out.
    pub proceed: BTreeMap<u64, Proceed>,
    /// The clients out of the round: too few neighbours could open their shares.
    pub excluded: BTreeSet<u64>,
}

/// The round's third phase.
#[derive(Debug, Clone)]
pub struct CheckShares {
    base: Base,
    graph: Graph,
    sharing: Sharing,
    pairing: Pairing,
}

impl CheckShares {
    pub(super) fn new(base: Base, graph: Graph, sharing: Sharing) -> Self {
        Self {
            base,
            graph,
            sharing,
            pairing: Pairing::default(),
        }
    }

    /// The neighbours in U2 whose shares `from` could not open.
    pub fn receive_check(&mut self, from: u64, refused: Vec<u64>) -> Result<(), SecAggError> {
        if !self.sharing.sharers.contains(&from) {
            return Err(SecAggError::NotParticipant(from));
        }
        if self.pairing.refused.contains_key(&from) {
            return Err(SecAggError::Duplicate(from));
        }
        let count = refused.len();
        let refused: BTreeSet<u64> = refused.into_iter().collect();
        let ns = &self.graph.neighbours[&from];
        let stranger =
            (refused.iter()).find(|v| !ns.contains(v) || !self.sharing.sharers.contains(v));
        if let Some(v) = stranger {
            let problem = format!("client {v} sent it no share");
            return Err(SecAggError::BadCheck { from, problem });
        }
        if refused.len() != count {
            let problem = "a client is named twice".into();
            return Err(SecAggError::BadCheck { from, problem });
        }
        self.pairing.refused.insert(from, refused);
        Ok(())
    }

    /// Excludes each client of U2 with fewer than t neighbours able to open its shares (treated
    /// as dropped before sharing: nobody masks with it). Returns the next phase and what every
    /// client that answered must leave out of its mask, or that it is excluded.
    pub fn close(self) -> Result<(MaskedInput, Checked), SecAggError> {
        let Self {
            base,
            graph,
            sharing,
            mut pairing,
        } = self;
        base.enough(Stage::CheckShares, pairing.refused.len())?;
        let t = graph.threshold;
        let overrefusing: BTreeSet<u64> = (pairing.refused.iter())
            .filter(|(u, refused)| {
                let k = graph.neighbours[*u]
                    .iter()
                    .filter(|v| sharing.sharers.contains(v))
                    .count();
                refused.len() > k.saturating_sub(t)
            })
            .map(|(&u, _)| u)
            .collect();
        for u in overrefusing {
            pairing.refused.insert(u, BTreeSet::new());
        }
        pairing.excluded = (sharing.sharers.iter().copied())
            .filter(|&v| {
                let holders = graph.neighbours[&v]
                    .iter()
                    .filter(|&&u| sharing.sharers.contains(&u) && !pairing.refused(u, v))
                    .count();
                holders < t
            })
            .collect();
        let staying: Vec<u64> = (pairing.refused.keys().copied())
            .filter(|u| !pairing.excluded.contains(u))
            .collect();
        base.enough(Stage::CheckShares, staying.len())?;
        let proceed = staying
            .into_iter()
            .map(|u| {
                let ns = &graph.neighbours[&u];
                let proceed = Proceed {
                    excluded: ns.intersection(&pairing.excluded).copied().collect(),
                    unpaired: ns
                        .iter()
                        .copied()
                        .filter(|&v| pairing.refused(v, u))
                        .collect(),
                };
                (u, proceed)
            })
            .collect();
        let excluded = pairing.excluded.clone();
        let next = MaskedInput::new(base, graph, sharing, pairing);
        Ok((next, Checked { proceed, excluded }))
    }
}

impl Phase for CheckShares {
    const STAGE: Stage = Stage::CheckShares;

    fn pending(&self) -> BTreeSet<u64> {
        let answered = self.pairing.refused.keys().copied().collect();
        waiting_for(&self.sharing.sharers, &answered)
    }

    fn receive(&mut self, from: u64, message: StageMessage) -> Result<(), SecAggError> {
        match message {
            StageMessage::Check(refused) => self.receive_check(from, refused),
            other => Err(wrong_stage(self.base.tag.round, Self::STAGE, &other)),
        }
    }

    fn round(&self) -> u64 {
        self.base.tag.round
    }
}
