//! The consistency check of a signed round (Bonawitz et al. 2017, Sec. 6): between the masked
//! inputs and the unmasking, each survivor signs (round, H(task), H(U1), U3) as it was told
//! them; the server checks each signature and forwards to every signer those of its neighbours.
//! A client reveals only once t of its neighbours signed the very sets it signed, so a server
//! that tells clients different survivor sets gets no reveal from those it lied to.

use super::{Phase, Stage, Unmasking, waiting_for, wrong_stage};
use crate::messages::{Endorsements, StageMessage};
use crate::{SecAggError, binding};
use std::collections::{BTreeMap, BTreeSet};

/// The phase between [`super::MaskedInput`] and [`Unmasking`] in a signed round.
#[derive(Debug, Clone)]
pub struct Consistency {
    unmasking: Unmasking,
    /// The signed payload every survivor's signature must cover.
    payload: Vec<u8>,
    signatures: BTreeMap<u64, [u8; 64]>,
}

impl Consistency {
    /// The check of the survivor set `unmasking` fixed.
    pub fn new(unmasking: Unmasking) -> Self {
        let input = &unmasking.input;
        let u3: Vec<u64> = input.masked.iter().copied().collect();
        let payload = binding::survivors_payload(&input.base.tag, &input.graph.members, &u3);
        Self {
            unmasking,
            payload,
            signatures: BTreeMap::new(),
        }
    }

    /// A survivor's signature over the survivor set.
    pub fn receive_signature(&mut self, from: u64, signature: [u8; 64]) -> Result<(), SecAggError> {
        let input = &self.unmasking.input;
        if !input.masked.contains(&from) {
            return Err(SecAggError::NotParticipant(from));
        }
        if self.signatures.contains_key(&from) {
            return Err(SecAggError::Duplicate(from));
        }
        let identity = (input.graph.keys[&from].signed.as_ref())
            .map(|s| s.certificate.identity)
            .ok_or_else(|| SecAggError::Unauthenticated {
                client: from,
                reason: "its keys were not signed".into(),
            })?;
        binding::check_survivors(from, &identity, &self.payload, &signature)?;
        self.signatures.insert(from, signature);
        Ok(())
    }

    /// The unmasking, asking only the signers to reveal, and each signer's neighbours'
    /// signatures.
    pub fn close(mut self) -> Result<(Unmasking, BTreeMap<u64, Endorsements>), SecAggError> {
        let input = &self.unmasking.input;
        input
            .base
            .enough(Stage::Consistency, self.signatures.len())?;
        let forwarded = (self.signatures.keys())
            .map(|&u| {
                let of_neighbours = (input.graph.neighbours[&u].iter())
                    .filter_map(|v| self.signatures.get(v).map(|s| (*v, *s)))
                    .collect();
                (u, of_neighbours)
            })
            .collect();
        self.unmasking.revealers = self.signatures.keys().copied().collect();
        Ok((self.unmasking, forwarded))
    }
}

impl Phase for Consistency {
    const STAGE: Stage = Stage::Consistency;

    fn pending(&self) -> BTreeSet<u64> {
        let signed = self.signatures.keys().copied().collect();
        waiting_for(&self.unmasking.input.masked, &signed)
    }

    fn receive(&mut self, from: u64, message: StageMessage) -> Result<(), SecAggError> {
        match message {
            StageMessage::Endorse(signature) => self.receive_signature(from, signature),
            other => Err(wrong_stage(self.round(), Self::STAGE, &other)),
        }
    }

    fn round(&self) -> u64 {
        self.unmasking.input.base.tag.round
    }
}
