//! What a strategy stack shows the coordinator beyond its aggregate: views that one strategy or
//! layer each fills (IADMM's per-client tensors, local DP's ledgers, the iterate average). A
//! stack's views are its layers' over its inner strategy's, so a new view is a field here and
//! the code that fills it, not a hook on every trait.

use crate::identity::ids::ClientId;
use crate::records::local_accounts::LocalAccounts;

/// What a client is sent at the start of a round instead of the global model.
pub(crate) trait ClientTensors {
    /// `client`'s tensor for the round whose global model is `global`.
    fn client_tensor(&self, client: ClientId, global: &[f32]) -> Vec<f32>;
}

/// See the module documentation; every view is absent by default.
#[derive(Clone, Copy, Default)]
pub(crate) struct Views<'a> {
    /// What each client is sent instead of the global model (IADMM: its anchor and point).
    pub client_tensors: Option<&'a dyn ClientTensors>,
    /// The clients' local ledgers, under a local mode (for metrics and the summary).
    pub local_accounts: Option<&'a LocalAccounts>,
    /// The model to evaluate and write instead of the global iterate (an average of the
    /// released iterates).
    pub average: Option<&'a [f32]>,
}

impl<'a> Views<'a> {
    /// These views, with `inner`'s wherever these have none.
    pub(crate) fn over(self, inner: Views<'a>) -> Views<'a> {
        Views {
            client_tensors: self.client_tensors.or(inner.client_tensors),
            local_accounts: self.local_accounts.or(inner.local_accounts),
            average: self.average.or(inner.average),
        }
    }

    /// What `client` is sent in place of `global`, if anything.
    pub(crate) fn client_tensor(&self, client: ClientId, global: &[f32]) -> Option<Vec<f32>> {
        (self.client_tensors).map(|t| t.client_tensor(client, global))
    }
}
