//! Phase 0, AdvertiseKeys: collect each sampled client's two public keys (U1), checked in a
//! signed round against the client's certificate and signature, then derive the neighbour graph
//! over U1 and fix the Shamir threshold t.

use super::{Base, Graph, Phase, RoundSetup, ShareKeys, Stage, waiting_for, wrong_stage};
use crate::graph::{self, GraphKind};
use crate::messages::{AdvertisedKeys, Member, Neighbourhood, StageMessage};
use crate::{SecAggError, binding, keys, min_threshold};
use std::collections::{BTreeMap, BTreeSet};

/// The round's first phase.
#[derive(Debug, Clone)]
pub struct AdvertiseKeys {
    base: Base,
    graph_kind: GraphKind,
    threshold_fraction: f64,
    sampled: BTreeSet<u64>,
    keys: BTreeMap<u64, AdvertisedKeys>,
    /// Signed rounds: the certified name of each client in `keys`.
    names: BTreeMap<u64, String>,
}

impl AdvertiseKeys {
    /// A round over the `sampled` clients. Every stage needs at least `min_survivors` (and at
    /// least 2) answers, and t = ceil(threshold_fraction * |N(u)|) shares recover a secret,
    /// raised to the smallest t the clients accept ([`min_threshold`]).
    pub fn new(setup: RoundSetup, sampled: impl IntoIterator<Item = u64>) -> Self {
        Self {
            base: Base {
                tag: setup.tag,
                verifier: setup.verifier,
                ring: setup.ring,
                dim: setup.dim,
                min_survivors: setup.min_survivors.max(2),
            },
            graph_kind: setup.graph,
            threshold_fraction: setup.threshold_fraction,
            sampled: sampled.into_iter().collect(),
            keys: BTreeMap::new(),
            names: BTreeMap::new(),
        }
    }

    /// A client's public keys; in a signed round, signed for this round and task by a
    /// certified, unrevoked identity whose name no other client of the round has.
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
        if let Some(verifier) = &self.base.verifier {
            let name = verifier.check_keys(&self.base.tag, &keys)?.name.clone();
            if let Some((&other, _)) = self.names.iter().find(|(_, n)| **n == name) {
                return Err(SecAggError::Unauthenticated {
                    client: from,
                    reason: format!("client {other} already holds the name {name:?}"),
                });
            }
            self.names.insert(from, name);
        }
        self.keys.insert(from, keys);
        Ok(())
    }

    /// Derives the graph over U1; returns the next phase and each client's neighbourhood.
    pub fn close(self) -> Result<(ShareKeys, BTreeMap<u64, Neighbourhood>), SecAggError> {
        let base = self.base;
        base.enough(Stage::AdvertiseKeys, self.keys.len())?;
        let members: Vec<Member> = (self.keys.iter())
            .map(|(id, keys)| Member::of(keys, self.names.get(id).cloned()))
            .collect();
        let neighbours = graph::derive(&base.tag, self.graph_kind, &members);
        let degree = neighbours.values().map(BTreeSet::len).min().unwrap_or(0);
        if degree < 2 {
            let reason = "secure aggregation needs at least 3 clients".into();
            return Err(base.abort(Stage::AdvertiseKeys, reason));
        }
        let t = ((self.threshold_fraction * degree as f64).ceil() as usize)
            .max(min_threshold(degree, base.verifier.is_some()));
        let graph = Graph {
            members: binding::members_digest(&base.tag, &members),
            keys: self.keys,
            neighbours,
            threshold: t.min(degree),
        };
        let hoods = (graph.neighbours.iter())
            .map(|(&u, ns)| {
                let hood = Neighbourhood {
                    threshold: graph.threshold,
                    members: members.clone(),
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
            other => Err(wrong_stage(self.base.tag.round, Self::STAGE, &other)),
        }
    }

    fn round(&self) -> u64 {
        self.base.tag.round
    }
}
