//! A round's task as sent to every sampled client, kept for clients that reconnect.

use crate::clients::Clients;
use crate::registry::ClientId;
use crate::service::send_all;
use crate::strategy::Strategy;
use fl_proto::v1::{RoundTask, ServerMessage, server_message};
use fl_proto::{chunk_count, encode_chunks};
use prost::Message;
use std::collections::BTreeMap;

/// The task of a round and which stream of each client got it.
pub struct RoundTasks {
    /// The task without its tensor sizes.
    template: RoundTask,
    /// The task and model chunks for a client that gets the global model.
    common: Vec<ServerMessage>,
    /// The stream generation each sampled client was sent the task on.
    sent_on: BTreeMap<ClientId, u64>,
}

impl RoundTasks {
    /// The tasks of `template`'s round over the global model `global`.
    pub fn new(template: RoundTask, global: &[f32]) -> Self {
        Self {
            common: task_messages(&template, global),
            template,
            sent_on: BTreeMap::new(),
        }
    }

    /// Sends client `id` its task on its live stream, unless that stream already got it, with the
    /// global model or what `strategy` sends it instead; returns the bytes sent.
    pub fn send(
        &mut self,
        clients: &Clients,
        strategy: &dyn Strategy,
        id: ClientId,
        global: &[f32],
    ) -> u64 {
        let Some((generation, outbox)) = clients.shared.registry().stream(id) else {
            return 0;
        };
        if self.sent_on.insert(id, generation) == Some(generation) {
            return 0;
        }
        let batch = match strategy.client_tensor(id, global) {
            Some(own) => task_messages(&self.template, &own),
            None => self.common.clone(),
        };
        let sent = batch.iter().map(|m| m.encoded_len() as u64).sum();
        send_all(outbox, batch);
        sent
    }
}

/// The messages of a task carrying `tensor`: the RoundTask, then the tensor's chunks.
fn task_messages(template: &RoundTask, tensor: &[f32]) -> Vec<ServerMessage> {
    let round = template.round;
    let task = RoundTask {
        num_values: tensor.len() as u64,
        num_chunks: chunk_count(tensor.len()),
        ..template.clone()
    };
    std::iter::once(server_message::Body::Task(task))
        .chain(encode_chunks(round, tensor).map(server_message::Body::ModelChunk))
        .map(|body| ServerMessage { body: Some(body) })
        .collect()
}
