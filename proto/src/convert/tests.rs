//! Round trips through the wire and refusals of malformed messages.

use super::secure::*;
use crate::v1;
use fl_model::{ExternalModel, LayerSpec, LocalConfig, Model, ModelSpec, Shape, TensorShape};
use fl_secagg::task::{AdmmStep, SecureTask, Task};
use fl_secagg::{AdvertisedKeys, Proceed, Quantizer, RevealedShare, Ring, ServerStage};

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
    let layers: Vec<LayerSpec> = fl_model::sequential::FEDAVG_CNN
        .iter()
        .map(|t| t.parse().unwrap())
        .collect();
    let spec = ModelSpec::sequential(input, &layers).unwrap();
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
            federation: "hospitals".into(),
            run: 9,
            min_survivors: 5,
        }),
        verified: None,
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
