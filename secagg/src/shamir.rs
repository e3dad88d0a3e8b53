//! t-out-of-n Shamir secret sharing of 32-byte secrets over GF(p), p = 2^61 - 1.
//!
//! Written by hand: the sharing crates on crates.io are either unmaintained (`sharks`, last
//! release 2021) or generic over elliptic-curve scalar fields (`vsss-rs`), which would pull a
//! second curve stack for a 100-line routine. A Mersenne prime makes reduction two adds.
//!
//! A secret is split into five limbs (four of 56 bits, one of 32), each below p, and every limb
//! gets its own random polynomial f of degree t - 1 with f(0) = limb (Shamir 1979). Holder i
//! receives (x_i, f(x_i)) with x_i = its client id + 1 (non-zero and distinct).

use rand::{CryptoRng, Rng};

/// p = 2^61 - 1.
pub const P: u64 = (1 << 61) - 1;
/// Field elements per secret.
const LIMBS: usize = 5;
/// Bytes of a serialized share: x then the five limbs, little-endian u64 each.
pub const SHARE_BYTES: usize = 8 * (1 + LIMBS);

/// One holder's share of one secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// x: the evaluation point (holder id + 1).
    pub x: u64,
    /// f_j(x) for each limb j.
    pub y: [u64; LIMBS],
}

/// Why shares cannot be made or combined.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ShamirError {
    /// Fewer than t shares.
    #[error("{got} shares, threshold is {threshold}")]
    TooFew {
        /// Shares given.
        got: usize,
        /// t.
        threshold: usize,
    },
    /// Two shares at one point, or a point 0 or >= p.
    #[error("share points must be distinct, non-zero and below 2^61 - 1")]
    BadPoint,
    /// A share's bytes are malformed.
    #[error("a share must be {SHARE_BYTES} bytes of field elements")]
    Malformed,
    /// The shares interpolate to something that is not a secret's limbs.
    #[error("the shares are inconsistent")]
    Inconsistent,
    /// t = 0 or t > n.
    #[error("threshold {threshold} is impossible with {holders} holders")]
    BadThreshold {
        /// t.
        threshold: usize,
        /// n.
        holders: usize,
    },
}

fn reduce(x: u128) -> u64 {
    // x = hi 2^61 + lo = hi + lo (mod 2^61 - 1).
    let lo = (x as u64) & P;
    let hi = (x >> 61) as u64;
    let mut s = lo + (hi & P) + (hi >> 61);
    while s >= P {
        s -= P;
    }
    s
}

fn mul(a: u64, b: u64) -> u64 {
    reduce(a as u128 * b as u128)
}

fn add(a: u64, b: u64) -> u64 {
    let s = a + b;
    if s >= P { s - P } else { s }
}

fn sub(a: u64, b: u64) -> u64 {
    if a >= b { a - b } else { a + P - b }
}

fn pow(mut a: u64, mut e: u64) -> u64 {
    let mut r = 1;
    while e > 0 {
        if e & 1 == 1 {
            r = mul(r, a);
        }
        a = mul(a, a);
        e >>= 1;
    }
    r
}

/// a^-1 = a^(p-2) (Fermat); a must be non-zero.
fn inv(a: u64) -> u64 {
    pow(a, P - 2)
}

fn limbs(secret: &[u8; 32]) -> [u64; LIMBS] {
    let mut out = [0u64; LIMBS];
    for (j, limb) in out.iter_mut().enumerate() {
        let (start, len) = if j < 4 { (7 * j, 7) } else { (28, 4) };
        let mut b = [0u8; 8];
        b[..len].copy_from_slice(&secret[start..start + len]);
        *limb = u64::from_le_bytes(b);
    }
    out
}

fn unlimbs(limbs: &[u64; LIMBS]) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    for (j, &limb) in limbs.iter().enumerate() {
        let (start, len) = if j < 4 { (7 * j, 7) } else { (28, 4) };
        if limb >> (8 * len) != 0 {
            return None;
        }
        out[start..start + len].copy_from_slice(&limb.to_le_bytes()[..len]);
    }
    Some(out)
}

/// The evaluation point of a holder: its id + 1, which must be below p.
pub fn point_of(holder: u64) -> Result<u64, ShamirError> {
    match holder.checked_add(1) {
        Some(x) if x < P => Ok(x),
        _ => Err(ShamirError::BadPoint),
    }
}

/// Splits `secret` into one share per holder, any `threshold` of which recover it.
pub fn split<R: Rng + CryptoRng>(
    secret: &[u8; 32],
    threshold: usize,
    holders: &[u64],
    rng: &mut R,
) -> Result<Vec<Share>, ShamirError> {
    if threshold == 0 || threshold > holders.len() {
        return Err(ShamirError::BadThreshold {
            threshold,
            holders: holders.len(),
        });
    }
    let xs = holders
        .iter()
        .map(|&h| point_of(h))
        .collect::<Result<Vec<_>, _>>()?;
    let mut seen = xs.clone();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != xs.len() {
        return Err(ShamirError::BadPoint);
    }
    // coefficients[j] = (limb_j, a_1, ..., a_{t-1}), a_i uniform in GF(p).
    let coefficients: Vec<Vec<u64>> = limbs(secret)
        .iter()
        .map(|&c0| {
            std::iter::once(c0)
                .chain((1..threshold).map(|_| rng.random_range(0..P)))
                .collect()
        })
        .collect();
    Ok(xs
        .iter()
        .map(|&x| {
            let mut y = [0u64; LIMBS];
            for (yj, coeffs) in y.iter_mut().zip(&coefficients) {
                // Horner: f(x) = c0 + x (c1 + x (c2 + ...)).
                *yj = coeffs.iter().rev().fold(0, |acc, &c| add(mul(acc, x), c));
            }
            Share { x, y }
        })
        .collect())
}

/// Recovers the secret from the first `threshold` shares by Lagrange interpolation at 0:
/// f(0) = sum_i y_i prod_{j != i} x_j / (x_j - x_i).
pub fn combine(shares: &[Share], threshold: usize) -> Result<[u8; 32], ShamirError> {
    if threshold == 0 || shares.len() < threshold {
        return Err(ShamirError::TooFew {
            got: shares.len(),
            threshold,
        });
    }
    let used = &shares[..threshold];
    for (i, a) in used.iter().enumerate() {
        if a.x == 0 || a.x >= P || used[..i].iter().any(|b| b.x == a.x) {
            return Err(ShamirError::BadPoint);
        }
    }
    let mut secret = [0u64; LIMBS];
    for (i, si) in used.iter().enumerate() {
        let (mut num, mut den) = (1u64, 1u64);
        for (j, sj) in used.iter().enumerate() {
            if i != j {
                num = mul(num, sj.x);
                den = mul(den, sub(sj.x, si.x));
            }
        }
        let lambda = mul(num, inv(den));
        for (acc, &y) in secret.iter_mut().zip(&si.y) {
            *acc = add(*acc, mul(lambda, y));
        }
    }
    unlimbs(&secret).ok_or(ShamirError::Inconsistent)
}

impl Share {
    /// x then the limbs, little-endian.
    pub fn to_bytes(&self) -> [u8; SHARE_BYTES] {
        let mut out = [0u8; SHARE_BYTES];
        for (i, v) in std::iter::once(self.x).chain(self.y).enumerate() {
            out[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Parses [`Share::to_bytes`]; every element must be a field element.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ShamirError> {
        if bytes.len() != SHARE_BYTES {
            return Err(ShamirError::Malformed);
        }
        let mut v = [0u64; 1 + LIMBS];
        for (i, c) in bytes.chunks_exact(8).enumerate() {
            v[i] = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            if v[i] >= P {
                return Err(ShamirError::Malformed);
            }
        }
        let mut y = [0u64; LIMBS];
        y.copy_from_slice(&v[1..]);
        Ok(Share { x: v[0], y })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn field_arithmetic_is_consistent() {
        let a = P - 5;
        assert_eq!(mul(a, inv(a)), 1);
        assert_eq!(add(a, 10), 5);
        assert_eq!(sub(3, 5), P - 2);
        assert_eq!(reduce(P as u128 * P as u128), 0);
        assert_eq!(reduce((P - 1) as u128 * (P - 1) as u128), 1);
    }

    #[test]
    fn any_t_shares_recover_the_secret_and_fewer_do_not() {
        let mut rng = StdRng::seed_from_u64(5);
        let secret: [u8; 32] = rng.random();
        let holders: Vec<u64> = (10..17).collect();
        let shares = split(&secret, 4, &holders, &mut rng).unwrap();
        assert_eq!(combine(&shares, 4).unwrap(), secret);
        assert_eq!(combine(&shares[3..], 4).unwrap(), secret);
        let mut mixed = vec![shares[6], shares[0], shares[4], shares[2]];
        assert_eq!(combine(&mixed, 4).unwrap(), secret);
        // With t - 1 points, interpolating as if t were 3 gives some other value.
        assert_ne!(combine(&shares[..3], 3).ok(), Some(secret));
        assert_eq!(
            combine(&shares[..3], 4),
            Err(ShamirError::TooFew {
                got: 3,
                threshold: 4
            })
        );
        mixed[1] = mixed[0];
        assert_eq!(combine(&mixed, 4), Err(ShamirError::BadPoint));
    }

    #[test]
    fn a_forged_share_changes_or_breaks_the_result() {
        let mut rng = StdRng::seed_from_u64(6);
        let secret = [7u8; 32];
        let mut shares = split(&secret, 3, &[1, 2, 3], &mut rng).unwrap();
        shares[1].y[0] = add(shares[1].y[0], 1);
        assert_ne!(combine(&shares, 3).ok(), Some(secret));
    }

    #[test]
    fn bad_parameters_and_bytes_are_refused() {
        let mut rng = StdRng::seed_from_u64(7);
        assert!(matches!(
            split(&[0; 32], 4, &[1, 2, 3], &mut rng),
            Err(ShamirError::BadThreshold { .. })
        ));
        assert_eq!(
            split(&[0; 32], 2, &[1, 1], &mut rng),
            Err(ShamirError::BadPoint)
        );
        assert_eq!(
            split(&[0; 32], 1, &[P - 1], &mut rng),
            Err(ShamirError::BadPoint)
        );
        let s = split(&[1; 32], 2, &[4, 5], &mut rng).unwrap()[0];
        assert_eq!(Share::from_bytes(&s.to_bytes()).unwrap(), s);
        assert_eq!(
            Share::from_bytes(&[0xff; SHARE_BYTES]),
            Err(ShamirError::Malformed)
        );
        assert_eq!(Share::from_bytes(&[0; 3]), Err(ShamirError::Malformed));
    }

    /// Hiding: t - 1 shares carry no information about the secret. For t = 2 a single share's
    /// first limb is f(x) = s + a x with a uniform, so it is uniform whatever s is. Bucketing the
    /// top 4 bits of 16,000 shares of the secret 0 and of the secret 0xff..ff, a chi-square test
    /// (15 degrees of freedom, critical value 37.7 at p = 0.001) finds both uniform.
    #[test]
    fn fewer_than_t_shares_look_uniform_whatever_the_secret() {
        let mut rng = StdRng::seed_from_u64(8);
        for secret in [[0u8; 32], [0xffu8; 32]] {
            let mut counts = [0f64; 16];
            let n = 16_000;
            for _ in 0..n {
                let share = split(&secret, 2, &[0, 1], &mut rng).unwrap()[0];
                counts[(share.y[0] >> 57) as usize] += 1.0;
            }
            // Buckets of the top 4 bits of [0, 2^61 - 1): all of equal size but the last (one short).
            let expected = n as f64 / 16.0;
            let chi2: f64 = counts
                .iter()
                .map(|c| (c - expected).powi(2) / expected)
                .sum();
            assert!(chi2 < 37.7, "chi-square {chi2}");
        }
    }
}
