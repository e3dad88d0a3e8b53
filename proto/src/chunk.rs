//! Tensor chunking: a flat vector of 32-bit words (`f32` model values, or ring elements of a
//! masked input) travels as little-endian bytes in [`TensorChunk`]s of at most
//! [`MAX_CHUNK_BYTES`], so any model size fits under gRPC's message limits.

use crate::v1::TensorChunk;
use bytes::Bytes;
use multiversion::multiversion;

/// Largest payload of one chunk: 16,320 bytes (4,080 values), so that a chunk with its protobuf
/// and gRPC envelopes fits one 16 KiB HTTP/2 DATA frame. Each end of a stream keeps its encoding
/// and decoding buffers as large as the largest message it has handled, for the stream's life:
/// with 64 KiB chunks every client that once took part held about 150 KB on the server (1.5 GB
/// for 10,000 clients); with 1 MiB chunks about 2 MiB.
pub const MAX_CHUNK_BYTES: usize = 16 * 1024 - 64;

/// Largest gRPC message either side accepts: a chunk's envelope fits with room to spare, and the
/// largest stage messages (neighbour keys, share inboxes) stay below it.
pub const MAX_MESSAGE_BYTES: usize = (1 << 20) + (64 << 10);
const VALUES_PER_CHUNK: usize = MAX_CHUNK_BYTES / 4;

/// Number of chunks [`encode_chunks`] makes for `num_values` values (at least one, so that even an
/// empty tensor is announced and acknowledged the same way).
pub fn chunk_count(num_values: usize) -> u32 {
    num_values.div_ceil(VALUES_PER_CHUNK).max(1) as u32
}

/// Splits `values` into chunks tagged with `round`, in order.
pub fn encode_chunks(round: u64, values: &[f32]) -> impl Iterator<Item = TensorChunk> + use<> {
    encode_word_chunks(round, bytemuck::cast_slice(values))
}

/// Splits the 32-bit words `words` into chunks tagged with `round`, in order, each word sent as
/// its little-endian bytes (an `f32` as those of its bits).
pub fn encode_word_chunks(round: u64, words: &[u32]) -> impl Iterator<Item = TensorChunk> + use<> {
    chunks_of(round, little_endian_copy(words))
}

/// The little-endian bytes of `words`, copied.
fn little_endian_copy(words: &[u32]) -> Bytes {
    if cfg!(target_endian = "little") {
        Bytes::copy_from_slice(bytemuck::cast_slice(words))
    } else {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }
}

/// [`encode_chunks`] of values the caller gives up: on a little-endian machine the chunks share
/// the vector's memory, so a client's upload is sent without a copy.
pub fn into_chunks(round: u64, values: Vec<f32>) -> impl Iterator<Item = TensorChunk> {
    /// The values as the little-endian bytes they are in memory.
    struct LittleEndian(Vec<f32>);
    impl AsRef<[u8]> for LittleEndian {
        fn as_ref(&self) -> &[u8] {
            bytemuck::cast_slice(&self.0)
        }
    }
    let bytes = if cfg!(target_endian = "little") {
        Bytes::from_owner(LittleEndian(values))
    } else {
        little_endian_copy(bytemuck::cast_slice(&values))
    };
    chunks_of(round, bytes)
}

/// The chunks of the encoded tensor `bytes`, each a slice of it (no copy). An empty tensor still
/// travels as one (empty) chunk.
fn chunks_of(round: u64, bytes: Bytes) -> impl Iterator<Item = TensorChunk> {
    (0..chunk_count(bytes.len() / 4)).map(move |index| {
        let start = index as usize * MAX_CHUNK_BYTES;
        let end = bytes.len().min(start + MAX_CHUNK_BYTES);
        TensorChunk {
            round,
            index,
            data: bytes.slice(start..end),
        }
    })
}

/// Appends the little-endian 32-bit words of `bytes` (four bytes each) to `words`, as an
/// iterator of known length over whole arrays, so that the conversion vectorises. Compiled per
/// x86-64 SIMD level (`multiversion`, as `fl_model::aggregate`'s passes over an update):
/// it runs over every model a client receives and every upload the server assembles, and
/// baseline x86-64 moves 16 bytes at a time.
#[multiversion(targets = "simd")]
fn extend_with_le_words(words: &mut Vec<u32>, bytes: &[u8]) {
    let (arrays, _) = bytes.as_chunks::<4>();
    words.extend(arrays.iter().map(|&b| u32::from_le_bytes(b)));
}

/// Why a chunk sequence was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChunkError {
    /// The header announced a chunk count that does not match its value count.
    #[error("header announces {chunks} chunks for {values} values; expected {expected}")]
    BadChunkCount {
        /// Announced chunks.
        chunks: u32,
        /// Announced values.
        values: u64,
        /// What [`chunk_count`] gives for that many values.
        expected: u32,
    },
    /// A chunk carried another round's number.
    #[error("chunk for round {got} inside a tensor of round {expected}")]
    WrongRound {
        /// Round of the tensor being assembled.
        expected: u64,
        /// Round the chunk claims.
        got: u64,
    },
    /// A chunk arrived out of order, duplicated, or past the announced count.
    #[error("chunk index {got} out of order (expected {expected})")]
    OutOfOrder {
        /// Next index due.
        expected: u32,
        /// Index received.
        got: u32,
    },
    /// A chunk's payload is larger than 1 MiB or not a whole number of f32 values.
    #[error("chunk {index} has {len} bytes; chunks carry whole f32 values and at most 1 MiB")]
    BadLength {
        /// Index of the chunk.
        index: u32,
        /// Its payload length.
        len: usize,
    },
    /// The chunks together carry more or fewer values than announced.
    #[error("tensor carries {got} values, header announced {expected}")]
    WrongTotal {
        /// Announced values.
        expected: u64,
        /// Values received.
        got: u64,
    },
}

/// Reassembles one tensor from its chunks, checking order, sizes and round.
#[derive(Debug)]
pub struct TensorAssembler {
    round: u64,
    expected_values: u64,
    expected_chunks: u32,
    next_index: u32,
    values: Vec<u32>,
}

impl TensorAssembler {
    /// Starts a tensor of `num_values` values in `num_chunks` chunks for `round`. The caller must
    /// have bounded `num_values` (e.g. by the model size) before calling: it sizes the buffer.
    pub fn new(round: u64, num_values: u64, num_chunks: u32) -> Result<Self, ChunkError> {
        let expected = chunk_count(num_values as usize);
        if num_chunks != expected {
            return Err(ChunkError::BadChunkCount {
                chunks: num_chunks,
                values: num_values,
                expected,
            });
        }
        Ok(Self {
            round,
            expected_values: num_values,
            expected_chunks: num_chunks,
            next_index: 0,
            values: Vec::with_capacity(num_values as usize),
        })
    }

    /// Round this tensor belongs to.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// Adds the next chunk; returns the whole tensor of `f32` values once the last chunk arrived.
    pub fn push(&mut self, chunk: TensorChunk) -> Result<Option<Vec<f32>>, ChunkError> {
        Ok(self
            .push_words(chunk)?
            .map(|w| w.into_iter().map(f32::from_bits).collect()))
    }

    /// Adds the next chunk; returns the whole tensor of raw words once the last chunk arrived.
    pub fn push_words(&mut self, chunk: TensorChunk) -> Result<Option<Vec<u32>>, ChunkError> {
        if chunk.round != self.round {
            return Err(ChunkError::WrongRound {
                expected: self.round,
                got: chunk.round,
            });
        }
        if chunk.index != self.next_index || chunk.index >= self.expected_chunks {
            return Err(ChunkError::OutOfOrder {
                expected: self.next_index,
                got: chunk.index,
            });
        }
        if chunk.data.len() > MAX_CHUNK_BYTES || !chunk.data.len().is_multiple_of(4) {
            return Err(ChunkError::BadLength {
                index: chunk.index,
                len: chunk.data.len(),
            });
        }
        let got = (self.values.len() + chunk.data.len() / 4) as u64;
        if got > self.expected_values {
            return Err(ChunkError::WrongTotal {
                expected: self.expected_values,
                got,
            });
        }
        extend_with_le_words(&mut self.values, &chunk.data);
        self.next_index += 1;
        if self.next_index < self.expected_chunks {
            return Ok(None);
        }
        if got != self.expected_values {
            return Err(ChunkError::WrongTotal {
                expected: self.expected_values,
                got,
            });
        }
        Ok(Some(std::mem::take(&mut self.values)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(n: usize) -> Vec<f32> {
        let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
        let chunks: Vec<_> = encode_chunks(7, &values).collect();
        assert_eq!(chunks.len() as u32, chunk_count(n));
        let mut asm = TensorAssembler::new(7, n as u64, chunks.len() as u32).unwrap();
        let mut out = None;
        for c in chunks {
            assert!(c.data.len() <= MAX_CHUNK_BYTES);
            out = asm.push(c).unwrap();
        }
        let out = out.expect("last chunk completes the tensor");
        assert_eq!(out, values);
        out
    }

    /// The wire format is each value's IEEE 754 bits in little-endian order, chunk after chunk.
    #[test]
    fn chunks_carry_little_endian_bits() {
        let chunks: Vec<_> = encode_chunks(3, &[1.0, -2.0]).collect();
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].data[..], [0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0]);
        let words: Vec<u32> = (0..VALUES_PER_CHUNK as u32 + 1).collect();
        let chunks: Vec<_> = encode_word_chunks(3, &words).collect();
        assert_eq!(
            (chunks[1].index, &chunks[1].data[..]),
            (1, &(VALUES_PER_CHUNK as u32).to_le_bytes()[..])
        );
    }

    /// The chunks that share a vector's memory are the chunks of its copy.
    #[test]
    fn owned_values_make_the_same_chunks() {
        for n in [0, 1, VALUES_PER_CHUNK, 2 * VALUES_PER_CHUNK + 5] {
            let values: Vec<f32> = (0..n).map(|i| i as f32 * -0.25 + 1.5).collect();
            let copied: Vec<_> = encode_chunks(9, &values).collect();
            let shared: Vec<_> = into_chunks(9, values).collect();
            assert_eq!(shared, copied, "{n} values");
        }
    }

    #[test]
    fn roundtrips_small_empty_and_multi_chunk_tensors() {
        roundtrip(0);
        roundtrip(10);
        roundtrip(VALUES_PER_CHUNK);
        roundtrip(VALUES_PER_CHUNK * 2 + 3);
    }

    #[test]
    fn refuses_out_of_order_wrong_round_and_ragged_chunks() {
        let values = vec![1.0f32; VALUES_PER_CHUNK + 1];
        let chunks: Vec<_> = encode_chunks(1, &values).collect();
        let mut asm = TensorAssembler::new(1, values.len() as u64, 2).unwrap();
        assert!(matches!(
            asm.push(chunks[1].clone()),
            Err(ChunkError::OutOfOrder { .. })
        ));
        let mut asm = TensorAssembler::new(1, values.len() as u64, 2).unwrap();
        let mut stale = chunks[0].clone();
        stale.round = 0;
        assert!(matches!(
            asm.push(stale),
            Err(ChunkError::WrongRound { .. })
        ));
        let mut asm = TensorAssembler::new(1, 3, 1).unwrap();
        let ragged = TensorChunk {
            round: 1,
            index: 0,
            data: vec![0; 7].into(),
        };
        assert!(matches!(
            asm.push(ragged),
            Err(ChunkError::BadLength { .. })
        ));
        let mut asm = TensorAssembler::new(1, 3, 1).unwrap();
        let short = TensorChunk {
            round: 1,
            index: 0,
            data: vec![0; 8].into(),
        };
        assert!(matches!(
            asm.push(short),
            Err(ChunkError::WrongTotal { .. })
        ));
        assert!(matches!(
            TensorAssembler::new(1, 3, 5),
            Err(ChunkError::BadChunkCount { .. })
        ));
    }
}
