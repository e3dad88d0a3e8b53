//! The signed round (the malicious-server variant) in memory: honest rounds stay exact, and each
//! attack of a server that deviates from the protocol is refused by the honest clients before
//! they share or reveal what it needs. The server here is the test, free to send anything.

use super::tests::tag;
use super::*;
use crate::task::TaskDigest;
use fl_authority::Authority;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A federation authority and what it certified.
struct Federation {
    authority: Authority,
    verifier: Arc<Verifier>,
}

impl Federation {
    fn new() -> Self {
        let authority = Authority::generate().unwrap();
        let verifier = Arc::new(Verifier::new(authority.public(), None).unwrap());
        Self {
            authority,
            verifier,
        }
    }

    /// The credentials of a client certified as `name`.
    fn credentials(&self, name: &str) -> Arc<Credentials> {
        let identity = fl_authority::Identity::generate().unwrap();
        let certificate = self.authority.certify(name, &identity.public()).unwrap();
        let verifier = (*self.verifier).clone();
        Arc::new(Credentials::new(identity, certificate, verifier).unwrap())
    }

    /// Client `id`, certified as `site-{id}`, in the round `tag`.
    fn client(&self, tag: RoundTag, id: u64, rng: &mut StdRng) -> ClientRound {
        let credentials = self.credentials(&format!("site-{id}"));
        ClientRound::new((tag, id), ring(), Some(credentials), rng)
    }

    fn setup(&self, graph: GraphKind) -> RoundSetup {
        RoundSetup {
            verifier: Some(self.verifier.clone()),
            threshold_fraction: 0.5,
            ..super::tests::setup(1, ring(), 8, graph)
        }
    }
}

fn ring() -> Ring {
    Ring::new(32).unwrap()
}

/// The neighbourhood an honest server sends each client, built without checking anything (as
/// a deviating server may send it): U1 with names, the derived graph and threshold `t`.
fn hoods(
    tag: &RoundTag,
    adverts: &[AdvertisedKeys],
    kind: GraphKind,
    t: usize,
) -> BTreeMap<u64, Neighbourhood> {
    let members: Vec<Member> = (adverts.iter())
        .map(|a| Member::of(a, a.signed.as_ref().map(|s| s.certificate.name.clone())))
        .collect();
    let graph = derive_graph(tag, kind, &members);
    let keys: BTreeMap<u64, &AdvertisedKeys> = adverts.iter().map(|a| (a.client, a)).collect();
    (graph.into_iter())
        .map(|(u, ns)| {
            let hood = Neighbourhood {
                threshold: t,
                members: members.clone(),
                neighbours: ns.iter().map(|v| keys[v].clone()).collect(),
            };
            (u, hood)
        })
        .collect()
}

/// A whole signed round through the server's phases over `n` clients (input (u, ..., u)), the
/// clients in `dropped` leaving after sharing; the result.
fn signed_round(n: u64, graph: GraphKind, dropped: &[u64]) -> Result<RoundResult, SecAggError> {
    let mut rng = StdRng::seed_from_u64(5);
    let fed = Federation::new();
    let mut clients: BTreeMap<u64, ClientRound> = (1..=n)
        .map(|u| (u, fed.client(tag(1), u, &mut rng)))
        .collect();
    let mut keys = AdvertiseKeys::new(fed.setup(graph), 1..=n);
    for (&u, c) in &clients {
        keys.receive_keys(u, c.advertise())?;
    }
    let (mut shares, hoods) = keys.close()?;
    for (u, hood) in hoods {
        shares.receive_shares(u, clients.get_mut(&u).unwrap().share_keys(hood, &mut rng)?)?;
    }
    let (mut check, inboxes) = shares.close()?;
    for (u, inbox) in inboxes {
        check.receive_check(u, clients.get_mut(&u).unwrap().check_shares(&inbox)?)?;
    }
    let (mut masked, checked) = check.close()?;
    for (u, proceed) in checked.proceed {
        let y = clients
            .get_mut(&u)
            .unwrap()
            .masked_input(&proceed, &[u; 8])?;
        if !dropped.contains(&u) {
            masked.receive_masked(u, &y)?;
        }
    }
    let (unmasking, survivors) = masked.close()?;
    let mut consistency = Consistency::new(unmasking);
    for &u in &survivors {
        consistency.receive_signature(u, clients.get_mut(&u).unwrap().endorse(&survivors)?)?;
    }
    let (mut unmasking, forwarded) = consistency.close()?;
    for (u, signatures) in forwarded {
        let reveals = clients.get_mut(&u).unwrap().reveal_endorsed(&signatures)?;
        unmasking.receive_reveal(u, reveals)?;
    }
    unmasking.finish()
}

/// With the protections on, rounds stay exact, with and without dropouts, on both graphs.
#[test]
fn signed_rounds_are_exact_under_dropouts() {
    for (n, graph, dropped) in [
        (8, GraphKind::Complete, vec![]),
        (8, GraphKind::Complete, vec![3]),
        (12, GraphKind::Regular(6), vec![]),
        (12, GraphKind::Regular(6), vec![5]),
    ] {
        let result = signed_round(n, graph, &dropped).unwrap();
        let survivors: Vec<u64> = (1..=n).filter(|u| !dropped.contains(u)).collect();
        let mut expected = vec![0u64; 8];
        survivors
            .iter()
            .for_each(|&u| ring().add_assign(&mut expected, &[u; 8]));
        assert_eq!(result.survivors, survivors);
        assert_eq!(
            result.sum, expected,
            "{n} clients, {graph:?}, {dropped:?} dropped"
        );
        assert_eq!(result.dropouts_recovered, dropped.len());
    }
}

/// Five certified clients of round 1 and their adverts.
fn five(fed: &Federation, rng: &mut StdRng) -> (BTreeMap<u64, ClientRound>, Vec<AdvertisedKeys>) {
    let clients: BTreeMap<u64, ClientRound> =
        (1..=5).map(|u| (u, fed.client(tag(1), u, rng))).collect();
    let adverts = clients.values().map(ClientRound::advertise).collect();
    (clients, adverts)
}

/// Key substitution: the server puts its own keys in client 2's advert (keeping or forging the
/// signature, or certifying its key with an authority of its own); client 1 refuses before it
/// shares anything.
#[test]
fn a_substituted_key_is_refused_before_any_share() {
    let mut rng = StdRng::seed_from_u64(6);
    let fed = Federation::new();
    let (mut clients, adverts) = five(&fed, &mut rng);
    let server_keys = KeyPair::generate(&mut rng).public.to_bytes();
    let rogue = Federation::new();
    let mut swapped = adverts.clone();
    swapped[1].mask_public = server_keys;
    let mut minted = ClientRound::new(
        (tag(1), 2),
        ring(),
        Some(rogue.credentials("site-2")),
        &mut rng,
    )
    .advertise();
    minted.mask_public = server_keys;
    let mut unsigned = adverts.clone();
    unsigned[1].signed = None;
    for (what, attack) in [("swapped", swapped), ("unsigned", unsigned)] {
        let hood = hoods(&tag(1), &attack, GraphKind::Complete, 3)
            .remove(&1)
            .unwrap();
        let refused = clients.get_mut(&1).unwrap().share_keys(hood, &mut rng);
        assert!(
            matches!(refused, Err(SecAggError::Unauthenticated { client: 2, .. })),
            "{what}: {refused:?}"
        );
    }
    let mut with_minted = adverts.clone();
    with_minted[1] = minted;
    let hood = hoods(&tag(1), &with_minted, GraphKind::Complete, 3)
        .remove(&3)
        .unwrap();
    let refused = clients.get_mut(&3).unwrap().share_keys(hood, &mut rng);
    assert!(
        matches!(refused, Err(SecAggError::Unauthenticated { client: 2, .. })),
        "{refused:?}"
    );
}

/// Model inconsistency: client 1 was sent another model (another H(task)) than the others; its
/// neighbours' signatures do not verify for its task, nor its for theirs: nobody shares.
#[test]
fn clients_sent_different_models_refuse_each_other() {
    let mut rng = StdRng::seed_from_u64(7);
    let fed = Federation::new();
    let crafted = RoundTag {
        digest: TaskDigest([0xee; 32]),
        ..tag(1)
    };
    let mut clients: BTreeMap<u64, ClientRound> = (1..=5)
        .map(|u| {
            (
                u,
                fed.client(if u == 1 { crafted } else { tag(1) }, u, &mut rng),
            )
        })
        .collect();
    let adverts: Vec<AdvertisedKeys> = clients.values().map(ClientRound::advertise).collect();
    for (u, hood) in hoods(&tag(1), &adverts, GraphKind::Complete, 3) {
        let refused = clients.get_mut(&u).unwrap().share_keys(hood, &mut rng);
        assert!(
            matches!(
                refused,
                Err(SecAggError::Unauthenticated { .. }) | Err(SecAggError::Refused(_))
            ),
            "client {u}: {refused:?}"
        );
    }
    // An unsigned round binds the task too: the pair seeds differ, so the masks cannot cancel.
    let (a, b) = (KeyPair::generate(&mut rng), KeyPair::generate(&mut rng));
    let ours = pair_seed(&tag(1), 1, &a.secret, 2, &b.public).unwrap();
    assert_ne!(
        ours,
        pair_seed(&crafted, 2, &b.secret, 1, &a.public).unwrap()
    );
}

/// Isolation by graph choice: the server hands client 1 neighbours other than the derived ones;
/// client 1 refuses. Fabricated clients: a certificate the authority did not sign, or revoked.
#[test]
fn a_chosen_neighbour_set_and_fabricated_or_revoked_clients_are_refused() {
    let mut rng = StdRng::seed_from_u64(8);
    let fed = Federation::new();
    let mut clients: BTreeMap<u64, ClientRound> = (1..=12)
        .map(|u| (u, fed.client(tag(1), u, &mut rng)))
        .collect();
    let adverts: Vec<AdvertisedKeys> = clients.values().map(ClientRound::advertise).collect();
    let mut hood = hoods(&tag(1), &adverts, GraphKind::Regular(4), 3)
        .remove(&1)
        .unwrap();
    let stranger = (2..=12u64)
        .find(|v| hood.neighbours.iter().all(|k| k.client != *v))
        .unwrap();
    hood.neighbours[0] = adverts[stranger as usize - 1].clone();
    let refused = clients.get_mut(&1).unwrap().share_keys(hood, &mut rng);
    assert!(
        matches!(&refused, Err(SecAggError::Refused(m)) if m.contains("derived")),
        "{refused:?}"
    );

    let rogue = Federation::new();
    let revoked = fed
        .authority
        .revocations(1, ["site-2".to_string()].into())
        .unwrap();
    let strict = Verifier::new(fed.authority.public(), Some(revoked)).unwrap();
    let identity = fl_authority::Identity::generate().unwrap();
    let certificate = fed.authority.certify("site-9", &identity.public()).unwrap();
    let watcher = Arc::new(Credentials::new(identity, certificate, strict).unwrap());
    let mut checking = ClientRound::new((tag(1), 9), ring(), Some(watcher), &mut rng);
    let mut with_revoked: Vec<AdvertisedKeys> = adverts[1..5].to_vec();
    with_revoked.push(checking.advertise());
    let hood = hoods(&tag(1), &with_revoked, GraphKind::Complete, 4)
        .remove(&9)
        .unwrap();
    let refused = checking.share_keys(hood, &mut rng);
    assert!(
        matches!(&refused, Err(SecAggError::Unauthenticated { client: 2, reason }) if reason.contains("revoked")),
        "{refused:?}"
    );

    let fabricated = ClientRound::new(
        (tag(1), 7),
        ring(),
        Some(rogue.credentials("site-7")),
        &mut rng,
    );
    let mut with_fabricated = adverts[..5].to_vec();
    with_fabricated.push(fabricated.advertise());
    let hood = hoods(&tag(1), &with_fabricated, GraphKind::Complete, 4)
        .remove(&1)
        .unwrap();
    let refused = clients.get_mut(&1).unwrap().share_keys(hood, &mut rng);
    assert!(
        matches!(refused, Err(SecAggError::Unauthenticated { client: 7, .. })),
        "{refused:?}"
    );
}

/// The dropout claims of the attack below: clients 1, 2, 3 are told U3 = S (client 1 survived),
/// 4 and 5 that client 1 dropped; 6 and 7 are the server's (certified, compromised).
fn claimed(u: u64) -> Vec<u64> {
    match u {
        1..=3 => (1..=7).collect(),
        _ => (2..=7).collect(),
    }
}

/// Seven clients through the masked input, `signed` or not, t = `t` on the complete graph: the
/// clients and, signed, the credentials of each.
fn masked_seven(
    signed: bool,
    t: usize,
    rng: &mut StdRng,
) -> (BTreeMap<u64, ClientRound>, BTreeMap<u64, Arc<Credentials>>) {
    let fed = Federation::new();
    let credentials: BTreeMap<u64, Arc<Credentials>> = match signed {
        true => (1..=7)
            .map(|u| (u, fed.credentials(&format!("site-{u}"))))
            .collect(),
        false => BTreeMap::new(),
    };
    let mut clients: BTreeMap<u64, ClientRound> = (1..=7)
        .map(|u| {
            let c = credentials.get(&u).cloned();
            (u, ClientRound::new((tag(1), u), ring(), c, rng))
        })
        .collect();
    let adverts: Vec<AdvertisedKeys> = clients.values().map(ClientRound::advertise).collect();
    let mut sealed = Vec::new();
    for (u, hood) in hoods(&tag(1), &adverts, GraphKind::Complete, t) {
        sealed.extend(clients.get_mut(&u).unwrap().share_keys(hood, rng).unwrap());
    }
    for (&u, c) in clients.iter_mut() {
        let inbox: Vec<SealedShares> = sealed.iter().filter(|s| s.to == u).cloned().collect();
        assert!(c.check_shares(&inbox).unwrap().is_empty());
        c.masked_input(&Proceed::default(), &[u; 8]).unwrap();
    }
    (clients, credentials)
}

/// Inconsistent dropout claims (Bonawitz et al. 2017, Sec. 6), with two of client 1's six
/// neighbours the server's. Unsigned (t = 4, a majority), honest clients told different survivor
/// sets reveal both of client 1's secrets: the server recovers b_1 and s_sk_1 and so client 1's
/// input. Signed (t = 5 > 2k/3), every honest client signs the set it was told, finds fewer than
/// t neighbours that signed the same one, and reveals nothing; signatures over the other set
/// do not verify.
#[test]
fn inconsistent_dropout_claims_get_no_reveal_in_a_signed_round() {
    let mut rng = StdRng::seed_from_u64(9);
    // Unsigned: the attack works.
    let (mut clients, _) = masked_seven(false, 4, &mut rng);
    let (mut self_mask, mut mask_key) = (Vec::new(), Vec::new());
    for u in 2..=5 {
        for r in clients.get_mut(&u).unwrap().unmask(&claimed(u)).unwrap() {
            match (r.owner, r.kind) {
                (1, SecretKind::SelfMask) => self_mask.push(r.share),
                (1, SecretKind::MaskKey) => mask_key.push(r.share),
                _ => {}
            }
        }
    }
    for sybil in [6, 7] {
        let (key, mask) = clients[&sybil].held_shares(1).unwrap();
        mask_key.push(key);
        self_mask.push(mask);
    }
    assert_eq!((self_mask.len(), mask_key.len()), (4, 4));
    let recovered = KeyPair::from_secret(shamir::combine(&mask_key, 4).unwrap());
    assert_eq!(
        recovered.public.to_bytes(),
        clients[&1].advertise().mask_public,
        "the unsigned round gave the server client 1's mask key"
    );
    shamir::combine(&self_mask, 4).unwrap();

    // Signed: a majority threshold is refused, and at t = 5 nobody reveals.
    let fed = Federation::new();
    let mut lone = fed.client(tag(1), 1, &mut rng);
    let peers: Vec<AdvertisedKeys> = (2..=7)
        .map(|u| fed.client(tag(1), u, &mut rng).advertise())
        .chain([lone.advertise()])
        .collect();
    let hood = hoods(&tag(1), &peers, GraphKind::Complete, 4)
        .remove(&1)
        .unwrap();
    assert!(
        matches!(lone.share_keys(hood, &mut rng), Err(SecAggError::Refused(m)) if m.contains("2n/3"))
    );
    let (mut clients, credentials) = masked_seven(true, 5, &mut rng);
    let signatures: BTreeMap<u64, [u8; 64]> = (clients.iter_mut())
        .map(|(&u, c)| (u, c.endorse(&claimed(u)).unwrap()))
        .collect();
    // A client signs once: a second survivor set is refused, and the refusal names it.
    let twice = clients
        .get_mut(&1)
        .unwrap()
        .endorse(&claimed(1))
        .unwrap_err();
    assert_eq!(
        twice.to_string(),
        "round 1: a survivors message arrived while this client is at consistency"
    );
    // The server's clients sign whatever it asks: here the set each victim was told.
    let members: Vec<Member> = (clients.values())
        .map(|c| {
            Member::of(
                &c.advertise(),
                Some(format!("site-{}", c.advertise().client)),
            )
        })
        .collect();
    let h_u1 = members_digest(&tag(1), &members);
    let sybil_signature = |sybil: u64, set: &[u64]| {
        let payload = survivors_payload(&tag(1), &h_u1, set);
        (sybil, credentials[&sybil].identity.sign(&payload))
    };
    for u in 1..=5 {
        let same_set: Endorsements = (signatures.iter())
            .filter(|&(&v, _)| v != u && v <= 5 && claimed(v) == claimed(u))
            .map(|(&v, &s)| (v, s))
            .chain([6, 7].map(|sybil| sybil_signature(sybil, &claimed(u))))
            .collect();
        let everyone: Endorsements = (signatures.iter())
            .filter(|&(&v, _)| v != u)
            .map(|(&v, &s)| (v, s))
            .collect();
        assert_eq!(same_set.len(), if u <= 3 { 4 } else { 3 });
        for forwarded in [same_set, everyone] {
            let c = clients.get_mut(&u).unwrap();
            let refused = c.reveal_endorsed(&forwarded);
            assert!(
                matches!(
                    refused,
                    Err(SecAggError::Refused(_)) | Err(SecAggError::Unauthenticated { .. })
                ),
                "client {u} revealed: {refused:?}"
            );
        }
    }
}

/// A certificate that verified once is remembered whole: its signature on another name or key
/// is refused, before and after the genuine one was seen.
#[test]
fn a_remembered_certificate_lends_its_signature_to_no_other() {
    let fed = Federation::new();
    let identity = fl_authority::Identity::generate().unwrap();
    let genuine = fed.authority.certify("site-1", &identity.public()).unwrap();
    let renamed = fl_authority::IdentityCertificate {
        name: "site-2".into(),
        ..genuine.clone()
    };
    let rekeyed = fl_authority::IdentityCertificate {
        identity: fl_authority::Identity::generate().unwrap().public(),
        ..genuine.clone()
    };
    for _ in 0..2 {
        fed.verifier.check_certificate(&genuine).unwrap();
        assert!(fed.verifier.check_certificate(&renamed).is_err());
        assert!(fed.verifier.check_certificate(&rekeyed).is_err());
    }
    // Revocation is checked every time, remembered or not.
    let list = fed
        .authority
        .revocations(1, ["site-1".to_string()].into())
        .unwrap();
    let strict = Verifier::new(fed.authority.public(), Some(list)).unwrap();
    for _ in 0..2 {
        strict.check_certificate(&genuine).unwrap_err();
    }
}

/// One attempt of a signed round of 5 clients with the given `credentials` (same names, ids
/// and task every time), run to the survivors' signatures: the clients and what each signed.
fn attempt_to_consistency(
    credentials: &BTreeMap<u64, Arc<Credentials>>,
    rng: &mut StdRng,
) -> (BTreeMap<u64, ClientRound>, BTreeMap<u64, [u8; 64]>) {
    let mut clients: BTreeMap<u64, ClientRound> = (credentials.iter())
        .map(|(&u, c)| {
            (
                u,
                ClientRound::new((tag(1), u), ring(), Some(c.clone()), rng),
            )
        })
        .collect();
    let adverts: Vec<AdvertisedKeys> = clients.values().map(ClientRound::advertise).collect();
    let mut sealed = Vec::new();
    for (u, hood) in hoods(&tag(1), &adverts, GraphKind::Complete, 3) {
        sealed.extend(clients.get_mut(&u).unwrap().share_keys(hood, rng).unwrap());
    }
    let survivors: Vec<u64> = clients.keys().copied().collect();
    let mut signatures = BTreeMap::new();
    for (&u, c) in clients.iter_mut() {
        let inbox: Vec<SealedShares> = sealed.iter().filter(|s| s.to == u).cloned().collect();
        assert!(c.check_shares(&inbox).unwrap().is_empty());
        c.masked_input(&Proceed::default(), &[u; 8]).unwrap();
        signatures.insert(u, c.endorse(&survivors).unwrap());
    }
    (clients, signatures)
}

/// A round run again with the same ids, names, round and task (a server re-running it, or a
/// client that lost its memory of the first attempt): the first attempt's survivor-set
/// signatures do not verify in the second, because what survivors sign binds the attempt's
/// key transcript, fresh in each attempt. The second attempt's own signatures do.
#[test]
fn endorsements_of_one_attempt_do_not_verify_in_another() {
    let mut rng = StdRng::seed_from_u64(11);
    let fed = Federation::new();
    let credentials: BTreeMap<u64, Arc<Credentials>> = (1..=5)
        .map(|u| (u, fed.credentials(&format!("site-{u}"))))
        .collect();
    let (_, first) = attempt_to_consistency(&credentials, &mut rng);
    let (mut clients, second) = attempt_to_consistency(&credentials, &mut rng);
    let others = |signed: &BTreeMap<u64, [u8; 64]>| -> Endorsements {
        (signed.iter())
            .filter(|&(&v, _)| v != 1)
            .map(|(&v, &s)| (v, s))
            .collect()
    };
    let mut replayed = clients.remove(&1).unwrap();
    let refused = replayed.reveal_endorsed(&others(&first));
    assert!(
        matches!(refused, Err(SecAggError::Unauthenticated { .. })),
        "{refused:?}"
    );
    let honest = clients.get_mut(&2).unwrap();
    let fresh: Endorsements = (second.iter())
        .filter(|&(&v, _)| v != 2)
        .map(|(&v, &s)| (v, s))
        .collect();
    assert_eq!(honest.reveal_endorsed(&fresh).unwrap().len(), 4);
}
