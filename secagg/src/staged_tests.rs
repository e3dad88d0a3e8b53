//! Protocol tests from a staged round: a round stopped at one of the server's phases, then fed
//! forged, misaddressed, stale or refused messages; the sum stays exact or the message is refused.

use super::tests::{setup, tag};
use super::*;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::BTreeMap;

/// A 5-client round driven to one of the server's phases, with everything needed to tamper
/// with it.
struct Staged<P> {
    server: P,
    clients: BTreeMap<u64, ClientRound>,
    inbox: BTreeMap<u64, Vec<SealedShares>>,
    sealed: BTreeMap<u64, Vec<SealedShares>>,
    proceed: BTreeMap<u64, Proceed>,
    rng: StdRng,
}

impl<P> Staged<P> {
    /// The server's phase, and the rest of the round.
    fn take(self) -> (P, Staged<()>) {
        let rest = Staged {
            server: (),
            clients: self.clients,
            inbox: self.inbox,
            sealed: self.sealed,
            proceed: self.proceed,
            rng: self.rng,
        };
        (self.server, rest)
    }

    /// The same round, at the server's next phase `server`.
    fn at<Q>(self, server: Q) -> Staged<Q> {
        Staged {
            server,
            clients: self.clients,
            inbox: self.inbox,
            sealed: self.sealed,
            proceed: self.proceed,
            rng: self.rng,
        }
    }
}

/// The round in ShareKeys: every client has sealed its shares, none is sent yet.
fn staged_shares() -> Staged<ShareKeys> {
    let ring = Ring::new(32).unwrap();
    let mut rng = StdRng::seed_from_u64(21);
    let ids = [1u64, 2, 3, 4, 5];
    let mut keys = AdvertiseKeys::new(setup(4, ring, 8, GraphKind::Complete), ids);
    let mut clients: BTreeMap<u64, ClientRound> = ids
        .iter()
        .map(|&u| (u, ClientRound::new((tag(4), u), ring, None, &mut rng)))
        .collect();
    for (&u, c) in &clients {
        keys.receive_keys(u, c.advertise()).unwrap();
    }
    let (server, hoods) = keys.close().unwrap();
    let mut sealed = BTreeMap::new();
    for (&u, c) in clients.iter_mut() {
        sealed.insert(u, c.share_keys(hoods[&u].clone(), &mut rng).unwrap());
    }
    Staged {
        server,
        clients,
        inbox: BTreeMap::new(),
        sealed,
        proceed: BTreeMap::new(),
        rng,
    }
}

/// The round in CheckShares: every inbox delivered, no check sent yet.
fn staged_check() -> Staged<CheckShares> {
    let mut st = staged_shares();
    for (&u, s) in &st.sealed {
        st.server.receive_shares(u, s.clone()).unwrap();
    }
    let (shares, rest) = st.take();
    let (server, inbox) = shares.close().unwrap();
    Staged { inbox, ..rest }.at(server)
}

/// The round in MaskedInput: every check answered, no masked input sent yet.
fn staged_masked() -> Staged<MaskedInput> {
    let mut st = staged_check();
    for (&u, c) in st.clients.iter_mut() {
        let refused = c.check_shares(&st.inbox[&u]).unwrap();
        st.server.receive_check(u, refused).unwrap();
    }
    let (check, rest) = st.take();
    let (server, checked) = check.close().unwrap();
    let proceed = checked.proceed;
    Staged { proceed, ..rest }.at(server)
}

/// The round in MaskedInput with clients 1 to 4's masked inputs taken (client 5 silent).
fn staged_unmasking() -> Staged<MaskedInput> {
    let mut st = staged_masked();
    let proceed = st.proceed.clone();
    send_masked(&mut st, &proceed, &[1, 2, 3, 4]);
    st
}

/// Each of `ids` masks its input (u, ..., u) as `proceed` says, and the server takes it.
fn send_masked(st: &mut Staged<MaskedInput>, proceed: &BTreeMap<u64, Proceed>, ids: &[u64]) {
    for &u in ids {
        let client = st.clients.get_mut(&u).unwrap();
        let y = client.masked_input(&proceed[&u], &[u; 8]).unwrap();
        st.server.receive_masked(u, &y).unwrap();
    }
}

/// The round after the masked-input stage: every survivor reveals; the result.
fn unmask_all(st: Staged<MaskedInput>) -> Result<RoundResult, SecAggError> {
    let mut clients = st.clients;
    let (mut unmasking, survivors) = st.server.close()?;
    for &u in &survivors {
        let reveals = clients.get_mut(&u).unwrap().unmask(&survivors)?;
        unmasking.receive_reveal(u, reveals)?;
    }
    unmasking.finish()
}

/// sum_{u in ids} (u, u, ..., u) over 8 coordinates of Z_2^32.
fn sum_of(ids: &[u64]) -> Vec<u64> {
    let ring = Ring::new(32).unwrap();
    let mut expected = vec![0u64; 8];
    for &u in ids {
        ring.add_assign(&mut expected, &[u; 8]);
    }
    expected
}

/// A client whose every share is garbage is excluded at the check (nobody masks with it, its
/// masked input is refused) and the others' sum comes out exact.
#[test]
fn a_client_whose_shares_do_not_open_is_excluded_and_the_sum_stays_exact() {
    let mut st = staged_check();
    for (&u, c) in st.clients.iter_mut() {
        let mut inbox = st.inbox[&u].clone();
        for s in inbox.iter_mut().filter(|s| s.from == 5) {
            s.ciphertext.iter_mut().for_each(|b| *b ^= 0x5a);
        }
        let refused = c.check_shares(&inbox).unwrap();
        assert_eq!(refused, if u == 5 { vec![] } else { vec![5] });
        st.server.receive_check(u, refused).unwrap();
    }
    let (check, rest) = st.take();
    let (masked, checked) = check.close().unwrap();
    let (proceed, excluded) = (checked.proceed, checked.excluded);
    let mut st = rest.at(masked);
    assert_eq!(excluded.iter().copied().collect::<Vec<_>>(), vec![5]);
    assert!(!proceed.contains_key(&5));
    assert_eq!(proceed[&1].excluded, vec![5]);
    assert!(matches!(
        st.server.receive_masked(5, &[0; 8]),
        Err(SecAggError::NotParticipant(5))
    ));
    send_masked(&mut st, &proceed, &[1, 2, 3, 4]);
    let result = unmask_all(st).unwrap();
    assert_eq!(result.survivors, vec![1, 2, 3, 4]);
    assert_eq!(result.sum, sum_of(&[1, 2, 3, 4]));
}

/// One refused pair (client 2 says it cannot open client 4's shares, rightly or not): neither
/// masks with the other, both stay, and the sum stays exact, with and without a dropout.
#[test]
fn a_refused_pair_goes_unmasked_and_the_sum_stays_exact() {
    for dropout in [None, Some(4u64), Some(2)] {
        let mut st = staged_check();
        for (&u, c) in st.clients.iter_mut() {
            let mut inbox = st.inbox[&u].clone();
            if u == 2 {
                let s = inbox.iter_mut().find(|s| s.from == 4).unwrap();
                s.ciphertext[0] ^= 1;
            }
            let refused = c.check_shares(&inbox).unwrap();
            st.server.receive_check(u, refused).unwrap();
        }
        let (check, rest) = st.take();
        let (masked, checked) = check.close().unwrap();
        let (proceed, excluded) = (checked.proceed, checked.excluded);
        let mut st = rest.at(masked);
        assert!(excluded.is_empty());
        assert_eq!(
            (proceed[&4].unpaired.clone(), proceed[&2].unpaired.clone()),
            (vec![2], vec![])
        );
        let alive: Vec<u64> = (1..=5u64).filter(|&u| Some(u) != dropout).collect();
        send_masked(&mut st, &proceed, &alive);
        let result = unmask_all(st).unwrap();
        assert_eq!(result.sum, sum_of(&alive), "dropout {dropout:?}");
    }
}

/// One client refuses every neighbour while the others' holder counts sit at the threshold
/// (client 5 shared nothing: each of 1..4 has k = 3 holders, t = 3). Its refusals are ignored:
/// no honest client is excluded, nobody leaves a pair unmasked, and the sum is exact (taken
/// without proof, the refusals once excluded clients 2, 3 and 4 and aborted the round).
#[test]
fn one_client_refusing_every_neighbour_excludes_no_honest_client() {
    let mut st = staged_shares();
    for (&u, s) in &st.sealed {
        if u != 5 {
            st.server.receive_shares(u, s.clone()).unwrap();
        }
    }
    let (shares, rest) = st.take();
    let (server, inbox) = shares.close().unwrap();
    let mut st = Staged { inbox, ..rest }.at(server);
    st.clients.remove(&5);
    for (&u, c) in st.clients.iter_mut() {
        let mut refused = c.check_shares(&st.inbox[&u]).unwrap();
        if u == 1 {
            refused = vec![2, 3, 4];
        }
        st.server.receive_check(u, refused).unwrap();
    }
    let (check, rest) = st.take();
    let (masked, checked) = check.close().unwrap();
    assert!(checked.excluded.is_empty(), "{:?}", checked.excluded);
    assert!(checked.proceed.values().all(|p| p.unpaired.is_empty()));
    let mut st = rest.at(masked);
    let proceed = checked.proceed;
    send_masked(&mut st, &proceed, &[1, 2, 3, 4]);
    let result = unmask_all(st).unwrap();
    assert_eq!(result.survivors, vec![1, 2, 3, 4]);
    assert_eq!(result.sum, sum_of(&[1, 2, 3, 4]));
}

/// The client refuses to mask with fewer than t neighbours, whoever asks it to.
#[test]
fn a_client_will_not_mask_with_fewer_than_t_neighbours() {
    let mut st = staged_check();
    let c = st.clients.get_mut(&1).unwrap();
    c.check_shares(&st.inbox[&1]).unwrap();
    let proceed = Proceed {
        excluded: vec![2],
        unpaired: vec![3, 4],
    };
    assert!(matches!(
        c.masked_input(&proceed, &[0; 8]),
        Err(SecAggError::Refused(_))
    ));
}

#[test]
fn forged_and_misaddressed_shares_are_refused() {
    let mut st = staged_shares();
    // A share for a peer that is not a neighbour (nor anyone), and a share set missing a peer.
    let mut wrong = st.sealed[&1].clone();
    wrong[0].to = 99;
    assert!(matches!(
        st.server.receive_shares(1, wrong),
        Err(SecAggError::WrongRecipients { .. })
    ));
    let short = st.sealed[&1][1..].to_vec();
    assert!(matches!(
        st.server.receive_shares(1, short),
        Err(SecAggError::WrongRecipients { .. })
    ));
    let mut spoofed = st.sealed[&2].clone();
    spoofed[0].from = 3;
    assert!(matches!(
        st.server.receive_shares(2, spoofed),
        Err(SecAggError::WrongRecipients { .. })
    ));
    // A forged ciphertext is caught by the receiving client's AEAD: it refuses that sender.
    let mut st = staged_check();
    let mut inbox = st.inbox[&1].clone();
    inbox[0].ciphertext[3] ^= 0x40;
    let from = inbox[0].from;
    let c = st.clients.get_mut(&1).unwrap();
    assert_eq!(c.check_shares(&inbox), Ok(vec![from]));
    // A share delivered to the wrong client does not open either.
    let mut st = staged_check();
    let mut other: Vec<SealedShares> = st.inbox[&2].clone();
    other.retain(|s| s.from != 1);
    let c = st.clients.get_mut(&1).unwrap();
    assert_eq!(c.check_shares(&other), Ok(vec![3, 4, 5]));
    // The server refuses a check naming a client that sent no share, or one twice.
    let mut st = staged_check();
    assert!(matches!(
        st.server.receive_check(1, vec![1]),
        Err(SecAggError::BadCheck { .. })
    ));
    assert!(matches!(
        st.server.receive_check(1, vec![2, 2]),
        Err(SecAggError::BadCheck { .. })
    ));
}

#[test]
fn stale_replayed_and_malformed_stage_messages_are_refused() {
    let mut st = staged_unmasking();
    let keys = st.clients[&1].advertise();
    // A replayed stage-0 message during masking.
    assert!(matches!(
        st.server.receive(1, StageMessage::Keys(keys)),
        Err(SecAggError::WrongStage {
            expected: Stage::MaskedInput,
            ..
        })
    ));
    // A masked input twice, of the wrong length, or outside the ring.
    assert_eq!(
        st.server.receive_masked(1, &[0; 8]),
        Err(SecAggError::Duplicate(1))
    );
    assert!(matches!(
        st.server.receive_masked(5, &[0; 7]),
        Err(SecAggError::BadMaskedInput { .. })
    ));
    assert!(matches!(
        st.server.receive_masked(5, &[u64::MAX; 8]),
        Err(SecAggError::BadMaskedInput { .. })
    ));
    // Client 5 is then dropped: the sum of the four others must come out exact.
    let (mut unmasking, survivors) = st.server.close().unwrap();
    assert_eq!(survivors, vec![1, 2, 3, 4]);
    let mut reveals: BTreeMap<u64, Vec<RevealedShare>> = BTreeMap::new();
    for &u in &survivors {
        reveals.insert(
            u,
            st.clients.get_mut(&u).unwrap().unmask(&survivors).unwrap(),
        );
    }
    // A client answering the unmasking stage twice is refused by itself, naming the message,
    // and by the server.
    let again = st
        .clients
        .get_mut(&1)
        .unwrap()
        .unmask(&survivors)
        .unwrap_err();
    assert_eq!(
        again.to_string(),
        "round 4: a survivors message arrived while this client is at unmasking"
    );
    unmasking.receive_reveal(1, reveals[&1].clone()).unwrap();
    assert_eq!(
        unmasking.receive_reveal(1, reveals[&1].clone()),
        Err(SecAggError::Duplicate(1))
    );
    // A forged share, a share of the wrong secret, and a share claimed by the wrong holder.
    let mut forged = reveals[&2].clone();
    forged[0].share.y[0] ^= 1;
    assert!(matches!(
        unmasking.receive_reveal(2, forged),
        Err(SecAggError::ForgedShare { .. })
    ));
    let mut wrong_kind = reveals[&2].clone();
    let i = wrong_kind.iter().position(|r| r.owner == 5).unwrap();
    wrong_kind[i].kind = SecretKind::SelfMask;
    assert!(matches!(
        unmasking.receive_reveal(2, wrong_kind),
        Err(SecAggError::WrongReveal { .. })
    ));
    assert!(matches!(
        unmasking.receive_reveal(3, reveals[&2].clone()),
        Err(SecAggError::ForgedShare { .. })
    ));
    for u in [2, 3, 4] {
        unmasking.receive_reveal(u, reveals[&u].clone()).unwrap();
    }
    let result = unmasking.finish().unwrap();
    let ring = Ring::new(32).unwrap();
    let mut expected = vec![0u64; 8];
    for u in 1..=4u64 {
        ring.add_assign(&mut expected, &[u; 8]);
    }
    assert_eq!(result.sum, expected);
    assert_eq!(result.dropouts_recovered, 1);
}

/// The client refuses a survivor list that would expose it, and a threshold that a minority
/// could reach.
#[test]
fn clients_refuse_unsafe_server_requests() {
    let mut st = staged_masked();
    let c = st.clients.get_mut(&1).unwrap();
    let _ = c.masked_input(&st.proceed[&1], &[0; 8]).unwrap();
    assert!(matches!(c.unmask(&[2, 3, 4]), Err(SecAggError::Refused(_))));
    assert!(matches!(c.unmask(&[1, 2]), Err(SecAggError::Refused(_))));
    let ring = Ring::new(32).unwrap();
    let mut fresh = ClientRound::new((tag(1), 1), ring, None, &mut st.rng);
    let peers: Vec<AdvertisedKeys> = (2..6)
        .map(|u| ClientRound::new((tag(1), u), ring, None, &mut st.rng).advertise())
        .collect();
    let hood = Neighbourhood {
        threshold: 2,
        members: (1..6)
            .map(|id| Member {
                id,
                name: None,
                keys: [0; 32],
            })
            .collect(),
        neighbours: peers,
    };
    assert!(matches!(
        fresh.share_keys(hood, &mut st.rng),
        Err(SecAggError::Refused(_))
    ));
}

/// The server never gets both secrets of one client: across every survivor's reveal, each owner's
/// shares are all of b (it survived) or all of its mask key (it dropped), never a mix.
#[test]
fn no_client_has_both_secrets_revealed() {
    let mut st = staged_unmasking();
    let (_, survivors) = st.server.close().unwrap();
    let mut kinds: BTreeMap<u64, std::collections::BTreeSet<SecretKind>> = BTreeMap::new();
    for &u in &survivors {
        for r in st.clients.get_mut(&u).unwrap().unmask(&survivors).unwrap() {
            kinds.entry(r.owner).or_default().insert(r.kind);
        }
    }
    assert!(kinds.values().all(|k| k.len() == 1), "{kinds:?}");
    assert_eq!(kinds[&5].iter().next(), Some(&SecretKind::MaskKey));
    assert_eq!(kinds[&1].iter().next(), Some(&SecretKind::SelfMask));
}
