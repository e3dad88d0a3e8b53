//! Secure aggregation against a server that attacks: real `fl-client` processes, each with its
//! own identity certified by a federation authority, against a scripted server (this test) that
//! deviates from the protocol. One test per attack of docs/src/explanation/threat-model.md; each checks what the
//! server received. Where the attack needs clients of its own, the server runs them in process
//! (certified, as compromised clients would be), each as a pair of identical twins so that it can
//! reveal both secrets of a victim.
//!
//! `cargo test malicious` runs them all.

mod admission;
mod honest;
mod policy;
mod scripted;

use fl_authority::{Authority, Identity};
use fl_secagg::{
    ClientRound, Credentials, GraphKind, Proceed, RoundTag, SealedShares, SecretKind, ServerStage,
    StageMessage, Verifier, share_commitment,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use scripted::*;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Key substitution: the server replaces every neighbour's keys in the victim's neighbourhood
/// with keys of its own (impersonating each neighbour with a client it runs). Unsigned, the
/// victim seals its shares to the server's keys and the server opens every one of them (t of
/// them recover its secrets). Signed, the victim refuses the round and shares nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_substitutes_keys() {
    for signed in [false, true] {
        let mut setup = setup(&format!("keys-{signed}"), 4, signed).await;
        let mut peers = setup.peers(4).await;
        let task = task(signed);
        let model = vec![0.0; PARAMS];
        let tag = tag_of(&task, &model);
        let adverts = keys_of(&mut peers, &task, |_| model.clone()).await;
        let victim = adverts[0].client;
        // The impersonators: one per neighbour, with that neighbour's id and name.
        let mut impostors: BTreeMap<u64, ClientRound> = BTreeMap::new();
        let mut forged = adverts.clone();
        for a in forged.iter_mut().skip(1) {
            let name = a.signed.as_ref().map(|s| s.certificate.name.clone());
            let [impostor, _] = setup.sybil(&name.unwrap_or_default(), tag, a.client, signed);
            let mut keys = impostor.advertise();
            keys.signed = a.signed.clone();
            *a = keys;
            impostors.insert(a.client, impostor);
        }
        let t = if signed { 3 } else { 2 };
        let hood = honest_hoods(&tag, &forged, GraphKind::Complete, t)
            .remove(&victim)
            .unwrap();
        let mut rng = StdRng::seed_from_u64(1);
        for (&v, impostor) in impostors.iter_mut() {
            // The impostor takes part in its own name, so that it can open what it is sent.
            let hood = honest_hoods(&tag, &forged, GraphKind::Complete, t)
                .remove(&v)
                .unwrap();
            if !signed {
                impostor.share_keys(hood, &mut rng).unwrap();
            }
        }
        let peer = peers.get_mut(&victim).unwrap();
        send_stage(peer, &ServerStage::Neighbours(hood)).await;
        match (signed, answer(peer).await) {
            (false, Answer::Stage(StageMessage::Shares(sealed))) => {
                // The leak of the unsigned protocol: every share opens for the server.
                for (v, impostor) in impostors.iter_mut() {
                    let mine: Vec<SealedShares> =
                        sealed.iter().filter(|s| s.to == *v).cloned().collect();
                    assert_eq!(impostor.check_shares(&mine).unwrap(), Vec::<u64>::new());
                }
            }
            (true, Answer::Failed(reason)) => {
                assert!(reason.contains("not authenticated"), "{reason}")
            }
            (_, other) => panic!("signed = {signed}: {other:?}"),
        }
        shut_down(&mut setup, &peers).await;
    }
}

/// Model inconsistency (Pasquini et al. 2022): the victim is sent one model, every other
/// client another. Their signatures bind H(task), so every client refuses its neighbours'
/// keys before sharing anything: the server receives no share from anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_sends_different_models() {
    let mut setup = setup("models", 4, true).await;
    let mut peers = setup.peers(4).await;
    let task = task(true);
    let victim = *peers.keys().next().unwrap();
    let model_of = |u: u64| vec![if u == victim { 0.0 } else { 0.5 }; PARAMS];
    let adverts = keys_of(&mut peers, &task, model_of).await;
    for (u, hood) in honest_hoods(
        &tag_of(&task, &model_of(u64::MAX)),
        &adverts,
        GraphKind::Complete,
        3,
    ) {
        send_stage(&peers[&u], &ServerStage::Neighbours(hood)).await;
    }
    for (u, peer) in peers.iter_mut() {
        match answer(peer).await {
            Answer::Failed(reason) => assert!(reason.contains("not authenticated"), "{reason}"),
            other => panic!("client {u} answered {other:?}"),
        }
    }
    shut_down(&mut setup, &peers).await;
}

/// Isolation by graph choice, and fabricated clients: the server gives the victim neighbours it
/// chose (not the derived ones), or neighbours certified by an authority of its own. The victim
/// refuses both before sharing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_chooses_neighbours_or_fabricates_clients() {
    let mut setup = setup("graph", 8, true).await;
    let mut peers = setup.peers(8).await;
    let task = task(true);
    let model = vec![0.0; PARAMS];
    let tag = tag_of(&task, &model);
    let adverts = keys_of(&mut peers, &task, |_| model.clone()).await;
    let mut hoods = honest_hoods(&tag, &adverts, GraphKind::Regular(4), 3);
    let ids: Vec<u64> = hoods.keys().copied().collect();
    // Victim 1: one derived neighbour replaced by a client the server chose.
    let (chosen_victim, fabricated_victim) = (ids[0], ids[1]);
    let mut hood = hoods.remove(&chosen_victim).unwrap();
    let outsider = (adverts.iter())
        .find(|a| a.client != chosen_victim && hood.neighbours.iter().all(|k| k.client != a.client))
        .unwrap();
    hood.neighbours[0] = outsider.clone();
    send_stage(&peers[&chosen_victim], &ServerStage::Neighbours(hood)).await;
    // Victim 2: a neighbour replaced by a client certified by the server's own authority.
    let mut hood = hoods.remove(&fabricated_victim).unwrap();
    let rogue = Authority::generate().unwrap();
    let identity = Identity::generate().unwrap();
    let name = hood.neighbours[0]
        .signed
        .as_ref()
        .unwrap()
        .certificate
        .name
        .clone();
    let certificate = rogue.certify(&name, &identity.public()).unwrap();
    let verifier = Verifier::new(rogue.public(), None).unwrap();
    let credentials = Arc::new(Credentials::new(identity, certificate, verifier).unwrap());
    let id = hood.neighbours[0].client;
    let mut rng = StdRng::seed_from_u64(2);
    hood.neighbours[0] =
        ClientRound::new((tag, id), ring(), Some(credentials), &mut rng).advertise();
    send_stage(&peers[&fabricated_victim], &ServerStage::Neighbours(hood)).await;
    for (victim, expected) in [
        (chosen_victim, "derived"),
        (fabricated_victim, "not authenticated"),
    ] {
        match answer(peers.get_mut(&victim).unwrap()).await {
            Answer::Failed(reason) => assert!(reason.contains(expected), "{reason}"),
            other => panic!("client {victim} answered {other:?}"),
        }
    }
    shut_down(&mut setup, &peers).await;
}

/// The victim's revealed shares that match the commitments it sealed, by kind.
struct Verified<'a> {
    tag: RoundTag,
    victim: u64,
    sealed: &'a [SealedShares],
    counts: BTreeMap<SecretKind, usize>,
}

impl Verified<'_> {
    fn count(&mut self, holder: u64, reveals: &[fl_secagg::RevealedShare]) {
        for r in reveals.iter().filter(|r| r.owner == self.victim) {
            let sealed = (self.sealed.iter()).find(|s| s.from == self.victim && s.to == holder);
            let committed = sealed.map(|s| match r.kind {
                SecretKind::MaskKey => s.mask_key_commitment,
                SecretKind::SelfMask => s.self_mask_commitment,
            });
            let share = r.share.to_bytes();
            let commitment = share_commitment(&self.tag, r.kind, self.victim, holder, &share);
            if committed == Some(commitment) {
                *self.counts.entry(r.kind).or_default() += 1;
            }
        }
    }
}

/// Inconsistent dropout claims (Bonawitz et al. 2017, Sec. 6). Five real clients and two of the
/// server's share and mask honestly; then the victim and two others are told the victim
/// survived, the other two that it dropped. Unsigned (t = 4), the server collects t verified
/// shares of both of the victim's secrets. Signed (t = 5), each client signs the set it was
/// told, finds fewer than t neighbours that signed the same one, and reveals nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_claims_inconsistent_dropouts() {
    for signed in [false, true] {
        let mut setup = setup(&format!("dropouts-{signed}"), 5, signed).await;
        let mut peers = setup.peers(5).await;
        let task = task(signed);
        let model = vec![0.0; PARAMS];
        let tag = tag_of(&task, &model);
        let mut adverts = keys_of(&mut peers, &task, |_| model.clone()).await;
        let mut sybils: BTreeMap<u64, [ClientRound; 2]> = BTreeMap::new();
        for id in [100, 101] {
            let twins = setup.sybil(&format!("sybil-{id}"), tag, id, signed);
            adverts.push(twins[0].advertise());
            sybils.insert(id, twins);
        }
        let t = if signed { 5 } else { 4 };
        let hoods = honest_hoods(&tag, &adverts, GraphKind::Complete, t);
        let mut sealed: Vec<SealedShares> = Vec::new();
        for (u, hood) in hoods {
            match sybils.get_mut(&u) {
                Some([first, second]) => {
                    // Twins share alike (same seed): the server relays one copy.
                    let shares = |twin: &mut ClientRound| {
                        let mut rng = StdRng::seed_from_u64(u + 1000);
                        twin.share_keys(hood.clone(), &mut rng).unwrap()
                    };
                    sealed.extend(shares(first));
                    assert_eq!(shares(second).len(), adverts.len() - 1);
                }
                None => {
                    let peer = peers.get_mut(&u).unwrap();
                    send_stage(peer, &ServerStage::Neighbours(hood)).await;
                    match answer(peer).await {
                        Answer::Stage(StageMessage::Shares(s)) => sealed.extend(s),
                        other => panic!("client {u}: {other:?}"),
                    }
                }
            }
        }
        for (&u, peer) in peers.iter() {
            let inbox = sealed.iter().filter(|s| s.to == u).cloned().collect();
            send_stage(peer, &ServerStage::ShareInbox(inbox)).await;
        }
        for (u, twins) in sybils.iter_mut() {
            let inbox: Vec<SealedShares> = sealed.iter().filter(|s| s.to == *u).cloned().collect();
            for twin in twins.iter_mut() {
                twin.check_shares(&inbox).unwrap();
                twin.masked_input(&Proceed::default(), &[0; PARAMS])
                    .unwrap();
            }
        }
        for peer in peers.values_mut() {
            assert!(
                matches!(answer(peer).await, Answer::Stage(StageMessage::Check(r)) if r.is_empty())
            );
            send_stage(peer, &ServerStage::Proceed(Proceed::default())).await;
        }
        for peer in peers.values_mut() {
            assert!(matches!(
                answer(peer).await,
                Answer::Stage(StageMessage::Masked(_))
            ));
        }
        // The claims: the victim and the next two are told the victim survived, the last two
        // that it dropped.
        let honest: Vec<u64> = peers.keys().copied().collect();
        let victim = honest[0];
        let everyone: Vec<u64> = adverts
            .iter()
            .map(|a| a.client)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let without: Vec<u64> = everyone.iter().copied().filter(|&u| u != victim).collect();
        let told = |u: u64| {
            if honest[3..].contains(&u) {
                without.clone()
            } else {
                everyone.clone()
            }
        };
        for (&u, peer) in peers.iter() {
            send_stage(peer, &ServerStage::Survivors(told(u))).await;
        }
        let mut verified = Verified {
            tag,
            victim,
            sealed: &sealed,
            counts: BTreeMap::new(),
        };
        if !signed {
            for (&u, [a, b]) in sybils.iter_mut() {
                verified.count(u, &a.unmask(&everyone).unwrap());
                verified.count(u, &b.unmask(&without).unwrap());
            }
            for (&u, peer) in peers.iter_mut() {
                match answer(peer).await {
                    Answer::Stage(StageMessage::Reveal(r)) => verified.count(u, &r),
                    other => panic!("client {u}: {other:?}"),
                }
            }
            let verified = verified.counts;
            // The leak of the unsigned protocol: t verified shares of both secrets.
            assert!(
                verified[&SecretKind::SelfMask] >= t && verified[&SecretKind::MaskKey] >= t,
                "{verified:?}"
            );
        } else {
            let mut signatures = BTreeMap::new();
            for (&u, peer) in peers.iter_mut() {
                match answer(peer).await {
                    Answer::Stage(StageMessage::Endorse(s)) => signatures.insert(u, s),
                    other => panic!("client {u}: {other:?}"),
                };
            }
            // The server's clients sign both sets.
            let mut sybil_signatures = Vec::new();
            for (&id, [a, b]) in sybils.iter_mut() {
                sybil_signatures.push((id, everyone.clone(), a.endorse(&everyone).unwrap()));
                sybil_signatures.push((id, without.clone(), b.endorse(&without).unwrap()));
            }
            for (&u, peer) in peers.iter() {
                // Each gets the signatures over the set it was told.
                let forwarded: Vec<(u64, [u8; 64])> = (signatures.iter())
                    .filter(|&(&v, _)| v != u && told(v) == told(u))
                    .map(|(&v, &s)| (v, s))
                    .chain(
                        (sybil_signatures.iter())
                            .filter(|(_, set, _)| *set == told(u))
                            .map(|(id, _, s)| (*id, *s)),
                    )
                    .collect();
                send_stage(peer, &ServerStage::Endorsements(forwarded)).await;
            }
            for (u, peer) in peers.iter_mut() {
                match answer(peer).await {
                    Answer::Failed(reason) => {
                        assert!(reason.contains("signed the survivor set"), "{reason}")
                    }
                    other => panic!("client {u} answered {other:?}"),
                }
            }
        }
        shut_down(&mut setup, &peers).await;
    }
}
