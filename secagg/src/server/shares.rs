//! Phase 1, ShareKeys: collect each U1 client's sealed shares, one per neighbour with its two
//! commitments (U2), then route every share to its holder.

use super::{Base, CheckShares, Graph, Phase, Sharing, Stage, waiting_for, wrong_stage};
use crate::SecAggError;
use crate::keys::SecretKind;
use crate::messages::{SealedShares, StageMessage};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The round's second phase.
#[derive(Debug, Clone)]
pub struct ShareKeys {
    base: Base,
    graph: Graph,
    sealed: BTreeMap<u64, Vec<SealedShares>>,
    commitments: HashMap<(u64, u64, SecretKind), [u8; 32]>,
}

impl ShareKeys {
    pub(super) fn new(base: Base, graph: Graph) -> Self {
        Self {
            base,
            graph,
            sealed: BTreeMap::new(),
            commitments: HashMap::new(),
        }
    }

    /// A client's sealed shares, one per neighbour, each with its two commitments.
    pub fn receive_shares(
        &mut self,
        from: u64,
        sealed: Vec<SealedShares>,
    ) -> Result<(), SecAggError> {
        let ns = (self.graph.neighbours.get(&from)).ok_or(SecAggError::NotParticipant(from))?;
        if self.sealed.contains_key(&from) {
            return Err(SecAggError::Duplicate(from));
        }
        let recipients: BTreeSet<u64> = sealed.iter().map(|s| s.to).collect();
        let wrong = |problem: String| SecAggError::WrongRecipients {
            from,
            expected: ns.len(),
            problem,
        };
        if let Some(s) = sealed.iter().find(|s| s.from != from) {
            let claimed = s.from;
            return Err(wrong(format!(
                "a share claims to come from client {claimed}"
            )));
        }
        if recipients.len() != sealed.len() {
            return Err(wrong("a neighbour is addressed twice".into()));
        }
        if let Some(v) = recipients.difference(ns).next() {
            return Err(wrong(format!("client {v} is not a neighbour")));
        }
        if recipients.len() != ns.len() {
            let (got, want) = (recipients.len(), ns.len());
            return Err(wrong(format!("{got} shares for {want} neighbours")));
        }
        for s in &sealed {
            let mask = (from, s.to, SecretKind::MaskKey);
            self.commitments.insert(mask, s.mask_key_commitment);
            let own = (from, s.to, SecretKind::SelfMask);
            self.commitments.insert(own, s.self_mask_commitment);
        }
        self.sealed.insert(from, sealed);
        Ok(())
    }

    /// Each client in U2 gets the shares its neighbours in U2 sealed for it; returns the next
    /// phase and those inboxes.
    pub fn close(self) -> Result<(CheckShares, BTreeMap<u64, Vec<SealedShares>>), SecAggError> {
        self.base.enough(Stage::ShareKeys, self.sealed.len())?;
        let mut inbox: BTreeMap<u64, Vec<SealedShares>> =
            self.sealed.keys().map(|&u| (u, Vec::new())).collect();
        for s in self.sealed.values().flatten() {
            if let Some(box_) = inbox.get_mut(&s.to) {
                box_.push(s.clone());
            }
        }
        let sharing = Sharing {
            sharers: self.sealed.into_keys().collect(),
            commitments: self.commitments,
        };
        Ok((CheckShares::new(self.base, self.graph, sharing), inbox))
    }
}

impl Phase for ShareKeys {
    const STAGE: Stage = Stage::ShareKeys;

    fn pending(&self) -> BTreeSet<u64> {
        let u1 = self.graph.keys.keys().copied().collect();
        waiting_for(&u1, &self.sealed.keys().copied().collect())
    }

    fn receive(&mut self, from: u64, message: StageMessage) -> Result<(), SecAggError> {
        match message {
            StageMessage::Shares(sealed) => self.receive_shares(from, sealed),
            other => Err(wrong_stage(self.base.tag.round, Self::STAGE, &other)),
        }
    }

    fn round(&self) -> u64 {
        self.base.tag.round
    }
}
