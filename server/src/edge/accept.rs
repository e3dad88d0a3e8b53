//! Accepting connections: a connection is handed to the HTTP/2 (and TLS) layer only once its
//! first bytes have arrived, so one that connects and stays silent, or trickles a few bytes,
//! holds its file descriptor for at most the handshake timeout. tonic and hyper have no such
//! timeout of their own (they wait for the preface as long as the peer keeps the socket open).
//! Accepted sockets send without delay (TCP_NODELAY), as tonic's own listener does when asked.

use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Bytes a connection must have sent before it is handed on: the length of the HTTP/2 client
/// preface (RFC 9113 Sec. 3.4); a TLS ClientHello is longer.
const FIRST_BYTES: usize = 24;

/// How often a connection that has sent part of its first bytes is looked at again.
const PEEK_EVERY: Duration = Duration::from_millis(5);

/// Connections waiting to be served; the accept loop pauses while it is full.
const QUEUE: usize = 1024;

/// The connections of `listener` that send their first bytes within `handshake`; the others are
/// closed. The accept loop ends when the returned stream is dropped.
pub(crate) fn guarded(
    listener: TcpListener,
    handshake: Duration,
) -> ReceiverStream<std::io::Result<TcpStream>> {
    let (tx, rx) = mpsc::channel(QUEUE);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = tx.closed() => return,
            };
            match accepted {
                Ok((stream, peer)) => {
                    // Nagle's algorithm would hold the tail of each burst of model chunks until
                    // the client's delayed ACK (40 ms on Linux): seconds per round for a large
                    // model. gRPC servers send at once.
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
                    }
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        match tokio::time::timeout(handshake, first_bytes(&stream)).await {
                            Ok(true) => {
                                let _ = tx.send(Ok(stream)).await;
                            }
                            Ok(false) => {}
                            Err(_) => tracing::debug!(%peer, "silent connection closed"),
                        }
                    });
                }
                // Out of descriptors, say: the listener stays, the next accept may succeed.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Waits until `stream` holds [`FIRST_BYTES`] unread bytes; false when the peer closes first.
async fn first_bytes(stream: &TcpStream) -> bool {
    let mut buf = [0u8; FIRST_BYTES];
    loop {
        match stream.peek(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) if n >= FIRST_BYTES => return true,
            // Peeking again at once would return the same bytes: wait for more.
            Ok(_) => tokio::time::sleep(PEEK_EVERY).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio_stream::StreamExt;

    /// A connection that sends its preface is handed on, set to send without delay.
    #[tokio::test]
    async fn accepted_connections_send_without_delay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut accepted = guarded(listener, Duration::from_secs(10));
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(&[0u8; FIRST_BYTES]).await.unwrap();
        let served = tokio::time::timeout(Duration::from_secs(10), accepted.next())
            .await
            .expect("handed on within the handshake timeout")
            .expect("the stream is open")
            .unwrap();
        assert!(served.nodelay().unwrap());
    }
}
