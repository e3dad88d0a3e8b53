//! What the server sends, encoded: a round's task with its tensor, the secure-aggregation stage
//! messages and Shutdown, from the domain crates' types (`fl_proto::convert` maps each). It keeps
//! no state; `crate::edge::clients` queues what it encodes.

use crate::round::strategy::{GroupRule, SecureRule};
use fl_proto::v1::{
    CoordinatorMessage, GroupTask, RoundTask, SecureGroup, ServerMessage, Shutdown, ShutdownKind,
    coordinator_message, server_message,
};
use fl_proto::{Frame, chunk_count, encode_chunks};
use fl_secagg::ServerStage;
use fl_secagg::task::Task;
use std::time::Duration;

/// A round's task as the wire carries it, without its tensor's size.
pub(crate) fn task_template(task: &Task) -> RoundTask {
    RoundTask::from(task)
}

/// The messages of a task carrying `tensor`: the RoundTask, then the tensor's chunks.
pub(crate) fn task_messages(template: &RoundTask, tensor: &[f32]) -> Vec<Frame> {
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

/// The messages of a group's part of a round (the aggregator tier): the GroupTask with the
/// task, its sampled `clients` (by the aggregator's ids), the group's rule and timeout, then the
/// model's chunks.
pub(crate) fn group_task(
    template: &RoundTask,
    clients: Vec<u64>,
    model: &[f32],
    (rule, timeout): (GroupRule, Duration),
) -> Vec<CoordinatorMessage> {
    let task = RoundTask {
        num_values: model.len() as u64,
        num_chunks: chunk_count(model.len()),
        ..template.clone()
    };
    let order = GroupTask {
        task: Some(task),
        clients,
        clip_bound: rule.clip_bound.unwrap_or(0.0),
        weight_by_examples: rule.weight_by_examples,
        timeout_secs: timeout.as_secs_f64(),
        secure: rule.secure.as_ref().map(secure_group),
    };
    let coordinator = |body| CoordinatorMessage { body: Some(body) };
    std::iter::once(coordinator_message::Body::Task(order))
        .chain(encode_chunks(template.round, model).map(coordinator_message::Body::ModelChunk))
        .map(coordinator)
        .collect()
}

/// A group's secure-aggregation settings as the wire carries them.
fn secure_group(rule: &SecureRule) -> SecureGroup {
    SecureGroup {
        threshold: rule.threshold,
        min_survivor_fraction: rule.min_survivor_fraction,
        min_survivors: rule.min_survivors as u64,
        complete: rule.degree.is_none(),
        degree: rule.degree.map_or(0, |k| k as u32),
        stage_timeout_secs: rule.stage_timeout.as_secs_f64(),
    }
}

/// A secure-aggregation stage message of round `round`.
pub(crate) fn stage(round: u64, stage: &ServerStage) -> Frame {
    message(fl_proto::server_stage_body(round, stage))
}

/// The end of the session: training finished, or the server stops to be resumed.
pub(crate) fn shutdown(round: u64, kind: ShutdownKind) -> Frame {
    message(server_message::Body::Shutdown(shutdown_of(round, kind)))
}

/// The same end for an aggregator's stream (the aggregator tier).
pub(crate) fn group_shutdown(round: u64, kind: ShutdownKind) -> CoordinatorMessage {
    let body = coordinator_message::Body::Shutdown(shutdown_of(round, kind));
    CoordinatorMessage { body: Some(body) }
}

/// A Shutdown of `kind` after `round`.
fn shutdown_of(round: u64, kind: ShutdownKind) -> Shutdown {
    let reason = match kind {
        ShutdownKind::Finished => "training finished",
        ShutdownKind::Resuming => "the server was interrupted and will be resumed: reconnect",
    };
    Shutdown {
        round,
        reason: reason.into(),
        kind: kind.into(),
    }
}

/// The message of `body`, encoded.
fn message(body: server_message::Body) -> Frame {
    Frame::encode(&ServerMessage { body: Some(body) })
}
