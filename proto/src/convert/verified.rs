//! A verified upload on the wire (the client's header and the chunks of the leader's share), and
//! the leader's and helper's prep shares.

use super::{WireError, bytes32};
use crate::v1;
use fl_secagg::verified::{
    LeaderShare, Parts, PrepShare, Report, Sealed, field_bytes, field_values,
};

/// A client's verified upload as the messages it sends: the header, then the leader's share of
/// the input as 32-bit words (two per field element, low word first) in chunks.
pub fn verified_upload(round: u64, report: &Report) -> Vec<v1::client_message::Body> {
    use v1::client_message::Body;
    let LeaderShare {
        input,
        proof,
        blind,
        helper_parts,
    } = &report.leader;
    let words: Vec<u32> = (field_bytes(input).chunks_exact(4))
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    let header = Body::VerifiedUploadHeader(v1::VerifiedUploadHeader {
        round,
        num_words: words.len() as u64,
        num_chunks: crate::chunk_count(words.len()),
        proof: field_bytes(proof),
        blind: blind.to_vec(),
        helper_wraparound_part: helper_parts.wraparound.to_vec(),
        helper_joint_rand_part: helper_parts.joint_rand.to_vec(),
        sealed_key: report.helper.encapped_key.clone(),
        sealed_share: report.helper.ciphertext.clone(),
    });
    let chunks = crate::encode_word_chunks(round, &words);
    std::iter::once(header)
        .chain(chunks.map(Body::UpdateChunk))
        .collect()
}

/// Field values from their wire bytes.
fn values(bytes: &[u8], what: &str) -> Result<Vec<fl_secagg::verified::F>, WireError> {
    field_values(bytes).ok_or_else(|| {
        WireError(format!(
            "{what} is not a list of 64-bit field elements below the modulus"
        ))
    })
}

/// The upload the server received: the header's fields read, with the leader's share of the
/// input from its assembled `words`.
pub fn received_upload(
    header: &v1::VerifiedUploadHeader,
    words: &[u32],
) -> Result<Report, WireError> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    Ok(Report {
        leader: LeaderShare {
            input: values(&bytes, "the leader's input share")?,
            proof: values(&header.proof, "the leader's proof share")?,
            blind: bytes32(&header.blind, "the leader's blind")?,
            helper_parts: Parts {
                wraparound: bytes32(
                    &header.helper_wraparound_part,
                    "the helper's wraparound part",
                )?,
                joint_rand: bytes32(
                    &header.helper_joint_rand_part,
                    "the helper's joint-rand part",
                )?,
            },
        },
        helper: Sealed {
            encapped_key: header.sealed_key.clone(),
            ciphertext: header.sealed_share.clone(),
        },
    })
}

impl From<&PrepShare> for v1::PrepShare {
    fn from(p: &PrepShare) -> Self {
        v1::PrepShare {
            verifier: field_bytes(&p.verifier),
            wraparound_part: p.parts.wraparound.to_vec(),
            joint_rand_part: p.parts.joint_rand.to_vec(),
        }
    }
}

impl TryFrom<&v1::PrepShare> for PrepShare {
    type Error = WireError;
    fn try_from(p: &v1::PrepShare) -> Result<Self, WireError> {
        Ok(PrepShare {
            verifier: values(&p.verifier, "a verifier share")?,
            parts: Parts {
                wraparound: bytes32(&p.wraparound_part, "a wraparound part")?,
                joint_rand: bytes32(&p.joint_rand_part, "a joint-rand part")?,
            },
        })
    }
}
