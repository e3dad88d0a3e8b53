//! The clients the server knows: who joined, with which session key and identity, and which are
//! connected right now (with the channel that feeds their Session stream).
//!
//! An enrolled client (see [`crate::identity::credentials`]) keeps its client id across joins and server
//! restarts: the id is looked up by its name, and the names' ids go into every checkpoint. An
//! anonymous client gets a new id at each Join, but can reopen its Session with the id and session
//! key it holds (a reconnect), as long as this server process knows them.
//!
//! A client without a live stream (joined but never opened its Session, or gone) is idle; idle
//! clients are counted, so that Join can refuse beyond a bound, and forgotten after a grace period
//! ([`Registry::forget_idle`]), so that joins that never become sessions cost nothing for long.

use crate::identity::ids::{ClientId, Identities};
use crate::identity::secret::constant_time_eq;
use rand::RngCore;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use crate::edge::outbox::Outbox;

#[derive(Debug)]
struct Entry {
    /// `None` for an enrolled identity restored from a checkpoint, until it joins again.
    session_key: Option<[u8; 32]>,
    /// The enrolled name, if any.
    identity: Option<String>,
    /// Revoked: no stream can be bound until it is admitted again.
    revoked: bool,
    /// The live stream, tagged with its generation so that a stale reader cannot detach a
    /// newer stream of the same client.
    stream: Option<(u64, Outbox)>,
    /// Since when it has had no stream (`None` while it has one).
    idle_since: Option<Instant>,
}

impl Entry {
    fn new(identity: Option<String>) -> Self {
        Self {
            session_key: None,
            identity,
            revoked: false,
            stream: None,
            idle_since: None,
        }
    }
}

/// Joined clients and their live streams.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    next_id: ClientId,
    next_generation: u64,
    clients: BTreeMap<ClientId, Entry>,
    /// Enrolled names and their ids.
    identities: BTreeMap<String, ClientId>,
    /// The idle clients, oldest first.
    idle: BTreeSet<(Instant, ClientId)>,
}

/// Why a Hello was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum AttachError {
    /// No client joined with that id.
    #[error("unknown client id {0}; call Join first")]
    UnknownClient(ClientId),
    /// The session key does not match the one handed out at Join.
    #[error("session key does not match client {0}")]
    BadKey(ClientId),
    /// The client was revoked.
    #[error("client {0} is revoked")]
    Revoked(ClientId),
}

impl Registry {
    /// A registry that knows the identities of an earlier run.
    pub(crate) fn restore(identities: &Identities) -> Self {
        let mut r = Self {
            next_id: identities.next_id,
            ..Self::default()
        };
        for (name, &id) in &identities.names {
            r.next_id = r.next_id.max(id + 1);
            r.identities.insert(name.clone(), id);
            r.clients.insert(id, Entry::new(Some(name.clone())));
            r.set_stream(id, None);
        }
        r
    }

    /// Binds (or with `None` unbinds) a client's stream, keeping the idle set in step; returns
    /// the stream it had.
    fn set_stream(&mut self, id: ClientId, stream: Option<(u64, Outbox)>) -> Option<(u64, Outbox)> {
        let entry = self.clients.get_mut(&id)?;
        if let Some(since) = entry.idle_since.take() {
            self.idle.remove(&(since, id));
        }
        if stream.is_none() {
            let now = Instant::now();
            entry.idle_since = Some(now);
            self.idle.insert((now, id));
        }
        std::mem::replace(&mut entry.stream, stream)
    }

    /// How many clients have no live stream.
    pub(crate) fn idle_count(&self) -> usize {
        self.idle.len()
    }

    /// Forgets every client idle since before `cutoff` (enrolled names keep their ids); returns
    /// how many. A forgotten client that comes back is told to join again.
    pub(crate) fn forget_idle(&mut self, cutoff: Instant) -> usize {
        let keep = self.idle.split_off(&(cutoff, 0));
        let expired = std::mem::replace(&mut self.idle, keep);
        for (_, id) in &expired {
            self.clients.remove(id);
        }
        expired.len()
    }

    /// What to checkpoint.
    pub(crate) fn identities(&self) -> Identities {
        Identities {
            names: self.identities.clone(),
            next_id: self.next_id,
        }
    }

    /// Admits a client and returns its id and fresh session key (from `rand`'s thread-local
    /// CSPRNG, ChaCha12 seeded from the OS). An enrolled `identity` keeps the id it had; its
    /// earlier session key stops working.
    pub(crate) fn join(&mut self, identity: Option<&str>) -> (ClientId, [u8; 32]) {
        let known = identity.and_then(|name| self.identities.get(name).copied());
        let id = known.unwrap_or_else(|| {
            let id = self.next_id;
            self.next_id += 1;
            if let Some(name) = identity {
                self.identities.insert(name.to_owned(), id);
            }
            id
        });
        let mut session_key = [0u8; 32];
        rand::rng().fill_bytes(&mut session_key);
        let entry = self
            .clients
            .entry(id)
            .or_insert_with(|| Entry::new(identity.map(str::to_owned)));
        entry.session_key = Some(session_key);
        entry.revoked = false;
        // A new or idle client's grace period starts (again) now.
        if entry.stream.is_none() {
            self.set_stream(id, None);
        }
        (id, session_key)
    }

    /// Binds a Session stream to a joined client, replacing any earlier stream (a reconnect).
    /// Returns the stream's generation, to quote in [`Registry::detach`], and the stream it
    /// replaced, which the caller ends.
    pub(crate) fn attach(
        &mut self,
        id: ClientId,
        key: &[u8],
        outbox: Outbox,
    ) -> Result<(u64, Option<Outbox>), AttachError> {
        let entry = self
            .clients
            .get_mut(&id)
            .ok_or(AttachError::UnknownClient(id))?;
        if !entry.session_key.is_some_and(|k| constant_time_eq(&k, key)) {
            return Err(AttachError::BadKey(id));
        }
        if entry.revoked {
            return Err(AttachError::Revoked(id));
        }
        let generation = self.next_generation;
        self.next_generation += 1;
        let old = self.set_stream(id, Some((generation, outbox)));
        Ok((generation, old.map(|(_, outbox)| outbox)))
    }

    /// Whether the stream of generation `generation` is still the client's live one.
    pub(crate) fn is_current(&self, id: ClientId, generation: u64) -> bool {
        self.clients
            .get(&id)
            .is_some_and(|e| matches!(e.stream, Some((g, _)) if g == generation))
    }

    /// Unbinds the stream of generation `generation` (a no-op when a newer one replaced it).
    /// Returns whether it was the live stream.
    pub(crate) fn detach(&mut self, id: ClientId, generation: u64) -> bool {
        let live = self.is_current(id, generation);
        if live {
            self.set_stream(id, None);
        }
        live
    }

    /// Unbinds whatever stream the client has and returns it.
    pub(crate) fn disconnect(&mut self, id: ClientId) -> Option<Outbox> {
        self.clients.get(&id)?.stream.as_ref()?;
        self.set_stream(id, None).map(|(_, outbox)| outbox)
    }

    /// Revokes every enrolled client whose name `active` refuses (anonymous clients are left
    /// alone): it can no longer bind a stream, and its live stream is unbound. Returns the
    /// clients revoked now, with the streams they had.
    pub(crate) fn revoke_inactive(
        &mut self,
        active: impl Fn(&str) -> bool,
    ) -> Vec<(ClientId, Option<Outbox>)> {
        let mut now_revoked = Vec::new();
        for (&id, entry) in &mut self.clients {
            let refused = entry.identity.as_deref().is_some_and(|name| !active(name));
            if refused && !entry.revoked {
                entry.revoked = true;
                entry.session_key = None;
                now_revoked.push(id);
            }
        }
        now_revoked
            .into_iter()
            .map(|id| (id, self.disconnect(id)))
            .collect()
    }

    /// Whether the client may take part: it joined and is not revoked.
    pub(crate) fn is_admitted(&self, id: ClientId) -> bool {
        self.clients.get(&id).is_some_and(|e| !e.revoked)
    }

    /// Ids of the clients with a live stream, ascending.
    pub(crate) fn connected(&self) -> Vec<ClientId> {
        self.clients
            .iter()
            .filter(|(_, e)| e.stream.is_some())
            .map(|(&id, _)| id)
            .collect()
    }

    /// The live stream of a client and its generation.
    pub(crate) fn stream(&self, id: ClientId) -> Option<(u64, Outbox)> {
        self.clients.get(&id).and_then(|e| e.stream.clone())
    }

    /// The live stream of a client.
    pub(crate) fn outbox(&self, id: ClientId) -> Option<Outbox> {
        self.clients
            .get(&id)
            .and_then(|e| e.stream.as_ref())
            .map(|(_, o)| o.clone())
    }

    /// Drops every live stream (ends all Session responses).
    pub(crate) fn disconnect_all(&mut self) {
        for id in self.connected() {
            self.set_stream(id, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    #[test]
    fn attach_checks_keys_and_generations() {
        let mut r = Registry::default();
        let (id, key) = r.join(None);
        let (tx, _rx) = mpsc::channel(1);
        assert_eq!(
            r.attach(id + 1, &key, tx.clone()).err(),
            Some(AttachError::UnknownClient(id + 1))
        );
        assert_eq!(
            r.attach(id, &[0; 32], tx.clone()).err(),
            Some(AttachError::BadKey(id))
        );
        let (g1, none) = r.attach(id, &key, tx.clone()).unwrap();
        assert!(none.is_none());
        let (g2, replaced) = r.attach(id, &key, tx).unwrap();
        assert!(
            replaced.is_some(),
            "the superseded stream is handed back to be ended"
        );
        assert!(!r.is_current(id, g1) && r.is_current(id, g2));
        assert!(
            !r.detach(id, g1),
            "a stale stream must not detach the new one"
        );
        assert_eq!(r.connected(), vec![id]);
        assert!(r.detach(id, g2));
        assert!(r.connected().is_empty());
    }

    #[test]
    fn idle_clients_are_counted_and_forgotten_after_their_grace() {
        let mut r = Registry::default();
        let (a, key_a) = r.join(None);
        let (b, _) = r.join(None);
        let (e, _) = r.join(Some("enrolled"));
        assert_eq!(r.idle_count(), 3);
        let (tx, _rx) = mpsc::channel(1);
        let (g, _) = r.attach(a, &key_a, tx).unwrap();
        assert_eq!(r.idle_count(), 2);
        assert_eq!(r.forget_idle(Instant::now()), 2);
        assert_eq!(r.idle_count(), 0);
        assert_eq!(r.connected(), vec![a]);
        assert!(!r.is_admitted(b), "a forgotten client must join again");
        assert_eq!(
            r.join(Some("enrolled")).0,
            e,
            "enrolled names keep their ids"
        );
        // A client that leaves is idle from then on.
        assert!(r.detach(a, g));
        assert_eq!(r.idle_count(), 2);
        assert_eq!(
            r.forget_idle(Instant::now() - std::time::Duration::from_secs(60)),
            0
        );
        assert_eq!(r.forget_idle(Instant::now()), 2);
        assert!(r.connected().is_empty() && !r.is_admitted(a));
    }

    #[test]
    fn enrolled_clients_keep_their_id_across_joins_and_restarts() {
        let mut r = Registry::default();
        let (a, key_a) = r.join(Some("a"));
        let (anon, _) = r.join(None);
        let (b, _) = r.join(Some("b"));
        let (a_again, key_a2) = r.join(Some("a"));
        assert_eq!(a_again, a);
        assert_ne!(key_a, key_a2);
        let (tx, _rx) = mpsc::channel(1);
        assert_eq!(
            r.attach(a, &key_a, tx.clone()).err(),
            Some(AttachError::BadKey(a)),
            "a new Join retires the earlier session key"
        );

        let saved = r.identities();
        let mut restored = Registry::restore(&saved);
        assert_eq!(restored.identities().names.get("b"), Some(&b));
        assert_eq!(
            restored.attach(a, &key_a2, tx).err(),
            Some(AttachError::BadKey(a)),
            "after a restart every client joins again"
        );
        assert_eq!(restored.join(Some("b")).0, b);
        let (fresh, _) = restored.join(None);
        assert!(fresh > anon && fresh > b, "no id is handed out twice");
    }

    #[test]
    fn revoked_clients_lose_their_stream_and_cannot_attach() {
        let mut r = Registry::default();
        let (a, key_a) = r.join(Some("a"));
        let (b, key_b) = r.join(Some("b"));
        let (anon, key_n) = r.join(None);
        let (tx, _rx) = mpsc::channel(1);
        for (id, key) in [(a, key_a), (b, key_b), (anon, key_n)] {
            r.attach(id, &key, tx.clone()).unwrap();
        }
        let revoked = r.revoke_inactive(|name| name != "a");
        assert_eq!(revoked.len(), 1);
        assert_eq!(revoked[0].0, a);
        assert!(revoked[0].1.is_some(), "its live stream is handed back");
        assert_eq!(r.connected(), vec![b, anon]);
        assert!(!r.is_admitted(a) && r.is_admitted(b) && r.is_admitted(anon));
        assert!(r.attach(a, &key_a, tx.clone()).is_err());
        assert!(
            r.revoke_inactive(|name| name != "a").is_empty(),
            "revoked once"
        );
        // Enrolled again (the operator undid the revocation): a new Join admits it.
        let (again, key) = r.join(Some("a"));
        assert_eq!(again, a);
        assert!(r.attach(a, &key, tx).is_ok());
    }
}
