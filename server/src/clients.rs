//! The round side of the client connections: the coordinator and the collections read the
//! handlers' [`Event`]s here and answer, refuse or dismiss clients through it.

use crate::ServerError;
use crate::registry::ClientId;
use crate::rejection::Rejection;
use crate::service::{Arrival, Event, Shared, send_all};
use crate::wire::{self, Outgoing};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// What waiting for the next event gave.
#[derive(Debug)]
pub enum Next {
    /// An event from a handler.
    Event(Event),
    /// The deadline passed first.
    Deadline,
    /// The operator asked the server to stop.
    Stopped,
}

/// The events from the handlers and the way back to the clients.
pub struct Clients {
    /// Shared with the gRPC handlers.
    pub shared: Arc<Shared>,
    events: mpsc::Receiver<Arrival>,
    stop: watch::Receiver<bool>,
}

impl Clients {
    /// Reads `events` and watches `stop`.
    pub fn new(
        shared: Arc<Shared>,
        events: mpsc::Receiver<Arrival>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self {
            shared,
            events,
            stop,
        }
    }

    /// Whether the operator asked the server to stop.
    pub fn stop_requested(&self) -> bool {
        *self.stop.borrow()
    }

    /// The next event, unless `deadline` passes or the operator stops the server first.
    pub async fn next_before(&mut self, deadline: Instant) -> Result<Next, ServerError> {
        tokio::select! {
            e = tokio::time::timeout_at(deadline.into(), self.events.recv()) => match e {
                Err(_) => Ok(Next::Deadline),
                Ok(None) => Err(ServerError::Internal("event channel closed".into())),
                // The upload's place is freed: the caller folds it before it asks again.
                Ok(Some(arrival)) => Ok(Next::Event(arrival.event)),
            },
            _ = self.stop.changed() => Ok(Next::Stopped),
        }
    }

    /// Waits until K = `expected` clients have live streams, for at most `patience`.
    pub async fn wait_for(
        &mut self,
        expected: usize,
        patience: Duration,
    ) -> Result<(), ServerError> {
        let deadline = Instant::now() + patience;
        tracing::info!(expected, "waiting for clients");
        loop {
            let connected = self.shared.registry().connected().len();
            if connected >= expected {
                tracing::info!(connected, "all expected clients connected");
                return Ok(());
            }
            match self.next_before(deadline).await? {
                Next::Deadline => {
                    return Err(ServerError::NotEnoughClients {
                        connected,
                        expected,
                    });
                }
                Next::Stopped => return Err(ServerError::Interrupted),
                // Only connections matter before the first round; stray uploads are refused
                // when rounds start checking them, so drop them here.
                Next::Event(Event::Update { client, .. } | Event::Sign { client, .. }) => {
                    self.reject(client, Rejection::NoRound)
                }
                Next::Event(_) => {}
            }
        }
    }

    /// Sends `messages` on `client`'s live stream; returns the bytes sent (0 without a stream).
    pub fn send(&self, client: ClientId, messages: Vec<Outgoing>) -> u64 {
        match self.shared.registry().outbox(client) {
            Some(outbox) => {
                let size = messages.iter().map(|m| m.message_len() as u64).sum();
                send_all(outbox, messages);
                size
            }
            None => 0,
        }
    }

    /// Ends a misbehaving client's stream with the status of `rejection`; the round goes on
    /// without it.
    pub fn reject(&self, client: ClientId, rejection: Rejection) {
        tracing::warn!(client, error = %rejection, "update refused; client dropped");
        if let Some(outbox) = self.shared.registry().disconnect(client) {
            tokio::spawn(async move {
                let _ = outbox.send(Err(Box::new(rejection.into()))).await;
            });
        }
    }

    /// Tells every connected client that training is over and releases their streams.
    pub fn shutdown_all(&self, round: u64) {
        let mut registry = self.shared.registry();
        for id in registry.connected() {
            if let Some(outbox) = registry.outbox(id) {
                send_all(outbox, vec![wire::shutdown(round, "training finished")]);
            }
        }
        registry.disconnect_all();
    }
}
