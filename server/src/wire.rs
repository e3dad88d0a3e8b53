//! What the server sends, in the wire's terms: the coordinator and the collections describe a
//! round's task and the secure-aggregation stage messages in `fl-common` types, and this module
//! encodes them (with `service`, which reads what clients send, and `clients`, which queues the
//! messages, the only place that knows `flp.v1`).

use crate::clients::Clients;
use crate::registry::ClientId;
use crate::service::send_all;
use crate::strategy::{RoundInstructions, Strategy};
use fl_common::model::{LocalConfig, ModelSpec};
use fl_common::secagg::{Calibration, Neighbourhood, Proceed, SealedShares};
use fl_proto::v1::{
    AdmmTask, LocalPrivacy, PeerKeys, RoundTask, SealedShare, SecAggNeighbours, SecAggProceed,
    SecAggShareInbox, SecAggSurvivors, SecAggTask, ServerMessage, Shutdown, server_message,
};
use fl_proto::{Frame, chunk_count, encode_chunks};
use std::collections::BTreeMap;

/// One message to send, encoded (once, however many clients it goes to).
pub type Outgoing = Frame;

/// What a round asks of its sampled clients.
pub struct TaskSpec<'a> {
    /// t.
    pub round: u64,
    /// The model.
    pub model: &'a ModelSpec,
    /// E, B, eta.
    pub local: LocalConfig,
    /// The secure round's code and noise, under secure aggregation.
    pub calibration: Option<&'a Calibration>,
    /// What the strategy stack adds (IADMM's step, the local mechanism).
    pub instructions: RoundInstructions,
}

/// The task of a round and which stream of each client got it, kept for clients that
/// reconnect.
pub struct RoundTasks {
    /// The task without its tensor sizes.
    template: RoundTask,
    /// The task and model chunks for a client that gets the global model.
    common: Vec<Outgoing>,
    /// The stream generation each sampled client was sent the task on.
    sent_on: BTreeMap<ClientId, u64>,
}

impl RoundTasks {
    /// The tasks of `spec` over the global model `global`.
    pub fn new(spec: &TaskSpec<'_>, global: &[f32]) -> Self {
        let template = RoundTask {
            round: spec.round,
            model: Some(spec.model.into()),
            config: Some(spec.local.into()),
            num_values: 0,
            num_chunks: 0,
            secagg: spec.calibration.map(|c| SecAggTask {
                ring_bits: c.quantizer.ring.bits(),
                clip_bound: c.quantizer.clip,
                scale: c.quantizer.scale,
                noise_variance: c.ddg.map_or(0, |d| d.client_variance),
            }),
            local_privacy: spec.instructions.local.map(LocalPrivacy::from),
            admm: spec.instructions.admm.map(|a| AdmmTask {
                rho: a.rho,
                total_examples: a.total_examples,
            }),
        };
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
        let sent = batch.iter().map(|m| m.message_len() as u64).sum();
        send_all(outbox, batch);
        sent
    }
}

/// The messages of a task carrying `tensor`: the RoundTask, then the tensor's chunks.
fn task_messages(template: &RoundTask, tensor: &[f32]) -> Vec<Outgoing> {
    let round = template.round;
    let task = RoundTask {
        num_values: tensor.len() as u64,
        num_chunks: chunk_count(tensor.len()),
        ..template.clone()
    };
    std::iter::once(server_message::Body::Task(task))
        .chain(encode_chunks(round, tensor).map(server_message::Body::ModelChunk))
        .map(message)
        .collect()
}

/// The message of `body`, encoded.
fn message(body: server_message::Body) -> Outgoing {
    Frame::encode(&ServerMessage { body: Some(body) })
}

/// The end of training.
pub fn shutdown(round: u64, reason: &str) -> Outgoing {
    let reason = reason.to_string();
    message(server_message::Body::Shutdown(Shutdown { round, reason }))
}

/// Stage 1's start: a client's neighbours, their keys and the threshold t.
pub fn neighbours(round: u64, hood: &Neighbourhood) -> Outgoing {
    message(server_message::Body::SecaggNeighbours(SecAggNeighbours {
        round,
        threshold: hood.threshold as u32,
        neighbours: hood.neighbours.iter().map(PeerKeys::from).collect(),
    }))
}

/// The check's start: the shares sealed for a client.
pub fn share_inbox(round: u64, inbox: &[SealedShares]) -> Outgoing {
    let shares = inbox.iter().map(SealedShare::from).collect();
    message(server_message::Body::SecaggShareInbox(SecAggShareInbox {
        round,
        shares,
    }))
}

/// Stage 2's start: who is excluded and who goes unpaired.
pub fn proceed(round: u64, p: Proceed) -> Outgoing {
    message(server_message::Body::SecaggProceed(SecAggProceed {
        round,
        excluded: p.excluded,
        unpaired: p.unpaired,
    }))
}

/// Stage 3's start: U3.
pub fn survivors(round: u64, survivors: &[u64]) -> Outgoing {
    message(server_message::Body::SecaggSurvivors(SecAggSurvivors {
        round,
        survivors: survivors.to_vec(),
    }))
}
