//! Phase 2, MaskedInput: collect each remaining client's masked input y_u into the running sum
//! (U3), then check that every secret to recover has t holders among the survivors.

use super::{
    Base, Collected, Graph, Pairing, Phase, Sharing, Stage, Unmasking, waiting_for, wrong_stage,
};
use crate::SecAggError;
use crate::messages::StageMessage;
use std::collections::BTreeSet;

/// The round's fourth phase.
#[derive(Debug, Clone)]
pub struct MaskedInput {
    collected: Collected,
}

impl MaskedInput {
    pub(super) fn new(base: Base, graph: Graph, sharing: Sharing, pairing: Pairing) -> Self {
        let sum = vec![0; base.dim];
        let collected = Collected {
            base,
            graph,
            sharing,
            pairing,
            masked: BTreeSet::new(),
            sum,
        };
        Self { collected }
    }

    /// A client's masked input y_u, added to the running sum once validated.
    pub fn receive_masked(&mut self, from: u64, y: &[u64]) -> Result<(), SecAggError> {
        if !self.collected.pairing.refused.contains_key(&from)
            || self.collected.pairing.excluded.contains(&from)
        {
            return Err(SecAggError::NotParticipant(from));
        }
        if self.collected.masked.contains(&from) {
            return Err(SecAggError::Duplicate(from));
        }
        let bad = |problem: String| SecAggError::BadMaskedInput { from, problem };
        let (ring, dim) = (self.collected.base.ring, self.collected.base.dim);
        if y.len() != dim {
            return Err(bad(format!("{} values, the model has {dim}", y.len())));
        }
        if let Some(i) = y.iter().position(|&v| !ring.contains(v)) {
            return Err(bad(format!("value {i} is outside Z_2^{}", ring.bits())));
        }
        ring.add_assign(&mut self.collected.sum, y);
        self.collected.masked.insert(from);
        Ok(())
    }

    /// Fixes U3, which every survivor is told; returns the next phase and U3.
    pub fn close(self) -> Result<(Unmasking, Vec<u64>), SecAggError> {
        self.collected
            .base
            .enough(Stage::MaskedInput, self.collected.masked.len())?;
        // Every secret to recover (b_v of a survivor, s_sk_v of a dropout) needs t holders in U3
        // that could open v's shares.
        let t = self.collected.graph.threshold;
        let short = self
            .collected
            .sharing
            .counted(&self.collected.pairing)
            .find_map(|v| {
                let holders = self.collected.graph.neighbours[&v]
                    .intersection(&self.collected.masked)
                    .filter(|&&u| !self.collected.pairing.refused(u, v))
                    .count();
                (holders < t).then_some((v, holders))
            });
        if let Some((v, holders)) = short {
            let reason =
                format!("only {holders} of client {v}'s share holders survived, {t} are needed");
            return Err(self.collected.base.abort(Stage::MaskedInput, reason));
        }
        let survivors = self.collected.masked.iter().copied().collect();
        Ok((Unmasking::new(self.collected), survivors))
    }
}

impl Phase for MaskedInput {
    const STAGE: Stage = Stage::MaskedInput;

    fn pending(&self) -> BTreeSet<u64> {
        let pool = self
            .collected
            .sharing
            .counted(&self.collected.pairing)
            .collect();
        waiting_for(&pool, &self.collected.masked)
    }

    fn receive(&mut self, from: u64, message: StageMessage) -> Result<(), SecAggError> {
        match message {
            StageMessage::Masked(y) => self.receive_masked(from, &y),
            other => Err(wrong_stage(
                self.collected.base.tag.round,
                Self::STAGE,
                &other,
            )),
        }
    }

    fn round(&self) -> u64 {
        self.collected.base.tag.round
    }
}
