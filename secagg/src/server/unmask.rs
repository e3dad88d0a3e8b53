//! Phase 3, Unmasking: each survivor reveals, for every neighbour in U2, its share of b_v if v
//! survived and of s_sk_v otherwise (never both), each checked against its commitment; then the
//! server recovers the secrets and removes every mask.

use super::{Collected, Phase, RoundResult, Stage, waiting_for, wrong_stage};
use crate::SecAggError;
use crate::keys::{self, KeyPair, SecretKind, share_commitment};
use crate::messages::{RevealedShare, StageMessage};
use crate::prg::{Sign, apply_masks};
use crate::shamir::{self, Share};
use std::collections::{BTreeMap, BTreeSet};
use x25519_dalek::PublicKey;

/// The round's last phase: the closed masked-input phase (U3 and the masked sum) and the
/// shares revealed so far.
#[derive(Debug, Clone)]
pub struct Unmasking {
    pub(super) input: Collected,
    /// Who is asked to reveal: U3, or in a signed round the survivors that signed it.
    pub(super) revealers: BTreeSet<u64>,
    revealed_by: BTreeSet<u64>,
    shares: BTreeMap<(u64, SecretKind), Vec<Share>>,
}

impl Unmasking {
    pub(super) fn new(input: Collected) -> Self {
        Self {
            revealers: input.masked.clone(),
            input,
            revealed_by: BTreeSet::new(),
            shares: BTreeMap::new(),
        }
    }

    /// What `holder` owes: for each neighbour v in U2 (not excluded, whose shares it opened),
    /// the share of b_v if v is in U3 and of s_sk_v otherwise.
    fn owed(&self, holder: u64) -> BTreeMap<u64, SecretKind> {
        (self.input.graph.neighbours[&holder].iter().copied())
            .filter(|&v| {
                self.input.sharing.sharers.contains(&v)
                    && !self.input.pairing.excluded.contains(&v)
                    && !self.input.pairing.refused(holder, v)
            })
            .map(|v| match self.input.masked.contains(&v) {
                true => (v, SecretKind::SelfMask),
                false => (v, SecretKind::MaskKey),
            })
            .collect()
    }

    /// A survivor's revealed shares: exactly what it owes, each matching its commitment; any
    /// fault refuses the whole message and stores nothing.
    pub fn receive_reveal(
        &mut self,
        from: u64,
        reveals: Vec<RevealedShare>,
    ) -> Result<(), SecAggError> {
        if !self.revealers.contains(&from) {
            return Err(SecAggError::NotParticipant(from));
        }
        if self.revealed_by.contains(&from) {
            return Err(SecAggError::Duplicate(from));
        }
        let owed = self.owed(from);
        let x = shamir::point_of(from)?;
        let mut seen = BTreeSet::new();
        for r in &reveals {
            self.check_reveal(from, x, &owed, r)?;
            if !seen.insert(r.owner) {
                let problem = format!("client {} revealed twice", r.owner);
                return Err(SecAggError::WrongReveal {
                    holder: from,
                    problem,
                });
            }
        }
        if seen.len() != owed.len() {
            let problem = format!("{} shares revealed, {} owed", seen.len(), owed.len());
            return Err(SecAggError::WrongReveal {
                holder: from,
                problem,
            });
        }
        for r in reveals {
            self.shares
                .entry((r.owner, r.kind))
                .or_default()
                .push(r.share);
        }
        self.revealed_by.insert(from);
        Ok(())
    }

    /// One revealed share: owed by `holder`, of the owed secret, at `holder`'s point `x`, and
    /// matching its commitment.
    fn check_reveal(
        &self,
        holder: u64,
        x: u64,
        owed: &BTreeMap<u64, SecretKind>,
        r: &RevealedShare,
    ) -> Result<(), SecAggError> {
        let wrong = |problem: String| SecAggError::WrongReveal { holder, problem };
        match owed.get(&r.owner) {
            None => {
                let owner = r.owner;
                return Err(wrong(format!(
                    "it holds no share of client {owner} to reveal"
                )));
            }
            Some(&kind) if kind != r.kind => {
                let (owner, kind) = (r.owner, r.kind);
                return Err(wrong(format!(
                    "client {owner}'s {kind:?} must not be revealed"
                )));
            }
            Some(_) => {}
        }
        let commitment = share_commitment(
            &self.input.base.tag,
            r.kind,
            r.owner,
            holder,
            &r.share.to_bytes(),
        );
        let committed = self
            .input
            .sharing
            .commitments
            .get(&(r.owner, holder, r.kind));
        if r.share.x != x || committed != Some(&commitment) {
            return Err(SecAggError::ForgedShare {
                holder,
                owner: r.owner,
                kind: r.kind,
            });
        }
        Ok(())
    }

    /// `owner`'s secret of `kind`, from t revealed shares.
    fn recover(&self, owner: u64, kind: SecretKind) -> Result<[u8; 32], SecAggError> {
        let shares = (self.shares.get(&(owner, kind))).map_or(&[][..], Vec::as_slice);
        let t = self.input.graph.threshold;
        if shares.len() < t {
            let got = shares.len();
            let reason =
                format!("{got} shares of client {owner}'s {kind:?} arrived, {t} are needed");
            return Err(self.input.base.abort(Stage::Unmasking, reason));
        }
        Ok(shamir::combine(shares, t)?)
    }

    /// Ends the round: removes each survivor's self-mask PRG(b_v) and, for each client that
    /// shared but dropped, the pairwise masks its neighbours in U3 added with it.
    pub fn finish(mut self) -> Result<RoundResult, SecAggError> {
        self.input
            .base
            .enough(Stage::Unmasking, self.revealed_by.len())?;
        let survivors: Vec<u64> = self.input.masked.iter().copied().collect();
        let mut masks = Vec::new();
        for &v in &survivors {
            masks.push((self.recover(v, SecretKind::SelfMask)?, Sign::Minus));
        }
        let dropped: Vec<u64> = (self.input.sharing.counted(&self.input.pairing))
            .filter(|v| !self.input.masked.contains(v))
            .collect();
        for &v in &dropped {
            masks.extend(self.pair_masks(v)?);
        }
        let mut sum = std::mem::take(&mut self.input.sum);
        apply_masks(&mut sum, &masks, self.input.base.ring);
        Ok(RoundResult {
            sum,
            survivors,
            dropouts_recovered: dropped.len(),
        })
    }

    /// The seeds and signs that remove the pairwise masks the survivors added with the dropped
    /// client `v`, from its recovered mask key.
    fn pair_masks(&self, v: u64) -> Result<Vec<([u8; 32], Sign)>, SecAggError> {
        let key = KeyPair::from_secret(self.recover(v, SecretKind::MaskKey)?);
        if key.public.to_bytes() != self.input.graph.keys[&v].mask_public {
            let reason = format!("client {v}'s recovered mask key does not match its public key");
            return Err(self.input.base.abort(Stage::Unmasking, reason));
        }
        let paired = (self.input.graph.neighbours[&v]
            .intersection(&self.input.masked)
            .copied())
        .filter(|&w| self.input.pairing.paired(v, w));
        let undo = |w: u64| {
            let peer = PublicKey::from(self.input.graph.keys[&w].mask_public);
            let seed = keys::pair_seed(&self.input.base.tag, v, &key.secret, w, &peer)?;
            // w added +PRG(s_wv) if w < v, -PRG(s_wv) otherwise: undo it.
            Ok((seed, if w < v { Sign::Minus } else { Sign::Plus }))
        };
        paired.map(undo).collect()
    }
}

impl Phase for Unmasking {
    const STAGE: Stage = Stage::Unmasking;

    fn pending(&self) -> BTreeSet<u64> {
        waiting_for(&self.revealers, &self.revealed_by)
    }

    fn receive(&mut self, from: u64, message: StageMessage) -> Result<(), SecAggError> {
        match message {
            StageMessage::Reveal(reveals) => self.receive_reveal(from, reveals),
            other => Err(wrong_stage(self.input.base.tag.round, Self::STAGE, &other)),
        }
    }

    fn round(&self) -> u64 {
        self.input.base.tag.round
    }
}
