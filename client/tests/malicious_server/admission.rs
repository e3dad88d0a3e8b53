//! What a task leaves out, or the policy does not name: a client under a policy admits only what
//! its policy lists (default deny), charges every release, secure rounds included, at a delta
//! the policy fixes, and answers nothing that depends on its examples outside a mechanism. Where
//! the attack has a form without the protection, the test shows it succeeding there first.

use crate::honest;
use crate::scripted::*;
use fl_authority::policy::{FederationPolicy, PolicyMode};
use fl_proto::v1::{AdmmTask, LocalPrivacy, ModelSpec, RoundTask, client_message};
use fl_secagg::{GraphKind, ServerStage, StageMessage, Verifier};
use std::sync::Arc;

/// What a client answered a task with, as the server reads it.
#[derive(Debug)]
enum Upload {
    /// A raw update (UpdateHeader) of this many examples.
    Raw { examples: u64 },
    /// A local mechanism's release, its (epsilon, delta, noise).
    Release {
        epsilon: f64,
        delta: f64,
        noise: f64,
    },
    /// The refusal's reason.
    Refused(String),
}

/// The client's answer to a task, read to its last chunk.
async fn upload(peer: &mut Peer) -> Upload {
    let (chunks, upload) = match next(peer).await.expect("an answer") {
        client_message::Body::UpdateHeader(h) => (
            h.num_chunks,
            Upload::Raw {
                examples: h.num_examples,
            },
        ),
        client_message::Body::ReleaseHeader(h) => {
            let r = h.release.unwrap();
            (
                h.num_chunks,
                Upload::Release {
                    epsilon: r.epsilon,
                    delta: r.delta,
                    noise: r.noise,
                },
            )
        }
        client_message::Body::TaskFailed(f) => return Upload::Refused(f.reason),
        other => panic!("unexpected {other:?}"),
    };
    for _ in 0..chunks {
        next(peer).await.expect("a chunk");
    }
    upload
}

/// The test policy with only `modes` allowed.
fn allowing(modes: &[PolicyMode]) -> FederationPolicy {
    FederationPolicy {
        modes: modes.iter().copied().collect(),
        ..policy()
    }
}

/// A plain task of round `round`: no mechanism, no secure aggregation (what a server of privacy
/// mode `none` or `central` sends; a central-DP server clips and noises only after the raw
/// update arrived).
fn plain_task(round: u64) -> RoundTask {
    RoundTask {
        round,
        secagg: None,
        ..task(false)
    }
}

/// A task under `ldp-gaussian` at (`epsilon`, `delta`), round `round`.
fn gaussian_task(round: u64, epsilon: f64, delta: f64) -> RoundTask {
    RoundTask {
        local_privacy: Some(LocalPrivacy {
            mechanism: "ldp-gaussian".into(),
            parameters: [
                ("epsilon".into(), epsilon),
                ("delta".into(), delta),
                ("clip_bound".into(), 1.0),
            ]
            .into(),
        }),
        ..plain_task(round)
    }
}

/// A plain task (the raw update, loss and example count) sent to a client without a policy is
/// trained and uploaded raw; to a client under a policy that lists every mode but `plain`, it
/// is refused naming the rule, and nothing of the client's data leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_sends_a_plain_task_to_a_policy_client() {
    let no_plain: Vec<PolicyMode> = (PolicyMode::all().into_iter())
        .filter(|m| *m != PolicyMode::Plain)
        .collect();
    for with_policy in [false, true] {
        let fleet = Fleet {
            signed: true,
            policy: with_policy.then(|| allowing(&no_plain)),
        };
        let mut setup = setup_fleet(&format!("plain-{with_policy}"), 1, fleet).await;
        let mut peers = setup.peers(1).await;
        let peer = peers.values_mut().next().unwrap();
        send_task(peer, &plain_task(1), &[0.0; PARAMS]).await;
        match (with_policy, upload(peer).await) {
            (false, Upload::Raw { examples }) => assert_eq!(examples, 30),
            (true, Upload::Refused(reason)) => {
                assert!(reason.contains("does not allow plain rounds"), "{reason}")
            }
            (_, other) => panic!("policy {with_policy}: {other:?}"),
        }
        shut_down(&mut setup, &peers).await;
    }
}

/// Federated evaluation (loss, accuracy and example count on the client's own data) asked of
/// a client under a policy that allows plain rounds: refused, so that no figure of its data
/// leaves outside a mechanism; the same policy's plain round without evaluation is trained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_asks_for_federated_evaluation() {
    let fleet = Fleet {
        signed: true,
        policy: Some(allowing(&[PolicyMode::Plain])),
    };
    let mut setup = setup_fleet("evaluate", 1, fleet).await;
    let mut peers = setup.peers(1).await;
    let peer = peers.values_mut().next().unwrap();
    let evaluate = RoundTask {
        evaluate: true,
        ..plain_task(1)
    };
    send_task(peer, &evaluate, &[0.0; PARAMS]).await;
    match upload(peer).await {
        Upload::Refused(reason) => assert!(reason.contains("federated evaluation"), "{reason}"),
        other => panic!("{other:?}"),
    }
    send_task(peer, &plain_task(2), &[0.0; PARAMS]).await;
    assert!(matches!(upload(peer).await, Upload::Raw { .. }));
    shut_down(&mut setup, &peers).await;
}

/// An IADMM step under the Laplace mechanism asked of a client whose policy allows the Laplace
/// mechanism but not IADMM: refused, naming the mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_asks_for_an_iadmm_step() {
    let fleet = Fleet {
        signed: true,
        policy: Some(allowing(&[PolicyMode::Local(
            fl_privacy::LocalKind::Laplace,
        )])),
    };
    let mut setup = setup_fleet("iadmm", 1, fleet).await;
    let mut peers = setup.peers(1).await;
    let peer = peers.values_mut().next().unwrap();
    let admm = RoundTask {
        num_values: 2 * PARAMS as u64,
        num_chunks: fl_proto::chunk_count(2 * PARAMS),
        admm: Some(AdmmTask {
            rho: 1.0,
            total_examples: 120,
        }),
        local_privacy: Some(LocalPrivacy {
            mechanism: "ldp-laplace".into(),
            parameters: [
                ("epsilon".into(), 1.0),
                ("clip_bound".into(), 1.0),
                ("steps".into(), 1.0),
            ]
            .into(),
        }),
        ..plain_task(1)
    };
    send_task(peer, &admm, &[0.0; 2 * PARAMS]).await;
    match upload(peer).await {
        Upload::Refused(reason) => {
            assert!(reason.contains("does not allow iadmm rounds"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    shut_down(&mut setup, &peers).await;
}

/// The task asks for delta 0.5 at epsilon 4. Without a policy the client releases at delta 0.5,
/// with little noise; under a policy of max_delta 1e-5 it releases at (4, 1e-5), with more than
/// three times the noise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_asks_for_a_large_delta() {
    let mut noise = Vec::new();
    for with_policy in [false, true] {
        let fleet = Fleet {
            signed: true,
            policy: with_policy.then(policy),
        };
        let mut setup = setup_fleet(&format!("delta-{with_policy}"), 1, fleet).await;
        let mut peers = setup.peers(1).await;
        let peer = peers.values_mut().next().unwrap();
        send_task(peer, &gaussian_task(1, 4.0, 0.5), &[0.0; PARAMS]).await;
        match upload(peer).await {
            Upload::Release {
                epsilon,
                delta,
                noise: sigma,
            } => {
                assert_eq!(epsilon, 4.0);
                assert_eq!(delta, if with_policy { 1e-5 } else { 0.5 });
                noise.push(sigma);
            }
            other => panic!("policy {with_policy}: {other:?}"),
        }
        shut_down(&mut setup, &peers).await;
    }
    assert!(noise[1] > 3.0 * noise[0], "{noise:?}");
}

/// The server runs the same model through secure rounds again and again, run after run, to
/// average the noise away. Each round is charged at the policy's floor (z = 4: epsilon 2.18
/// for one round at delta 1e-5, 3.20 for two, 4.03 for three); under a total cap of 4 two
/// rounds go through, the clients are restarted, and every one refuses the third: the budget
/// is spent. Before secure rounds were charged the third went through like the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_repeats_secure_rounds_of_one_model() {
    let capped = FederationPolicy {
        max_total_epsilon: 4.0,
        ..policy()
    };
    let fleet = Fleet {
        signed: true,
        policy: Some(capped),
    };
    let mut setup = setup_fleet("repeat", 4, fleet).await;
    let mut peers = setup.peers(4).await;
    let verifier = Arc::new(Verifier::new(setup.authority.public(), None).unwrap());
    let model = vec![0.0; PARAMS];
    for run in 1..=2 {
        let task = task_in(true, "hospitals", run);
        let done = honest::round(
            &mut peers,
            &task,
            (&model, 0.7),
            Some(verifier.clone()),
            honest::Deviation::None,
        )
        .await
        .unwrap();
        assert_eq!(done.result.survivors.len(), 4);
    }
    for i in 0..4 {
        setup.restart(i);
    }
    let mut peers = setup.peers(4).await;
    let task = task_in(true, "hospitals", 3);
    for peer in peers.values() {
        send_task(peer, &task, &model).await;
    }
    for (u, peer) in peers.iter_mut() {
        match answer(peer).await {
            Answer::Failed(reason) => assert!(reason.contains("budget is spent"), "{reason}"),
            other => panic!("client {u} took part a third time: {other:?}"),
        }
    }
    shut_down(&mut setup, &peers).await;
}

/// The server probes each client's largest label with a model of 1, 2 or 3 classes (every
/// client has labels 0, 1 and 2): each answers with a release at the same epsilon, never a
/// refusal that names its labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_probes_the_class_count() {
    let mut setup = setup_fleet("classes", 3, Fleet::default()).await;
    let mut peers = setup.peers(3).await;
    for (classes, peer) in (1..=3).zip(peers.values_mut()) {
        let probe = RoundTask {
            model: Some(ModelSpec {
                layer_sizes: vec![FEATURES as u32, classes],
                ..Default::default()
            }),
            num_values: (FEATURES as u64 + 1) * u64::from(classes),
            num_chunks: 1,
            ..gaussian_task(1, 2.0, 1e-5)
        };
        let d = (FEATURES + 1) * classes as usize;
        send_task(peer, &probe, &vec![0.0; d]).await;
        match upload(peer).await {
            Upload::Release { epsilon, .. } => assert_eq!(epsilon, 2.0, "{classes} classes"),
            other => panic!("{classes} classes: {other:?}"),
        }
    }
    shut_down(&mut setup, &peers).await;
}

/// The server relays a neighbour's mask key with its top bit set (the same point to X25519,
/// another key to every digest): the victim refuses the neighbourhood before sharing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_sends_a_non_canonical_key() {
    let mut setup = setup("canonical", 4, false).await;
    let mut peers = setup.peers(4).await;
    let task = task(false);
    let model = vec![0.0; PARAMS];
    let tag = tag_of(&task, &model);
    let mut adverts = keys_of(&mut peers, &task, |_| model.clone()).await;
    let victim = adverts[0].client;
    adverts[1].mask_public[31] |= 0x80;
    let hood = honest_hoods(&tag, &adverts, GraphKind::Complete, 3)
        .remove(&victim)
        .unwrap();
    let peer = peers.get_mut(&victim).unwrap();
    send_stage(peer, &ServerStage::Neighbours(hood)).await;
    match answer(peer).await {
        Answer::Failed(reason) => assert!(reason.contains("not canonical"), "{reason}"),
        Answer::Stage(StageMessage::Shares(_)) => panic!("shared under a non-canonical key"),
        other => panic!("{other:?}"),
    }
    shut_down(&mut setup, &peers).await;
}

/// A client that has held serial 2 of its federation's policy is started again with serial 1
/// (an older, looser policy put back in its place): it refuses to start, naming both serials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_rolls_the_policy_back() {
    let newer = FederationPolicy {
        serial: 2,
        ..policy()
    };
    let fleet = Fleet {
        signed: true,
        policy: Some(newer),
    };
    let mut setup = setup_fleet("rollback", 1, fleet).await;
    let peers = setup.peers(1).await;
    let older = FederationPolicy {
        max_release_epsilon: 40.0,
        ..policy()
    };
    let signed = setup.authority.sign_policy(older).unwrap();
    std::fs::write(setup.dir.join("policy.toml"), signed.to_toml()).unwrap();
    setup.restart(0);
    let status = wait_for_exit(&mut setup.processes[0]).await;
    assert_eq!(status.code(), Some(1), "{status:?}");
    let log = std::fs::read_to_string(setup.dir.join("client-0.log")).unwrap();
    assert!(log.contains("serial 1 is older than serial 2"), "{log}");
    drop(peers);
}

/// A server (or an aggregator, to its group) that finishes a round with fewer survivors than the
/// task's n_min, the survivors its noise was charged for: five clients mask, and it says the
/// last dropped. With n_min = 0 in the task the four left endorse U3; with n_min = 5 each
/// refuses it before signing or revealing anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_finishes_below_the_floor() {
    for floor in [0, 5] {
        let mut setup = setup(&format!("floor-{floor}"), 5, true).await;
        let mut peers = setup.peers(5).await;
        let verifier = Arc::new(Verifier::new(setup.authority.public(), None).unwrap());
        let mut task = task(true);
        task.secagg.as_mut().unwrap().min_survivors = floor;
        let model = vec![0.0; PARAMS];
        let dropped = honest::Deviation::Drop(1);
        let ended = honest::round(&mut peers, &task, (&model, 0.7), Some(verifier), dropped).await;
        match (floor, ended) {
            (0, Ok(done)) => assert_eq!(done.result.survivors.len(), 4),
            (5, Err(reason)) => assert!(reason.contains("below the task's n_min = 5"), "{reason}"),
            (_, other) => panic!("n_min {floor}: {other:?}"),
        }
        shut_down(&mut setup, &peers).await;
    }
}
