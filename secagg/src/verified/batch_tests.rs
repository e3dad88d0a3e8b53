//! A round between the leader and the helper: what is summed, what each refuses, and what a
//! helper that deviates makes the leader do.

use super::*;
use crate::keys::RoundTag;
use crate::task::TaskDigest;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DIM: usize = 300;

fn shape() -> Shape {
    Shape::new(DIM, 1.0).unwrap()
}

fn tag(round: u64) -> RoundTag {
    RoundTag {
        round,
        digest: TaskDigest([round as u8; 32]),
    }
}

/// An update of L2 norm `norm`.
fn update(norm: f64, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let u: Vec<f64> = (0..DIM).map(|_| rng.random::<f64>() - 0.5).collect();
    let length = u.iter().map(|v| v * v).sum::<f64>().sqrt();
    u.iter().map(|v| (v * norm / length) as f32).collect()
}

/// Clients 1..=n's honest uploads of norm 0.9 for round `tag`.
fn uploads(key: &HelperPublicKey, tag: &RoundTag, n: u64) -> Vec<(u64, Report)> {
    (1..=n)
        .map(|c| {
            let report = shard(&shape(), &Binder::new(tag, c), key, &update(0.9, c)).unwrap();
            (c, report)
        })
        .collect()
}

/// The sum of clients 1..=n's updates.
fn expected(n: u64) -> Vec<f64> {
    let mut sum = vec![0.0; DIM];
    for c in 1..=n {
        sum.iter_mut()
            .zip(update(0.9, c))
            .for_each(|(s, v)| *s += f64::from(v));
    }
    sum
}

#[test]
fn honest_uploads_are_summed_and_a_forged_one_is_excluded() {
    let (key, public) = HelperKey::generate();
    let mut helper = Helper::new(key, 2, 0.0);
    let t = tag(1);
    let mut all = uploads(&public, &t, 3);
    // Client 4 sends client 1's report as its own.
    all.push((4, all[0].1.clone()));
    let (leader, batch) = LeaderRound::start(t, shape(), all, 0.0);
    let verified = leader.finish(helper.answer(&batch).unwrap()).unwrap();
    assert_eq!(verified.accepted, 3);
    assert_eq!(verified.excluded, vec![(4, Exclusion::Sealed)]);
    let step = 3.0 * shape().decode(F::from(1));
    for (got, want) in verified.sum.iter().zip(expected(3)) {
        assert!((got - want).abs() <= step, "{got} vs {want}");
    }
}

#[test]
fn the_helper_answers_a_round_once_and_refuses_duplicates_and_small_batches() {
    let (key, public) = HelperKey::generate();
    let mut helper = Helper::new(key, 3, 0.0);
    let t = tag(2);
    let (_, batch) = LeaderRound::start(t, shape(), uploads(&public, &t, 3), 0.0);
    assert!(helper.answer(&batch).is_ok());
    assert_eq!(helper.answer(&batch), Err(BatchRefusal::Answered(2)));
    let t = tag(3);
    let mut twice = batch.clone();
    twice.tag = t;
    twice.uploads.push(twice.uploads[0].clone());
    assert_eq!(helper.answer(&twice), Err(BatchRefusal::Duplicate(1)));
    let t = tag(4);
    let (_, small) = LeaderRound::start(t, shape(), uploads(&public, &t, 2), 0.0);
    let refused = helper.answer(&small);
    assert_eq!(
        refused,
        Err(BatchRefusal::TooFew {
            accepted: 2,
            floor: 3
        })
    );
}

#[test]
fn a_helper_that_deviates_makes_the_round_abort() {
    let (key, public) = HelperKey::generate();
    let mut helper = Helper::new(key, 1, 0.0);
    let t = tag(5);
    let (leader, batch) = LeaderRound::start(t, shape(), uploads(&public, &t, 3), 0.0);
    let honest = helper.answer(&batch).unwrap();
    let fresh = |leader: &LeaderRound| LeaderRound {
        shape: leader.shape,
        uploads: leader.uploads.clone(),
    };
    // Says it refused an upload the proof accepts.
    let mut flipped = honest.clone();
    flipped.accepted[1] = false;
    assert_eq!(
        fresh(&leader).finish(flipped),
        Err(HelperFault::Disagrees(2))
    );
    // Sends a verifier share that makes the proof fail, yet accepts.
    let mut forged = honest.clone();
    if let Some(p) = forged.prep[0].as_mut() {
        p.verifier[0] += F::from(1);
    }
    assert_eq!(
        fresh(&leader).finish(forged),
        Err(HelperFault::Disagrees(1))
    );
    // Sends a sum of another length.
    let mut short = honest.clone();
    short.aggregate.pop();
    assert!(matches!(
        fresh(&leader).finish(short),
        Err(HelperFault::Shape(_))
    ));
    assert!(leader.finish(honest).is_ok());
}

/// The helper's noise: z S per coordinate of the decoded sum, at least its own floor. With
/// d = 300 draws the sample standard deviation is within 4 of its own standard errors
/// (sigma / sqrt(2 d), 4.1%) of sigma but for a chance below 1e-4.
#[test]
fn the_helper_adds_noise_of_at_least_its_floor() {
    let (key, public) = HelperKey::generate();
    let mut helper = Helper::new(key, 1, 2.0);
    let t = tag(6);
    let (leader, batch) = LeaderRound::start(t, shape(), uploads(&public, &t, 2), 0.5);
    let verified = leader.finish(helper.answer(&batch).unwrap()).unwrap();
    let noise: Vec<f64> = (verified.sum.iter().zip(expected(2)))
        .map(|(g, w)| g - w)
        .collect();
    let std = (noise.iter().map(|n| n * n).sum::<f64>() / DIM as f64).sqrt();
    let sigma = 2.0;
    let tolerance = 4.0 * sigma / (2.0 * DIM as f64).sqrt();
    assert!((std - sigma).abs() <= tolerance, "std {std}, sigma {sigma}");
}

/// The model-replacement attacker: its update scaled far above the bound, claiming V0 = B; and
/// the same attacker just within the bound, whose upload is valid.
#[test]
fn an_unclipped_scaled_upload_is_excluded() {
    let (key, public) = HelperKey::generate();
    let mut helper = Helper::new(key, 1, 0.0);
    let t = tag(7);
    let mut all = uploads(&public, &t, 2);
    for (client, scale) in [(3, 50.0), (4, 1.01 / 0.9)] {
        let scaled: Vec<f32> = update(0.9, client).iter().map(|v| v * scale).collect();
        let report = shard_unclipped(&shape(), &Binder::new(&t, client), &public, &scaled);
        all.push((client, report.unwrap()));
    }
    let within: Vec<f32> = update(0.9, 5).iter().map(|v| v * 0.99 / 0.9).collect();
    let report = shard_unclipped(&shape(), &Binder::new(&t, 5), &public, &within).unwrap();
    all.push((5, report));
    let (leader, batch) = LeaderRound::start(t, shape(), all, 0.0);
    let verified = leader.finish(helper.answer(&batch).unwrap()).unwrap();
    assert_eq!(verified.accepted, 3);
    let excluded = vec![(3, Exclusion::Proof), (4, Exclusion::Proof)];
    assert_eq!(verified.excluded, excluded);
}
