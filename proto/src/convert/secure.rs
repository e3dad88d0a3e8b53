//! The secure-aggregation stages on the wire: signed key advertisements, sealed and revealed
//! shares, masked inputs as ring words, and each stage's messages in both directions.

use crate::v1;
use fl_authority::{IdentityCertificate, IdentityKey, MAX_NAME_BYTES};
use fl_secagg::{
    AdvertisedKeys, Member, Neighbourhood, Proceed, RevealedShare, Ring, SealedShares, SecretKind,
    ServerStage, Share, Signed, StageMessage,
};

use super::{WireError, bytes32, bytes64};

impl From<&Signed> for v1::SignedKeys {
    fn from(s: &Signed) -> Self {
        let c = &s.certificate;
        v1::SignedKeys {
            certificate: Some(v1::IdentityCertificate {
                name: c.name.clone(),
                identity: c.identity.0.to_vec(),
                signature: c.signature.to_vec(),
            }),
            signature: s.signature.to_vec(),
        }
    }
}

impl TryFrom<&v1::SignedKeys> for Signed {
    type Error = WireError;
    fn try_from(s: &v1::SignedKeys) -> Result<Self, WireError> {
        let c = (s.certificate.as_ref())
            .ok_or_else(|| WireError("signed keys without a certificate".into()))?;
        if c.name.is_empty() || c.name.len() > MAX_NAME_BYTES {
            return Err(WireError(format!(
                "a certificate's name must have 1 to {MAX_NAME_BYTES} bytes"
            )));
        }
        Ok(Signed {
            certificate: IdentityCertificate {
                name: c.name.clone(),
                identity: IdentityKey(bytes32(&c.identity, "identity")?),
                signature: bytes64(&c.signature, "certificate signature")?,
            },
            signature: bytes64(&s.signature, "signature")?,
        })
    }
}

impl From<&AdvertisedKeys> for v1::PeerKeys {
    fn from(k: &AdvertisedKeys) -> Self {
        v1::PeerKeys {
            client_id: k.client,
            cipher_public: k.cipher_public.to_vec(),
            mask_public: k.mask_public.to_vec(),
            signed: k.signed.as_deref().map(v1::SignedKeys::from),
        }
    }
}

impl TryFrom<&v1::PeerKeys> for AdvertisedKeys {
    type Error = WireError;
    fn try_from(k: &v1::PeerKeys) -> Result<Self, WireError> {
        Ok(AdvertisedKeys {
            client: k.client_id,
            cipher_public: bytes32(&k.cipher_public, "cipher_public")?,
            mask_public: bytes32(&k.mask_public, "mask_public")?,
            signed: (k.signed.as_ref().map(Signed::try_from).transpose()?).map(Box::new),
        })
    }
}

/// A client's keys message as sent by client `id`.
pub fn advertised_keys(id: u64, k: &v1::SecAggKeys) -> Result<AdvertisedKeys, WireError> {
    AdvertisedKeys::try_from(&v1::PeerKeys {
        client_id: id,
        cipher_public: k.cipher_public.clone(),
        mask_public: k.mask_public.clone(),
        signed: k.signed.clone(),
    })
}

/// A survivor-set signature from the wire.
pub fn endorsement(e: &v1::SecAggEndorse) -> Result<[u8; 64], WireError> {
    bytes64(&e.signature, "signature")
}

impl From<&SealedShares> for v1::SealedShare {
    fn from(s: &SealedShares) -> Self {
        v1::SealedShare {
            from: s.from,
            to: s.to,
            ciphertext: s.ciphertext.clone(),
            mask_key_commitment: s.mask_key_commitment.to_vec(),
            self_mask_commitment: s.self_mask_commitment.to_vec(),
        }
    }
}

impl TryFrom<&v1::SealedShare> for SealedShares {
    type Error = WireError;
    fn try_from(s: &v1::SealedShare) -> Result<Self, WireError> {
        Ok(SealedShares {
            from: s.from,
            to: s.to,
            ciphertext: s.ciphertext.clone(),
            mask_key_commitment: bytes32(&s.mask_key_commitment, "mask_key_commitment")?,
            self_mask_commitment: bytes32(&s.self_mask_commitment, "self_mask_commitment")?,
        })
    }
}

impl From<&RevealedShare> for v1::RevealedShare {
    fn from(r: &RevealedShare) -> Self {
        v1::RevealedShare {
            owner: r.owner,
            kind: match r.kind {
                SecretKind::MaskKey => v1::SecretKind::MaskKey,
                SecretKind::SelfMask => v1::SecretKind::SelfMask,
            } as i32,
            share: r.share.to_bytes().to_vec(),
        }
    }
}

impl TryFrom<&v1::RevealedShare> for RevealedShare {
    type Error = WireError;
    fn try_from(r: &v1::RevealedShare) -> Result<Self, WireError> {
        let kind = match v1::SecretKind::try_from(r.kind) {
            Ok(v1::SecretKind::MaskKey) => SecretKind::MaskKey,
            Ok(v1::SecretKind::SelfMask) => SecretKind::SelfMask,
            _ => return Err(WireError(format!("unknown secret kind {}", r.kind))),
        };
        Ok(RevealedShare {
            owner: r.owner,
            kind,
            share: Share::from_bytes(&r.share).map_err(|e| WireError(e.to_string()))?,
        })
    }
}

/// The 32-bit words that carry ring elements: one per element for b = 32, two (low first) for
/// b = 64.
pub fn ring_words(ring: Ring, values: &[u64]) -> Vec<u32> {
    match ring.bits() {
        32 => values.iter().map(|&v| v as u32).collect(),
        _ => values
            .iter()
            .flat_map(|&v| [v as u32, (v >> 32) as u32])
            .collect(),
    }
}

/// The ring elements carried by `words` (see [`ring_words`]).
pub fn ring_elements(ring: Ring, words: &[u32]) -> Result<Vec<u64>, WireError> {
    match ring.bits() {
        32 => Ok(words.iter().map(|&w| u64::from(w)).collect()),
        _ if words.len().is_multiple_of(2) => Ok(words
            .chunks_exact(2)
            .map(|p| u64::from(p[0]) | (u64::from(p[1]) << 32))
            .collect()),
        _ => Err(WireError(
            "a 64-bit masked input needs an even number of words".into(),
        )),
    }
}

/// A neighbourhood message: U1 with each member's advertisement digest, and the neighbours'
/// keys.
fn neighbourhood(n: &v1::SecAggNeighbours) -> Result<Neighbourhood, WireError> {
    let neighbours = (n.neighbours.iter())
        .map(AdvertisedKeys::try_from)
        .collect::<Result<_, _>>()?;
    let members = (n.members.iter())
        .map(|m| {
            Ok(Member {
                id: m.client_id,
                name: m.name.clone(),
                keys: bytes32(&m.keys, "a member's advertisement digest")?,
            })
        })
        .collect::<Result<_, WireError>>()?;
    Ok(Neighbourhood {
        threshold: n.threshold as usize,
        members,
        neighbours,
    })
}

/// A server's secure-aggregation stage message as (its round, the stage), or `None` for a body
/// of another kind.
pub fn server_stage(
    body: &v1::server_message::Body,
) -> Option<Result<(u64, ServerStage), WireError>> {
    use v1::server_message::Body;
    let stage = match body {
        Body::SecaggNeighbours(n) => {
            neighbourhood(n).map(|hood| (n.round, ServerStage::Neighbours(hood)))
        }
        Body::SecaggEndorsements(e) => (e.endorsements.iter())
            .map(|e| Ok((e.client_id, bytes64(&e.signature, "signature")?)))
            .collect::<Result<_, _>>()
            .map(|signatures| (e.round, ServerStage::Endorsements(signatures))),
        Body::SecaggShareInbox(inbox) => (inbox.shares.iter())
            .map(SealedShares::try_from)
            .collect::<Result<_, _>>()
            .map(|shares| (inbox.round, ServerStage::ShareInbox(shares))),
        Body::SecaggProceed(p) => Ok((
            p.round,
            ServerStage::Proceed(Proceed {
                excluded: p.excluded.clone(),
                unpaired: p.unpaired.clone(),
            }),
        )),
        Body::SecaggSurvivors(s) => Ok((s.round, ServerStage::Survivors(s.survivors.clone()))),
        Body::Task(_) | Body::ModelChunk(_) | Body::Shutdown(_) => return None,
    };
    Some(stage)
}

/// The messages that carry a client's stage message of round `round` in a ring of `ring`: one
/// message, or for the masked input a header and its chunks.
pub fn client_stage(
    round: u64,
    ring: Ring,
    message: &StageMessage,
) -> Vec<v1::client_message::Body> {
    use v1::client_message::Body;
    let one = match message {
        StageMessage::Keys(k) => Body::SecaggKeys(v1::SecAggKeys {
            round,
            cipher_public: k.cipher_public.to_vec(),
            mask_public: k.mask_public.to_vec(),
            signed: k.signed.as_deref().map(v1::SignedKeys::from),
        }),
        StageMessage::Endorse(signature) => Body::SecaggEndorse(v1::SecAggEndorse {
            round,
            signature: signature.to_vec(),
        }),
        StageMessage::Shares(sealed) => Body::SecaggShares(v1::SecAggShares {
            round,
            shares: sealed.iter().map(v1::SealedShare::from).collect(),
        }),
        StageMessage::Check(refused) => Body::SecaggCheck(v1::SecAggCheck {
            round,
            refused: refused.clone(),
        }),
        StageMessage::Reveal(reveals) => Body::SecaggReveal(v1::SecAggReveal {
            round,
            shares: reveals.iter().map(v1::RevealedShare::from).collect(),
        }),
        StageMessage::Masked(y) => {
            let words = ring_words(ring, y);
            let header = Body::MaskedInputHeader(v1::MaskedInputHeader {
                round,
                num_words: words.len() as u64,
                num_chunks: crate::chunk_count(words.len()),
            });
            let chunks = crate::encode_word_chunks(round, &words);
            return std::iter::once(header)
                .chain(chunks.map(Body::UpdateChunk))
                .collect();
        }
    };
    vec![one]
}

/// The wire body of a server's stage message of round `round`.
pub fn server_stage_body(round: u64, stage: &ServerStage) -> v1::server_message::Body {
    use v1::server_message::Body;
    match stage {
        ServerStage::Neighbours(hood) => Body::SecaggNeighbours(v1::SecAggNeighbours {
            round,
            threshold: hood.threshold as u32,
            neighbours: hood.neighbours.iter().map(v1::PeerKeys::from).collect(),
            members: (hood.members.iter())
                .map(|m| v1::Member {
                    client_id: m.id,
                    name: m.name.clone(),
                    keys: m.keys.to_vec(),
                })
                .collect(),
        }),
        ServerStage::ShareInbox(inbox) => Body::SecaggShareInbox(v1::SecAggShareInbox {
            round,
            shares: inbox.iter().map(v1::SealedShare::from).collect(),
        }),
        ServerStage::Proceed(p) => Body::SecaggProceed(v1::SecAggProceed {
            round,
            excluded: p.excluded.clone(),
            unpaired: p.unpaired.clone(),
        }),
        ServerStage::Survivors(survivors) => Body::SecaggSurvivors(v1::SecAggSurvivors {
            round,
            survivors: survivors.clone(),
        }),
        ServerStage::Endorsements(signatures) => Body::SecaggEndorsements(v1::SecAggEndorsements {
            round,
            endorsements: (signatures.iter())
                .map(|(id, s)| v1::Endorsement {
                    client_id: *id,
                    signature: s.to_vec(),
                })
                .collect(),
        }),
    }
}
