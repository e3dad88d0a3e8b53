//! The circuit as two aggregators run it: each queries its share of the input and the proof, and
//! the sum of their verifier messages decides.

use super::*;
use prio::field::FieldElement;
use prio::flp::Flp;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// d of the test vectors.
const DIM: usize = 200;
/// f: fractional bits.
const FRAC: u32 = 15;
/// r, the repetitions to pass, and the wraparound slack a = alpha sqrt(B), alpha = sqrt(ln(2 /
/// 0.01)) = 2.30 (completeness error 0.01 per repetition).
const REPS: (usize, usize) = (100, 75);

/// The circuit for a norm bound of 1 at f = 15, with its Z from `seed`.
fn circuit(seed: u64) -> NormCircuit {
    let root = f64::from(1u32 << FRAC);
    let bound = (root as u64).pow(2);
    let slack = (2.3 * root) as u64;
    let mut z_seed = [0u8; 32];
    z_seed[..8].copy_from_slice(&seed.to_le_bytes());
    NormCircuit::new(DIM, bound, (REPS.0, REPS.1, slack), z_seed).unwrap()
}

/// An update of L2 norm `norm`.
fn update(norm: f64, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let u: Vec<f64> = (0..DIM).map(|_| rng.random::<f64>() - 0.5).collect();
    let length = u.iter().map(|v| v * v).sum::<f64>().sqrt();
    u.iter().map(|v| (v * norm / length) as f32).collect()
}

/// Whether two aggregators, each with one additive share of `input` and of its proof, accept it.
fn accepted(c: &NormCircuit, input: &[F]) -> bool {
    let joint_rand = F::random_vector(c.joint_rand_len());
    let proof = c
        .prove(input, &F::random_vector(c.prove_rand_len()), &joint_rand)
        .unwrap();
    let query_rand = F::random_vector(c.query_rand_len());
    let split = |v: &[F]| {
        let first: Vec<F> = F::random_vector(v.len());
        let second: Vec<F> = v.iter().zip(&first).map(|(&x, &s)| x - s).collect();
        [first, second]
    };
    let (inputs, proofs) = (split(input), split(&proof));
    let mut verifier = vec![F::zero(); c.verifier_len()];
    for (i, p) in inputs.iter().zip(&proofs) {
        let share = c.query(i, p, &query_rand, &joint_rand, 2).unwrap();
        for (v, s) in verifier.iter_mut().zip(share) {
            *v += s;
        }
    }
    c.decide(&verifier).unwrap()
}

#[test]
fn an_update_within_the_bound_is_accepted() {
    let c = circuit(1);
    for (norm, seed) in [(0.99, 1), (0.5, 2), (3.0, 3)] {
        // Norm 3 is clipped to the bound first.
        let (x, bound) = fixed_point(&update(norm, seed), 1.0, FRAC);
        assert_eq!(bound, c.bound);
        let input = c.encode(&x).unwrap();
        assert_eq!(input.len(), c.input_len());
        assert!(accepted(&c, &input), "norm {norm}");
    }
}

/// A client that skips the clip and claims a squared norm within B (V0 = B, U0 = 0), every
/// other part of its input honest, is refused at 1.01 times the bound; the honest encoder refuses
/// to encode it at all.
#[test]
fn an_update_above_the_bound_is_refused() {
    let c = circuit(2);
    let scale = f64::from(1u32 << FRAC);
    let x: Vec<i64> = (update(1.01, 4).iter())
        .map(|&v| (f64::from(v) * scale) as i64)
        .collect();
    assert!(matches!(c.encode(&x), Err(EncodeError::Norm(_))));
    // The same layout (B and 1.03^2 B have the same bits), with the larger bound's encoding.
    let loose_bound = (c.bound as f64 * 1.03 * 1.03) as u64;
    let loose = NormCircuit::new(DIM, loose_bound, (c.reps, c.pass, c.slack), c.z_seed);
    let mut forged = loose.unwrap().encode(&x).unwrap();
    let b0 = c.b0;
    for i in 0..b0 {
        forged[DIM + i] = F::from((c.bound >> i) & 1);
        forged[DIM + b0 + i] = F::zero();
    }
    assert!(!accepted(&c, &forged));
}

/// X = (2^48, 1, 0, ...): in the 64-bit field 2^96 = -1, so its squares sum to 0 and the sum
/// check alone passes; the wraparound repetitions catch it (Z_k's first value is not 0 in about
/// half of them, so fewer than 75 of 100 can be flagged honestly).
#[test]
fn a_vector_whose_squares_wrap_around_is_refused() {
    let c = circuit(3);
    let big = 1i64 << 48;
    let mut x = vec![0i64; DIM];
    (x[0], x[1]) = (big, 1);
    // The cheater's best input: V0 = 0 (the squares' sum mod q), U0 = B; each repetition that
    // passes (|Y_k| small, where Z_k's first value is 0) flagged honestly, then failed ones
    // flagged too until `pass` are, with S_k what makes WC_0 hold.
    let mut input: Vec<F> = x.iter().map(|&v| F::from(v as u64)).collect();
    let push_bits = |v: u64, n: usize, out: &mut Vec<F>| {
        out.extend((0..n).map(|i| F::from((v >> i) & 1)));
    };
    push_bits(0, c.b0, &mut input);
    push_bits(c.bound, c.b0, &mut input);
    let a = i128::from(c.slack);
    let ys = c.projections(&x);
    let passing = ys.iter().filter(|y| (-a..=a + 1).contains(y)).count();
    assert!(
        passing < c.pass,
        "{passing} repetitions pass: Z does not test the wraparound"
    );
    let mut lies = c.pass - passing;
    let mut s = Vec::new();
    for &y in &ys {
        let passes = (-a..=a + 1).contains(&y);
        let lie = !passes && lies > 0;
        lies -= usize::from(lie);
        let v1 = ((y + a).rem_euclid(1 << c.b1)) as u64;
        push_bits(v1, c.b1, &mut input);
        input.push(F::from(u64::from(passes || lie)));
        s.push(circuit::reduce(y + a - i128::from(v1)));
    }
    input.extend(s);
    assert_eq!(input.len(), c.input_len());
    assert!(!accepted(&c, &input));
}

#[test]
fn an_input_of_another_shape_is_refused_by_the_proof_system() {
    let c = circuit(4);
    let (x, _) = fixed_point(&update(0.5, 5), 1.0, FRAC);
    let mut input = c.encode(&x).unwrap();
    input.pop();
    let joint_rand = F::random_vector(c.joint_rand_len());
    assert!(
        c.prove(&input, &F::random_vector(c.prove_rand_len()), &joint_rand)
            .is_err()
    );
}
