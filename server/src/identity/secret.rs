//! Secrets kept as digests: a token in clear exists only where it is presented, and what the
//! server stores or writes is its SHA-256 [`Digest`] (`sha256:HEX`), compared in constant time.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};
use std::fmt;
use std::str::FromStr;

/// How [`Digest`]s are written.
const PREFIX: &str = "sha256:";
/// Bytes of a generated token (256 bits, from the OS's generator).
const TOKEN_BYTES: usize = 32;

/// A new random token: 256 bits from the OS's generator, in hex.
pub fn new_token() -> std::io::Result<String> {
    use rand::TryRngCore;
    let mut bytes = [0u8; TOKEN_BYTES];
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .map_err(std::io::Error::other)?;
    Ok(hex::encode(bytes))
}

/// A SHA-256 digest: of a token, or of a certificate's DER encoding.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest(pub(super) [u8; 32]);

impl Digest {
    /// SHA-256 of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// Whether two digests are equal, in time independent of where they differ.
    pub fn matches(&self, other: &Digest) -> bool {
        constant_time_eq(&self.0, &other.0)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}", hex::encode(self.0))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Digest {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let hex = s
            .strip_prefix(PREFIX)
            .ok_or_else(|| format!("a digest is written {PREFIX}<64 hex digits>, not {s:?}"))?;
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(hex, &mut bytes)
            .map_err(|e| format!("{s:?} is not a SHA-256 digest: {e}"))?;
        Ok(Self(bytes))
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// The enrollment token shared by every client (`server.token`). In a configuration file it is
/// written in clear or as `sha256:HEX`; it is always written out as its digest. The clear text,
/// when this process read it, stays in memory for in-process clients (`fl sim`).
#[derive(Clone)]
pub struct Token {
    digest: Digest,
    clear: Option<String>,
}

impl Token {
    /// The token `clear`.
    pub fn new(clear: &str) -> Self {
        Self {
            digest: Digest::of(clear.as_bytes()),
            clear: Some(clear.to_owned()),
        }
    }

    /// Its digest.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// The clear text, when this process was given it.
    pub fn clear(&self) -> Option<&str> {
        self.clear.as_deref()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({})", self.digest)
    }
}

impl PartialEq for Token {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest
    }
}

impl Serialize for Token {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.digest.serialize(s)
    }
}

/// In a configuration a token is a string: the secret itself, or its digest `sha256:HEX`.
impl schemars::JsonSchema for Token {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Token".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string" })
    }
}

impl<'de> Deserialize<'de> for Token {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text.starts_with(PREFIX) {
            let digest = text.parse().map_err(serde::de::Error::custom)?;
            return Ok(Self {
                digest,
                clear: None,
            });
        }
        if text.is_empty() {
            return Err(serde::de::Error::custom(
                "an empty token would admit anyone: leave server.token out instead",
            ));
        }
        Ok(Self::new(&text))
    }
}

/// Compares secrets in time independent of where they differ.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_whole_slices() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
