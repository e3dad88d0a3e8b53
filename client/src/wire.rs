//! Encoding what a client sends: one message, an upload as a header and its chunks, a secure
//! stage message, or a task's refusal.

use crate::ClientError;
use crate::engine::Outgoing;
use crate::round::Computed;
use fl_privacy::Released;
use fl_proto::v1::{
    ClientEvaluation, ClientMessage, LocalRelease, ReleaseHeader, SignDsUpload, TaskFailed,
    UpdateHeader, client_message,
};
use fl_proto::{chunk_count, client_stage, into_chunks, verified_upload};
use tokio::sync::mpsc;

/// Queues one message on the session's outgoing stream.
pub(crate) async fn send(
    outbox: &mpsc::Sender<ClientMessage>,
    body: client_message::Body,
) -> Result<(), ClientError> {
    outbox
        .send(ClientMessage { body: Some(body) })
        .await
        .map_err(|_| ClientError::SessionLost)
}

/// Sends what the engine asked for.
pub(crate) async fn send_outgoing(
    outbox: &mpsc::Sender<ClientMessage>,
    outgoing: Outgoing,
) -> Result<(), ClientError> {
    let bodies = match outgoing {
        Outgoing::Upload { round, computed } => return upload(outbox, round, computed).await,
        Outgoing::Stage {
            round,
            ring,
            message,
        } => client_stage(round, ring, &message),
        Outgoing::Verified { round, report } => verified_upload(round, &report),
        Outgoing::Failed { round, reason } => {
            vec![client_message::Body::TaskFailed(TaskFailed {
                round,
                reason,
            })]
        }
    };
    for body in bodies {
        send(outbox, body).await?;
    }
    Ok(())
}

/// Sends an upload: a dense tensor as a header and its chunks (slices of the values' own
/// memory), or a SignDS release. Only a plain result (no local mechanism; the curator is trusted)
/// carries the example count and loss.
async fn upload(
    outbox: &mpsc::Sender<ClientMessage>,
    round: u64,
    computed: Computed,
) -> Result<(), ClientError> {
    let (header, values) = match computed {
        Computed::Plain {
            values,
            loss,
            examples,
            evaluation,
        } => {
            let header = client_message::Body::UpdateHeader(UpdateHeader {
                round,
                num_examples: examples,
                num_values: values.len() as u64,
                num_chunks: chunk_count(values.len()),
                train_loss: loss,
                evaluation: evaluation.map(|e| ClientEvaluation {
                    loss: e.loss,
                    accuracy: e.accuracy,
                    num_examples: e.examples,
                }),
            });
            (header, values)
        }
        Computed::Protected(protected) => match protected.into_released() {
            Released::Dense { values, release } => {
                let header = client_message::Body::ReleaseHeader(ReleaseHeader {
                    round,
                    num_values: values.len() as u64,
                    num_chunks: chunk_count(values.len()),
                    release: Some(LocalRelease::from(&release)),
                });
                (header, values)
            }
            Released::Sign {
                sign,
                indices,
                release,
            } => {
                let upload = SignDsUpload {
                    round,
                    sign: i32::from(sign),
                    indices: indices.into_iter().map(u64::from).collect(),
                    release: Some(LocalRelease::from(&release)),
                };
                return send(outbox, client_message::Body::SigndsUpload(upload)).await;
            }
        },
    };
    send(outbox, header).await?;
    for chunk in into_chunks(round, values) {
        send(outbox, client_message::Body::UpdateChunk(chunk)).await?;
    }
    Ok(())
}
