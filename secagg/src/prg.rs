//! Masks: the ChaCha20 keystream of a full 256-bit seed, read as little-endian ring elements.
//! The same seed always expands to the same mask, so a pair of clients (and later the server,
//! from reconstructed secrets) derive identical masks without sending them.

use super::ring::Ring;
use chacha20::ChaCha20;
use chacha20::cipher::{KeyIvInit, StreamCipher};

/// Whether a mask is added to or subtracted from the accumulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sign {
    /// acc += PRG(seed).
    Plus,
    /// acc -= PRG(seed).
    Minus,
}

/// Keystream bytes produced per ChaCha20 call.
const BLOCK_BYTES: usize = 16 * 1024;

/// acc ±= PRG(seed) over the ring, element by element, without materialising the mask. The
/// nonce is fixed at zero: every seed is fresh per round and pair (HKDF with the round in its
/// context), so no (key, nonce) pair repeats.
pub fn apply_mask(acc: &mut [u64], seed: &[u8; 32], ring: Ring, sign: Sign) {
    let mut cipher = ChaCha20::new(seed.into(), &[0u8; 12].into());
    let width = ring.element_bytes();
    let mut buf = vec![0u8; BLOCK_BYTES];
    for chunk in acc.chunks_mut(BLOCK_BYTES / width) {
        let bytes = &mut buf[..chunk.len() * width];
        cipher.write_keystream(bytes);
        match (width, sign) {
            (4, Sign::Plus) => mix::<4, false>(chunk, bytes, ring.mask()),
            (4, Sign::Minus) => mix::<4, true>(chunk, bytes, ring.mask()),
            (_, Sign::Plus) => mix::<8, false>(chunk, bytes, ring.mask()),
            (_, Sign::Minus) => mix::<8, true>(chunk, bytes, ring.mask()),
        }
    }
}

/// acc ±= PRG(seed) for every (seed, sign) of `masks`, spread over the cores: each thread
/// expands its share of the masks into an accumulator of its own (the first into `acc`), and the
/// accumulators are then added. The result equals applying the masks one by one.
pub fn apply_masks(acc: &mut [u64], masks: &[([u8; 32], Sign)], ring: Ring) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_thread = masks.len().div_ceil(threads.max(1)).max(1);
    let mut groups = masks.chunks(per_thread);
    let Some(own) = groups.next() else {
        return;
    };
    let apply_all = |acc: &mut [u64], group: &[([u8; 32], Sign)]| {
        for (seed, sign) in group {
            apply_mask(acc, seed, ring, *sign);
        }
    };
    let len = acc.len();
    std::thread::scope(|scope| {
        let others: Vec<_> = groups
            .map(|group| {
                scope.spawn(move || {
                    let mut part = vec![0u64; len];
                    apply_all(&mut part, group);
                    part
                })
            })
            .collect();
        apply_all(acc, own);
        for other in others {
            let part = other.join().expect("mask expansion does not panic");
            for (a, p) in acc.iter_mut().zip(part) {
                *a = a.wrapping_add(p) & ring.mask();
            }
        }
    });
}

/// acc[i] = acc[i] ± m_i mod 2^b, m_i the i-th W-byte little-endian word of `bytes`. Width and
/// sign are constants so the loop compiles without branches (a - m = a + (2^64 - m) mod 2^b).
fn mix<const W: usize, const NEGATE: bool>(acc: &mut [u64], bytes: &[u8], mask: u64) {
    for (a, c) in acc.iter_mut().zip(bytes.chunks_exact(W)) {
        let mut word = [0u8; 8];
        word[..W].copy_from_slice(c);
        let m = u64::from_le_bytes(word);
        let m = if NEGATE { m.wrapping_neg() } else { m };
        *a = a.wrapping_add(m) & mask;
    }
}

/// PRG(seed) as `len` ring elements.
pub fn expand(seed: &[u8; 32], ring: Ring, len: usize) -> Vec<u64> {
    let mut v = vec![0u64; len];
    apply_mask(&mut v, seed, ring, Sign::Plus);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plus_then_minus_cancels_and_seeds_differ() {
        for bits in [32, 64] {
            let ring = Ring::new(bits).unwrap();
            let x: Vec<u64> = (0..40_000u64).map(|i| (i * 7) & ring.mask()).collect();
            let mut y = x.clone();
            apply_mask(&mut y, &[3u8; 32], ring, Sign::Plus);
            assert_ne!(x, y);
            apply_mask(&mut y, &[3u8; 32], ring, Sign::Minus);
            assert_eq!(x, y);
            assert_ne!(expand(&[3u8; 32], ring, 8), expand(&[4u8; 32], ring, 8));
            assert!(
                expand(&[3u8; 32], ring, 100)
                    .iter()
                    .all(|&m| ring.contains(m))
            );
        }
    }

    /// Masks applied over the cores equal the masks applied one by one.
    #[test]
    fn masks_over_threads_equal_masks_one_by_one() {
        let ring = Ring::new(32).unwrap();
        let masks: Vec<([u8; 32], Sign)> = (0..7u8)
            .map(|i| ([i; 32], if i % 3 == 0 { Sign::Minus } else { Sign::Plus }))
            .collect();
        let start: Vec<u64> = (0..10_001u64)
            .map(|i| (i * 2_654_435_761) & ring.mask())
            .collect();
        let mut one_by_one = start.clone();
        for (seed, sign) in &masks {
            apply_mask(&mut one_by_one, seed, ring, *sign);
        }
        let mut parallel = start;
        apply_masks(&mut parallel, &masks, ring);
        assert_eq!(parallel, one_by_one);
    }

    /// The keystream over many blocks equals an independent ChaCha20 (rand_chacha's, whose
    /// 64-bit block counter and zero stream id give the same words as RFC 8439's 32-bit counter
    /// and zero nonce below 2^32 blocks), whichever SIMD backend chacha20 picked at run time.
    #[test]
    fn expansion_equals_an_independent_chacha20() {
        use rand::{RngCore, SeedableRng};
        let seed = [0x5au8; 32];
        let len = 300_003;
        for bits in [32, 64] {
            let ring = Ring::new(bits).unwrap();
            let width = ring.element_bytes();
            let mut stream = vec![0u8; len * width];
            rand_chacha::ChaCha20Rng::from_seed(seed).fill_bytes(&mut stream);
            let expected: Vec<u64> = stream
                .chunks_exact(width)
                .map(|c| {
                    let mut word = [0u8; 8];
                    word[..width].copy_from_slice(c);
                    u64::from_le_bytes(word) & ring.mask()
                })
                .collect();
            assert!(expand(&seed, ring, len) == expected, "{bits}-bit ring");
        }
    }

    /// A prefix of a longer expansion equals the shorter expansion (the stream is position-based),
    /// and the first bytes match the RFC 8439 Sec. 2.4.2-style keystream of an all-zero key.
    #[test]
    fn expansion_is_a_prefix_stable_keystream() {
        let ring = Ring::new(32).unwrap();
        let long = expand(&[9u8; 32], ring, 10_000);
        let short = expand(&[9u8; 32], ring, 5_000);
        assert_eq!(&long[..5_000], &short[..]);
        // ChaCha20, key 0, nonce 0, counter 0: keystream starts 76 b8 e0 ad (RFC 7539 A.1 #1).
        assert_eq!(
            expand(&[0u8; 32], ring, 1)[0],
            u32::from_le_bytes([0x76, 0xb8, 0xe0, 0xad]) as u64
        );
    }
}
