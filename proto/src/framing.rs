//! gRPC's message framing (gRPC over HTTP/2, "Length-Prefixed-Message": a compressed flag byte,
//! a 4-byte big-endian length, the message), done here for the server's `Session` stream rather
//! than by tonic's codec.
//!
//! Why by hand: tonic's codec encodes each message into a buffer of the stream's own and decodes
//! from another, and each buffer keeps the capacity of the largest message it handled for the
//! stream's whole life. With 10,000 streams those buffers were most of the server's heap
//! (`heaptrack`; docs/src/results/speed.md, "Scale and memory"), and the model was encoded again for every client it went
//! to. A [`Frame`] is encoded once, into an exactly sized `Bytes` that every stream sending it
//! shares, and a [`Deframer`] holds no buffer between messages.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The prefix of every message: the compressed flag and the length.
pub const PREFIX_BYTES: usize = 5;

/// One length-prefixed gRPC message, encoded once for any number of streams (cloning it shares
/// the bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame(Bytes);

impl Frame {
    /// `message` framed, uncompressed.
    ///
    /// # Panics
    /// If the message is 4 GiB or larger, which no message of `flp.v1` can be (a tensor travels
    /// in chunks of [`crate::MAX_CHUNK_BYTES`]).
    pub fn encode(message: &impl prost::Message) -> Self {
        let len = message.encoded_len();
        let prefix = u32::try_from(len).expect("a flp.v1 message is far below 4 GiB");
        let mut buf = BytesMut::with_capacity(PREFIX_BYTES + len);
        buf.put_u8(0);
        buf.put_u32(prefix);
        message.encode_raw(&mut buf);
        Self(buf.freeze())
    }

    /// The message's encoded length, without the prefix.
    pub fn message_len(&self) -> usize {
        self.0.len() - PREFIX_BYTES
    }

    /// The framed bytes, as they go on the wire.
    pub fn into_bytes(self) -> Bytes {
        self.0
    }
}

/// Why the bytes of a stream do not read as messages.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FrameError {
    /// The flag says compressed; no compression is ever negotiated.
    #[error("message is compressed, but no compression was negotiated")]
    Compressed,
    /// A flag byte other than 0 or 1.
    #[error("invalid compressed flag {0}")]
    Flag(u8),
    /// The length prefix exceeds the receiver's limit.
    #[error("message of {0} bytes exceeds the limit of {1}")]
    TooLarge(usize, usize),
    /// The stream ended inside a message.
    #[error("stream ended inside a message ({0} bytes unread)")]
    Truncated(usize),
    /// The bytes are not a message of the expected type.
    #[error("undecodable message: {0}")]
    Decode(#[from] prost::DecodeError),
}

/// Messages out of the data of one stream, which arrives in pieces of any size.
#[derive(Debug)]
pub struct Deframer {
    /// What has arrived and not yet been read; empty (with no allocation) between messages.
    buf: BytesMut,
    /// The longest message accepted.
    limit: usize,
}

impl Deframer {
    /// A reader refusing messages longer than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            limit,
        }
    }

    /// Adds the stream's next piece of data.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole message, if it has arrived.
    pub fn message<M: prost::Message + Default>(&mut self) -> Result<Option<M>, FrameError> {
        let Some(header) = self.buf.get(..PREFIX_BYTES) else {
            return Ok(None);
        };
        match header[0] {
            0 => {}
            1 => return Err(FrameError::Compressed),
            flag => return Err(FrameError::Flag(flag)),
        }
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if len > self.limit {
            return Err(FrameError::TooLarge(len, self.limit));
        }
        if self.buf.len() < PREFIX_BYTES + len {
            // Room for the whole message at once, rather than doubling towards it.
            self.buf.reserve(PREFIX_BYTES + len - self.buf.len());
            return Ok(None);
        }
        let mut message = self.buf.split_to(PREFIX_BYTES + len).freeze();
        if self.buf.is_empty() {
            // Let go of the allocation, which `message` and its `Bytes` fields may still share.
            self.buf = BytesMut::new();
        }
        message.advance(PREFIX_BYTES);
        Ok(Some(M::decode(message)?))
    }

    /// Checks the end of the stream: nothing may be left of a message.
    pub fn finish(&self) -> Result<(), FrameError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(FrameError::Truncated(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{ClientMessage, Hello, TensorChunk, client_message};
    use proptest::prelude::*;

    fn hello(id: &str) -> ClientMessage {
        ClientMessage {
            body: Some(client_message::Body::Hello(Hello {
                client_id: id.into(),
                session_key: vec![7; 32],
            })),
        }
    }

    fn chunk(len: usize) -> ClientMessage {
        ClientMessage {
            body: Some(client_message::Body::UpdateChunk(TensorChunk {
                round: 3,
                index: 1,
                data: Bytes::from(vec![0xab; len]),
            })),
        }
    }

    #[test]
    fn a_frame_is_the_prefix_and_the_message() {
        let m = hello("42");
        let frame = Frame::encode(&m);
        assert_eq!(frame.message_len(), prost::Message::encoded_len(&m));
        let bytes = frame.into_bytes();
        assert_eq!(bytes[0], 0);
        assert_eq!(&bytes[1..5], &(bytes.len() as u32 - 5).to_be_bytes());
        assert_eq!(prost::Message::encode_to_vec(&m), &bytes[5..]);
    }

    proptest! {
        /// Whatever pieces the stream's data comes in, the messages read are those sent, in
        /// order, and the reader holds nothing once they are read.
        #[test]
        fn messages_survive_any_split(
            sizes in proptest::collection::vec(0usize..40_000, 1..6),
            cuts in proptest::collection::vec(1usize..20_000, 1..40),
        ) {
            let sent: Vec<ClientMessage> = sizes.iter().map(|&n| chunk(n)).collect();
            let wire: Vec<u8> = sent
                .iter()
                .flat_map(|m| Frame::encode(m).into_bytes().to_vec())
                .collect();
            let mut reader = Deframer::new(64 * 1024);
            let mut read = Vec::new();
            let mut rest = &wire[..];
            for cut in cuts.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let (piece, tail) = rest.split_at((*cut).min(rest.len()));
                rest = tail;
                reader.push(piece);
                while let Some(m) = reader.message::<ClientMessage>().unwrap() {
                    read.push(m);
                }
            }
            prop_assert_eq!(read, sent);
            prop_assert_eq!(reader.finish(), Ok(()));
            prop_assert_eq!(reader.buf.capacity(), 0);
        }
    }

    #[test]
    fn an_oversized_length_is_refused_before_its_bytes_arrive() {
        let mut reader = Deframer::new(1000);
        reader.push(&[0, 0, 0, 3, 233]);
        assert_eq!(
            reader.message::<ClientMessage>().unwrap_err(),
            FrameError::TooLarge(1001, 1000)
        );
    }

    #[test]
    fn compressed_or_unknown_flags_are_refused() {
        let mut reader = Deframer::new(1000);
        reader.push(&[1, 0, 0, 0, 0]);
        assert_eq!(
            reader.message::<ClientMessage>().unwrap_err(),
            FrameError::Compressed
        );
        let mut reader = Deframer::new(1000);
        reader.push(&[9, 0, 0, 0, 0]);
        assert_eq!(
            reader.message::<ClientMessage>().unwrap_err(),
            FrameError::Flag(9)
        );
    }

    #[test]
    fn a_stream_ending_inside_a_message_is_truncated() {
        let bytes = Frame::encode(&hello("1")).into_bytes();
        let mut reader = Deframer::new(1000);
        reader.push(&bytes[..bytes.len() - 1]);
        assert_eq!(reader.message::<ClientMessage>(), Ok(None));
        assert_eq!(reader.finish(), Err(FrameError::Truncated(bytes.len() - 1)));
    }

    #[test]
    fn undecodable_bytes_are_a_decode_error() {
        let mut reader = Deframer::new(1000);
        reader.push(&[0, 0, 0, 0, 2, 0xff, 0xff]);
        assert!(matches!(
            reader.message::<ClientMessage>(),
            Err(FrameError::Decode(_))
        ));
    }
}
