//! Property tests of what the server reads from the wire: arbitrary bytes never make the message
//! decoder or the tensor assembler panic, and the assembler only ever completes a tensor of the
//! announced length from chunks in order.

use fl_proto::v1::{ClientMessage, TensorChunk};
use fl_proto::{TensorAssembler, chunk_count, encode_chunks};
use proptest::prelude::*;
use prost::Message;

proptest! {
    #[test]
    fn arbitrary_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let _ = ClientMessage::decode(bytes.as_slice());
    }

    #[test]
    fn arbitrary_chunks_never_complete_a_wrong_tensor(
        values in 1u64..5000,
        declared_chunks in 0u32..4,
        chunks in proptest::collection::vec(
            (0u64..3, 0u32..4, proptest::collection::vec(any::<u8>(), 0..64)),
            0..8,
        ),
    ) {
        if let Ok(mut a) = TensorAssembler::new(1, values, declared_chunks) {
            for (round, index, data) in chunks {
                match a.push(TensorChunk { round, index, data: data.into() }) {
                    Ok(Some(tensor)) => prop_assert_eq!(tensor.len() as u64, values),
                    Ok(None) => {}
                    Err(_) => break,
                }
            }
        }
    }

}

proptest! {
    // Tensors of up to 2.4 MB (three chunks): fewer, larger cases.
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn honest_chunks_round_trip(values in proptest::collection::vec(any::<f32>(), 1..600_000)) {
        let n = values.len();
        let mut a = TensorAssembler::new(4, n as u64, chunk_count(n)).unwrap();
        let mut out = None;
        for chunk in encode_chunks(4, &values) {
            prop_assert!(out.is_none());
            out = a.push(chunk).unwrap();
        }
        let out = out.unwrap();
        prop_assert_eq!(out.len(), n);
        prop_assert!(out.iter().zip(&values).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}
