//! The client's side of one secure-aggregation round, as a state machine over the stage messages.
//!
//! With [`Credentials`] the client takes part in the malicious-server variant: it signs its keys,
//! refuses a neighbour whose keys are not signed for this round and task by a certified,
//! unrevoked identity, refuses a neighbour set that is not the one derived from U1, signs the
//! survivor set it is given and reveals only once t of its neighbours signed the same sets.

use super::SecAggError;
use super::binding::{self, Credentials};
use super::graph::{self, GraphKind};
use super::keys::{self, KeyPair, RoundTag, SecretKind, share_commitment};
use super::messages::Stage;
use super::messages::{
    AdvertisedKeys, Member, Neighbourhood, Proceed, RevealedShare, SealedShares,
};
use super::prg::{Sign, apply_mask};
use super::ring::Ring;
use super::shamir::{self, SHARE_BYTES, Share};
use fl_authority::IdentityKey;
use fl_authority::policy::FederationPolicy;
use rand::{CryptoRng, Rng};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use x25519_dalek::PublicKey;

/// Bytes of a share plaintext: round, from, to, then the two shares.
const PLAINTEXT_BYTES: usize = 24 + 2 * SHARE_BYTES;

struct Peer {
    cipher_public: PublicKey,
    mask_public: PublicKey,
    /// Its certified identity key (signed rounds).
    identity: Option<IdentityKey>,
}

/// The smallest Shamir threshold t a client accepts with `n` neighbours: t > n/2 against an
/// honest-but-curious server (no minority recovers a secret), and t > 2n/3 in a signed round
/// (Bonawitz et al. 2017, Sec. 6: both secrets of one client stay hidden while fewer than
/// 2t - n > n/3 of its neighbours are the server's); at least 2.
pub fn min_threshold(n: usize, signed: bool) -> usize {
    let t = match signed {
        true => 2 * n / 3 + 1,
        false => n / 2 + 1,
    };
    t.max(2)
}

/// Client u's state in one round.
pub struct ClientRound {
    tag: RoundTag,
    me: u64,
    ring: Ring,
    cipher: KeyPair,
    mask: KeyPair,
    /// b_u.
    self_mask: [u8; 32],
    stage: Stage,
    threshold: usize,
    neighbours: BTreeMap<u64, Peer>,
    /// Shares of (s_sk_v, b_v) held for each neighbour v that shared (N(u) ∩ U2) and whose shares
    /// opened.
    held: BTreeMap<u64, (Share, Share)>,
    /// Signed rounds: this client's identity and the checks of its peers.
    credentials: Option<Arc<Credentials>>,
    /// H(U1), as this client was told U1.
    members: [u8; 32],
    /// U3, as this client signed it.
    survivors: BTreeSet<u64>,
    /// The federation's rules on the round's size, graph and threshold, if the client has them.
    policy: Option<Arc<FederationPolicy>>,
    /// n_min: the fewest clients the round may admit (U1) or keep (U3).
    min_survivors: u64,
    /// This client's advertisement, signed once when the round is made.
    advert: AdvertisedKeys,
}

impl ClientRound {
    /// Fresh keys and self-mask seed for the round `tag` names (its number and the digest of
    /// the task and model this client received), all from `rng` (a CSPRNG). With `credentials`
    /// the round is signed.
    pub fn new<R: Rng + CryptoRng>(
        (tag, me): (RoundTag, u64),
        ring: Ring,
        credentials: Option<Arc<Credentials>>,
        rng: &mut R,
    ) -> Self {
        let (cipher, mask) = (KeyPair::generate(rng), KeyPair::generate(rng));
        let mut advert = AdvertisedKeys {
            client: me,
            cipher_public: cipher.public.to_bytes(),
            mask_public: mask.public.to_bytes(),
            signed: None,
        };
        if let Some(c) = &credentials {
            c.sign_keys(&tag, &mut advert);
        }
        Self {
            tag,
            me,
            ring,
            cipher,
            mask,
            self_mask: rng.random(),
            stage: Stage::AdvertiseKeys,
            threshold: 0,
            neighbours: BTreeMap::new(),
            held: BTreeMap::new(),
            credentials,
            members: [0; 32],
            survivors: BTreeSet::new(),
            policy: None,
            min_survivors: 0,
            advert,
        }
    }

    /// The round under the federation's `policy`: a neighbourhood outside its minimums (|U1|,
    /// k, t) is refused before anything is shared.
    pub fn under(mut self, policy: Option<Arc<FederationPolicy>>) -> Self {
        self.policy = policy;
        self
    }

    /// This client refuses a round that admits (U1) or keeps (U3) fewer than `n_min` clients:
    /// the task's floor, which the round's noise was calibrated and charged for.
    pub fn surviving_at_least(mut self, n_min: u64) -> Self {
        self.min_survivors = n_min;
        self
    }

    /// Tests only: the shares this client holds of `owner`'s (s_sk, b), as a client the server
    /// controls would hand them over.
    #[cfg(test)]
    pub(super) fn held_shares(&self, owner: u64) -> Option<(Share, Share)> {
        self.held.get(&owner).copied()
    }

    /// Whether the round is signed (this client has credentials).
    pub fn signed(&self) -> bool {
        self.credentials.is_some()
    }

    /// Refuses the server's `message` unless this client is at `stage`, the one that message
    /// follows: a message sent twice, early or late names itself.
    fn expect(&self, stage: Stage, message: &'static str) -> Result<(), SecAggError> {
        if self.stage == stage {
            return Ok(());
        }
        Err(SecAggError::OutOfOrder {
            round: self.tag.round,
            message,
            stage: self.stage,
        })
    }

    /// Stage 0: the public keys to advertise, signed when the client has credentials.
    pub fn advertise(&self) -> AdvertisedKeys {
        self.advert.clone()
    }

    /// Refuses a threshold t with `n` neighbours below [`min_threshold`] or above n.
    fn check_threshold(&self, t: usize, n: usize) -> Result<(), SecAggError> {
        let signed = self.credentials.is_some();
        if t < min_threshold(n, signed) || t > n {
            let need = match signed {
                true => "tau > 2n/3",
                false => "tau > n/2",
            };
            return Err(SecAggError::Refused(format!(
                "threshold tau = {t} with {n} neighbours (need 2 <= tau <= n and {need})"
            )));
        }
        Ok(())
    }

    /// Checks U1 as told (increasing ids, this client in it under its own name and its own
    /// advertisement's digest, names unique in a signed round, each neighbour under the digest
    /// of the keys it was sent) and that `neighbours` is this client's neighbour set in the
    /// graph derived from it; keeps H(U1), the attempt's key transcript.
    fn check_members(
        &mut self,
        members: &[Member],
        neighbours: &BTreeMap<u64, AdvertisedKeys>,
    ) -> Result<(), SecAggError> {
        let refuse = |problem: String| Err(SecAggError::Refused(problem));
        if members.windows(2).any(|w| w[0].id >= w[1].id) {
            return refuse("the admitted clients are not listed once each by id".into());
        }
        let own_name = self.credentials.as_ref().map(|c| &c.certificate.name);
        let own_keys = self.advert.digest();
        match members.iter().find(|m| m.id == self.me) {
            Some(m) if m.name.as_ref() == own_name && m.keys == own_keys => {}
            Some(_) | None => {
                return refuse(
                    "the admitted clients leave out this client, misname it or misstate its keys"
                        .into(),
                );
            }
        }
        // U1 is sorted by id (checked above), so each neighbour is found by a binary search.
        let listed = |k: &AdvertisedKeys| {
            (members.binary_search_by_key(&k.client, |m| m.id))
                .is_ok_and(|i| members[i].keys == k.digest())
        };
        if let Some(k) = neighbours.values().find(|k| !listed(k)) {
            return refuse(format!(
                "neighbour {} is not in the admitted clients with the keys it was sent with",
                k.client
            ));
        }
        if own_name.is_some() {
            let names: BTreeSet<Option<&String>> =
                members.iter().map(|m| m.name.as_ref()).collect();
            if names.len() != members.len() || names.contains(&None) {
                return refuse("the admitted clients' names are missing or repeated".into());
            }
        }
        let kind = GraphKind::Regular(neighbours.len());
        let derived = graph::neighbours_of(&self.tag, kind, members, self.me);
        if !derived.is_some_and(|d| d.iter().eq(neighbours.keys())) {
            return refuse(
                "the neighbour set is not the one derived from the admitted clients".into(),
            );
        }
        self.members = binding::members_digest(&self.tag, members);
        Ok(())
    }

    /// The neighbours' keys, checked in a signed round against their certificates, their
    /// signatures (in one batch) and the names U1 gives them.
    fn peers(&self, hood: &Neighbourhood) -> Result<Vec<Peer>, SecAggError> {
        let certificates = match &self.credentials {
            None => vec![None; hood.neighbours.len()],
            Some(c) => {
                let checked = c.verifier.check_all_keys(&self.tag, &hood.neighbours)?;
                checked.into_iter().map(Some).collect()
            }
        };
        let mut peers = Vec::with_capacity(hood.neighbours.len());
        for (keys, certificate) in hood.neighbours.iter().zip(certificates) {
            if let Some(certificate) = certificate {
                let listed = hood.members.iter().find(|m| m.id == keys.client);
                if listed.and_then(|m| m.name.as_ref()) != Some(&certificate.name) {
                    return Err(SecAggError::Unauthenticated {
                        client: keys.client,
                        reason: "its certificate names another client".into(),
                    });
                }
            }
            peers.push(Peer {
                cipher_public: PublicKey::from(keys.cipher_public),
                mask_public: PublicKey::from(keys.mask_public),
                identity: certificate.map(|c| c.identity),
            });
        }
        Ok(peers)
    }

    /// Stage 1: Shamir-shares s_sk_u and b_u among the neighbours (threshold t) and seals each
    /// holder's pair of shares to it. Refuses a neighbourhood in which t shares could be gathered
    /// from a minority (t below [`min_threshold`]): the server could then ask different clients
    /// for both secrets of one client; a neighbour set not derived from U1; and, in a signed
    /// round, any neighbour whose keys are not signed for this round and task.
    pub fn share_keys<R: Rng + CryptoRng>(
        &mut self,
        hood: Neighbourhood,
        rng: &mut R,
    ) -> Result<Vec<SealedShares>, SecAggError> {
        self.expect(Stage::AdvertiseKeys, "neighbours")?;
        self.check_threshold(hood.threshold, hood.neighbours.len())?;
        if let Some(policy) = &self.policy {
            policy.check_round(hood.members.len(), hood.neighbours.len(), hood.threshold)?;
        }
        self.check_floor("admitted clients", hood.members.len())?;
        let (n, t) = (hood.neighbours.len(), hood.threshold);
        let mut neighbours = BTreeMap::new();
        let mut adverts = BTreeMap::new();
        for (k, peer) in hood.neighbours.iter().zip(self.peers(&hood)?) {
            if k.client == self.me || neighbours.insert(k.client, peer).is_some() {
                return Err(SecAggError::Refused(format!(
                    "neighbour list repeats client {} or names this client",
                    k.client
                )));
            }
            // A neighbour's keys are canonical (protocol.md, "Key derivation"), whatever the
            // server relays; a key of small order fails its agreement.
            keys::check_canonical(k.client, &k.cipher_public)?;
            keys::check_canonical(k.client, &k.mask_public)?;
            adverts.insert(k.client, k.clone());
        }
        self.check_members(&hood.members, &adverts)?;
        let holders: Vec<u64> = neighbours.keys().copied().collect();
        let key_shares = shamir::split(&self.mask.secret.to_bytes(), t, &holders, rng)?;
        let mask_shares = shamir::split(&self.self_mask, t, &holders, rng)?;
        let mut out = Vec::with_capacity(n);
        for ((&to, peer), (ks, bs)) in neighbours.iter().zip(key_shares.iter().zip(&mask_shares)) {
            let cipher = keys::share_cipher(
                &self.tag,
                self.me,
                to,
                &self.cipher.secret,
                to,
                &peer.cipher_public,
            )?;
            let mut plaintext = Vec::with_capacity(PLAINTEXT_BYTES);
            for v in [self.tag.round, self.me, to] {
                plaintext.extend_from_slice(&v.to_be_bytes());
            }
            plaintext.extend_from_slice(&ks.to_bytes());
            plaintext.extend_from_slice(&bs.to_bytes());
            out.push(SealedShares {
                from: self.me,
                to,
                ciphertext: keys::seal(&cipher, &self.tag, self.me, to, &plaintext),
                mask_key_commitment: share_commitment(
                    &self.tag,
                    SecretKind::MaskKey,
                    self.me,
                    to,
                    &ks.to_bytes(),
                ),
                self_mask_commitment: share_commitment(
                    &self.tag,
                    SecretKind::SelfMask,
                    self.me,
                    to,
                    &bs.to_bytes(),
                ),
            });
        }
        self.neighbours = neighbours;
        self.threshold = t;
        self.stage = Stage::ShareKeys;
        Ok(out)
    }

    fn open(&self, sealed: &SealedShares) -> Result<(Share, Share), SecAggError> {
        let bad = SecAggError::BadShare { from: sealed.from };
        let peer = self
            .neighbours
            .get(&sealed.from)
            .ok_or(SecAggError::BadShare { from: sealed.from })?;
        if sealed.to != self.me {
            return Err(bad);
        }
        let cipher = keys::share_cipher(
            &self.tag,
            sealed.from,
            self.me,
            &self.cipher.secret,
            sealed.from,
            &peer.cipher_public,
        )?;
        let plain = keys::open(&cipher, &self.tag, sealed.from, self.me, &sealed.ciphertext)
            .ok_or(SecAggError::BadShare { from: sealed.from })?;
        if plain.len() != PLAINTEXT_BYTES {
            return Err(bad);
        }
        let header: Vec<u64> = plain[..24]
            .chunks_exact(8)
            .map(|c| u64::from_be_bytes(c.try_into().expect("8")))
            .collect();
        if header != [self.tag.round, sealed.from, self.me] {
            return Err(bad);
        }
        let ks = Share::from_bytes(&plain[24..24 + SHARE_BYTES])?;
        let bs = Share::from_bytes(&plain[24 + SHARE_BYTES..])?;
        let x = shamir::point_of(self.me)?;
        if ks.x != x || bs.x != x {
            return Err(bad);
        }
        Ok((ks, bs))
    }

    /// The check: opens the shares the neighbours in U2 sent and keeps those that open; returns
    /// the neighbours whose shares do not (forged, altered or misaddressed). This client will hold
    /// nothing of theirs and not mask with them: to it they dropped.
    pub fn check_shares(&mut self, incoming: &[SealedShares]) -> Result<Vec<u64>, SecAggError> {
        self.expect(Stage::ShareKeys, "share-inbox")?;
        let mut refused = BTreeSet::new();
        for sealed in incoming {
            if !self.neighbours.contains_key(&sealed.from) {
                return Err(SecAggError::Refused(format!(
                    "a share from client {}, which is not a neighbour",
                    sealed.from
                )));
            }
            if self.held.contains_key(&sealed.from) || refused.contains(&sealed.from) {
                return Err(SecAggError::Refused(format!(
                    "two share messages from client {}",
                    sealed.from
                )));
            }
            match self.open(sealed) {
                Ok(shares) => {
                    self.held.insert(sealed.from, shares);
                }
                Err(_) => {
                    refused.insert(sealed.from);
                }
            }
        }
        self.stage = Stage::CheckShares;
        Ok(refused.into_iter().collect())
    }

    /// Stage 2: masks the quantised update with the neighbours the server did not exclude and
    /// that could open this client's shares (P):
    /// y_u = x_u + PRG(b_u) + sum_{v in P} (+PRG(s_uv) if u < v, −PRG(s_uv) if u > v).
    /// Refuses to mask with fewer than t neighbours.
    pub fn masked_input(&mut self, proceed: &Proceed, x: &[u64]) -> Result<Vec<u64>, SecAggError> {
        self.expect(Stage::CheckShares, "proceed")?;
        let named = proceed.excluded.iter().chain(&proceed.unpaired);
        if let Some(v) = named.clone().find(|v| !self.neighbours.contains_key(v)) {
            return Err(SecAggError::Refused(format!(
                "the server names client {v}, which is not a neighbour"
            )));
        }
        self.held.retain(|v, _| !proceed.excluded.contains(v));
        let paired: Vec<u64> = self
            .held
            .keys()
            .copied()
            .filter(|v| !proceed.unpaired.contains(v))
            .collect();
        if paired.len() < self.threshold {
            return Err(SecAggError::Refused(format!(
                "only {} neighbours to mask with, threshold is {}",
                paired.len(),
                self.threshold
            )));
        }
        if x.iter().any(|&v| !self.ring.contains(v)) {
            return Err(SecAggError::Refused(
                "the input is not a vector of ring elements".into(),
            ));
        }
        let mut y = x.to_vec();
        apply_mask(&mut y, &self.self_mask, self.ring, Sign::Plus);
        for v in paired {
            let seed = keys::pair_seed(
                &self.tag,
                self.me,
                &self.mask.secret,
                v,
                &self.neighbours[&v].mask_public,
            )?;
            let sign = if self.me < v { Sign::Plus } else { Sign::Minus };
            apply_mask(&mut y, &seed, self.ring, sign);
        }
        self.stage = Stage::MaskedInput;
        Ok(y)
    }

    /// Checks a survivor list: it holds this client and at least t clients.
    fn check_survivors(&self, survivors: &[u64]) -> Result<BTreeSet<u64>, SecAggError> {
        let survivors: BTreeSet<u64> = survivors.iter().copied().collect();
        if !survivors.contains(&self.me) {
            return Err(SecAggError::Refused(
                "the survivor list leaves out this client".into(),
            ));
        }
        if survivors.len() < self.threshold {
            return Err(SecAggError::Refused(format!(
                "{} survivors, threshold is {}",
                survivors.len(),
                self.threshold
            )));
        }
        self.check_floor("survivors", survivors.len())?;
        Ok(survivors)
    }

    /// Refuses `count` `what` below the task's n_min.
    fn check_floor(&self, what: &str, count: usize) -> Result<(), SecAggError> {
        match (count as u64) < self.min_survivors {
            true => Err(SecAggError::Refused(format!(
                "{count} {what}, below the task's n_min = {}, which its noise was charged for",
                self.min_survivors
            ))),
            false => Ok(()),
        }
    }

    /// Stage 3 of an unsigned round: for each neighbour v that shared, the share of b_v if v
    /// survived (is in U3) and of s_sk_v if it did not: never both for one v. Answers once;
    /// refuses a survivor list without this client or with fewer than t members, and refuses
    /// outright in a signed round, which reveals only after the consistency check.
    pub fn unmask(&mut self, survivors: &[u64]) -> Result<Vec<RevealedShare>, SecAggError> {
        self.expect(Stage::MaskedInput, "survivors")?;
        if self.credentials.is_some() {
            return Err(SecAggError::Refused(
                "a signed round reveals shares only after t neighbours signed the survivor set"
                    .into(),
            ));
        }
        let survivors = self.check_survivors(survivors)?;
        Ok(self.reveal(&survivors))
    }

    /// The consistency check of a signed round: signs (round, H(task), H(U1), U3) for the
    /// survivor list it is given, which it will not sign again nor reveal for any other.
    pub fn endorse(&mut self, survivors: &[u64]) -> Result<[u8; 64], SecAggError> {
        self.expect(Stage::MaskedInput, "survivors")?;
        let Some(credentials) = self.credentials.clone() else {
            return Err(SecAggError::Refused(
                "this client has no identity to sign with".into(),
            ));
        };
        self.survivors = self.check_survivors(survivors)?;
        self.stage = Stage::Consistency;
        Ok(credentials.identity.sign(&self.survivors_payload()))
    }

    fn survivors_payload(&self) -> Vec<u8> {
        let u3: Vec<u64> = self.survivors.iter().copied().collect();
        binding::survivors_payload(&self.tag, &self.members, &u3)
    }

    /// Stage 3 of a signed round: reveals as [`Self::unmask`] does, for the survivor set it
    /// signed, once `endorsements` hold valid signatures of that set (and of the same U1) by at
    /// least t of its neighbours in U3. They are checked in order until t are valid; one that
    /// does not verify refuses the round (the server checks them before it forwards them, so one
    /// that does not verify was altered on the way).
    pub fn reveal_endorsed(
        &mut self,
        endorsements: &[(u64, [u8; 64])],
    ) -> Result<Vec<RevealedShare>, SecAggError> {
        self.expect(Stage::Consistency, "endorsements")?;
        let payload = self.survivors_payload();
        let mut signers = BTreeSet::new();
        let (mut order, mut signed) = (Vec::new(), Vec::with_capacity(self.threshold));
        for (signer, signature) in endorsements {
            if signers.len() == self.threshold {
                break;
            }
            let identity = (self.neighbours.get(signer))
                .filter(|_| self.survivors.contains(signer))
                .and_then(|p| p.identity)
                .ok_or_else(|| {
                    SecAggError::Refused(format!(
                        "a survivor-set signature of client {signer}, not a surviving neighbour"
                    ))
                })?;
            if signers.insert(*signer) {
                order.push(*signer);
                signed.push((identity, payload.as_slice(), *signature));
            }
        }
        if signers.len() < self.threshold {
            return Err(SecAggError::Refused(format!(
                "{} neighbours signed the survivor set, threshold is {}",
                signers.len(),
                self.threshold
            )));
        }
        binding::check_all_survivors(&order, &signed)?;
        let survivors = std::mem::take(&mut self.survivors);
        Ok(self.reveal(&survivors))
    }

    /// For each neighbour v held: the share of b_v if v is in U3, of s_sk_v if not.
    fn reveal(&mut self, survivors: &BTreeSet<u64>) -> Vec<RevealedShare> {
        self.stage = Stage::Unmasking;
        self.held
            .iter()
            .map(|(&owner, &(key_share, mask_share))| {
                if survivors.contains(&owner) {
                    RevealedShare {
                        owner,
                        kind: SecretKind::SelfMask,
                        share: mask_share,
                    }
                } else {
                    RevealedShare {
                        owner,
                        kind: SecretKind::MaskKey,
                        share: key_share,
                    }
                }
            })
            .collect()
    }
}
