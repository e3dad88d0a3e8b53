//! A client's Session stream as the server frames it: the input is split into length-prefixed
//! frames (one length byte each), each decoded as a `ClientMessage` and handed to
//! `fl_server::Framer`. Nothing may panic, and the framer may only ever produce an
//! update of the model's length or a masked input of one or two words per parameter.

#![no_main]

use fl_proto::v1::ClientMessage;
use fl_server::Event;
use fl_server::Framer;
use fl_secagg::StageMessage;
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// The model's parameter count: small, so that whole tensors are within the fuzzer's reach.
const N: usize = 5;

fuzz_target!(|data: &[u8]| {
    let mut framer = Framer::new(1, N);
    let mut rest = data;
    while let Some((&len, tail)) = rest.split_first() {
        let (frame, next) = tail.split_at(usize::from(len).min(tail.len()));
        rest = next;
        let Ok(message) = ClientMessage::decode(frame) else {
            continue;
        };
        match framer.accept(message) {
            Ok(Some(Event::Update { values, .. })) => assert_eq!(values.len(), N),
            Ok(Some(Event::SecAgg {
                message: StageMessage::Masked(y),
                ..
            })) => assert_eq!(y.len(), N),
            Ok(_) => {}
            Err(_) => break,
        }
    }
});
