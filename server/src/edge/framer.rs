//! The framing of one client's stream, without I/O: the messages after Hello become the round's
//! [`Event`]s, tensors are assembled from their header and chunks, and what breaks the framing
//! (a chunk without a header, chunks out of order, a header announcing a tensor of the wrong
//! size, garbage) is refused with the status that ends the stream. What an update means (its
//! round, whether the client was sampled, its values) is judged by the round loop. A masked
//! input's words become ring elements here, so the round gets `fl_secagg::StageMessage`s.
//! The fuzz target `fuzz/fuzz_targets/session.rs` drives the framer with arbitrary bytes.

use crate::identity::ids::ClientId;
use crate::round::events::{Declared, Event, UploadHeader};
use fl_privacy::Release;
use fl_proto::v1::client_message;
use fl_proto::v1::{
    ClientMessage, LocalRelease, MaskedInputHeader, TensorChunk, UpdateHeader, VerifiedUploadHeader,
};
use fl_proto::{
    ChunkError, TensorAssembler, WireError, advertised_keys, endorsement, received_upload,
    ring_elements,
};
use fl_secagg::{RevealedShare, Ring, SealedShares, StageMessage};
use prost::Message;
use tonic::Status;

/// Longest reason a `TaskFailed` may give.
pub(crate) const MAX_REASON_BYTES: usize = 4096;
/// Most examples a client may report, for training or evaluation: 2^40, a thousand times any
/// real client's data. Reported counts weigh uploads and are summed over a round's clients; the
/// bound keeps one liar from dominating or overflowing those sums.
pub(crate) const MAX_REPORTED_EXAMPLES: u64 = 1 << 40;

/// The evaluation an update header reports, if any, refused unless its figures are sound and
/// every example count it reports is at most [`MAX_REPORTED_EXAMPLES`].
fn checked_evaluation(h: &UpdateHeader) -> Result<Option<(f64, f64, u64)>, Status> {
    let evaluation = h.evaluation.map(|e| (e.loss, e.accuracy, e.num_examples));
    if evaluation.is_some_and(|(loss, accuracy, n)| {
        !(loss.is_finite() && (0.0..=1.0).contains(&accuracy) && n > 0)
    }) {
        return Err(Status::invalid_argument(
            "an evaluation needs a finite loss, an accuracy in [0, 1] and n > 0",
        ));
    }
    let counts = [Some(h.num_examples), evaluation.map(|(.., n)| n)];
    if (counts.into_iter().flatten()).any(|n| n > MAX_REPORTED_EXAMPLES) {
        return Err(Status::invalid_argument(format!(
            "a reported example count above {MAX_REPORTED_EXAMPLES}"
        )));
    }
    Ok(evaluation)
}

/// Reads a declared release off the wire.
fn declared(release: Option<&LocalRelease>) -> Declared {
    match release.map(Release::try_from) {
        None => Declared::Absent,
        Some(Ok(release)) => Declared::Read(release),
        Some(Err(e)) => Declared::Unreadable(e.to_string()),
    }
}

/// What the chunks being received will make.
#[derive(Debug)]
enum Expecting {
    /// A dense update.
    Update(UploadHeader),
    /// A masked input of a secure-aggregation round.
    Masked {
        /// Its round.
        round: u64,
        /// The ring its words carry elements of: one word each for b = 32, two for b = 64.
        ring: Ring,
    },
    /// The leader's share of a verified upload, with its header.
    Verified(Box<VerifiedUploadHeader>),
}

/// Field elements a verified upload may carry beyond the model's d: the circuit's bits and S_k,
/// 2 b0 + r (b1 + 2), about 4,300 with r = 135 (`fl_secagg::verified::shape`); a bound on what a
/// header may make the server buffer.
const MAX_VERIFIED_EXTRA: u64 = 16_384;

/// A tensor being received: what it is and the chunks so far.
#[derive(Debug)]
struct Pending {
    expecting: Expecting,
    assembler: TensorAssembler,
    bytes: u64,
}

fn wire_status(e: WireError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// Adds a chunk to the tensor in progress; once complete, turns it into its event.
fn push_chunk(
    pending: &mut Option<Pending>,
    id: ClientId,
    chunk: TensorChunk,
    size: u64,
) -> Result<Option<Event>, Status> {
    let Some(p) = pending.as_mut() else {
        return Err(Status::invalid_argument(
            "update chunk without an UpdateHeader or MaskedInputHeader",
        ));
    };
    p.bytes += size;
    let Some(words) = p.assembler.push_words(chunk).map_err(chunk_status)? else {
        return Ok(None);
    };
    let p = pending.take().expect("checked above");
    Ok(Some(match p.expecting {
        Expecting::Update(header) => Event::Update {
            client: id,
            header,
            values: words.into_iter().map(f32::from_bits).collect(),
            bytes: p.bytes,
        },
        Expecting::Masked { round, ring } => Event::SecAgg {
            client: id,
            round,
            message: StageMessage::Masked(ring_elements(ring, &words).map_err(wire_status)?),
            bytes: p.bytes,
        },
        Expecting::Verified(header) => Event::Verified {
            client: id,
            round: header.round,
            report: Box::new(received_upload(&header, &words).map_err(wire_status)?),
            bytes: p.bytes,
        },
    }))
}

/// Turns a secure-aggregation stage message into its event (the tensor-carrying stage goes
/// through [`push_chunk`]).
fn secagg_event(id: ClientId, body: client_message::Body, bytes: u64) -> Result<Event, Status> {
    let (round, message) = match body {
        client_message::Body::SecaggKeys(k) => {
            let keys = advertised_keys(id, &k).map_err(wire_status)?;
            (k.round, StageMessage::Keys(keys))
        }
        client_message::Body::SecaggEndorse(e) => {
            let signature = endorsement(&e).map_err(wire_status)?;
            (e.round, StageMessage::Endorse(signature))
        }
        client_message::Body::SecaggShares(s) => {
            let shares = s
                .shares
                .iter()
                .map(SealedShares::try_from)
                .collect::<Result<_, _>>()
                .map_err(wire_status)?;
            (s.round, StageMessage::Shares(shares))
        }
        client_message::Body::SecaggCheck(c) => (c.round, StageMessage::Check(c.refused)),
        client_message::Body::SecaggReveal(r) => {
            let reveals = r
                .shares
                .iter()
                .map(RevealedShare::try_from)
                .collect::<Result<_, _>>()
                .map_err(wire_status)?;
            (r.round, StageMessage::Reveal(reveals))
        }
        _ => unreachable!("only called with secure-aggregation bodies"),
    };
    Ok(Event::SecAgg {
        client: id,
        round,
        message,
        bytes,
    })
}

/// The framing of one client's stream, without I/O: turns the messages after Hello into
/// [`Event`]s, assembling tensors from their header and chunks, and refuses what breaks the
/// framing. The fuzz target `fuzz/fuzz_targets/session.rs` drives it with arbitrary bytes.
#[derive(Debug)]
pub struct Framer {
    id: ClientId,
    num_params: usize,
    pending: Option<Pending>,
}

impl Framer {
    /// The framing of client `id`'s stream, for a model of `num_params` parameters.
    pub fn new(id: ClientId, num_params: usize) -> Self {
        Self {
            id,
            num_params,
            pending: None,
        }
    }

    /// Whether `message` opens a tensor, whose chunks follow.
    pub fn opens_tensor(message: &ClientMessage) -> bool {
        matches!(
            message.body,
            Some(
                client_message::Body::UpdateHeader(_)
                    | client_message::Body::ReleaseHeader(_)
                    | client_message::Body::MaskedInputHeader(_)
                    | client_message::Body::VerifiedUploadHeader(_)
            )
        )
    }

    /// Whether a tensor is half received.
    pub fn in_tensor(&self) -> bool {
        self.pending.is_some()
    }

    /// Starts receiving a dense upload's chunks: `values` in `chunks`.
    fn start_upload(
        &mut self,
        header: UploadHeader,
        (values, chunks): (u64, u32),
        size: u64,
    ) -> Result<(), Status> {
        let round = header.round();
        if values != self.num_params as u64 {
            return Err(Status::invalid_argument(format!(
                "update has {values} values, the model has {} parameters",
                self.num_params
            )));
        }
        let assembler = TensorAssembler::new(round, values, chunks).map_err(chunk_status)?;
        self.pending = Some(Pending {
            expecting: Expecting::Update(header),
            assembler,
            bytes: size,
        });
        Ok(())
    }

    /// Starts receiving a masked input's chunks: one word per parameter in a 32-bit ring, two in
    /// a 64-bit one (the round checks that the ring is its own).
    fn start_masked(&mut self, header: &MaskedInputHeader, size: u64) -> Result<(), Status> {
        let n = self.num_params as u64;
        let bits = match header.num_words {
            w if w == n => 32,
            w if w == 2 * n => 64,
            w => {
                return Err(Status::invalid_argument(format!(
                    "masked input has {w} words, the model has {n} parameters"
                )));
            }
        };
        let ring = Ring::new(bits).map_err(Status::internal)?;
        let assembler = TensorAssembler::new(header.round, header.num_words, header.num_chunks)
            .map_err(chunk_status)?;
        self.pending = Some(Pending {
            expecting: Expecting::Masked {
                round: header.round,
                ring,
            },
            assembler,
            bytes: size,
        });
        Ok(())
    }

    /// Starts receiving a verified upload's leader share: two words per field element, at least
    /// d elements and at most [`MAX_VERIFIED_EXTRA`] more (the round checks the exact length).
    fn start_verified(&mut self, header: VerifiedUploadHeader, size: u64) -> Result<(), Status> {
        let d = self.num_params as u64;
        let words = header.num_words;
        if !words.is_multiple_of(2) || words < 2 * d || words > 2 * (d + MAX_VERIFIED_EXTRA) {
            return Err(Status::invalid_argument(format!(
                "a verified upload of {words} words, the model has {d} parameters"
            )));
        }
        let assembler =
            TensorAssembler::new(header.round, words, header.num_chunks).map_err(chunk_status)?;
        self.pending = Some(Pending {
            expecting: Expecting::Verified(Box::new(header)),
            assembler,
            bytes: size,
        });
        Ok(())
    }

    /// Takes the next message: `Ok(Some(event))` when it completes one, `Ok(None)` when more
    /// must follow, `Err` when it breaks the framing (the stream then ends).
    pub fn accept(&mut self, message: ClientMessage) -> Result<Option<Event>, Status> {
        let size = message.encoded_len() as u64;
        let id = self.id;
        let body = message
            .body
            .ok_or_else(|| Status::invalid_argument("empty ClientMessage"))?;
        if self.pending.is_some() && !matches!(body, client_message::Body::UpdateChunk(_)) {
            return Err(Status::invalid_argument(
                "a message other than a chunk before the previous tensor's chunks were complete",
            ));
        }
        let event = match body {
            client_message::Body::UpdateHeader(h) => {
                let evaluation = checked_evaluation(&h)?;
                let header = UploadHeader::Plain {
                    round: h.round,
                    num_examples: h.num_examples,
                    train_loss: h.train_loss,
                    evaluation,
                };
                self.start_upload(header, (h.num_values, h.num_chunks), size)?;
                None
            }
            client_message::Body::ReleaseHeader(h) => {
                let header = UploadHeader::Released {
                    round: h.round,
                    release: declared(h.release.as_ref()),
                };
                self.start_upload(header, (h.num_values, h.num_chunks), size)?;
                None
            }
            client_message::Body::MaskedInputHeader(header) => {
                self.start_masked(&header, size)?;
                None
            }
            client_message::Body::VerifiedUploadHeader(header) => {
                self.start_verified(header, size)?;
                None
            }
            client_message::Body::UpdateChunk(chunk) => {
                push_chunk(&mut self.pending, id, chunk, size)?
            }
            body @ (client_message::Body::SecaggKeys(_)
            | client_message::Body::SecaggShares(_)
            | client_message::Body::SecaggCheck(_)
            | client_message::Body::SecaggEndorse(_)
            | client_message::Body::SecaggReveal(_)) => Some(secagg_event(id, body, size)?),
            client_message::Body::SigndsUpload(upload) => Some(Event::Sign {
                client: id,
                round: upload.round,
                sign: i64::from(upload.sign),
                release: declared(upload.release.as_ref()),
                indices: upload.indices,
                bytes: size,
            }),
            client_message::Body::TaskFailed(f) if f.reason.len() > MAX_REASON_BYTES => {
                return Err(Status::invalid_argument(format!(
                    "TaskFailed reason longer than {MAX_REASON_BYTES} bytes"
                )));
            }
            client_message::Body::TaskFailed(f) => Some(Event::Failed {
                client: id,
                round: f.round,
                reason: f.reason,
            }),
            client_message::Body::Hello(_) => {
                return Err(Status::invalid_argument("Hello sent twice on one Session"));
            }
        };
        Ok(event)
    }
}

fn chunk_status(e: ChunkError) -> Status {
    Status::invalid_argument(format!("malformed update: {e}"))
}
