//! The server's side of one secure-aggregation round: it routes keys and sealed shares, sums the
//! masked inputs and, from the revealed shares, removes every mask.

use super::graph::{self, GraphKind};
use super::keys::{self, KeyPair, SecretKind, share_commitment};
use super::messages::{AdvertisedKeys, Neighbourhood, Proceed, RevealedShare, SealedShares};
use super::prg::{Sign, apply_mask};
use super::ring::Ring;
use super::shamir::{self, Share};
use super::{SecAggError, check_stage};
use rand::{CryptoRng, Rng};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use x25519_dalek::PublicKey;

/// The stages of a round, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// Collecting public keys (U1).
    AdvertiseKeys,
    /// Collecting sealed shares (U2).
    ShareKeys,
    /// Collecting which neighbours' shares each client could not open.
    CheckShares,
    /// Collecting masked inputs (U3).
    MaskedInput,
    /// Collecting revealed shares.
    Unmasking,
    /// The sum is known (or the round aborted).
    Done,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::AdvertiseKeys => "advertise-keys",
            Stage::ShareKeys => "share-keys",
            Stage::CheckShares => "check-shares",
            Stage::MaskedInput => "masked-input",
            Stage::Unmasking => "unmasking",
            Stage::Done => "done",
        })
    }
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

/// The server's state in one round.
#[derive(Clone)]
pub struct ServerRound {
    round: u64,
    ring: Ring,
    dim: usize,
    graph_kind: GraphKind,
    threshold_fraction: f64,
    min_survivors: usize,
    stage: Stage,
    sampled: BTreeSet<u64>,
    keys: BTreeMap<u64, AdvertisedKeys>,
    neighbours: BTreeMap<u64, BTreeSet<u64>>,
    threshold: usize,
    sealed: BTreeMap<u64, Vec<SealedShares>>,
    commitments: HashMap<(u64, u64, SecretKind), [u8; 32]>,
    /// For each client that answered the check, the neighbours whose shares it refused.
    refused: BTreeMap<u64, BTreeSet<u64>>,
    /// Clients of U2 too few of whose shares could be opened: out, as if they never shared.
    excluded: BTreeSet<u64>,
    masked: BTreeSet<u64>,
    sum: Vec<u64>,
    revealed_by: BTreeSet<u64>,
    shares: BTreeMap<(u64, SecretKind), Vec<Share>>,
}

impl ServerRound {
    /// A round over the `sampled` clients. Every stage needs at least `min_survivors` (and at
    /// least 2) answers, and t = max(2, ceil(threshold_fraction * |N(u)|)) shares recover a secret.
    pub fn new(
        round: u64,
        ring: Ring,
        dim: usize,
        graph_kind: GraphKind,
        threshold_fraction: f64,
        min_survivors: usize,
        sampled: impl IntoIterator<Item = u64>,
    ) -> Self {
        Self {
            round,
            ring,
            dim,
            graph_kind,
            threshold_fraction,
            min_survivors: min_survivors.max(2),
            stage: Stage::AdvertiseKeys,
            sampled: sampled.into_iter().collect(),
            keys: BTreeMap::new(),
            neighbours: BTreeMap::new(),
            threshold: 0,
            sealed: BTreeMap::new(),
            commitments: HashMap::new(),
            refused: BTreeMap::new(),
            excluded: BTreeSet::new(),
            masked: BTreeSet::new(),
            sum: vec![0; dim],
            revealed_by: BTreeSet::new(),
            shares: BTreeMap::new(),
        }
    }

    /// The round this state runs.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// The stage in progress.
    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// The clients still expected to answer the current stage.
    pub fn pending(&self) -> BTreeSet<u64> {
        let (pool, answered): (BTreeSet<u64>, BTreeSet<u64>) = match self.stage {
            Stage::AdvertiseKeys => (self.sampled.clone(), self.keys.keys().copied().collect()),
            Stage::ShareKeys => (
                self.keys.keys().copied().collect(),
                self.sealed.keys().copied().collect(),
            ),
            Stage::CheckShares => (
                self.sealed.keys().copied().collect(),
                self.refused.keys().copied().collect(),
            ),
            Stage::MaskedInput => (self.sharers().collect(), self.masked.clone()),
            Stage::Unmasking => (self.masked.clone(), self.revealed_by.clone()),
            Stage::Done => (BTreeSet::new(), BTreeSet::new()),
        };
        pool.difference(&answered).copied().collect()
    }

    fn expect(&self, stage: Stage) -> Result<(), SecAggError> {
        check_stage(self.round, self.stage, stage)
    }

    /// U2 without the excluded clients: those whose shares are held and whose masks count.
    fn sharers(&self) -> impl Iterator<Item = u64> + '_ {
        self.sealed
            .keys()
            .copied()
            .filter(|v| !self.excluded.contains(v))
    }

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

    fn abort(&mut self, reason: String) -> SecAggError {
        let stage = self.stage;
        self.stage = Stage::Done;
        SecAggError::Aborted {
            round: self.round,
            stage,
            reason,
        }
    }

    fn enough(&mut self, answered: usize) -> Result<(), SecAggError> {
        if answered < self.min_survivors {
            let need = self.min_survivors;
            return Err(self.abort(format!(
                "{answered} clients answered, at least {need} are needed"
            )));
        }
        Ok(())
    }

    /// Stage 0: a client's public keys.
    pub fn receive_keys(&mut self, from: u64, keys: AdvertisedKeys) -> Result<(), SecAggError> {
        self.expect(Stage::AdvertiseKeys)?;
        if !self.sampled.contains(&from) || keys.client != from {
            return Err(SecAggError::NotParticipant(from));
        }
        if self.keys.contains_key(&from) {
            return Err(SecAggError::Duplicate(from));
        }
        // A low-order or non-canonical key would make its neighbours refuse the round.
        keys::check_public(from, &keys.cipher_public)?;
        keys::check_public(from, &keys.mask_public)?;
        self.keys.insert(from, keys);
        Ok(())
    }

    /// Ends stage 0: draws the graph over U1 and returns each client's neighbourhood.
    pub fn close_keys<R: Rng + CryptoRng>(
        &mut self,
        rng: &mut R,
    ) -> Result<BTreeMap<u64, Neighbourhood>, SecAggError> {
        self.expect(Stage::AdvertiseKeys)?;
        self.enough(self.keys.len())?;
        let u1: Vec<u64> = self.keys.keys().copied().collect();
        self.neighbours = graph::build(self.graph_kind, &u1, rng);
        let degree = self
            .neighbours
            .values()
            .map(BTreeSet::len)
            .min()
            .unwrap_or(0);
        if degree < 2 {
            return Err(self.abort("secure aggregation needs at least 3 clients".into()));
        }
        // t > |N|/2 always (the clients refuse less), and t >= 2.
        let t = ((self.threshold_fraction * degree as f64).ceil() as usize)
            .max(degree / 2 + 1)
            .max(2);
        self.threshold = t.min(degree);
        self.stage = Stage::ShareKeys;
        Ok(self
            .neighbours
            .iter()
            .map(|(&u, ns)| {
                let hood = Neighbourhood {
                    threshold: self.threshold,
                    neighbours: ns.iter().map(|v| self.keys[v].clone()).collect(),
                };
                (u, hood)
            })
            .collect())
    }

    /// Stage 1: a client's sealed shares, one per neighbour, each with its two commitments.
    pub fn receive_shares(
        &mut self,
        from: u64,
        sealed: Vec<SealedShares>,
    ) -> Result<(), SecAggError> {
        self.expect(Stage::ShareKeys)?;
        let ns = self
            .neighbours
            .get(&from)
            .ok_or(SecAggError::NotParticipant(from))?;
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
            return Err(wrong(format!(
                "a share claims to come from client {}",
                s.from
            )));
        }
        if recipients.len() != sealed.len() {
            return Err(wrong("a neighbour is addressed twice".into()));
        }
        if let Some(v) = recipients.difference(ns).next() {
            return Err(wrong(format!("client {v} is not a neighbour")));
        }
        if recipients.len() != ns.len() {
            return Err(wrong(format!(
                "{} shares for {} neighbours",
                recipients.len(),
                ns.len()
            )));
        }
        for s in &sealed {
            self.commitments
                .insert((from, s.to, SecretKind::MaskKey), s.mask_key_commitment);
            self.commitments
                .insert((from, s.to, SecretKind::SelfMask), s.self_mask_commitment);
        }
        self.sealed.insert(from, sealed);
        Ok(())
    }

    /// Ends stage 1: each client in U2 gets the shares its neighbours in U2 sealed for it.
    pub fn close_shares(&mut self) -> Result<BTreeMap<u64, Vec<SealedShares>>, SecAggError> {
        self.expect(Stage::ShareKeys)?;
        self.enough(self.sealed.len())?;
        let mut inbox: BTreeMap<u64, Vec<SealedShares>> =
            self.sealed.keys().map(|&u| (u, Vec::new())).collect();
        for s in self.sealed.values().flatten() {
            if let Some(box_) = inbox.get_mut(&s.to) {
                box_.push(s.clone());
            }
        }
        self.stage = Stage::CheckShares;
        Ok(inbox)
    }

    /// The check: the neighbours in U2 whose shares `from` could not open.
    pub fn receive_check(&mut self, from: u64, refused: Vec<u64>) -> Result<(), SecAggError> {
        self.expect(Stage::CheckShares)?;
        if !self.sealed.contains_key(&from) {
            return Err(SecAggError::NotParticipant(from));
        }
        if self.refused.contains_key(&from) {
            return Err(SecAggError::Duplicate(from));
        }
        let count = refused.len();
        let refused: BTreeSet<u64> = refused.into_iter().collect();
        let ns = &self.neighbours[&from];
        let stranger = refused
            .iter()
            .find(|v| !ns.contains(v) || !self.sealed.contains_key(v));
        if let Some(v) = stranger {
            return Err(SecAggError::BadCheck {
                from,
                problem: format!("client {v} sent it no share"),
            });
        }
        if refused.len() != count {
            return Err(SecAggError::BadCheck {
                from,
                problem: "a client is named twice".into(),
            });
        }
        self.refused.insert(from, refused);
        Ok(())
    }

    /// Ends the check: a client of U2 with fewer than t neighbours able to open its shares is
    /// excluded (its secrets could not be recovered; it is treated as dropped before sharing, so
    /// nobody masks with it). Every other client that answered learns which of its neighbours are
    /// excluded and which refused its shares (those pairs go unmasked).
    pub fn close_checks(&mut self) -> Result<BTreeMap<u64, Proceed>, SecAggError> {
        self.expect(Stage::CheckShares)?;
        self.enough(self.refused.len())?;
        let t = self.threshold;
        self.excluded = self
            .sealed
            .keys()
            .copied()
            .filter(|&v| {
                let holders = self.neighbours[&v]
                    .iter()
                    .filter(|&&u| self.sealed.contains_key(&u) && !self.refused(u, v))
                    .count();
                holders < t
            })
            .collect();
        let staying: Vec<u64> = self
            .refused
            .keys()
            .copied()
            .filter(|u| !self.excluded.contains(u))
            .collect();
        self.enough(staying.len())?;
        self.stage = Stage::MaskedInput;
        Ok(staying
            .into_iter()
            .map(|u| {
                let ns = &self.neighbours[&u];
                let proceed = Proceed {
                    excluded: ns.intersection(&self.excluded).copied().collect(),
                    unpaired: ns.iter().copied().filter(|&v| self.refused(v, u)).collect(),
                };
                (u, proceed)
            })
            .collect())
    }

    /// The clients [`ServerRound::close_checks`] excluded.
    pub fn excluded(&self) -> &BTreeSet<u64> {
        &self.excluded
    }

    /// Stage 2: a client's masked input y_u, added to the running sum once validated.
    pub fn receive_masked(&mut self, from: u64, y: &[u64]) -> Result<(), SecAggError> {
        self.expect(Stage::MaskedInput)?;
        if !self.refused.contains_key(&from) || self.excluded.contains(&from) {
            return Err(SecAggError::NotParticipant(from));
        }
        if self.masked.contains(&from) {
            return Err(SecAggError::Duplicate(from));
        }
        let bad = |problem: String| SecAggError::BadMaskedInput { from, problem };
        if y.len() != self.dim {
            return Err(bad(format!(
                "{} values, the model has {}",
                y.len(),
                self.dim
            )));
        }
        if let Some(i) = y.iter().position(|&v| !self.ring.contains(v)) {
            return Err(bad(format!(
                "value {i} is outside Z_2^{}",
                self.ring.bits()
            )));
        }
        self.ring.add_assign(&mut self.sum, y);
        self.masked.insert(from);
        Ok(())
    }

    /// Ends stage 2: U3, which every survivor is told.
    pub fn close_masked(&mut self) -> Result<Vec<u64>, SecAggError> {
        self.expect(Stage::MaskedInput)?;
        self.enough(self.masked.len())?;
        // Every secret to recover (b_v of a survivor, s_sk_v of a dropout) needs t holders in U3
        // that could open v's shares.
        let t = self.threshold;
        let short = self.sharers().find_map(|v| {
            let holders = self.neighbours[&v]
                .intersection(&self.masked)
                .filter(|&&u| !self.refused(u, v))
                .count();
            (holders < t).then_some((v, holders))
        });
        if let Some((v, holders)) = short {
            return Err(self.abort(format!(
                "only {holders} of client {v}'s share holders survived, {t} are needed"
            )));
        }
        self.stage = Stage::Unmasking;
        Ok(self.masked.iter().copied().collect())
    }

    /// Stage 3: a survivor's revealed shares. It must reveal, for each neighbour v in U2, the
    /// share of b_v if v is in U3 and of s_sk_v otherwise, each matching its commitment; any
    /// fault refuses the whole message and stores nothing.
    pub fn receive_reveal(
        &mut self,
        from: u64,
        reveals: Vec<RevealedShare>,
    ) -> Result<(), SecAggError> {
        self.expect(Stage::Unmasking)?;
        if !self.masked.contains(&from) {
            return Err(SecAggError::NotParticipant(from));
        }
        if self.revealed_by.contains(&from) {
            return Err(SecAggError::Duplicate(from));
        }
        let wrong = |problem: String| SecAggError::WrongReveal {
            holder: from,
            problem,
        };
        let owed: BTreeMap<u64, SecretKind> = self.neighbours[&from]
            .iter()
            .filter(|&&v| {
                self.sealed.contains_key(&v)
                    && !self.excluded.contains(&v)
                    && !self.refused(from, v)
            })
            .map(|&v| {
                (
                    v,
                    if self.masked.contains(&v) {
                        SecretKind::SelfMask
                    } else {
                        SecretKind::MaskKey
                    },
                )
            })
            .collect();
        let x = shamir::point_of(from)?;
        let mut seen = BTreeSet::new();
        for r in &reveals {
            match owed.get(&r.owner) {
                None => {
                    return Err(wrong(format!(
                        "it holds no share of client {} to reveal",
                        r.owner
                    )));
                }
                Some(&kind) if kind != r.kind => {
                    return Err(wrong(format!(
                        "client {}'s {:?} must not be revealed",
                        r.owner, r.kind
                    )));
                }
                Some(_) => {}
            }
            if !seen.insert(r.owner) {
                return Err(wrong(format!("client {} revealed twice", r.owner)));
            }
            let commitment =
                share_commitment(self.round, r.kind, r.owner, from, &r.share.to_bytes());
            if r.share.x != x || self.commitments.get(&(r.owner, from, r.kind)) != Some(&commitment)
            {
                return Err(SecAggError::ForgedShare {
                    holder: from,
                    owner: r.owner,
                    kind: r.kind,
                });
            }
        }
        if seen.len() != owed.len() {
            return Err(wrong(format!(
                "{} shares revealed, {} owed",
                seen.len(),
                owed.len()
            )));
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

    fn recover(&mut self, owner: u64, kind: SecretKind) -> Result<[u8; 32], SecAggError> {
        let shares = self
            .shares
            .get(&(owner, kind))
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let t = self.threshold;
        if shares.len() < t {
            let got = shares.len();
            return Err(self.abort(format!(
                "{got} shares of client {owner}'s {kind:?} arrived, {t} are needed"
            )));
        }
        Ok(shamir::combine(shares, t)?)
    }

    /// Ends the round: removes each survivor's self-mask PRG(b_v) and, for each client that
    /// shared but dropped, the pairwise masks its neighbours in U3 added with it.
    pub fn finish(&mut self) -> Result<RoundResult, SecAggError> {
        self.expect(Stage::Unmasking)?;
        self.enough(self.revealed_by.len())?;
        let mut sum = std::mem::take(&mut self.sum);
        let survivors: Vec<u64> = self.masked.iter().copied().collect();
        for &v in &survivors {
            let b = self.recover(v, SecretKind::SelfMask)?;
            apply_mask(&mut sum, &b, self.ring, Sign::Minus);
        }
        let dropped: Vec<u64> = self
            .sharers()
            .filter(|v| !self.masked.contains(v))
            .collect();
        for &v in &dropped {
            let key = KeyPair::from_secret(self.recover(v, SecretKind::MaskKey)?);
            if key.public.to_bytes() != self.keys[&v].mask_public {
                return Err(self.abort(format!(
                    "client {v}'s recovered mask key does not match its public key"
                )));
            }
            let paired: Vec<u64> = self.neighbours[&v]
                .intersection(&self.masked)
                .copied()
                .filter(|&w| self.paired(v, w))
                .collect();
            for w in paired {
                let seed = keys::pair_seed(
                    self.round,
                    v,
                    &key.secret,
                    w,
                    &PublicKey::from(self.keys[&w].mask_public),
                )?;
                // w added +PRG(s_wv) if w < v, -PRG(s_wv) otherwise: undo it.
                let sign = if w < v { Sign::Minus } else { Sign::Plus };
                apply_mask(&mut sum, &seed, self.ring, sign);
            }
        }
        self.stage = Stage::Done;
        Ok(RoundResult {
            sum,
            survivors,
            dropouts_recovered: dropped.len(),
        })
    }
}
