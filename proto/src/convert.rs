//! Conversions between wire messages and `fl-common`'s types.

use crate::v1;
use fl_common::authority::{IdentityCertificate, IdentityKey, MAX_NAME_BYTES};
use fl_common::model::cnn::MAX_LAYERS;
use fl_common::model::{
    Architecture, ExternalModel, LayerSpec, LocalConfig, Model, ModelError, ModelSpec, Shape,
    TensorShape,
};
use fl_common::privacy::{LocalMechanism, MAX_VARIANCE, Release, ReleaseKind};
use fl_common::secagg::{
    AdvertisedKeys, Member, Neighbourhood, Proceed, Quantizer, RevealedShare, Ring, SealedShares,
    SecretKind, ServerStage, Share, Signed, StageMessage,
};
use fl_common::task::{AdmmStep, SecureTask, Task};

/// A wire message whose fields cannot be what the protocol says.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed message: {0}")]
pub struct WireError(pub String);

fn bytes32(bytes: &[u8], what: &str) -> Result<[u8; 32], WireError> {
    bytes
        .try_into()
        .map_err(|_| WireError(format!("{what} must be 32 bytes, not {}", bytes.len())))
}

fn bytes64(bytes: &[u8], what: &str) -> Result<[u8; 64], WireError> {
    bytes
        .try_into()
        .map_err(|_| WireError(format!("{what} must be 64 bytes, not {}", bytes.len())))
}

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

impl From<&ModelSpec> for v1::ModelSpec {
    fn from(spec: &ModelSpec) -> Self {
        match spec.architecture() {
            Architecture::Dense(sizes) => v1::ModelSpec {
                layer_sizes: sizes.iter().map(|&w| w as u32).collect(),
                ..Default::default()
            },
            Architecture::Conv(cnn) => {
                let input = cnn.layers()[0].input;
                v1::ModelSpec {
                    layer_sizes: Vec::new(),
                    input: Some(v1::ImageShape {
                        height: input.height as u32,
                        width: input.width as u32,
                        channels: input.channels as u32,
                    }),
                    layers: cnn.layers().iter().map(|l| l.spec.to_string()).collect(),
                    tensors: Vec::new(),
                }
            }
        }
    }
}

impl From<&Model> for v1::ModelSpec {
    fn from(model: &Model) -> Self {
        match model {
            Model::Network(spec) => spec.into(),
            Model::External(external) => v1::ModelSpec {
                tensors: (external.tensors().iter())
                    .map(|t| v1::NamedShape {
                        name: t.name.clone(),
                        shape: t.shape.iter().map(|&d| d as u64).collect(),
                    })
                    .collect(),
                ..Default::default()
            },
        }
    }
}

impl TryFrom<&v1::ModelSpec> for Model {
    type Error = ModelError;

    /// A built-in network as [`ModelSpec`]'s conversion reads it, or an external model's
    /// tensors, validated by [`ExternalModel::new`] (a peer's spec is untrusted).
    fn try_from(wire: &v1::ModelSpec) -> Result<Self, Self::Error> {
        if wire.tensors.is_empty() {
            return ModelSpec::try_from(wire).map(Model::Network);
        }
        let bad = |why: &str| ModelError::BadTensors(why.into());
        if !wire.layer_sizes.is_empty() || !wire.layers.is_empty() || wire.input.is_some() {
            return Err(bad("both tensors and a built-in network"));
        }
        if wire.tensors.len() > fl_common::model::MAX_TENSORS {
            return Err(bad("too many tensors"));
        }
        let tensors = (wire.tensors.iter())
            .map(|t| {
                let shape = (t.shape.iter())
                    .map(|&d| usize::try_from(d).map_err(|_| bad("a dimension beyond usize")))
                    .collect::<Result<_, _>>()?;
                Ok(TensorShape {
                    name: t.name.clone(),
                    shape,
                })
            })
            .collect::<Result<_, ModelError>>()?;
        ExternalModel::new(tensors).map(Model::External)
    }
}

impl TryFrom<&v1::ModelSpec> for ModelSpec {
    type Error = ModelError;

    /// Validates the architecture as [`ModelSpec::new`] and [`ModelSpec::cnn`] do (a peer's
    /// spec is untrusted).
    fn try_from(wire: &v1::ModelSpec) -> Result<Self, Self::Error> {
        if !wire.tensors.is_empty() {
            return Err(ModelError::BadLayers("an external model's tensors".into()));
        }
        if wire.layers.is_empty() {
            return ModelSpec::new(wire.layer_sizes.iter().map(|&w| w as usize).collect());
        }
        let bad = |why: String| ModelError::BadLayers(why);
        if !wire.layer_sizes.is_empty() {
            return Err(bad("both layer widths and layers".into()));
        }
        if wire.layers.len() > MAX_LAYERS {
            return Err(bad(format!("more than {MAX_LAYERS} layers")));
        }
        let i = wire
            .input
            .ok_or_else(|| bad("layers without an input shape".into()))?;
        let input = Shape {
            height: i.height as usize,
            width: i.width as usize,
            channels: i.channels as usize,
        };
        let layers = (wire.layers.iter().enumerate())
            .map(|(n, text)| {
                text.parse()
                    .map_err(|e| bad(format!("layer {n} ({text:?}): {e}")))
            })
            .collect::<Result<Vec<LayerSpec>, _>>()?;
        ModelSpec::cnn(input, &layers)
    }
}

impl From<LocalConfig> for v1::LocalConfig {
    fn from(c: LocalConfig) -> Self {
        v1::LocalConfig {
            epochs: c.epochs,
            batch_size: c.batch_size,
            learning_rate: c.learning_rate,
            random_shift: c.random_shift,
        }
    }
}

impl From<v1::LocalConfig> for LocalConfig {
    fn from(c: v1::LocalConfig) -> Self {
        LocalConfig {
            epochs: c.epochs,
            batch_size: c.batch_size,
            learning_rate: c.learning_rate,
            random_shift: c.random_shift,
        }
    }
}

impl From<LocalMechanism> for v1::LocalPrivacy {
    fn from(m: LocalMechanism) -> Self {
        use v1::local_privacy::Mechanism;
        let mechanism = match m {
            LocalMechanism::Gaussian {
                epsilon,
                delta,
                clip,
            } => Mechanism::Gaussian(v1::GaussianLdp {
                epsilon,
                delta,
                clip_bound: clip,
            }),
            LocalMechanism::Laplace {
                epsilon,
                clip,
                steps,
            } => Mechanism::Laplace(v1::LaplaceLdp {
                epsilon,
                clip_bound: clip,
                steps,
            }),
            LocalMechanism::SignDs { epsilon, k, h } => Mechanism::Signds(v1::SignDsLdp {
                epsilon,
                k: k as u64,
                h: h as u64,
            }),
        };
        v1::LocalPrivacy {
            mechanism: Some(mechanism),
        }
    }
}

impl TryFrom<&v1::LocalPrivacy> for LocalMechanism {
    type Error = WireError;
    fn try_from(p: &v1::LocalPrivacy) -> Result<Self, WireError> {
        use v1::local_privacy::Mechanism;
        let size =
            |v: u64| usize::try_from(v).map_err(|_| WireError(format!("size {v} too large")));
        Ok(match &p.mechanism {
            Some(Mechanism::Gaussian(g)) => LocalMechanism::Gaussian {
                epsilon: g.epsilon,
                delta: g.delta,
                clip: g.clip_bound,
            },
            Some(Mechanism::Laplace(l)) => LocalMechanism::Laplace {
                epsilon: l.epsilon,
                clip: l.clip_bound,
                steps: l.steps,
            },
            Some(Mechanism::Signds(s)) => LocalMechanism::SignDs {
                epsilon: s.epsilon,
                k: size(s.k)?,
                h: size(s.h)?,
            },
            None => return Err(WireError("LocalPrivacy without a mechanism".into())),
        })
    }
}

impl From<&Release> for v1::LocalRelease {
    fn from(r: &Release) -> Self {
        v1::LocalRelease {
            mechanism: match r.kind {
                ReleaseKind::Gaussian => v1::LocalMechanism::Gaussian,
                ReleaseKind::Laplace => v1::LocalMechanism::Laplace,
                ReleaseKind::SignDs => v1::LocalMechanism::Signds,
            } as i32,
            epsilon: r.epsilon,
            delta: r.delta,
            noise: r.noise,
            sensitivity: r.sensitivity,
        }
    }
}

impl TryFrom<&v1::LocalRelease> for Release {
    type Error = WireError;
    fn try_from(r: &v1::LocalRelease) -> Result<Self, WireError> {
        let kind = match v1::LocalMechanism::try_from(r.mechanism) {
            Ok(v1::LocalMechanism::Gaussian) => ReleaseKind::Gaussian,
            Ok(v1::LocalMechanism::Laplace) => ReleaseKind::Laplace,
            Ok(v1::LocalMechanism::Signds) => ReleaseKind::SignDs,
            _ => {
                return Err(WireError(format!(
                    "unknown local mechanism {}",
                    r.mechanism
                )));
            }
        };
        Ok(Release {
            kind,
            epsilon: r.epsilon,
            delta: r.delta,
            noise: r.noise,
            sensitivity: r.sensitivity,
        })
    }
}

/// A task the client can act on, or why it cannot: the model and settings read, the secure
/// round's code checked (positive finite S, gamma >= 1/S, noise within the sampler's range), an
/// IADMM step's rho and I checked.
impl TryFrom<&v1::RoundTask> for Task {
    type Error = WireError;
    fn try_from(t: &v1::RoundTask) -> Result<Self, WireError> {
        let bad = |m: String| WireError(m);
        let model = Model::try_from(
            t.model
                .as_ref()
                .ok_or(bad("task without a model spec".into()))?,
        )
        .map_err(|e| bad(e.to_string()))?;
        let config = LocalConfig::from(t.config.ok_or(bad("task without a local config".into()))?);
        let local = (t.local_privacy.as_ref())
            .map(LocalMechanism::try_from)
            .transpose()?;
        let secure = t.secagg.map(secure_task).transpose()?;
        let admm = match t.admm {
            None => None,
            Some(a) if a.rho > 0.0 && a.rho.is_finite() && a.total_examples > 0 => Some(AdmmStep {
                rho: a.rho,
                total_examples: a.total_examples,
            }),
            Some(a) => {
                return Err(bad(format!(
                    "unusable IADMM step rho = {}, I = {}",
                    a.rho, a.total_examples
                )));
            }
        };
        Ok(Task {
            round: t.round,
            model,
            config,
            local,
            secure,
            admm,
            evaluate: t.evaluate,
        })
    }
}

/// The secure round of a task: its code and noise, checked.
fn secure_task(task: v1::SecAggTask) -> Result<SecureTask, WireError> {
    let ring = Ring::new(task.ring_bits).map_err(WireError)?;
    if !(task.clip_bound > 0.0
        && task.clip_bound.is_finite()
        && task.scale >= 1.0 / task.clip_bound
        && task.scale.is_finite())
    {
        return Err(WireError(format!(
            "unusable quantisation S = {}, gamma = {}",
            task.clip_bound, task.scale
        )));
    }
    if task.noise_variance > MAX_VARIANCE {
        return Err(WireError(format!(
            "noise variance {} is beyond the sampler's range",
            task.noise_variance
        )));
    }
    Ok(SecureTask {
        quantizer: Quantizer {
            ring,
            clip: task.clip_bound,
            scale: task.scale,
        },
        noise_variance: task.noise_variance,
        signed: task.signed,
    })
}

/// A server's secure-aggregation stage message as (its round, the stage), or `None` for a body
/// of another kind.
pub fn server_stage(
    body: &v1::server_message::Body,
) -> Option<Result<(u64, ServerStage), WireError>> {
    use v1::server_message::Body;
    let stage = match body {
        Body::SecaggNeighbours(n) => (n.neighbours.iter())
            .map(AdvertisedKeys::try_from)
            .collect::<Result<_, _>>()
            .map(|neighbours| {
                let members = (n.members.iter())
                    .map(|m| Member {
                        id: m.client_id,
                        name: m.name.clone(),
                    })
                    .collect();
                let hood = Neighbourhood {
                    threshold: n.threshold as usize,
                    members,
                    neighbours,
                };
                (n.round, ServerStage::Neighbours(hood))
            }),
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

/// A task's wire message, without its tensor's size (`num_values` and `num_chunks` are the
/// sender's to fill in).
impl From<&Task> for v1::RoundTask {
    fn from(task: &Task) -> Self {
        v1::RoundTask {
            round: task.round,
            model: Some((&task.model).into()),
            config: Some(task.config.into()),
            num_values: 0,
            num_chunks: 0,
            secagg: task.secure.map(|s| v1::SecAggTask {
                ring_bits: s.quantizer.ring.bits(),
                clip_bound: s.quantizer.clip,
                scale: s.quantizer.scale,
                noise_variance: s.noise_variance,
                signed: s.signed,
            }),
            local_privacy: task.local.map(v1::LocalPrivacy::from),
            admm: task.admm.map(|a| v1::AdmmTask {
                rho: a.rho,
                total_examples: a.total_examples,
            }),
            evaluate: task.evaluate,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_elements_roundtrip_through_words() {
        for bits in [32, 64] {
            let ring = Ring::new(bits).unwrap();
            let v = vec![0, 1, ring.mask(), 0x1234_5678 & ring.mask()];
            assert_eq!(ring_elements(ring, &ring_words(ring, &v)).unwrap(), v);
        }
        assert!(ring_elements(Ring::new(64).unwrap(), &[1, 2, 3]).is_err());
    }

    #[test]
    fn malformed_secagg_fields_are_refused() {
        let short = v1::PeerKeys {
            client_id: 1,
            cipher_public: vec![0; 31],
            mask_public: vec![0; 32],
            signed: None,
        };
        assert!(AdvertisedKeys::try_from(&short).is_err());
        let signed = v1::SignedKeys {
            certificate: Some(v1::IdentityCertificate {
                name: "site".into(),
                identity: vec![1; 32],
                signature: vec![2; 64],
            }),
            signature: vec![3; 64],
        };
        let ok = v1::PeerKeys {
            cipher_public: vec![0; 32],
            signed: Some(signed.clone()),
            ..short.clone()
        };
        let keys = AdvertisedKeys::try_from(&ok).unwrap();
        assert_eq!(v1::PeerKeys::from(&keys), ok);
        for broken in [
            v1::SignedKeys {
                signature: vec![3; 63],
                ..signed.clone()
            },
            v1::SignedKeys {
                certificate: None,
                ..signed.clone()
            },
        ] {
            let bad = v1::PeerKeys {
                signed: Some(broken),
                ..ok.clone()
            };
            assert!(AdvertisedKeys::try_from(&bad).is_err());
        }
        let bad_kind = v1::RevealedShare {
            owner: 1,
            kind: 0,
            share: vec![0; 48],
        };
        assert!(RevealedShare::try_from(&bad_kind).is_err());
        let bad_share = v1::RevealedShare {
            owner: 1,
            kind: 1,
            share: vec![0; 47],
        };
        assert!(RevealedShare::try_from(&bad_share).is_err());
    }

    #[test]
    fn model_spec_roundtrips_and_untrusted_specs_are_validated() {
        let spec = ModelSpec::mlp(784, &[600, 100], 10).unwrap();
        let wire = v1::ModelSpec::from(&spec);
        assert_eq!(ModelSpec::try_from(&wire).unwrap(), spec);
        let bogus = v1::ModelSpec {
            layer_sizes: vec![u32::MAX, u32::MAX],
            ..Default::default()
        };
        assert!(ModelSpec::try_from(&bogus).is_err());
    }

    #[test]
    fn a_cnn_spec_crosses_the_wire_and_bad_layers_are_refused() {
        let input = Shape {
            height: 28,
            width: 28,
            channels: 1,
        };
        let layers: Vec<LayerSpec> = fl_common::model::cnn::FEDAVG_CNN
            .iter()
            .map(|t| t.parse().unwrap())
            .collect();
        let spec = ModelSpec::cnn(input, &layers).unwrap();
        let wire = v1::ModelSpec::from(&spec);
        assert!(wire.layer_sizes.is_empty());
        assert_eq!(wire.layers[0], "conv:32:5:pad2");
        assert_eq!(ModelSpec::try_from(&wire).unwrap(), spec);
        let refused = |edit: fn(&mut v1::ModelSpec)| {
            let mut bad = wire.clone();
            edit(&mut bad);
            ModelSpec::try_from(&bad).unwrap_err().to_string()
        };
        assert!(refused(|w| w.layers[3] = "conv:64:x".into()).contains("layer 3"));
        assert!(refused(|w| w.layers.truncate(8)).contains("last layer must be dense"));
        assert!(refused(|w| w.input = None).contains("input shape"));
        assert!(refused(|w| w.layer_sizes = vec![784, 10]).contains("both"));
        assert!(refused(|w| w.layers = vec!["relu".into(); 10_000]).contains("layers"));
        let huge = |w: &mut v1::ModelSpec| w.layers[0] = "conv:32:5:pad4000000000".into();
        assert!(refused(huge).contains("layer 0"));
    }

    /// An external model's names and shapes cross the wire in order; a list that mixes in a
    /// built-in network, or that the model's checks refuse, is refused.
    #[test]
    fn an_external_model_crosses_the_wire_and_bad_lists_are_refused() {
        let tensor = |name: &str, shape: &[usize]| TensorShape {
            name: name.into(),
            shape: shape.to_vec(),
        };
        let model = Model::External(
            ExternalModel::new(vec![
                tensor("fc.weight", &[10, 4]),
                tensor("fc.bias", &[10]),
            ])
            .unwrap(),
        );
        let wire = v1::ModelSpec::from(&model);
        assert_eq!(wire.tensors[0].name, "fc.bias");
        assert_eq!(wire.tensors[1].shape, vec![10, 4]);
        assert_eq!(Model::try_from(&wire).unwrap(), model);
        assert!(ModelSpec::try_from(&wire).is_err());
        let refused = |edit: fn(&mut v1::ModelSpec)| {
            let mut bad = wire.clone();
            edit(&mut bad);
            Model::try_from(&bad).unwrap_err().to_string()
        };
        assert!(refused(|w| w.layer_sizes = vec![4, 10]).contains("both"));
        assert!(refused(|w| w.tensors[1].name = "fc.bias".into()).contains("twice"));
        assert!(refused(|w| w.tensors[0].shape = vec![u64::MAX, 2]).contains("parameters"));
        let mlp = Model::from(ModelSpec::mlp(4, &[3], 2).unwrap());
        assert_eq!(Model::try_from(&v1::ModelSpec::from(&mlp)).unwrap(), mlp);
    }

    /// A task survives the wire: what the server sends is what the client reads, and a task
    /// whose code or step is unusable is refused.
    #[test]
    fn tasks_cross_the_wire_unchanged_and_bad_ones_are_refused() {
        let task = Task {
            round: 7,
            model: ModelSpec::logistic(3, 2).unwrap().into(),
            config: LocalConfig {
                epochs: 2,
                batch_size: 5,
                learning_rate: 0.1,
                random_shift: 0,
            },
            local: None,
            secure: Some(SecureTask {
                quantizer: Quantizer {
                    ring: Ring::new(64).unwrap(),
                    clip: 1.0,
                    scale: 1000.0,
                },
                noise_variance: 12,
                signed: true,
            }),
            admm: Some(AdmmStep {
                rho: 2.0,
                total_examples: 60,
            }),
            evaluate: true,
        };
        let wire = v1::RoundTask::from(&task);
        assert_eq!(Task::try_from(&wire).unwrap(), task);
        let mut bad = wire.clone();
        bad.secagg.as_mut().unwrap().scale = 0.5;
        assert!(Task::try_from(&bad).unwrap_err().0.contains("quantisation"));
        let mut bad = wire;
        bad.admm.as_mut().unwrap().rho = f64::NAN;
        assert!(Task::try_from(&bad).unwrap_err().0.contains("IADMM"));
    }

    #[test]
    fn server_stages_cross_the_wire_unchanged() {
        let stages = [
            ServerStage::Proceed(Proceed {
                excluded: vec![1, 2],
                unpaired: vec![3],
            }),
            ServerStage::Survivors(vec![4, 5]),
            ServerStage::ShareInbox(Vec::new()),
            ServerStage::Endorsements(vec![(3, [7; 64])]),
        ];
        for stage in stages {
            let body = server_stage_body(9, &stage);
            assert_eq!(server_stage(&body).unwrap().unwrap(), (9, stage));
        }
    }
}
