//! Z_{2^b}: the finite ring that masked updates live in (b = 32 or 64). Elements are stored as
//! `u64` reduced modulo 2^b; sums wrap, so pairwise masks cancel exactly (Bonawitz et al. 2017,
//! Sec. 3: masking must happen in a finite group, never on floats).

use serde::{Deserialize, Serialize};

/// The ring Z_{2^b}.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct Ring {
    bits: u32,
}

impl Ring {
    /// Z_{2^bits}; `bits` must be 32 or 64.
    pub fn new(bits: u32) -> Result<Self, String> {
        match bits {
            32 | 64 => Ok(Self { bits }),
            _ => Err(format!("ring bit width must be 32 or 64, not {bits}")),
        }
    }

    /// b.
    pub fn bits(self) -> u32 {
        self.bits
    }

    /// Bytes per element on the wire (b / 8).
    pub fn element_bytes(self) -> usize {
        self.bits as usize / 8
    }

    /// 2^b - 1.
    pub fn mask(self) -> u64 {
        if self.bits == 64 {
            u64::MAX
        } else {
            (1u64 << self.bits) - 1
        }
    }

    /// Whether `x` is a reduced element (x < 2^b).
    pub fn contains(self, x: u64) -> bool {
        x <= self.mask()
    }

    /// a + b mod 2^b.
    pub fn add(self, a: u64, b: u64) -> u64 {
        a.wrapping_add(b) & self.mask()
    }

    /// a - b mod 2^b.
    pub fn sub(self, a: u64, b: u64) -> u64 {
        a.wrapping_sub(b) & self.mask()
    }

    /// The ring element of a signed integer (two's complement, reduced).
    pub fn from_signed(self, x: i64) -> u64 {
        (x as u64) & self.mask()
    }

    /// The signed integer in [-2^(b-1), 2^(b-1)) that `x` represents.
    pub fn to_signed(self, x: u64) -> i64 {
        if self.bits == 64 {
            x as i64
        } else {
            let half = 1u64 << (self.bits - 1);
            if x >= half {
                x as i64 - (1i64 << self.bits)
            } else {
                x as i64
            }
        }
    }

    /// The largest magnitude a sum may reach without wrapping: 2^(b-1) - 1.
    pub fn max_signed(self) -> f64 {
        (2f64).powi(self.bits as i32 - 1) - 1.0
    }

    /// acc += v elementwise.
    pub fn add_assign(self, acc: &mut [u64], v: &[u64]) {
        for (a, &x) in acc.iter_mut().zip(v) {
            *a = self.add(*a, x);
        }
    }
}

impl TryFrom<u32> for Ring {
    type Error = String;
    fn try_from(bits: u32) -> Result<Self, String> {
        Ring::new(bits)
    }
}

impl From<Ring> for u32 {
    fn from(r: Ring) -> u32 {
        r.bits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_wraps_modulo_two_to_the_b() {
        let r = Ring::new(32).unwrap();
        assert_eq!(r.add(u32::MAX as u64, 2), 1);
        assert_eq!(r.sub(1, 2), u32::MAX as u64);
        assert_eq!(r.to_signed(r.from_signed(-5)), -5);
        assert_eq!(r.to_signed(r.from_signed(i32::MAX as i64)), i32::MAX as i64);
        let r64 = Ring::new(64).unwrap();
        assert_eq!(r64.add(u64::MAX, 2), 1);
        assert_eq!(r64.to_signed(r64.from_signed(-7)), -7);
        assert!(Ring::new(16).is_err());
    }
}
