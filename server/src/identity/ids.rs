//! The identities the server hands out.

use std::collections::BTreeMap;

/// Identity the server assigns at Join.
pub(crate) type ClientId = u64;

/// What the registry keeps across a restart: the enrolled names' ids, and the first id not yet
/// handed out (so that no new client takes the id, and the strategy state, of an earlier one).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Identities {
    /// Enrolled name -> client id.
    pub names: BTreeMap<String, ClientId>,
    /// The next id to hand out.
    pub next_id: ClientId,
}
