//! Signed secure aggregation end to end: a server configured with the federation authority's
//! public key (`secagg.authority`) and its signed policy (`secagg.policy`), and clients with
//! certified identities holding the same policy, run exact rounds, one client dropping after it
//! shared its keys, over real gRPC streams; a client without an identity is refused by the
//! signed round and does not spoil it.

use crate::support;

use fl_authority::policy::{FederationPolicy, MinDegree, PolicyMode};
use fl_authority::{Authority, Identity};
use fl_client::{ClientOptions, TrainingSlots, run_client};
use fl_secagg::{Credentials, PlainInputs, Verifier};
use fl_server::config::{DropoutStage, PrivacyMode};
use std::sync::Arc;
use support::blobs;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_rounds_are_exact_with_a_dropout_and_refuse_an_uncertified_client() {
    let out = std::env::temp_dir().join(format!("fl-signed-secagg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let authority = Authority::generate().unwrap();
    let authority_pub = out.join("authority.pub");
    let hex = format!("{}\n", hex::encode(authority.public().to_bytes()));
    std::fs::write(&authority_pub, hex).unwrap();
    let run = out.join("run");
    let mut c = support::small_config(&run, 6, 6.0, 2);
    c.model.kind = fl_server::config::ModelKind::Logistic;
    c.privacy.mode = PrivacyMode::SecAgg;
    c.privacy.clip_bound = 10.0;
    c.secagg.authority = Some(authority_pub);
    // The policy: at least 4 admitted clients, 3 neighbours, t >= 0.7 k. Five certified
    // clients, of which at least 0.7 x 6 = 5 must survive each stage, meet it.
    let policy = FederationPolicy {
        federation: "hospitals".into(),
        serial: 1,
        modes: [PolicyMode::SecAgg].into(),
        min_clients: 4,
        min_degree: MinDegree::AtLeast(3),
        min_threshold: 0.7,
        min_noise_multiplier: 0.0,
        max_release_epsilon: 4.0,
        max_total_epsilon: 40.0,
        max_delta: 1e-5,
        max_model_magnitude: 1e4,
    };
    let signed = authority.sign_policy(policy.clone()).unwrap();
    let policy_file = out.join("policy.toml");
    std::fs::write(&policy_file, signed.to_toml()).unwrap();
    c.secagg.policy = Some(policy_file);
    c.secagg.threshold = 0.7;
    c.secagg.min_survivors = 0.6;
    c.validate_for_server().unwrap();
    let policy = Arc::new(policy);
    c.secagg.stage_timeout_secs = 20.0;
    c.secagg.sim_dropout = 0.2;
    c.secagg.sim_dropout_stage = DropoutStage::AfterShares;
    let data = Arc::new(blobs(600));
    let oracle = Arc::new(PlainInputs::default());
    let server = support::start_server(c, data.clone(), None, Some(oracle.clone())).await;
    let slots = TrainingSlots::new(2);
    let verifier = Verifier::new(authority.public(), None).unwrap();
    let clients: Vec<_> = (0..6)
        .map(|i| {
            let mut opts = ClientOptions {
                oracle: Some(oracle.clone()),
                ..support::client_options(&server.endpoint, i, &slots)
            };
            if i < 5 {
                let identity = Identity::generate().unwrap();
                let name = format!("hospital-{i}");
                let certificate = authority.certify(&name, &identity.public()).unwrap();
                let credentials = Credentials::new(identity, certificate, verifier.clone());
                opts.credentials = Some(Arc::new(credentials.unwrap()));
                opts.policy = Some(policy.clone());
            }
            tokio::spawn(run_client(opts, support::client_data(&data, i)))
        })
        .collect();
    let summary = support::finished(server.handle).await;
    assert_eq!(summary.rounds_completed, 2);
    let mut refusals = Vec::new();
    for client in clients {
        let report = client.await.unwrap().unwrap();
        refusals.push(report.last_refusal.unwrap_or_default());
    }
    assert!(refusals[..5].iter().all(String::is_empty), "{refusals:?}");
    assert!(refusals[5].contains("no identity"), "{refusals:?}");
    let metrics = support::read_metrics(&run);
    for m in &metrics {
        let secagg = m.secagg.as_ref().unwrap();
        assert_eq!(secagg.aborted, None, "{metrics:?}");
        // Five certified clients, one dropped by the injector after sharing: its masks are
        // recovered and the sum of the other four is exact.
        assert_eq!((secagg.survivors, secagg.dropouts_recovered), (4, 1));
        assert_eq!(secagg.max_abs_error, Some(0), "{metrics:?}");
    }
    std::fs::remove_dir_all(&out).unwrap();
}
