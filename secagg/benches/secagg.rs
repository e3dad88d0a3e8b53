//! Secure-aggregation costs for a 500,000-parameter model in Z_2^32: mask expansion throughput,
//! one client's whole round (share keys, open shares, mask, reveal) and the server's unmasking
//! (summing the masked inputs, checking the revealed shares, recovering the secrets and removing
//! every mask), for 100 and 1,000 clients on the complete graph and on the SecAgg+ k-regular graph.
//!
//! A client's round is measured from its neighbours' keys to its reveal (Shamir splitting, k
//! share encryptions, k openings, k + 1 mask expansions, the reveal); its own training is not
//! included. The neighbours' sealed shares are made in the untimed setup.
//!
//! `round_cost` times a whole round in memory (every client's keys, shares, check, masked input
//! and reveal, and the server's phases through the unmasked sum) with and without the
//! malicious-server protections (signed keys, certificates, the consistency check), side by
//! side: 100 clients on the complete graph and 220 (K = 1000, m = 220) on the k-regular graph,
//! for a model of 535,818 parameters (a little more than the 532,110 of configs/secagg-signed.toml's
//! MLP) and one of 100,000.
//! The signatures' cost does not grow with d, so the smaller model shows the larger ratio. All
//! clients run one after the other in one process: the times are the round's total work, not
//! its wall-clock time across machines.
//!
//! `verified_cost` sets a verified round (`fl_secagg::verified`) beside the signed secure round of
//! 100 clients on the complete graph, in one run per size (`verified_cost/d100000`,
//! `verified_cost/d535818`): one client's proof (clip, encode, prove, split and seal), the two
//! aggregators' checks of 10 uploads (the leader's preparation, the helper's, the leader's
//! decisions and sum), and at d = 100,000 the whole verified round of 100 clients (100 proofs and
//! the checks), all in one process as above. Each upload's proof and checks are independent of
//! the others', so a round of n costs n (proof + checks / 10); the measured round at d = 100,000
//! checks that sum.
//!
//! `cargo bench -p fl-secagg --bench secagg`; report medians with the machine's core count.

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use fl_authority::{Authority, Identity};
use fl_secagg::task::TaskDigest;
use fl_secagg::verified::{
    Binder, Helper, HelperKey, HelperPublicKey, LeaderRound, Report, Shape, shard,
};
use fl_secagg::{
    AdvertiseKeys, AdvertisedKeys, ClientRound, GraphKind, Member, Neighbourhood, Proceed, Ring,
    RoundSetup, RoundTag, SealedShares, Sign, Unmasking, apply_mask, auto_degree,
};
use fl_secagg::{Consistency, Credentials, Verifier};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;

/// d: parameters of the benchmark model.
const DIM: usize = 500_000;

fn ring() -> Ring {
    Ring::new(32).unwrap()
}

/// Round 1 of a task whose digest is all ones.
const TAG: RoundTag = RoundTag {
    round: 1,
    digest: TaskDigest([1; 32]),
};

/// A client of round 1, unsigned.
fn client(id: u64, rng: &mut StdRng) -> ClientRound {
    ClientRound::new((TAG, id), ring(), None, rng)
}

/// U1 of unsigned clients with these advertisements, in increasing order of id.
fn members<'a>(adverts: impl IntoIterator<Item = &'a AdvertisedKeys>) -> Vec<Member> {
    let mut members: Vec<Member> = adverts.into_iter().map(|a| Member::of(a, None)).collect();
    members.sort_by_key(|m| m.id);
    members
}

fn mask_expansion(c: &mut Criterion) {
    let mut group = c.benchmark_group("mask_expansion");
    group.throughput(Throughput::Bytes((DIM * 4) as u64));
    let mut acc = vec![0u64; DIM];
    group.bench_function("500k_elements_z2_32", |b| {
        b.iter(|| apply_mask(black_box(&mut acc), &[7u8; 32], ring(), Sign::Plus))
    });
    group.finish();
}

/// The shares `me` receives from `k` neighbours (each sealed by a neighbour that shares with `me`
/// and one other client, which costs the same for `me` to open as a full neighbourhood would).
fn inbox(me: &ClientRound, k: usize, rng: &mut StdRng) -> (Vec<AdvertisedKeys>, Vec<SealedShares>) {
    let other = client(1_000_000, rng).advertise();
    let mut adverts = Vec::with_capacity(k);
    let mut sealed = Vec::with_capacity(k);
    for v in 0..k as u64 {
        let mut peer = client(v + 1, rng);
        adverts.push(peer.advertise());
        let hood = Neighbourhood {
            threshold: 2,
            members: members([&me.advertise(), &peer.advertise(), &other]),
            neighbours: vec![me.advertise(), other.clone()],
        };
        let from_peer = peer.share_keys(hood, rng).unwrap();
        sealed.extend(from_peer.into_iter().filter(|s| s.to == 0));
    }
    (adverts, sealed)
}

fn client_round(c: &mut Criterion) {
    let mut group = c.benchmark_group("client_round_500k");
    group.sample_size(10);
    let x = vec![1u64; DIM];
    for (label, k) in [
        ("n100_complete_k99", 99),
        ("n100_regular_k20", auto_degree(100)),
        ("n1000_complete_k999", 999),
        ("n1000_regular_k30", auto_degree(1000)),
    ] {
        let t = k / 2 + 1;
        let mut setup_rng = StdRng::seed_from_u64(1);
        let mut rng = StdRng::seed_from_u64(2);
        let survivors: Vec<u64> = (0..=k as u64).collect();
        group.bench_function(label, |b| {
            b.iter_batched(
                || {
                    let me = client(0, &mut setup_rng);
                    let (adverts, sealed) = inbox(&me, k, &mut setup_rng);
                    (me, adverts, sealed)
                },
                |(mut me, adverts, sealed)| {
                    let own = me.advertise();
                    let hood = Neighbourhood {
                        threshold: t,
                        members: members(adverts.iter().chain([&own])),
                        neighbours: adverts,
                    };
                    black_box(me.share_keys(hood, &mut rng).unwrap());
                    black_box(me.check_shares(&sealed).unwrap());
                    black_box(me.masked_input(&Proceed::default(), &x).unwrap());
                    black_box(me.unmask(&survivors).unwrap())
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

/// A server round over `n` clients, advanced to the unmasking stage: every client's keys, shares
/// and (content-free but well-formed) masked input received; `dropped` of them sent no masked
/// input. Returns the server's unmasking phase and each survivor's reveal. Clients mask a 1-element input here: the
/// server's cost does not depend on what the masks are.
fn staged_server(
    n: usize,
    graph: GraphKind,
    dropped: usize,
) -> (Unmasking, BTreeMap<u64, Vec<fl_secagg::RevealedShare>>) {
    let mut rng = StdRng::seed_from_u64(3);
    let ids: Vec<u64> = (0..n as u64).collect();
    let setup = RoundSetup {
        tag: TAG,
        ring: ring(),
        dim: DIM,
        graph,
        threshold_fraction: 0.6,
        min_survivors: 3,
        verifier: None,
    };
    let mut keys = AdvertiseKeys::new(setup, ids.iter().copied());
    let mut clients: BTreeMap<u64, ClientRound> =
        ids.iter().map(|&u| (u, client(u, &mut rng))).collect();
    for (&u, c) in &clients {
        keys.receive_keys(u, c.advertise()).unwrap();
    }
    let (mut shares, hoods) = keys.close().unwrap();
    for (u, hood) in hoods {
        let sealed = clients
            .get_mut(&u)
            .unwrap()
            .share_keys(hood, &mut rng)
            .unwrap();
        shares.receive_shares(u, sealed).unwrap();
    }
    let y = vec![5u64; DIM];
    let (mut check, inboxes) = shares.close().unwrap();
    for (u, inbox) in inboxes {
        let refused = clients.get_mut(&u).unwrap().check_shares(&inbox).unwrap();
        check.receive_check(u, refused).unwrap();
    }
    let (mut masked, checked) = check.close().unwrap();
    for (u, proceed) in checked.proceed {
        clients
            .get_mut(&u)
            .unwrap()
            .masked_input(&proceed, &[0])
            .unwrap();
        if u >= dropped as u64 {
            masked.receive_masked(u, &y).unwrap();
        }
    }
    let (server, survivors) = masked.close().unwrap();
    let reveals = survivors
        .iter()
        .map(|&u| (u, clients.get_mut(&u).unwrap().unmask(&survivors).unwrap()))
        .collect();
    (server, reveals)
}

fn server_unmask(c: &mut Criterion) {
    let mut group = c.benchmark_group("server_unmask_500k");
    group.sample_size(10);
    for (label, n, graph, dropped) in [
        ("n100_complete_0pct", 100, GraphKind::Complete, 0),
        ("n100_complete_10pct", 100, GraphKind::Complete, 10),
        (
            "n100_regular_0pct",
            100,
            GraphKind::Regular(auto_degree(100)),
            0,
        ),
        (
            "n100_regular_10pct",
            100,
            GraphKind::Regular(auto_degree(100)),
            10,
        ),
        (
            "n1000_regular_0pct",
            1000,
            GraphKind::Regular(auto_degree(1000)),
            0,
        ),
        (
            "n1000_regular_10pct",
            1000,
            GraphKind::Regular(auto_degree(1000)),
            100,
        ),
        ("n1000_complete_0pct", 1000, GraphKind::Complete, 0),
    ] {
        let (server, reveals) = staged_server(n, graph, dropped);
        group.bench_function(label, |b| {
            b.iter_batched(
                || (server.clone(), reveals.clone()),
                |(mut s, reveals)| {
                    for (u, r) in reveals {
                        s.receive_reveal(u, r).unwrap();
                    }
                    black_box(s.finish().unwrap())
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

/// One whole round over clients 0..n (`credentials[u]` signs for u in a signed round): every
/// client's and the server's work, in one thread after the other; returns the unmasked sum.
fn whole_round(
    (n, dim): (u64, usize),
    graph: GraphKind,
    credentials: &[Option<Arc<Credentials>>],
) -> Vec<u64> {
    let mut rng = StdRng::from_os_rng();
    let verifier = (credentials[0].as_ref()).map(|c| Arc::new(c.verifier.clone()));
    let setup = RoundSetup {
        tag: TAG,
        ring: ring(),
        dim,
        graph,
        threshold_fraction: 0.6,
        min_survivors: 3,
        verifier: verifier.clone(),
    };
    let mut clients: BTreeMap<u64, ClientRound> = (0..n)
        .map(|u| {
            let c = credentials[u as usize].clone();
            (u, ClientRound::new((TAG, u), ring(), c, &mut rng))
        })
        .collect();
    let mut keys = AdvertiseKeys::new(setup, 0..n);
    for (&u, c) in &clients {
        keys.receive_keys(u, c.advertise()).unwrap();
    }
    let (mut shares, hoods) = keys.close().unwrap();
    for (u, hood) in hoods {
        let sealed = clients.get_mut(&u).unwrap().share_keys(hood, &mut rng);
        shares.receive_shares(u, sealed.unwrap()).unwrap();
    }
    let (mut check, inboxes) = shares.close().unwrap();
    for (u, inbox) in inboxes {
        let refused = clients.get_mut(&u).unwrap().check_shares(&inbox).unwrap();
        check.receive_check(u, refused).unwrap();
    }
    let (mut masked, checked) = check.close().unwrap();
    let x = vec![1u64; dim];
    for (u, proceed) in checked.proceed {
        let y = clients
            .get_mut(&u)
            .unwrap()
            .masked_input(&proceed, &x)
            .unwrap();
        masked.receive_masked(u, &y).unwrap();
    }
    let (mut unmasking, survivors) = masked.close().unwrap();
    if verifier.is_some() {
        let mut consistency = Consistency::new(unmasking);
        for &u in &survivors {
            let signature = clients.get_mut(&u).unwrap().endorse(&survivors).unwrap();
            consistency.receive_signature(u, signature).unwrap();
        }
        let (next, forwarded) = consistency.close().unwrap();
        unmasking = next;
        for (u, signatures) in forwarded {
            let reveals = clients.get_mut(&u).unwrap().reveal_endorsed(&signatures);
            unmasking.receive_reveal(u, reveals.unwrap()).unwrap();
        }
    } else {
        for &u in &survivors {
            let reveals = clients.get_mut(&u).unwrap().unmask(&survivors).unwrap();
            unmasking.receive_reveal(u, reveals).unwrap();
        }
    }
    unmasking.finish().unwrap().sum
}

fn round_cost(c: &mut Criterion) {
    let mut group = c.benchmark_group("round_cost");
    group.sample_size(10);
    let authority = Authority::generate().unwrap();
    let verifier = Verifier::new(authority.public(), None).unwrap();
    let certified = |u: u64| {
        let identity = Identity::generate().unwrap();
        let certificate = (authority.certify(&format!("site-{u}"), &identity.public())).unwrap();
        Some(Arc::new(
            Credentials::new(identity, certificate, verifier.clone()).unwrap(),
        ))
    };
    let signed: Vec<_> = (0..220).map(certified).collect();
    let unsigned = vec![None; 220];
    for (label, n, graph) in [
        ("k100_complete", 100, GraphKind::Complete),
        (
            "k1000_m220_regular",
            220,
            GraphKind::Regular(auto_degree(220)),
        ),
    ] {
        for (size, dim) in [("d535818", 535_818), ("d100000", 100_000)] {
            for (variant, credentials) in [("unprotected", &unsigned), ("protected", &signed)] {
                let name = format!("{label}_{size}_{variant}");
                let round = || black_box(whole_round((n, dim), graph, credentials));
                group.bench_function(name, |b| b.iter(round));
            }
        }
    }
    group.finish();
}

/// Clients in `verified_cost`'s rounds (K = 100, every client in the round).
const VERIFIED_CLIENTS: u64 = 100;
/// Uploads whose checks `verified_cost` times.
const VERIFIED_CHECKED: usize = 10;

/// An update of L2 norm 0.9 for client `c`.
fn verified_update(dim: usize, c: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(c);
    let u: Vec<f32> = (0..dim).map(|_| rng.random::<f32>() - 0.5).collect();
    let norm = u.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
    u.iter()
        .map(|v| (f64::from(*v) * 0.9 / norm) as f32)
        .collect()
}

/// Clients 0..n's uploads for round `tag`.
fn verified_uploads(
    shape: &Shape,
    tag: &RoundTag,
    key: &HelperPublicKey,
    n: u64,
) -> Vec<(u64, Report)> {
    (0..n)
        .map(|c| {
            let update = verified_update(shape.dim, c);
            (c, shard(shape, &Binder::new(tag, c), key, &update).unwrap())
        })
        .collect()
}

/// Both aggregators' checks of `uploads` and the verified sum; a fresh helper each time, since a
/// helper answers each round once.
fn verified_checks(shape: Shape, key: &[u8; 32], uploads: Vec<(u64, Report)>) -> usize {
    let mut helper = Helper::new(HelperKey::from_bytes(key).unwrap(), 1, 0.0);
    let (leader, batch) = LeaderRound::start(TAG, shape, uploads, 0.0);
    let reply = helper.answer(&batch).unwrap();
    leader.finish(reply).unwrap().accepted
}

fn verified_cost(c: &mut Criterion) {
    let mut group = c.benchmark_group("verified_cost");
    group.sample_size(10);
    let authority = Authority::generate().unwrap();
    let verifier = Verifier::new(authority.public(), None).unwrap();
    let signed: Vec<_> = (0..VERIFIED_CLIENTS)
        .map(|u| {
            let identity = Identity::generate().unwrap();
            let certificate = authority.certify(&format!("site-{u}"), &identity.public());
            let credentials = Credentials::new(identity, certificate.unwrap(), verifier.clone());
            Some(Arc::new(credentials.unwrap()))
        })
        .collect();
    let (key, public) = HelperKey::generate();
    let key = key.to_bytes();
    for (size, dim) in [("d100000", 100_000), ("d535818", 535_818)] {
        let shape = Shape::new(dim, 1.0).unwrap();
        group.bench_function(format!("{size}/signed_secure_round"), |b| {
            b.iter(|| {
                black_box(whole_round(
                    (VERIFIED_CLIENTS, dim),
                    GraphKind::Complete,
                    &signed,
                ))
            })
        });
        let update = verified_update(dim, 0);
        group.bench_function(format!("{size}/client_proof"), |b| {
            b.iter(|| black_box(shard(&shape, &Binder::new(&TAG, 0), &public, &update)))
        });
        let mut uploads = verified_uploads(&shape, &TAG, &public, VERIFIED_CHECKED as u64);
        let bytes = upload_bytes(&uploads[0].1);
        println!(
            "verified_cost/{size}: one client's upload {bytes} bytes, secure 4 d = {}",
            4 * dim
        );
        group.bench_function(format!("{size}/checks_of_10_uploads"), |b| {
            let fresh = || uploads.clone();
            b.iter_batched(
                fresh,
                |u| verified_checks(shape, &key, u),
                BatchSize::LargeInput,
            )
        });
        uploads.clear();
        if dim == 100_000 {
            group.bench_function(format!("{size}/verified_round"), |b| {
                let round = || verified_uploads(&shape, &TAG, &public, VERIFIED_CLIENTS);
                b.iter(|| verified_checks(shape, &key, round()))
            });
        }
    }
    group.finish();
}

/// The bytes of a verified upload's fields: the leader's input and proof shares (8 bytes per
/// field element), its blind and the helper's two parts, and the sealed share (the wire's
/// framing adds a few bytes per chunk of 16 KiB).
fn upload_bytes(report: &Report) -> usize {
    let leader = &report.leader;
    8 * (leader.input.len() + leader.proof.len())
        + 3 * 32
        + report.helper.encapped_key.len()
        + report.helper.ciphertext.len()
}

criterion_group!(
    benches,
    mask_expansion,
    client_round,
    server_unmask,
    round_cost,
    verified_cost
);
criterion_main!(benches);
