//! The clients the server knows: who joined, with which session key, and which are connected
//! right now (with the channel that feeds their Session stream).

use fl_proto::v1::ServerMessage;
use rand::RngCore;
use std::collections::BTreeMap;
use tokio::sync::mpsc;
use tonic::Status;

/// Identity the server assigns at Join.
pub type ClientId = u64;

/// The sending half of a client's Session stream.
pub type Outbox = mpsc::Sender<Result<ServerMessage, Status>>;

#[derive(Debug)]
struct Entry {
    session_key: [u8; 32],
    num_examples: u64,
    /// The live stream, tagged with its generation so that a stale reader cannot detach a
    /// newer stream of the same client.
    stream: Option<(u64, Outbox)>,
}

/// Joined clients and their live streams.
#[derive(Debug, Default)]
pub struct Registry {
    next_id: ClientId,
    next_generation: u64,
    clients: BTreeMap<ClientId, Entry>,
}

/// Why a Hello was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AttachError {
    /// No client joined with that id.
    #[error("unknown client id {0}; call Join first")]
    UnknownClient(ClientId),
    /// The session key does not match the one handed out at Join.
    #[error("session key does not match client {0}")]
    BadKey(ClientId),
}

impl Registry {
    /// Admits a client and returns its id and fresh session key (from `rand`'s thread-local
    /// CSPRNG, ChaCha12 seeded from the OS).
    pub fn join(&mut self, num_examples: u64) -> (ClientId, [u8; 32]) {
        let id = self.next_id;
        self.next_id += 1;
        let mut session_key = [0u8; 32];
        rand::rng().fill_bytes(&mut session_key);
        self.clients.insert(
            id,
            Entry {
                session_key,
                num_examples,
                stream: None,
            },
        );
        (id, session_key)
    }

    /// Binds a Session stream to a joined client, replacing any earlier stream (a reconnect).
    /// Returns the stream's generation, to quote in [`Registry::detach`].
    pub fn attach(&mut self, id: ClientId, key: &[u8], outbox: Outbox) -> Result<u64, AttachError> {
        let entry = self
            .clients
            .get_mut(&id)
            .ok_or(AttachError::UnknownClient(id))?;
        if !constant_time_eq(&entry.session_key, key) {
            return Err(AttachError::BadKey(id));
        }
        let generation = self.next_generation;
        self.next_generation += 1;
        entry.stream = Some((generation, outbox));
        Ok(generation)
    }

    /// Unbinds the stream of generation `generation` (a no-op when a newer one replaced it).
    /// Returns whether it was the live stream.
    pub fn detach(&mut self, id: ClientId, generation: u64) -> bool {
        match self.clients.get_mut(&id) {
            Some(entry) if matches!(entry.stream, Some((g, _)) if g == generation) => {
                entry.stream = None;
                true
            }
            _ => false,
        }
    }

    /// Unbinds whatever stream the client has and returns it.
    pub fn disconnect(&mut self, id: ClientId) -> Option<Outbox> {
        self.clients
            .get_mut(&id)
            .and_then(|e| e.stream.take())
            .map(|(_, outbox)| outbox)
    }

    /// Ids of the clients with a live stream, ascending.
    pub fn connected(&self) -> Vec<ClientId> {
        self.clients
            .iter()
            .filter(|(_, e)| e.stream.is_some())
            .map(|(&id, _)| id)
            .collect()
    }

    /// The live stream of a client.
    pub fn outbox(&self, id: ClientId) -> Option<Outbox> {
        self.clients
            .get(&id)
            .and_then(|e| e.stream.as_ref())
            .map(|(_, o)| o.clone())
    }

    /// Example count the client declared at Join.
    pub fn num_examples(&self, id: ClientId) -> Option<u64> {
        self.clients.get(&id).map(|e| e.num_examples)
    }

    /// Drops every live stream (ends all Session responses).
    pub fn disconnect_all(&mut self) {
        for entry in self.clients.values_mut() {
            entry.stream = None;
        }
    }
}

/// Compares secrets in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_checks_keys_and_generations() {
        let mut r = Registry::default();
        let (id, key) = r.join(600);
        let (tx, _rx) = mpsc::channel(1);
        assert_eq!(
            r.attach(id + 1, &key, tx.clone()),
            Err(AttachError::UnknownClient(id + 1))
        );
        assert_eq!(
            r.attach(id, &[0; 32], tx.clone()),
            Err(AttachError::BadKey(id))
        );
        let g1 = r.attach(id, &key, tx.clone()).unwrap();
        let g2 = r.attach(id, &key, tx).unwrap();
        assert!(
            !r.detach(id, g1),
            "a stale stream must not detach the new one"
        );
        assert_eq!(r.connected(), vec![id]);
        assert!(r.detach(id, g2));
        assert!(r.connected().is_empty());
        assert_eq!(r.num_examples(id), Some(600));
    }

    #[test]
    fn constant_time_eq_compares_whole_slices() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
