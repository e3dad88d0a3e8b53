//! Phase 2, MaskedInput: collect each remaining client's masked input y_u into the running sum
//! (U3), then check that every secret to recover has t holders among the survivors.

use super::{Base, Graph, Pairing, Phase, Sharing, Stage, Unmasking, waiting_for, wrong_stage};
use crate::secagg::SecAggError;
use crate::secagg::messages::StageMessage;
use std::collections::BTreeSet;

/// The round's fourth phase.
#[derive(Debug, Clone)]
pub struct MaskedInput {
    pub(super) base: Base,
    pub(super) graph: Graph,
    pub(super) sharing: Sharing,
    pub(super) pairing: Pairing,
    /// U3 so far.
    pub(super) masked: BTreeSet<u64>,
    /// sum_{u in U3} y_u mod 2^b.
    pub(super) sum: Vec<u64>,
}

impl MaskedInput {
    pub(super) fn new(base: Base, graph: Graph, sharing: Sharing, pairing: Pairing) -> Self {
        let sum = vec![0; base.dim];
        Self {
            base,
            graph,
            sharing,
            pairing,
            masked: BTreeSet::new(),
            sum,
        }
    }

    /// A client's masked input y_u, added to the running sum once validated.
    pub fn receive_masked(&mut self, from: u64, y: &[u64]) -> Result<(), SecAggError> {
        if !self.pairing.refused.contains_key(&from) || self.pairing.excluded.contains(&from) {
            return Err(SecAggError::NotParticipant(from));
        }
        if self.masked.contains(&from) {
            return Err(SecAggError::Duplicate(from));
        }
        let bad = |problem: String| SecAggError::BadMaskedInput { from, problem };
        let (ring, dim) = (self.base.ring, self.base.dim);
        if y.len() != dim {
            return Err(bad(format!("{} values, the model has {dim}", y.len())));
        }
        if let Some(i) = y.iter().position(|&v| !ring.contains(v)) {
            return Err(bad(format!("value {i} is outside Z_2^{}", ring.bits())));
        }
        ring.add_assign(&mut self.sum, y);
        self.masked.insert(from);
        Ok(())
    }

    /// Fixes U3, which every survivor is told; returns the next phase and U3.
    pub fn close(self) -> Result<(Unmasking, Vec<u64>), SecAggError> {
        self.base.enough(Stage::MaskedInput, self.masked.len())?;
        // Every secret to recover (b_v of a survivor, s_sk_v of a dropout) needs t holders in U3
        // that could open v's shares.
        let t = self.graph.threshold;
        let short = self.sharing.counted(&self.pairing).find_map(|v| {
            let holders = self.graph.neighbours[&v]
                .intersection(&self.masked)
                .filter(|&&u| !self.pairing.refused(u, v))
                .count();
            (holders < t).then_some((v, holders))
        });
        if let Some((v, holders)) = short {
            let reason =
                format!("only {holders} of client {v}'s share holders survived, {t} are needed");
            return Err(self.base.abort(Stage::MaskedInput, reason));
        }
        let survivors = self.masked.iter().copied().collect();
        Ok((Unmasking::new(self), survivors))
    }
}

impl Phase for MaskedInput {
    const STAGE: Stage = Stage::MaskedInput;

    fn pending(&self) -> BTreeSet<u64> {
        let pool = self.sharing.counted(&self.pairing).collect();
        waiting_for(&pool, &self.masked)
    }

    fn receive(&mut self, from: u64, message: StageMessage) -> Result<(), SecAggError> {
        match message {
            StageMessage::Masked(y) => self.receive_masked(from, &y),
            other => Err(wrong_stage(self.base.tag.round, Self::STAGE, &other)),
        }
    }

    fn round(&self) -> u64 {
        self.base.tag.round
    }
}
