use super::*;
use crate::{AccountantKind, LedgerEvent, Neighbours, PrivacyEvent, gaussian_epsilon};

/// The event of step `step` of a stream of `bands` bands, separation b and at most k.
fn round(step: u64, bands: u64, b: u64, k: Option<u64>) -> BandedRound {
    BandedRound {
        noise_multiplier: 1.0,
        step,
        bands,
        min_separation: b,
        max_participations: k,
        neighbours: Neighbours::ZeroOut,
    }
}

/// The charges of a stream and the steps a number of charges covers are what
/// [`BandedRound::charge`] gives step by step.
#[test]
fn charges_and_the_steps_they_cover_follow_the_charge_rule() {
    for b in 1..6 {
        for k in [None, Some(1), Some(3)] {
            let counted = |steps: u64| {
                (1..=steps)
                    .filter(|&t| round(t, b, b, k).charge().is_some())
                    .count() as u64
            };
            let stream = round(1, b, b, k);
            for steps in 0..40 {
                assert_eq!(
                    stream.charges_in(steps),
                    counted(steps),
                    "b = {b}, k = {k:?}, {steps} steps"
                );
            }
            let cap = 60;
            for charges in 0..20 {
                let most = (0..=cap).filter(|&s| counted(s) <= charges).max().unwrap();
                assert_eq!(
                    stream.steps_covered(charges, cap),
                    most,
                    "b = {b}, k = {k:?}, {charges} charges"
                );
            }
        }
    }
}

/// The Toeplitz C of `c`, `n` x `n`, row-major.
fn toeplitz(c: &[f64], n: usize) -> Vec<Vec<f64>> {
    (0..n)
        .map(|i| {
            (0..n)
                .map(|j| {
                    if i >= j && i - j < c.len() {
                        c[i - j]
                    } else {
                        0.0
                    }
                })
                .collect()
        })
        .collect()
}

/// Every participation pattern over steps 0..n: sets of steps at least `b` apart, at most `k`.
fn patterns(n: usize, b: usize, k: usize) -> Vec<Vec<usize>> {
    let mut all = vec![vec![]];
    for step in 0..n {
        let grown: Vec<Vec<usize>> = (all.iter())
            .filter(|p| p.len() < k && p.last().is_none_or(|&l| step - l >= b))
            .map(|p| [p.as_slice(), &[step]].concat())
            .collect();
        all.extend(grown);
    }
    all
}

/// The sensitivity^2 of C X over the first `n` steps, by brute force: the largest
/// ||sum_{i in P} s_i C_{:n, i}||^2 over participation patterns P and signs s_i = +-1 (unit
/// contributions; with one coordinate a sign is all a unit vector can choose).
fn brute_sensitivity(c: &[f64], n: usize, b: usize, k: usize) -> f64 {
    let m = toeplitz(c, n);
    let mut best = 0.0f64;
    for p in patterns(n, b, k) {
        for signs in 0u32..(1 << p.len()) {
            let s = |l: usize| if signs >> l & 1 == 1 { -1.0 } else { 1.0 };
            let norm2: f64 = (0..n)
                .map(|row| {
                    let v: f64 = p.iter().enumerate().map(|(l, &i)| s(l) * m[row][i]).sum();
                    v * v
                })
                .sum();
            best = best.max(norm2);
        }
    }
    best
}

/// Charges (Gaussian mechanisms of multiplier z) the ledger holds after `n` steps.
fn charges(n: u64, bands: u64, b: u64, k: Option<u64>) -> usize {
    (1..=n)
        .filter(|&t| round(t, bands, b, k).charge().is_some())
        .count()
}

/// For every prefix of small streams (p <= b, with and without k), the charges bound the
/// brute-forced sensitivity^2 from above, and by less than one charge: the accounting is sound
/// and not loose. With p > b the brute force exceeds the charges: such events are refused.
#[test]
fn charges_bound_the_brute_forced_sensitivity_of_every_prefix() {
    for (bands, b, k) in [
        (1, 1, None),
        (2, 2, None),
        (2, 3, Some(2)),
        (3, 3, None),
        (3, 4, Some(1)),
    ] {
        let c = BandedFactorization::optimised(bands, 9, 0.9);
        for n in 1..=9u64 {
            let k_max = k.unwrap_or(n) as usize;
            let exact = brute_sensitivity(c.coefficients(), n as usize, b as usize, k_max);
            let charged = charges(n, bands as u64, b, k) as f64;
            assert!(
                exact <= charged + 1e-9,
                "p {bands} b {b} k {k:?} n {n}: {exact} > {charged}"
            );
            assert!(
                exact > charged - 1.0,
                "p {bands} b {b} k {k:?} n {n}: {exact} vs {charged}"
            );
        }
    }
    let overlapping = BandedFactorization::square_root(3);
    let exact = brute_sensitivity(overlapping.coefficients(), 8, 2, 8);
    assert!(exact > charges(8, 3, 2, None) as f64 + 0.1, "{exact}");
    assert!(!round(1, 3, 2, None).separated());
    let event = PrivacyEvent::from(round(1, 3, 2, None));
    assert!(event.rdp_curve(&[2.0])[0].is_infinite() && event.as_gaussian().is_none());
}

/// The ledger's epsilon for a small stream, composed by the PLD accountant event by event,
/// matches the exact epsilon of the one Gaussian mechanism the whole stream is: multiplier z
/// over the brute-forced sensitivity (Balle and Wang 2018, Thm 8). The tolerance is the PLD's
/// discretisation, which errs toward a larger epsilon.
#[test]
fn ledger_epsilon_is_the_one_shot_gaussian_of_the_brute_forced_sensitivity() {
    let (z, n, b, delta) = (2.5, 9u64, 3u64, 1e-5);
    let c = BandedFactorization::optimised(3, n, 0.0);
    let sensitivity =
        brute_sensitivity(c.coefficients(), n as usize, b as usize, n as usize).sqrt();
    let mut pld = AccountantKind::Pld.accountant();
    for t in 1..=n {
        let event = BandedRound {
            noise_multiplier: z,
            ..round(t, 3, b, None)
        };
        pld.compose(&event.into(), 1);
    }
    let exact = gaussian_epsilon(z, sensitivity, delta);
    let ledger = pld.epsilon(delta);
    assert!(
        ledger >= exact - 1e-9 && ledger <= exact * 1.01,
        "ledger {ledger}, exact {exact}"
    );
}

/// C w = z, step by step: the stream's noise is C^{-1} Z, and it keeps p - 1 vectors.
#[test]
fn noise_is_c_inverse_z_from_p_minus_one_vectors() {
    let c = BandedFactorization::square_root(3);
    let mut noise = BandedNoise::new(&c, 2);
    let zs: Vec<Vec<f32>> = (0..6)
        .map(|t| vec![t as f32 - 2.5, 1.0 / (t + 1) as f32])
        .collect();
    let mut ws: Vec<Vec<f32>> = Vec::new();
    for z in &zs {
        ws.push(noise.substitute(z.clone()).to_vec());
        assert!(noise.history.len() <= 2);
    }
    let m = toeplitz(c.coefficients(), zs.len());
    for (t, z) in zs.iter().enumerate() {
        for i in 0..2 {
            let cw: f64 = (0..=t).map(|s| m[t][s] * f64::from(ws[s][i])).sum();
            assert!(
                (cw - f64::from(z[i])).abs() < 1e-5,
                "step {t}: {cw} vs {}",
                z[i]
            );
        }
    }
}

/// The square root's coefficients are binom(2j, j) / 4^j normalised, and the search never ends
/// worse than where it started; with momentum 0.9 over 50 steps it gains clearly.
#[test]
fn the_search_improves_on_the_banded_square_root() {
    let root = BandedFactorization::square_root(4);
    let raw = [1.0, 0.5, 0.375, 0.3125];
    let norm = raw.iter().map(|v: &f64| v * v).sum::<f64>().sqrt();
    for (c, r) in root.coefficients().iter().zip(raw) {
        assert!((c - r / norm).abs() < 1e-12);
    }
    for (steps, momentum) in [(50, 0.0), (50, 0.9), (8, 0.5)] {
        let best = BandedFactorization::optimised(4, steps, momentum);
        assert!(best.loss(steps, momentum) <= root.loss(steps, momentum));
        assert!((best.coefficients().iter().map(|v| v * v).sum::<f64>() - 1.0).abs() < 1e-12);
    }
    let (root, best) = (
        root.loss(50, 0.9),
        BandedFactorization::optimised(4, 50, 0.9).loss(50, 0.9),
    );
    assert!(best < 0.9 * root, "{best} vs {root}");
}

/// Charges fall on steps 1, b + 1, 2b + 1, ... and stop after k.
#[test]
fn charges_fall_once_per_separation_up_to_k() {
    let charged: Vec<u64> = (1..=12)
        .filter(|&t| round(t, 2, 3, Some(3)).charge().is_some())
        .collect();
    assert_eq!(charged, [1, 4, 7]);
    let unbounded: Vec<u64> = (1..=12)
        .filter(|&t| round(t, 2, 3, None).charge().is_some())
        .collect();
    assert_eq!(unbounded, [1, 4, 7, 10]);
}

/// b = 3, k = 2: an identity returns no sooner than 3 steps later, and not a third time;
/// events carry the step and the rule they were accounted under.
#[test]
fn an_identity_returns_only_after_b_steps_and_at_most_k_times() {
    let mut stream = BandedStream::new(round(1, 3, 3, Some(2)), 10, 0.0);
    let mut took = Vec::new();
    for step in 1..=10u64 {
        stream.advance();
        assert_eq!(stream.step(), step);
        if stream.contributes(7) {
            took.push(step);
        }
        assert!(!stream.may_contribute(7) && !stream.contributes(7));
        let e = stream.event();
        assert_eq!((e.step, e.bands, e.min_separation), (step, 3, 3));
        assert_eq!(e.max_participations, Some(2));
    }
    assert_eq!(took, [1, 4]);
}

/// Steps must move forward; a skipped step is drawn, so the next one is the stream's own.
#[test]
fn steps_move_forward_and_skipped_steps_are_drawn() {
    use rand::SeedableRng;
    let mut noise = AlignedNoise(BandedNoise::new(&BandedFactorization::square_root(2), 3));
    let mut rng = StdRng::seed_from_u64(2);
    let mut sum = vec![0.0f32; 3];
    noise.add(&mut sum, 1, 1.0, &mut rng).unwrap();
    assert!(sum.iter().all(|v| *v != 0.0));
    noise.add(&mut sum, 4, 1.0, &mut rng).unwrap();
    assert_eq!(noise.0.step(), 4);
    let again = noise.add(&mut sum, 4, 1.0, &mut rng);
    assert_eq!(
        again,
        Err(StepMismatch {
            stream: 4,
            round: 4
        })
    );
}
