//! The protocol's test vectors (docs/src/reference/protocol-vectors.toml): fixed inputs, and every derived
//! byte string an independent implementation must reproduce (docs/src/reference/protocol.md). The test
//! recomputes each and compares; `write_protocol_vectors` (ignored) rewrites the file after a
//! deliberate change of the protocol.

use super::binding::{keys_payload, members_digest, survivors_payload};
use super::graph::{GraphKind, derive};
use super::keys::{self, KeyPair, RoundTag, SecretKind, pair_seed, share_commitment};
use super::messages::{AdvertisedKeys, Member, Signed};
use super::prg::expand;
use super::ring::Ring;
use super::shamir::{self, Share};
use crate::task::{SecureTask, Task};
use fl_authority::policy::{FederationPolicy, MinDegree, PolicyMode};
use fl_authority::{Authority, Identity};
use fl_model::{LocalConfig, ModelSpec};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::BTreeMap;

/// The file, beside the protocol's description.
const FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../docs/src/reference/protocol-vectors.toml"
);

/// The fixed task: logistic regression 2 -> 2, E = 1, B = 10, eta = 0.1, a signed round in
/// Z_2^32 with S = 1, gamma = 1000, no noise, federation "hospitals", run 42; the model's six
/// values.
fn task() -> (Task, Vec<f32>) {
    let task = Task {
        round: 7,
        model: ModelSpec::logistic(2, 2).unwrap().into(),
        config: LocalConfig {
            epochs: 1,
            batch_size: 10,
            learning_rate: 0.1,
            random_shift: 0,
        },
        local: None,
        secure: Some(SecureTask {
            quantizer: crate::Quantizer {
                ring: Ring::new(32).unwrap(),
                clip: 1.0,
                scale: 1000.0,
            },
            noise_variance: 0,
            signed: true,
            federation: "hospitals".into(),
            run: 42,
            min_survivors: 3,
        }),
        verified: None,
        admm: None,
        evaluate: false,
    };
    (task, vec![0.5, -0.25, 1.0, 0.0, 2.0, -3.0])
}

/// Every vector, as hex strings (lists of hex for several values), by name.
fn compute() -> BTreeMap<String, toml::Value> {
    let mut out = BTreeMap::new();
    let mut put = |name: &str, value: toml::Value| {
        out.insert(name.to_string(), value);
    };
    let hex = |b: &[u8]| toml::Value::String(hex::encode(b));
    let (task, model) = task();
    let digest = task.secure_digest(&model).unwrap();
    put("task_digest", hex(&digest.0));
    let tag = RoundTag { round: 7, digest };
    // Client u = 3 and v = 5 with secrets 0x01.. and 0x02.. (mask and cipher pairs alike).
    let (u, v) = (KeyPair::from_secret([1; 32]), KeyPair::from_secret([2; 32]));
    put("u_public", hex(u.public.as_bytes()));
    put("v_public", hex(v.public.as_bytes()));
    put(
        "pair_seed_3_5",
        hex(&pair_seed(&tag, 3, &u.secret, 5, &v.public).unwrap()),
    );
    let cipher = keys::share_cipher(&tag, 3, 5, &u.secret, 5, &v.public).unwrap();
    let plaintext: Vec<u8> = (0u8..120).collect();
    put(
        "share_ciphertext_3_to_5",
        hex(&keys::seal(&cipher, &tag, 3, 5, &plaintext)),
    );
    let share = [0x11u8; 48];
    let commit = |kind| hex(&share_commitment(&tag, kind, 3, 5, &share));
    put("commitment_mask_key_3_5", commit(SecretKind::MaskKey));
    put("commitment_self_mask_3_5", commit(SecretKind::SelfMask));
    for bits in [32, 64] {
        let mask = expand(&[0x42; 32], Ring::new(bits).unwrap(), 4);
        let words = mask
            .iter()
            .map(|w| toml::Value::String(format!("{w:016x}")));
        put(
            &format!("mask_z{bits}_first4"),
            toml::Value::Array(words.collect()),
        );
    }
    // Signatures: the authority 0x55.., the identity 0x44.. of "hospital-1" (Ed25519 is
    // deterministic, RFC 8032).
    let authority = Authority::from_secret(&[0x55; 32]);
    let identity = Identity::from_secret(&[0x44; 32]);
    let certificate = authority.certify("hospital-1", &identity.public()).unwrap();
    put("authority_public", hex(&authority.public().to_bytes()));
    put("identity_public", hex(&identity.public().0));
    put("certificate_signature", hex(&certificate.signature));
    let keys = AdvertisedKeys {
        client: 3,
        cipher_public: v.public.to_bytes(),
        mask_public: u.public.to_bytes(),
        signed: None,
    };
    let payload = keys_payload(&tag, &keys);
    put("keys_payload", hex(&payload));
    let signature = identity.sign(&payload);
    put("keys_signature", hex(&signature));
    let signed = AdvertisedKeys {
        signed: Some(Box::new(Signed {
            certificate,
            signature,
        })),
        ..keys
    };
    put("advert_digest_3", hex(&signed.digest()));
    // U1: client 3 with its signed advertisement, 5 and 9 with digests 0x05.. and 0x09...
    let members: Vec<Member> = [(3, "hospital-1"), (5, "hospital-2"), (9, "hospital-3")]
        .map(|(id, name)| Member {
            id,
            name: Some(name.into()),
            keys: if id == 3 {
                signed.digest()
            } else {
                [id as u8; 32]
            },
        })
        .into();
    let h_u1 = members_digest(&tag, &members);
    put("members_digest", hex(&h_u1));
    let payload = survivors_payload(&tag, &h_u1, &[3, 5, 9]);
    put("survivors_payload", hex(&payload));
    put("survivors_signature", hex(&identity.sign(&payload)));
    // The graph: twelve certified clients "site-0".."site-11" (ids 100..111), k = 4.
    let sites: Vec<Member> = (0..12)
        .map(|i| Member {
            id: 100 + i,
            name: Some(format!("site-{i}")),
            keys: [0; 32],
        })
        .collect();
    let graph = derive(&tag, GraphKind::Regular(4), &sites);
    let rows = graph.iter().map(|(u, ns)| {
        let ns: Vec<String> = ns.iter().map(u64::to_string).collect();
        toml::Value::String(format!("{u}: {}", ns.join(" ")))
    });
    put("graph_regular4_sites", toml::Value::Array(rows.collect()));
    let policy = FederationPolicy {
        federation: "hospitals".into(),
        serial: 3,
        modes: [
            PolicyMode::SecAgg,
            PolicyMode::Local(fl_privacy::LocalKind::Gaussian),
        ]
        .into(),
        min_clients: 10,
        min_degree: MinDegree::AtLeast(8),
        min_threshold: 0.75,
        min_noise_multiplier: 0.5,
        max_release_epsilon: 4.0,
        max_total_epsilon: 50.0,
        max_delta: 1e-5,
        max_model_magnitude: 1e4,
    };
    put("policy_payload", hex(&policy.payload()));
    let signed = authority.sign_policy(policy).unwrap();
    put("policy_signature", hex(&signed.signature));
    put("refused_public_keys", refused_keys(u.public.as_bytes()));
    out
}

/// Public keys every client refuses (protocol.md, "Keys"): u = p = 2^255 - 19 and u = p + 1
/// (not canonical), `public` with its top bit set (the same point to X25519, another encoding),
/// and u = 1 (of small order).
fn refused_keys(public: &[u8; 32]) -> toml::Value {
    let mut p = [0xff; 32];
    (p[0], p[31]) = (0xed, 0x7f);
    let mut p1 = p;
    p1[0] = 0xee;
    let mut top = *public;
    top[31] |= 0x80;
    let mut one = [0; 32];
    one[0] = 1;
    let keys = [p, p1, top, one].map(|k| toml::Value::String(hex::encode(k)));
    toml::Value::Array(keys.to_vec())
}

/// Shamir's vector: the secret 0x33.. in three shares (holders 3, 5, 9), any two of which
/// recover it. Shares are random, so the file keeps one draw and the test combines it.
const SHAMIR: &str = "shamir_shares_3_5_9";

/// The file's vectors.
fn stored() -> BTreeMap<String, toml::Value> {
    let text = std::fs::read_to_string(FILE).expect("docs/src/reference/protocol-vectors.toml");
    let table: toml::Table = toml::from_str(&text).unwrap();
    table.into_iter().collect()
}

#[test]
fn the_protocol_reproduces_its_test_vectors() {
    let (stored, computed) = (stored(), compute());
    let named: Vec<&String> = stored.keys().filter(|k| *k != SHAMIR).collect();
    assert_eq!(named, computed.keys().collect::<Vec<_>>());
    for (name, value) in &computed {
        assert_eq!(&stored[name], value, "vector {name}");
    }
    // The stored Shamir shares recover the secret from any two, and parse back as written.
    let shares: Vec<Share> = (stored[SHAMIR].as_array().unwrap().iter())
        .map(|s| Share::from_bytes(&hex::decode(s.as_str().unwrap()).unwrap()).unwrap())
        .collect();
    for pair in [[0, 1], [0, 2], [1, 2]] {
        let two = [shares[pair[0]], shares[pair[1]]];
        assert_eq!(shamir::combine(&two, 2).unwrap(), [0x33; 32]);
    }
    for key in stored["refused_public_keys"].as_array().unwrap() {
        let bytes: [u8; 32] = hex::decode(key.as_str().unwrap())
            .unwrap()
            .try_into()
            .unwrap();
        assert!(keys::check_public(1, &bytes).is_err(), "{key} accepted");
    }
}

/// Rewrites the file: `cargo test -p fl-secagg write_protocol_vectors -- --ignored`, only after
/// a deliberate change of the protocol (which breaks interoperability; say so).
#[test]
#[ignore]
fn write_protocol_vectors() {
    let header = "# Test vectors of the secure-aggregation protocol (docs/src/reference/protocol.md): every value \
                  is hex;\n# the inputs are fixed in secagg/src/vectors.rs and described \
                  in docs/src/reference/protocol.md, \"Test vectors\".\n\n";
    let mut table: toml::Table = compute().into_iter().collect();
    let shares = shamir::split(&[0x33; 32], 2, &[3, 5, 9], &mut StdRng::from_os_rng()).unwrap();
    let encoded = shares
        .iter()
        .map(|s| toml::Value::String(hex::encode(s.to_bytes())));
    table.insert(SHAMIR.into(), toml::Value::Array(encoded.collect()));
    std::fs::write(
        FILE,
        format!("{header}{}", toml::to_string(&table).unwrap()),
    )
    .unwrap();
}
