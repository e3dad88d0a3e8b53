//! The round side of the client connections, the coordinator's one port to the edge: the
//! coordinator and the collections read the handlers' [`Event`]s here, send the round's task
//! (kept for clients that come back) and the stage messages in the domain crates' types, and
//! refuse or dismiss clients in the round's terms ([`Rejection`]).

use crate::edge::outbox::{Outbox, send_all};
use crate::edge::shared::Shared;
use crate::edge::wire;
use crate::error::ServerError;
use crate::identity::ids::{self, ClientId, GroupId, Identities};
use crate::round::events::{Arrival, Event};
use crate::round::rejection::Rejection;
use crate::round::strategy::GroupRule;
use fl_proto::Frame;
use fl_proto::v1::RoundTask;
use fl_proto::v1::ShutdownKind;
use fl_secagg::ServerStage;
use fl_secagg::task::Task;
use prost::Message;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// How often the population is counted again while waiting for K clients.
const POPULATION_POLL: Duration = Duration::from_millis(250);

/// What waiting for the next event gave.
#[derive(Debug)]
pub(crate) enum Next {
    /// An event from a handler.
    Event(Event),
    /// The deadline passed first.
    Deadline,
    /// The operator asked the server to stop.
    Stopped,
}

/// An aggregator's part of a round, as it was sent.
#[derive(Debug)]
pub(crate) struct SentPart {
    /// The aggregator's name.
    pub aggregator: String,
    /// Its clients connected when the part was sent.
    pub connected: usize,
    /// Its clients sampled into the round.
    pub sampled: usize,
    /// When the part was sent.
    pub at: Instant,
}

/// The events from the handlers and the way back to the clients.
pub(crate) struct Clients {
    shared: Arc<Shared>,
    events: mpsc::Receiver<Arrival>,
    stop: watch::Receiver<bool>,
    /// The tasks clients may be sent, by round: the current round's (for clients sampled into
    /// it and those that come back), or in asynchronous mode each model version still current
    /// enough to be sent.
    tasks: BTreeMap<u64, RoundTasks>,
    /// Clients refused since [`Clients::take_refused`] was last called.
    refused: AtomicUsize,
}

/// The task of a round and which stream of each client got it.
struct RoundTasks {
    /// The task without its tensor sizes.
    template: RoundTask,
    /// The task and model chunks for a client that gets the global model.
    common: Vec<Frame>,
    /// The stream generation each sampled client was sent the task on.
    sent_on: BTreeMap<ClientId, u64>,
}

impl Clients {
    /// Reads `events` and watches `stop`.
    pub(crate) fn new(
        shared: Arc<Shared>,
        events: mpsc::Receiver<Arrival>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self {
            shared,
            events,
            stop,
            tasks: BTreeMap::new(),
            refused: AtomicUsize::new(0),
        }
    }

    /// Whether the operator asked the server to stop.
    pub(crate) fn stop_requested(&self) -> bool {
        *self.stop.borrow()
    }

    /// The clients with a live stream, after revoking those the enrollment list no longer
    /// admits (a client revoked since the last check is neither sampled nor sent the model),
    /// and the clients the live aggregators report.
    pub(crate) fn connected(&self) -> Vec<ClientId> {
        self.shared.enforce_enrollment();
        let mut connected = self.shared.registry().connected();
        connected.extend(self.shared.groups().members());
        connected
    }

    /// How many clients [`Clients::connected`] would give.
    fn population(&self) -> usize {
        self.shared.registry().connected().len() + self.shared.groups().members().count()
    }

    /// Sends each live aggregator with clients in `sampled` its part of the current round: the
    /// task with the model `global`, its sampled clients (by its own ids), how to sum their
    /// updates and its `timeout`; returns the bytes sent and the parts sent, by group.
    pub(crate) fn send_group_tasks(
        &self,
        sampled: &BTreeSet<ClientId>,
        global: &[f32],
        (rule, timeout): (GroupRule, Duration),
    ) -> (u64, BTreeMap<GroupId, SentPart>) {
        let mut shares: BTreeMap<GroupId, Vec<ClientId>> = BTreeMap::new();
        for (group, local) in sampled.iter().filter_map(|&id| ids::group_of(id)) {
            shares.entry(group).or_default().push(local);
        }
        let Some(tasks) = self.tasks.values().next_back() else {
            return (0, BTreeMap::new());
        };
        let groups = self.shared.groups();
        let (mut bytes, mut sent) = (0, BTreeMap::new());
        for (group, clients) in shares {
            let (Some(outbox), Some((aggregator, connected))) =
                (groups.outbox(group), groups.describe(group))
            else {
                continue;
            };
            let part = SentPart {
                aggregator,
                connected,
                sampled: clients.len(),
                at: Instant::now(),
            };
            let messages = wire::group_task(&tasks.template, clients, global, (rule, timeout));
            bytes += messages.iter().map(|m| m.encoded_len() as u64).sum::<u64>();
            sent.insert(group, part);
            tokio::spawn(async move {
                for m in messages {
                    if outbox.send(Ok(m)).await.is_err() {
                        break;
                    }
                }
            });
        }
        (bytes, sent)
    }

    /// Counts clients an aggregator refused in the round, with those refused here.
    pub(crate) fn add_refused(&self, refused: usize) {
        self.refused.fetch_add(refused, Ordering::Relaxed);
    }

    /// Whether `client` is still admitted (not revoked).
    pub(crate) fn is_admitted(&self, client: ClientId) -> bool {
        self.shared.registry().is_admitted(client)
    }

    /// What a checkpoint keeps of the registry.
    pub(crate) fn identities(&self) -> Identities {
        self.shared.registry().identities()
    }

    /// The next event, unless `deadline` passes or the operator stops the server first.
    pub(crate) async fn next_before(&mut self, deadline: Instant) -> Result<Next, ServerError> {
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
    pub(crate) async fn wait_for(
        &mut self,
        expected: usize,
        patience: Duration,
    ) -> Result<(), ServerError> {
        let deadline = Instant::now() + patience;
        tracing::info!(expected, "waiting for clients");
        loop {
            let connected = self.population();
            if connected >= expected {
                tracing::info!(connected, "all expected clients connected");
                return Ok(());
            }
            // Aggregators' reports change the population without an event: look again soon.
            let wake = deadline.min(Instant::now() + POPULATION_POLL);
            match self.next_before(wake).await? {
                Next::Deadline if Instant::now() < deadline => {}
                Next::Deadline => {
                    return Err(ServerError::NotEnoughClients {
                        connected,
                        expected,
                    });
                }
                Next::Stopped => return Err(ServerError::Interrupted),
                // Only connections matter before the first round; stray uploads are refused
                // when rounds start checking them, so drop them here.
                Next::Event(
                    Event::Update { client, .. }
                    | Event::Sign { client, .. }
                    | Event::Verified { client, .. },
                ) => self.reject(client, Rejection::NoRound),
                Next::Event(_) => {}
            }
        }
    }

    /// Starts a round: `task` over the global model `global` is what its clients are sent.
    pub(crate) fn start_round(&mut self, task: &Task, global: &[f32]) {
        self.tasks.clear();
        self.add_version(task, global);
    }

    /// Adds the task of a new model version beside those still current (asynchronous mode).
    pub(crate) fn add_version(&mut self, task: &Task, global: &[f32]) {
        let template = wire::task_template(task);
        let tasks = RoundTasks {
            common: wire::task_messages(&template, global),
            template,
            sent_on: BTreeMap::new(),
        };
        self.tasks.insert(task.round, tasks);
    }

    /// Forgets the tasks of rounds before `round`.
    pub(crate) fn retire_before(&mut self, round: u64) {
        self.tasks = self.tasks.split_off(&round);
    }

    /// Sends client `id` the task of round `round` (asynchronous mode), as
    /// [`Clients::send_task`] sends the current one.
    pub(crate) fn send_version(&mut self, id: ClientId, round: u64) -> u64 {
        let stream = self.shared.registry().stream(id);
        match (self.tasks.get_mut(&round), stream) {
            (Some(tasks), Some(stream)) => send_once(tasks, id, stream, || None),
            _ => 0,
        }
    }

    /// Sends client `id` the round's task on its live stream, unless that stream already got it,
    /// with the global model or the tensor `own` gives it instead (IADMM's anchor and point);
    /// returns the bytes sent.
    pub(crate) fn send_task(
        &mut self,
        id: ClientId,
        own: impl FnOnce() -> Option<Vec<f32>>,
    ) -> u64 {
        let stream = self.shared.registry().stream(id);
        match (self.tasks.values_mut().next_back(), stream) {
            (Some(tasks), Some(stream)) => send_once(tasks, id, stream, own),
            _ => 0,
        }
    }

    /// Sends `client` a stage message of round `round`; returns the bytes sent (0 without a
    /// stream).
    pub(crate) fn send_stage(&self, client: ClientId, round: u64, stage: &ServerStage) -> u64 {
        self.send(client, vec![wire::stage(round, stage)])
    }

    /// Sends `messages` on `client`'s live stream; returns the bytes sent (0 without a stream).
    fn send(&self, client: ClientId, messages: Vec<Frame>) -> u64 {
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
    pub(crate) fn reject(&self, client: ClientId, rejection: Rejection) {
        tracing::warn!(client, error = %rejection, "update refused; client dropped");
        self.refused.fetch_add(1, Ordering::Relaxed);
        if let Some(outbox) = self.shared.registry().disconnect(client) {
            tokio::spawn(async move {
                let _ = outbox.send(Err(Box::new(rejection.into()))).await;
            });
        }
    }

    /// How many clients were refused since the last call (a round's count, taken at its end).
    pub(crate) fn take_refused(&self) -> usize {
        self.refused.swap(0, Ordering::Relaxed)
    }

    /// Tells every connected client and aggregator that training is over, or (`resuming`) that
    /// the server stops to be resumed and they should reconnect, and releases their streams.
    pub(crate) fn shutdown_all(&self, round: u64, resuming: bool) {
        let kind = match resuming {
            true => ShutdownKind::Resuming,
            false => ShutdownKind::Finished,
        };
        let mut registry = self.shared.registry();
        for id in registry.connected() {
            if let Some(outbox) = registry.outbox(id) {
                send_all(outbox, vec![wire::shutdown(round, kind)]);
            }
        }
        registry.disconnect_all();
        // The aggregators tell their clients themselves.
        for outbox in self.shared.groups().close_all() {
            let message = wire::group_shutdown(round, kind);
            tokio::spawn(async move { outbox.send(Ok(message)).await });
        }
    }
}

/// Sends `tasks` to client `id` on its live `(generation, outbox)` unless that stream already got
/// it, with the global model or the tensor `own` gives it instead; returns the bytes sent.
fn send_once(
    tasks: &mut RoundTasks,
    id: ClientId,
    (generation, outbox): (u64, Outbox),
    own: impl FnOnce() -> Option<Vec<f32>>,
) -> u64 {
    if tasks.sent_on.insert(id, generation) == Some(generation) {
        return 0;
    }
    let batch = match own() {
        Some(tensor) => wire::task_messages(&tasks.template, &tensor),
        None => tasks.common.clone(),
    };
    let sent = batch.iter().map(|m| m.message_len() as u64).sum();
    send_all(outbox, batch);
    sent
}
