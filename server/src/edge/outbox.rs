//! What a session's response stream is fed, and the sending half each live stream has in the
//! registry.

use fl_proto::Frame;
use tokio::sync::mpsc;
use tonic::Status;

/// What a session's response stream is fed: messages, then possibly the status that ends it
/// (boxed, so that a queued message takes a few words).
pub(crate) type Outgoing = Result<Frame, Box<Status>>;

/// The sending half of a client's Session stream.
pub(crate) type Outbox = mpsc::Sender<Outgoing>;

/// Sends `messages` to a client in order without blocking the caller (a slow client only delays
/// itself); returns at once.
pub(crate) fn send_all(outbox: Outbox, messages: Vec<Frame>) {
    tokio::spawn(async move {
        for m in messages {
            if outbox.send(Ok(m)).await.is_err() {
                break;
            }
        }
    });
}
