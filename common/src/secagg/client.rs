//! The client's side of one secure-aggregation round, as a state machine over the stage messages.

use super::keys::{self, KeyPair, SecretKind, share_commitment};
use super::messages::{AdvertisedKeys, Neighbourhood, Proceed, RevealedShare, SealedShares};
use super::prg::{Sign, apply_mask};
use super::ring::Ring;
use super::server::Stage;
use super::shamir::{self, SHARE_BYTES, Share};
use super::{SecAggError, check_stage};
use rand::{CryptoRng, Rng};
use std::collections::{BTreeMap, BTreeSet};
use x25519_dalek::PublicKey;

/// Bytes of a share plaintext: round, from, to, then the two shares.
const PLAINTEXT_BYTES: usize = 24 + 2 * SHARE_BYTES;

struct Peer {
    cipher_public: PublicKey,
    mask_public: PublicKey,
}

/// Client u's state in one round.
pub struct ClientRound {
    round: u64,
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
}

impl ClientRound {
    /// Fresh keys and self-mask seed for `round`, all from `rng` (a CSPRNG).
    pub fn new<R: Rng + CryptoRng>(round: u64, me: u64, ring: Ring, rng: &mut R) -> Self {
        Self {
            round,
            me,
            ring,
            cipher: KeyPair::generate(rng),
            mask: KeyPair::generate(rng),
            self_mask: rng.random(),
            stage: Stage::AdvertiseKeys,
            threshold: 0,
            neighbours: BTreeMap::new(),
            held: BTreeMap::new(),
        }
    }

    fn expect(&self, stage: Stage) -> Result<(), SecAggError> {
        check_stage(self.round, self.stage, stage)
    }

    /// Stage 0: the public keys to advertise.
    pub fn advertise(&self) -> AdvertisedKeys {
        AdvertisedKeys {
            client: self.me,
            cipher_public: self.cipher.public.to_bytes(),
            mask_public: self.mask.public.to_bytes(),
        }
    }

    /// Stage 1: Shamir-shares s_sk_u and b_u among the neighbours (threshold t) and seals each
    /// holder's pair of shares to it. Refuses a neighbourhood in which t shares could be gathered
    /// from a minority (2t <= |N(u)|): the server could then ask different clients for both
    /// secrets of one client.
    pub fn share_keys<R: Rng + CryptoRng>(
        &mut self,
        hood: Neighbourhood,
        rng: &mut R,
    ) -> Result<Vec<SealedShares>, SecAggError> {
        self.expect(Stage::AdvertiseKeys)?;
        let n = hood.neighbours.len();
        let t = hood.threshold;
        if t < 2 || t > n || 2 * t <= n {
            return Err(SecAggError::Refused(format!(
                "threshold {t} with {n} neighbours (need 2 <= t <= n and t > n/2)"
            )));
        }
        let mut neighbours = BTreeMap::new();
        for k in &hood.neighbours {
            let peer = Peer {
                cipher_public: PublicKey::from(k.cipher_public),
                mask_public: PublicKey::from(k.mask_public),
            };
            if k.client == self.me || neighbours.insert(k.client, peer).is_some() {
                return Err(SecAggError::Refused(format!(
                    "neighbour list repeats client {} or names this client",
                    k.client
                )));
            }
        }
        let holders: Vec<u64> = neighbours.keys().copied().collect();
        let key_shares = shamir::split(&self.mask.secret.to_bytes(), t, &holders, rng)?;
        let mask_shares = shamir::split(&self.self_mask, t, &holders, rng)?;
        let mut out = Vec::with_capacity(n);
        for ((&to, peer), (ks, bs)) in neighbours.iter().zip(key_shares.iter().zip(&mask_shares)) {
            let cipher = keys::share_cipher(
                self.round,
                self.me,
                to,
                &self.cipher.secret,
                to,
                &peer.cipher_public,
            )?;
            let mut plaintext = Vec::with_capacity(PLAINTEXT_BYTES);
            for v in [self.round, self.me, to] {
                plaintext.extend_from_slice(&v.to_be_bytes());
            }
            plaintext.extend_from_slice(&ks.to_bytes());
            plaintext.extend_from_slice(&bs.to_bytes());
            out.push(SealedShares {
                from: self.me,
                to,
                ciphertext: keys::seal(&cipher, self.round, self.me, to, &plaintext),
                mask_key_commitment: share_commitment(
                    self.round,
                    SecretKind::MaskKey,
                    self.me,
                    to,
                    &ks.to_bytes(),
                ),
                self_mask_commitment: share_commitment(
                    self.round,
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
            self.round,
            sealed.from,
            self.me,
            &self.cipher.secret,
            sealed.from,
            &peer.cipher_public,
        )?;
        let plain = keys::open(
            &cipher,
            self.round,
            sealed.from,
            self.me,
            &sealed.ciphertext,
        )
        .ok_or(SecAggError::BadShare { from: sealed.from })?;
        if plain.len() != PLAINTEXT_BYTES {
            return Err(bad);
        }
        let header: Vec<u64> = plain[..24]
            .chunks_exact(8)
            .map(|c| u64::from_be_bytes(c.try_into().expect("8")))
            .collect();
        if header != [self.round, sealed.from, self.me] {
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
        self.expect(Stage::ShareKeys)?;
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
        self.expect(Stage::CheckShares)?;
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
                self.round,
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

    /// Stage 3: for each neighbour v that shared, the share of b_v if v survived (is in U3) and
    /// of s_sk_v if it did not: never both for one v. Answers once; refuses a survivor list
    /// without this client or with fewer than t members.
    pub fn unmask(&mut self, survivors: &[u64]) -> Result<Vec<RevealedShare>, SecAggError> {
        self.expect(Stage::MaskedInput)?;
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
        self.stage = Stage::Unmasking;
        Ok(self
            .held
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
            .collect())
    }
}
