//! What the server sends, encoded: a round's task with its tensor, the secure-aggregation stage
//! messages and Shutdown, from the domain crates' types (`fl_proto::convert` maps each). It keeps
//! no state; `crate::edge::clients` queues what it encodes.

use fl_proto::v1::{RoundTask, ServerMessage, Shutdown, ShutdownKind, server_message};
use fl_proto::{Frame, chunk_count, encode_chunks};
use fl_secagg::ServerStage;
use fl_secagg::task::Task;

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

/// A secure-aggregation stage message of round `round`.
pub(crate) fn stage(round: u64, stage: &ServerStage) -> Frame {
    message(fl_proto::server_stage_body(round, stage))
}

/// The end of the session: training finished, or the server stops to be resumed.
pub(crate) fn shutdown(round: u64, kind: ShutdownKind) -> Frame {
    let reason = match kind {
        ShutdownKind::Finished => "training finished",
        ShutdownKind::Resuming => "the server was interrupted and will be resumed: reconnect",
    };
    message(server_message::Body::Shutdown(Shutdown {
        round,
        reason: reason.into(),
        kind: kind.into(),
    }))
}

/// The message of `body`, encoded.
fn message(body: server_message::Body) -> Frame {
    Frame::encode(&ServerMessage { body: Some(body) })
}
