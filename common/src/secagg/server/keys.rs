//! Phase 0, AdvertiseKeys: collect each sampled client's two public keys (U1), then draw the
//! neighbour graph over U1 and fix the Shamir threshold t.

use super::{Base, Graph, Phase, ShareKeys, Stage, waiting_for, wrong_stage};
use crate::secagg::SecAggError;
use crate::secagg::graph::{self, GraphKind};
use crate::secagg::keys;
use crate::secagg::messages::{AdvertisedKeys, Neighbourhood, StageMessage};
use crate::secagg::ring::Ring;
use rand::{CryptoRng, Rng};
use std::collections::{BTreeMap, BTreeSet};

/// The round's first phase.
#[derive(Debug, Clone)]
pub struct AdvertiseKeys {
    base: Base,
    graph_kind: GraphKind,
    threshold_fraction: f64,
    sampled: BTreeSet<u64>,
    keys: BTreeMap<u64, AdvertisedKeys>,
}

impl AdvertiseKeys {
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
            base: Base {
                round,
                ring,
                dim,
                min_survivors: min_survivors.max(2),
            },
            graph_kind,
            threshold_fraction,
            sampled: sampled.into_iter().collect(),
            keys: BTreeMap::new(),
        }
    }

    /// A client's public keys.
    pub fn receive_keys(&mut self, from: u64, keys: AdvertisedKeys) -> Result<(), SecAggError> {
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

    /// Draws the graph over U1; returns the next phase and each client's neighbourhood.
    pub fn close<R: Rng + CryptoRng>(
        self,
        rng: &mut R,
    ) -> Result<(ShareKeys, BTreeMap<u64, Neighbourhood>), SecAggError> {
        let base = self.base;
        base.enough(Stage::AdvertiseKeys, self.keys.len())?;
        let u1: Vec<u64> = self.keys.keys().copied().collect();
        let neighbours = graph::build(self.graph_kind, &u1, rng);
        let degree = neighbours.values().map(BTreeSet::len).min().unwrap_or(0);
        if degree < 2 {
            let reason = "secure aggregation needs at least 3 clients".into();
            return Err(base.abort(Stage::AdvertiseKeys, reason));
        }
        // t > |N|/2 always (the clients refuse less), and t >= 2.
        let t = ((self.threshold_fraction * degree as f64).ceil() as usize)
            .max(degree / 2 + 1)
            .max(2);
        let graph = Graph {
            keys: self.keys,
            neighbours,
            threshold: t.min(degree),
        };
        let hoods = (graph.neighbours.iter())
            .map(|(&u, ns)| {
                let hood = Neighbourhood {
                    threshold: graph.threshold,
                    neighbours: ns.iter().map(|v| graph.keys[v].clone()).collect(),
                };
                (u, hood)
            })
            .collect();
        Ok((ShareKeys::new(base, graph), hoods))
    }
}

impl Phase for AdvertiseKeys {
    const STAGE: Stage = Stage::AdvertiseKeys;

    fn pending(&self) -> BTreeSet<u64> {
        waiting_for(&self.sampled, &self.keys.keys().copied().collect())
    }

    fn receive(&mut self, from: u64, message: StageMessage) -> Result<(), SecAggError> {
        match message {
            StageMessage::Keys(keys) => self.receive_keys(from, keys),
            other => Err(wrong_stage(self.base.round, Self::STAGE, &other)),
        }
    }

    fn round(&self) -> u64 {
        self.base.round
    }
}
