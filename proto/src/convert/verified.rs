//! A verified upload on the wire (the client's header and the chunks of the leader's share), and
//! what the leader and the helper exchange about a round.

use super::{WireError, bytes32};
use crate::v1;
use fl_secagg::RoundTag;
use fl_secagg::task::TaskDigest;
use fl_secagg::verified::{
    Batch, BatchUpload, LeaderShare, Parts, PrepShare, Reply, Report, Sealed, Shape, field_bytes,
    field_values,
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

impl From<&Batch> for v1::VerifyRequest {
    fn from(b: &Batch) -> Self {
        v1::VerifyRequest {
            round: b.tag.round,
            task_digest: b.tag.digest.0.to_vec(),
            dim: b.shape.dim as u64,
            clip_bound: b.shape.clip,
            verify_key: b.verify_key.to_vec(),
            noise_multiplier: b.noise_multiplier,
            uploads: (b.uploads.iter())
                .map(|u| v1::HelperUpload {
                    client: u.client,
                    sealed_key: u.sealed.encapped_key.clone(),
                    sealed_share: u.sealed.ciphertext.clone(),
                    leader: Some(v1::PrepShare::from(&u.leader)),
                })
                .collect(),
        }
    }
}

impl TryFrom<&v1::VerifyRequest> for Batch {
    type Error = WireError;
    fn try_from(r: &v1::VerifyRequest) -> Result<Self, WireError> {
        let dim = usize::try_from(r.dim).map_err(|_| WireError(format!("d = {}", r.dim)))?;
        let shape = Shape::new(dim, r.clip_bound).map_err(|e| WireError(e.to_string()))?;
        let uploads = (r.uploads.iter())
            .map(|u| {
                let leader = (u.leader.as_ref())
                    .ok_or_else(|| WireError("an upload without the leader's prep share".into()))?;
                Ok(BatchUpload {
                    client: u.client,
                    sealed: Sealed {
                        encapped_key: u.sealed_key.clone(),
                        ciphertext: u.sealed_share.clone(),
                    },
                    leader: PrepShare::try_from(leader)?,
                })
            })
            .collect::<Result<_, WireError>>()?;
        Ok(Batch {
            tag: RoundTag {
                round: r.round,
                digest: TaskDigest(bytes32(&r.task_digest, "the task digest")?),
            },
            shape,
            verify_key: bytes32(&r.verify_key, "the verify key")?,
            noise_multiplier: r.noise_multiplier,
            uploads,
        })
    }
}

impl From<&Reply> for v1::VerifyReply {
    fn from(r: &Reply) -> Self {
        v1::VerifyReply {
            helper: (r.prep.iter())
                .map(|p| p.as_ref().map(v1::PrepShare::from).unwrap_or_default())
                .collect(),
            accepted: r.accepted.clone(),
            aggregate: field_bytes(&r.aggregate),
        }
    }
}

impl TryFrom<&v1::VerifyReply> for Reply {
    type Error = WireError;
    /// An empty prep share stands for none (an upload excluded before preparing).
    fn try_from(r: &v1::VerifyReply) -> Result<Self, WireError> {
        let prep = (r.helper.iter())
            .map(|p| match p == &v1::PrepShare::default() {
                true => Ok(None),
                false => PrepShare::try_from(p).map(Some),
            })
            .collect::<Result<_, WireError>>()?;
        Ok(Reply {
            prep,
            accepted: r.accepted.clone(),
            aggregate: values(&r.aggregate, "the helper's aggregate")?,
        })
    }
}
