//! Encoding what a client sends: one message, or an upload as a header and its chunks.

use crate::ClientError;
use crate::local_round::Upload;
use fl_common::privacy::Protected;
use fl_proto::chunk_count;
use fl_proto::encode_chunks;
use fl_proto::v1::{
    ClientMessage, LocalRelease, ReleaseHeader, SignDsUpload, UpdateHeader, client_message,
};
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

/// Sends an upload: a dense tensor as a header and its chunks, or a SignDS release. Only a
/// plain upload (no local mechanism; the curator is trusted) carries the example count and loss.
pub(crate) async fn send_upload(
    outbox: &mpsc::Sender<ClientMessage>,
    round: u64,
    num_examples: u64,
    upload: Upload,
) -> Result<(), ClientError> {
    let (header, values) = match upload {
        Upload::Plain { values, loss } => {
            let header = client_message::Body::UpdateHeader(UpdateHeader {
                round,
                num_examples,
                num_values: values.len() as u64,
                num_chunks: chunk_count(values.len()),
                train_loss: loss,
            });
            (header, values)
        }
        Upload::Protected(Protected::Dense { values, release }) => {
            let header = client_message::Body::ReleaseHeader(ReleaseHeader {
                round,
                num_values: values.len() as u64,
                num_chunks: chunk_count(values.len()),
                release: Some(LocalRelease::from(&release)),
            });
            (header, values)
        }
        Upload::Protected(Protected::Sign {
            sign,
            indices,
            release,
        }) => {
            let upload = SignDsUpload {
                round,
                sign: i32::from(sign),
                indices: indices.into_iter().map(u64::from).collect(),
                release: Some(LocalRelease::from(&release)),
            };
            return send(outbox, client_message::Body::SigndsUpload(upload)).await;
        }
    };
    send(outbox, header).await?;
    for chunk in encode_chunks(round, &values) {
        send(outbox, client_message::Body::UpdateChunk(chunk)).await?;
    }
    Ok(())
}
