//! The content digest that checkpoints and model files carry, checked when they are loaded: a
//! flipped byte, a truncated tensor or an edited metadata value is refused, naming the file.
//!
//! SHA-256 over every tensor (name, dtype, shape, bytes) in name order and every metadata entry
//! but the digest itself, in key order, each field length-prefixed so that no two contents hash
//! alike by shifting bytes between fields. It detects damage and careless edits, not an attacker
//! who can rewrite the file: such a one recomputes the digest.

use safetensors::SafeTensors;
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;

/// Metadata key of the digest, `sha256:HEX`.
pub(crate) const KEY: &str = "fl.sha256";

/// One tensor as the digest reads it.
pub(crate) struct Part<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its dtype, as safetensors writes it (`F32`).
    pub dtype: String,
    /// Its shape.
    pub shape: &'a [usize],
    /// Its bytes.
    pub data: &'a [u8],
}

/// The digest of `tensors` (any order) and `metadata` (its [`KEY`] entry left out).
pub(crate) fn of<'a>(mut tensors: Vec<Part<'a>>, metadata: &HashMap<String, String>) -> String {
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    tensors.sort_by(|a, b| a.name.cmp(b.name));
    for t in &tensors {
        field(t.name.as_bytes());
        field(t.dtype.as_bytes());
        let shape: Vec<u8> = (t.shape.iter())
            .flat_map(|d| (*d as u64).to_le_bytes())
            .collect();
        field(&shape);
        field(t.data);
    }
    let mut entries: Vec<_> = metadata.iter().filter(|(k, _)| *k != KEY).collect();
    entries.sort();
    for (k, v) in entries {
        field(k.as_bytes());
        field(v.as_bytes());
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// Checks a loaded file's digest: `Ok(true)` when it matches, `Ok(false)` when the file has none
/// (written by another tool), an error naming what differs otherwise.
pub(crate) fn check(
    file: &SafeTensors,
    metadata: Option<&HashMap<String, String>>,
) -> Result<bool, String> {
    let empty = HashMap::new();
    let metadata = metadata.unwrap_or(&empty);
    let Some(stated) = metadata.get(KEY) else {
        return Ok(false);
    };
    let tensors = file.tensors();
    let parts = (tensors.iter())
        .map(|(name, view)| Part {
            name,
            dtype: format!("{:?}", view.dtype()),
            shape: view.shape(),
            data: view.data(),
        })
        .collect();
    let actual = of(parts, metadata);
    match actual == *stated {
        true => Ok(true),
        false => Err(format!(
            "its content does not match its digest ({stated} stated, {actual} found): the file \
             was damaged or edited"
        )),
    }
}
