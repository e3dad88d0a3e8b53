//! A client's side of a verified round, without I/O: its update clipped, encoded, proved and
//! split between the server and the helper (`fl_secagg::verified`), the helper's share sealed to
//! the key the client holds.

use crate::refusal::Refusal;
use fl_secagg::verified::{Binder, HelperPublicKey, Report, Shape, shard, shard_unclipped};

/// A helper's public key from its 64 hex digits (as `fl-server --role helper` prints it).
pub fn helper_key(text: &str) -> Result<[u8; 32], String> {
    let bytes = hex::decode(text.trim()).map_err(|e| format!("not hex: {e}"))?;
    HelperPublicKey::from_bytes(&bytes)
        .map(|key| key.to_bytes())
        .map_err(|e| format!("{e}: 64 hex digits"))
}

/// The verified upload of `update`, or (in the rare case the wraparound check fails an honest
/// update, which would tell the server something of it) of the zero update in its place; or,
/// for a compromised client (simulation only), its attack's update unclipped.
pub(crate) fn verified_upload(
    shape: &Shape,
    binder: &Binder,
    helper: &[u8; 32],
    (update, attack): (&[f32], Option<Vec<f32>>),
) -> Result<Box<Report>, Refusal> {
    let key = HelperPublicKey::from_bytes(helper).map_err(|e| Refusal::Verified(e.to_string()))?;
    if let Some(poisoned) = attack {
        let report = shard_unclipped(shape, binder, &key, &poisoned);
        return (report.map(Box::new)).map_err(|e| Refusal::Verified(e.to_string()));
    }
    let report = shard(shape, binder, &key, update).or_else(|reason| {
        tracing::warn!(%reason, "the update could not be proved: sending the zero update instead");
        shard(shape, binder, &key, &vec![0.0; update.len()])
    });
    report
        .map(Box::new)
        .map_err(|e| Refusal::Verified(e.to_string()))
}
