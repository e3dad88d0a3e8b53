//! The gRPC codec of `flp.v1`: prost's, except that bytes which do not decode as the expected
//! message are the sender's fault, `INVALID_ARGUMENT`, where tonic's default says `INTERNAL`
//! (which tells operators the receiver is broken). The generated client and server use it
//! (`codec_path` in `build.rs`).

use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

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
    type Encoder = ProstEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
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
        self.0.buffer_settings()
    }
}
