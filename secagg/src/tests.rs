//! Whole-protocol tests: clients and server driven in memory, with dropouts and hostile input.

use super::*;
use crate::task::TaskDigest;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

/// Round `round` of a task whose digest is all `round`s.
pub(super) fn tag(round: u64) -> RoundTag {
    RoundTag {
        round,
        digest: TaskDigest([round as u8; 32]),
    }
}

/// An unsigned round's setup: t = 0.6 of the neighbours, at least 3 answers per stage.
pub(super) fn setup(round: u64, ring: Ring, dim: usize, graph: GraphKind) -> RoundSetup {
    RoundSetup {
        tag: tag(round),
        ring,
        dim,
        graph,
        threshold_fraction: 0.6,
        min_survivors: 3,
        verifier: None,
    }
}

/// When a simulated client stops answering.
#[derive(Clone, Copy, PartialEq)]
enum DropAt {
    Never,
    /// After advertising keys, before sharing.
    BeforeShares,
    /// After sharing keys, before sending its masked input.
    AfterShares,
    /// After its masked input, before unmasking.
    AfterMasked,
}

struct Outcome {
    result: Result<RoundResult, SecAggError>,
    expected: Vec<u64>,
}

/// One round over `n` clients with ids 10.. and inputs drawn uniformly from the ring; `drop(i)`
/// says when client i stops answering.
fn run(
    n: usize,
    ring: Ring,
    dim: usize,
    graph: GraphKind,
    drop: impl Fn(usize) -> DropAt,
    seed: u64,
) -> Outcome {
    let mut rng = StdRng::seed_from_u64(seed);
    let ids: Vec<u64> = (0..n as u64).map(|i| 10 + i).collect();
    let inputs: BTreeMap<u64, Vec<u64>> = ids
        .iter()
        .map(|&u| {
            (
                u,
                (0..dim)
                    .map(|_| rng.random::<u64>() & ring.mask())
                    .collect(),
            )
        })
        .collect();
    let mut clients: BTreeMap<u64, ClientRound> = ids
        .iter()
        .map(|&u| (u, ClientRound::new((tag(1), u), ring, None, &mut rng)))
        .collect();
    let plan: BTreeMap<u64, DropAt> = ids.iter().enumerate().map(|(i, &u)| (u, drop(i))).collect();
    let outcome = |result, survivors: &[u64]| {
        let mut expected = vec![0u64; dim];
        for u in survivors {
            ring.add_assign(&mut expected, &inputs[u]);
        }
        Outcome { result, expected }
    };
    let mut go = || -> Result<RoundResult, SecAggError> {
        let mut keys = AdvertiseKeys::new(setup(1, ring, dim, graph), ids.iter().copied());
        for (u, c) in &clients {
            keys.receive_keys(*u, c.advertise())?;
        }
        let (mut shares, hoods) = keys.close()?;
        for (u, hood) in hoods {
            if plan[&u] == DropAt::BeforeShares {
                continue;
            }
            let sealed = clients.get_mut(&u).unwrap().share_keys(hood, &mut rng)?;
            shares.receive_shares(u, sealed)?;
        }
        let (mut check, inboxes) = shares.close()?;
        for (u, inbox) in inboxes {
            if plan[&u] == DropAt::AfterShares {
                continue;
            }
            let refused = clients.get_mut(&u).unwrap().check_shares(&inbox)?;
            check.receive_check(u, refused)?;
        }
        let (mut masked, checked) = check.close()?;
        for (u, proceed) in checked.proceed {
            let y = clients
                .get_mut(&u)
                .unwrap()
                .masked_input(&proceed, &inputs[&u])?;
            masked.receive_masked(u, &y)?;
        }
        let (mut unmasking, survivors) = masked.close()?;
        for &u in &survivors {
            if plan[&u] == DropAt::AfterMasked {
                continue;
            }
            let reveals = clients.get_mut(&u).unwrap().unmask(&survivors)?;
            unmasking.receive_reveal(u, reveals)?;
        }
        unmasking.finish()
    };
    let result = go();
    let survivors = result
        .as_ref()
        .map(|r| r.survivors.clone())
        .unwrap_or_default();
    outcome(result, &survivors)
}

/// Exactness: with 0%, 10% and 30% of the clients dropping after key sharing (and some before
/// sharing or after masking), the unmasked sum equals the survivors' sum in the ring exactly.
#[test]
fn the_unmasked_sum_is_exact_under_dropouts() {
    for bits in [32, 64] {
        let ring = Ring::new(bits).unwrap();
        for (percent, graph) in [
            (0, GraphKind::Complete),
            (10, GraphKind::Complete),
            (30, GraphKind::Complete),
            (10, GraphKind::Regular(8)),
        ] {
            let n = 20;
            let dropped = n * percent / 100;
            let out = run(
                n,
                ring,
                1000,
                graph,
                |i| {
                    if i < dropped {
                        DropAt::AfterShares
                    } else {
                        DropAt::Never
                    }
                },
                7 + percent as u64,
            );
            let result = out.result.unwrap();
            assert_eq!(result.survivors.len(), n - dropped);
            assert_eq!(result.dropouts_recovered, dropped);
            assert_eq!(
                result.sum, out.expected,
                "{bits} bits, {percent}% dropped, {graph:?}"
            );
        }
    }
    // Dropouts at every stage at once.
    let ring = Ring::new(32).unwrap();
    let out = run(
        30,
        ring,
        257,
        GraphKind::Complete,
        |i| match i % 10 {
            0 => DropAt::BeforeShares,
            1 => DropAt::AfterShares,
            2 => DropAt::AfterMasked,
            _ => DropAt::Never,
        },
        3,
    );
    let result = out.result.unwrap();
    assert_eq!(result.survivors.len(), 24);
    assert_eq!(result.sum, out.expected);
}

/// Too few survivors: the round aborts, says why, and yields nothing.
#[test]
fn a_round_below_threshold_aborts_cleanly() {
    let ring = Ring::new(32).unwrap();
    let out = run(
        10,
        ring,
        10,
        GraphKind::Complete,
        |i| {
            if i < 6 {
                DropAt::AfterShares
            } else {
                DropAt::Never
            }
        },
        1,
    );
    match out.result {
        Err(SecAggError::Aborted { stage, reason, .. }) => {
            assert_eq!(stage, Stage::MaskedInput, "{reason}");
            assert!(reason.contains("needed"), "{reason}");
        }
        other => panic!("expected an abort, got {:?}", other.map(|r| r.survivors)),
    }
    let out = run(
        10,
        ring,
        10,
        GraphKind::Complete,
        |i| {
            if i < 8 {
                DropAt::BeforeShares
            } else {
                DropAt::Never
            }
        },
        2,
    );
    assert!(matches!(
        out.result,
        Err(SecAggError::Aborted {
            stage: Stage::ShareKeys,
            ..
        })
    ));
}

/// Hiding: one client's masked upload is indistinguishable from uniform even when its input is
/// all zeros. 64,000 ring elements bucketed by their top 6 bits: chi-square with 63 degrees of
/// freedom stays under 103.4 (p = 0.001).
#[test]
fn a_masked_upload_looks_uniform() {
    let ring = Ring::new(32).unwrap();
    let mut rng = StdRng::seed_from_u64(11);
    let ids = [1u64, 2, 3, 4];
    let mut keys = AdvertiseKeys::new(setup(1, ring, 64_000, GraphKind::Complete), ids);
    let mut clients: Vec<ClientRound> = ids
        .iter()
        .map(|&u| ClientRound::new((tag(1), u), ring, None, &mut rng))
        .collect();
    for (c, &u) in clients.iter().zip(&ids) {
        keys.receive_keys(u, c.advertise()).unwrap();
    }
    let (mut shares, hoods) = keys.close().unwrap();
    for (c, &u) in clients.iter_mut().zip(&ids) {
        let sealed = c.share_keys(hoods[&u].clone(), &mut rng).unwrap();
        shares.receive_shares(u, sealed).unwrap();
    }
    let (_, inbox) = shares.close().unwrap();
    assert_eq!(
        clients[0].check_shares(&inbox[&1]).unwrap(),
        Vec::<u64>::new()
    );
    let y = clients[0]
        .masked_input(&Proceed::default(), &vec![0u64; 64_000])
        .unwrap();
    let mut counts = [0f64; 64];
    for v in &y {
        counts[(v >> 26) as usize] += 1.0;
    }
    let expected = y.len() as f64 / 64.0;
    let chi2: f64 = counts
        .iter()
        .map(|c| (c - expected).powi(2) / expected)
        .sum();
    assert!(chi2 < 103.4, "chi-square {chi2}");
}
