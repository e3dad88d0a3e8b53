//! The gRPC codec of `flp.v1`: prost's, except that bytes which do not decode as the expected
//! message are the sender's fault, `INVALID_ARGUMENT`, where tonic's default says `INTERNAL`
//! (which tells operators the receiver is broken), and that its buffers are sized for a server
//! holding thousands of long-lived streams ([`BUFFERS`]). The generated client and server use it
//! (`codec_path` in `build.rs`).

use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Each stream's coding buffers start at 2 KiB (tonic: 8 KiB), enough for every message but a
/// tensor chunk, and an encoder hands its bytes to HTTP/2 once it holds 16 KiB (tonic: 32 KiB),
/// one chunk: an idle stream holds less, and a stream sending the model holds one chunk ahead
/// of the peer's flow-control window instead of two.
pub const BUFFERS: (usize, usize) = (2 * 1024, 16 * 1024);

fn buffer_settings() -> BufferSettings {
    BufferSettings::new(BUFFERS.0, BUFFERS.1)
}

/// [`ProstCodec`] with undecodable input reported as `INVALID_ARGUMENT`.
#[derive(Debug, Clone, Default)]
pub struct StrictCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Codec for StrictCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = SizedEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        SizedEncoder(self.0.encoder())
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder(self.0.decoder())
    }
}

/// [`ProstDecoder`] with decoding errors as `INVALID_ARGUMENT`.
#[derive(Debug, Clone, Default)]
pub struct StrictDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0
            .decode(buf)
            .map_err(|e| Status::invalid_argument(e.message().to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer_settings()
    }
}

/// [`ProstEncoder`] with the buffers of [`BUFFERS`].
#[derive(Debug, Clone, Default)]
pub struct SizedEncoder<T>(ProstEncoder<T>);

impl<T: prost::Message> Encoder for SizedEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        self.0.encode(item, buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer_settings()
    }
}
