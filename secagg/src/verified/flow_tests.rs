//! A verified upload from the client through both aggregators: what is summed, what is excluded
//! and why.

use super::*;
use crate::keys::RoundTag;
use crate::task::TaskDigest;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// d of the test uploads.
const DIM: usize = 300;

fn shape() -> Shape {
    Shape::new(DIM, 1.0).unwrap()
}

fn binder(round: u64, client: u64) -> Binder {
    let tag = RoundTag {
        round,
        digest: TaskDigest([7; 32]),
    };
    Binder::new(&tag, client)
}

/// An update of L2 norm `norm`.
fn update(norm: f64, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let u: Vec<f64> = (0..DIM).map(|_| rng.random::<f64>() - 0.5).collect();
    let length = u.iter().map(|v| v * v).sum::<f64>().sqrt();
    u.iter().map(|v| (v * norm / length) as f32).collect()
}

/// Both aggregators' work on `report` under `binder`: the sum of their shares of X if both accept
/// it (they must agree).
fn verify(key: &HelperKey, binder: &Binder, report: &Report) -> Result<Vec<F>, Exclusion> {
    let shape = shape();
    let verify_key = [9; 32];
    let helper_share = InputShare::open(&shape, binder, key, &report.helper)?;
    let leader_share = InputShare::from(report.leader.clone());
    verify_shares(binder, &verify_key, leader_share, helper_share)
}

/// Both aggregators' prepare and decide on two input shares.
fn verify_shares(
    binder: &Binder,
    verify_key: &[u8; 32],
    leader: InputShare,
    helper: InputShare,
) -> Result<Vec<F>, Exclusion> {
    let shape = shape();
    let (leader_prep, leader_pending) = prepare(&shape, Role::Leader, binder, verify_key, leader)?;
    let (helper_prep, helper_pending) = prepare(&shape, Role::Helper, binder, verify_key, helper)?;
    let at_helper = decide(&shape, &helper_prep, &leader_prep, helper_pending);
    let at_leader = decide(&shape, &leader_prep, &helper_prep, leader_pending);
    assert_eq!(
        at_leader.is_ok(),
        at_helper.is_ok(),
        "the aggregators disagree"
    );
    let (leader_x, helper_x) = (at_leader?, at_helper?);
    Ok(sum_shares(DIM, [&leader_x[..], &helper_x[..]]))
}

/// The honest client's upload of `update` for `binder`.
fn upload(key: &HelperKey, binder: &Binder, update: &[f32]) -> Report {
    shard(&shape(), binder, &key.public(), update).unwrap()
}

#[test]
fn an_update_within_the_bound_is_summed_to_its_value() {
    let (key, _) = HelperKey::generate();
    let b = binder(1, 11);
    for (norm, seed) in [(0.99, 1), (0.3, 2)] {
        let u = update(norm, seed);
        let x = verify(&key, &b, &upload(&key, &b, &u)).unwrap();
        let step = shape().decode(F::from(1));
        for (got, want) in x.iter().zip(&u) {
            // Rounding toward zero loses less than one step of 2^-f.
            assert!((shape().decode(*got) - f64::from(*want)).abs() <= step + 1e-9);
        }
    }
}

/// An update above the bound, honestly sharded, is clipped to it first.
#[test]
fn an_honest_client_clips_an_update_above_the_bound() {
    let (key, _) = HelperKey::generate();
    let b = binder(1, 11);
    let x = verify(&key, &b, &upload(&key, &b, &update(5.0, 3))).unwrap();
    let norm = x
        .iter()
        .map(|&v| shape().decode(v).powi(2))
        .sum::<f64>()
        .sqrt();
    assert!(norm <= 1.0 && norm > 0.999, "{norm}");
}

/// A client that skips the clip ([`shard_unclipped`]): its update of norm `norm`.
fn forged(key: &HelperKey, b: &Binder, norm: f64) -> Report {
    shard_unclipped(&shape(), b, &key.public(), &update(norm, 4)).unwrap()
}

#[test]
fn a_contribution_above_the_bound_is_excluded_and_one_below_is_not() {
    let (key, _) = HelperKey::generate();
    let b = binder(2, 5);
    assert_eq!(
        verify(&key, &b, &forged(&key, &b, 1.01)),
        Err(Exclusion::Proof)
    );
    assert!(verify(&key, &b, &forged(&key, &b, 0.99)).is_ok());
}

#[test]
fn an_upload_replayed_in_another_round_or_for_another_client_is_excluded() {
    let (key, _) = HelperKey::generate();
    let report = upload(&key, &binder(3, 5), &update(0.5, 5));
    for other in [binder(4, 5), binder(3, 6)] {
        assert_eq!(verify(&key, &other, &report), Err(Exclusion::Sealed));
    }
}

/// Past the seal: shares made for one client verified as another's (as if the helper's share had
/// been sealed without the binder) fail the seeds' check.
#[test]
fn shares_made_for_another_client_fail_the_binding() {
    let (key, _) = HelperKey::generate();
    let (made_for, claimed) = (binder(3, 5), binder(3, 6));
    let report = upload(&key, &made_for, &update(0.5, 6));
    let helper = InputShare::open(&shape(), &made_for, &key, &report.helper).unwrap();
    let leader = InputShare::from(report.leader);
    assert_eq!(
        verify_shares(&claimed, &[9; 32], leader, helper),
        Err(Exclusion::Binding)
    );
}

#[test]
fn shares_mixed_from_two_uploads_are_excluded() {
    let (key, _) = HelperKey::generate();
    let b = binder(5, 1);
    let first = upload(&key, &b, &update(0.5, 7));
    let second = upload(&key, &b, &update(0.5, 8));
    let mixed = Report {
        leader: first.leader,
        helper: second.helper,
    };
    assert_eq!(verify(&key, &b, &mixed), Err(Exclusion::Binding));
}

#[test]
fn a_malformed_proof_is_excluded() {
    let (key, _) = HelperKey::generate();
    let b = binder(6, 1);
    let honest = upload(&key, &b, &update(0.5, 9));
    let mut altered = honest.clone();
    altered.leader.proof[3] += F::from(1);
    assert_eq!(verify(&key, &b, &altered), Err(Exclusion::Proof));
    let mut short = honest.clone();
    short.leader.proof.pop();
    assert!(matches!(
        verify(&key, &b, &short),
        Err(Exclusion::Malformed(_))
    ));
    let mut sealed = honest;
    sealed.helper.ciphertext[0] ^= 1;
    assert_eq!(verify(&key, &b, &sealed), Err(Exclusion::Sealed));
}

#[test]
fn field_values_off_the_field_or_ragged_are_refused() {
    let values = [F::from(1), -F::from(1)];
    assert_eq!(field_values(&field_bytes(&values)), Some(values.to_vec()));
    assert_eq!(field_values(&[0xff; 8]), None);
    assert_eq!(field_values(&[0; 7]), None);
}

/// What the leader holds of an upload tells nothing of it: its share of X is uniform whatever X
/// is, so two different updates give shares with no visible trace of either (a weak check: the
/// share differs from X everywhere but by chance).
#[test]
fn the_leader_share_is_not_the_update() {
    let (key, _) = HelperKey::generate();
    let b = binder(7, 1);
    let u = update(0.5, 10);
    let report = upload(&key, &b, &u);
    let (x, _) = fixed_point(&u, 1.0, shape().frac_bits);
    let same = (report.leader.input.iter().zip(&x))
        .filter(|(s, v)| shape().decode(**s) == **v as f64 / f64::from(shape().frac_bits).exp2())
        .count();
    assert!(same <= 1, "{same} of {DIM} coordinates in the clear");
}
