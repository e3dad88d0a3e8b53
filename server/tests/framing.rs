//! Property test of the server's stream framing ([`fl_server::Framer`]): whatever
//! sequence of messages a client sends, decoded from arbitrary bytes or built from arbitrary
//! fields, the framer never panics and only ever hands the round loop an update of the model's
//! length or a masked input of one or two words per parameter. The fuzz target
//! `fuzz/fuzz_targets/session.rs` checks the same with coverage guidance.

use fl_proto::v1::{
    ClientMessage, MaskedInputHeader, TensorChunk, UpdateHeader, client_message::Body,
};
use fl_secagg::StageMessage;
use fl_server::Event;
use fl_server::Framer;
use proptest::prelude::*;
use prost::Message;

/// The model's parameter count in these tests.
const N: usize = 5;

/// Feeds `messages` to a fresh framer until it refuses one; checks every event.
fn feed(messages: impl IntoIterator<Item = ClientMessage>) -> Result<(), TestCaseError> {
    let mut framer = Framer::new(7, N);
    for m in messages {
        match framer.accept(m) {
            Ok(Some(Event::Update { client, values, .. })) => {
                prop_assert_eq!(client, 7);
                prop_assert_eq!(values.len(), N);
            }
            Ok(Some(Event::SecAgg {
                message: StageMessage::Masked(y),
                ..
            })) => prop_assert_eq!(y.len(), N),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    Ok(())
}

/// Messages a client could send, with fields drawn near the interesting boundaries.
fn message() -> impl Strategy<Value = ClientMessage> {
    let chunk = (
        0u64..3,
        0u32..3,
        proptest::collection::vec(any::<u8>(), 0..48),
    )
        .prop_map(|(round, index, data)| {
            Body::UpdateChunk(TensorChunk {
                round,
                index,
                data: data.into(),
            })
        });
    let header = (0u64..3, 0u64..12, 0u32..3).prop_map(|(round, num_values, num_chunks)| {
        Body::UpdateHeader(UpdateHeader {
            round,
            num_examples: 1,
            num_values,
            num_chunks,
            ..UpdateHeader::default()
        })
    });
    let masked = (0u64..3, 0u64..12, 0u32..3).prop_map(|(round, num_words, num_chunks)| {
        Body::MaskedInputHeader(MaskedInputHeader {
            round,
            num_words,
            num_chunks,
        })
    });
    prop_oneof![chunk, header, masked].prop_map(|body| ClientMessage { body: Some(body) })
}

proptest! {
    #[test]
    fn arbitrary_message_sequences_are_framed_or_refused(
        messages in proptest::collection::vec(message(), 0..12),
    ) {
        feed(messages)?;
    }

    #[test]
    fn messages_decoded_from_arbitrary_bytes_are_framed_or_refused(
        frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..96), 0..12),
    ) {
        feed(frames.iter().filter_map(|f| ClientMessage::decode(f.as_slice()).ok()))?;
    }
}

#[test]
fn an_honest_update_is_framed_into_one_event() {
    let values = [1.0f32, -2.0, 0.5, 0.0, 3.0];
    let mut framer = Framer::new(1, N);
    let header = Body::UpdateHeader(UpdateHeader {
        round: 2,
        num_examples: 10,
        num_values: N as u64,
        num_chunks: 1,
        ..UpdateHeader::default()
    });
    let chunk = fl_proto::encode_chunks(2, &values).map(Body::UpdateChunk);
    let mut events = Vec::new();
    for body in std::iter::once(header).chain(chunk) {
        events.push(framer.accept(ClientMessage { body: Some(body) }).unwrap());
    }
    assert!(events[0].is_none());
    match events.pop().flatten() {
        Some(Event::Update { values: got, .. }) => assert_eq!(got, values),
        other => panic!("expected the update, got {other:?}"),
    }
    // A header in the middle of a tensor breaks the framing.
    let header = Body::UpdateHeader(UpdateHeader {
        num_values: N as u64,
        num_chunks: 1,
        ..UpdateHeader::default()
    });
    assert!(
        framer
            .accept(ClientMessage {
                body: Some(header.clone())
            })
            .unwrap()
            .is_none()
    );
    let refused = framer.accept(ClientMessage { body: Some(header) });
    assert!(
        refused
            .unwrap_err()
            .message()
            .contains("before the previous tensor")
    );
}
