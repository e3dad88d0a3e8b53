//! The seams a server written from the protocol's documentation alone found, each closed by
//! what a client enforces: the federation policy its authority signed, the attempt it signs
//! once, and no data-dependent signal outside a release. Where the attack has a form without
//! the protection, the test shows it succeeding there first.

use crate::honest;
use crate::scripted::*;
use fl_proto::v1::{LocalPrivacy, RoundTask, client_message};
use fl_secagg::{GraphKind, SealedShares, ServerStage, StageMessage, Verifier};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The federation id of the policy, or none.
fn federation(with_policy: bool) -> &'static str {
    if with_policy { "hospitals" } else { "" }
}

/// The server admits the victim with only two clients of its own: U1 = {v, c1, c2}, k = 2,
/// t = 2 (which t > 2k/3 allows). Without a policy the victim shares both secrets with the two
/// compromised clients, which open them: t of each is the server's. Under a policy of at least
/// 4 clients the victim refuses before sharing, naming the rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_admits_the_victim_with_too_few_clients() {
    for with_policy in [false, true] {
        let fleet = Fleet {
            signed: true,
            policy: with_policy.then(policy),
        };
        let mut setup = setup_fleet(&format!("small-{with_policy}"), 1, fleet).await;
        let mut peers = setup.peers(1).await;
        let task = task_in(true, federation(with_policy), 1);
        let model = vec![0.0; PARAMS];
        let tag = tag_of(&task, &model);
        let mut adverts = keys_of(&mut peers, &task, |_| model.clone()).await;
        let victim = adverts[0].client;
        let mut sybils = BTreeMap::new();
        for id in [100, 101] {
            let [twin, _] = setup.sybil(&format!("sybil-{id}"), tag, id, true);
            adverts.push(twin.advertise());
            sybils.insert(id, twin);
        }
        let mut hoods = honest_hoods(&tag, &adverts, GraphKind::Complete, 2);
        let peer = peers.get_mut(&victim).unwrap();
        send_stage(
            peer,
            &ServerStage::Neighbours(hoods.remove(&victim).unwrap()),
        )
        .await;
        match (with_policy, answer(peer).await) {
            (false, Answer::Stage(StageMessage::Shares(sealed))) => {
                // Both holders are the server's, and both open what they were sealed.
                let mut rng = StdRng::seed_from_u64(3);
                for (id, sybil) in sybils.iter_mut() {
                    let hood = hoods.remove(id).unwrap();
                    sybil.share_keys(hood, &mut rng).unwrap();
                    let mine: Vec<SealedShares> =
                        sealed.iter().filter(|s| s.to == *id).cloned().collect();
                    assert_eq!(mine.len(), 1);
                    assert_eq!(sybil.check_shares(&mine).unwrap(), Vec::<u64>::new());
                }
            }
            (true, Answer::Failed(reason)) => {
                assert!(reason.contains("at least 4 clients"), "{reason}")
            }
            (_, other) => panic!("policy {with_policy}: {other:?}"),
        }
        shut_down(&mut setup, &peers).await;
    }
}

/// A finished round sent again (same run, same round) is refused by every client; and in a new
/// attempt (another run id) the first attempt's survivor-set signatures do not verify, since
/// they bind that attempt's key transcript: no compromised client is needed for either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_reruns_a_finished_round() {
    let fleet = Fleet {
        signed: true,
        policy: Some(policy()),
    };
    let mut setup = setup_fleet("rerun", 4, fleet).await;
    let mut peers = setup.peers(4).await;
    let verifier = Arc::new(Verifier::new(setup.authority.public(), None).unwrap());
    let model = vec![0.0; PARAMS];
    let mut task = task_in(true, "hospitals", 1);
    let noise = task.secagg.as_ref().unwrap();
    let floor = policy().min_noise_variance(noise.clip_bound, noise.scale);
    task.secagg.as_mut().unwrap().noise_variance = floor;
    let first = honest::round(
        &mut peers,
        &task,
        (&model, 0.7),
        Some(verifier.clone()),
        honest::Deviation::None,
    )
    .await
    .unwrap();
    assert_eq!(first.result.survivors.len(), 4);
    for peer in peers.values() {
        send_task(peer, &task, &model).await;
    }
    for (u, peer) in peers.iter_mut() {
        match answer(peer).await {
            Answer::Failed(reason) => assert!(reason.contains("already took part"), "{reason}"),
            other => panic!("client {u} took part again: {other:?}"),
        }
    }
    let again = task_in(true, "hospitals", 2);
    let mut again = RoundTask {
        secagg: again.secagg,
        ..task.clone()
    };
    again.secagg.as_mut().unwrap().noise_variance = floor;
    let replayed = honest::round(
        &mut peers,
        &again,
        (&model, 0.7),
        Some(verifier),
        honest::Deviation::Replay(&first.endorsements),
    )
    .await
    .unwrap_err();
    assert!(replayed.contains("does not verify"), "{replayed}");
    shut_down(&mut setup, &peers).await;
}

/// The server asks for no distributed noise. Without a policy the clients add none, and the
/// unmasked sum of updates that are zero (a learning rate of 1e-30) is exactly zero. Under a
/// policy with z = 4 each of the 4 clients adds variance (4 S gamma)^2 = 1.6 10^7 levels
/// whatever the task says: the sum's 15 values have standard deviation 8000, and their root mean
/// square is above 400 except with probability P(chi^2_15 < 0.0375), below 1e-15.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_removes_the_distributed_noise() {
    for with_policy in [false, true] {
        let fleet = Fleet {
            signed: true,
            policy: with_policy.then(policy),
        };
        let mut setup = setup_fleet(&format!("noise-{with_policy}"), 4, fleet).await;
        let mut peers = setup.peers(4).await;
        let verifier = Arc::new(Verifier::new(setup.authority.public(), None).unwrap());
        let mut task = task_in(true, federation(with_policy), 1);
        task.config.as_mut().unwrap().learning_rate = 1e-30;
        let model = vec![0.0; PARAMS];
        let honest = honest::round(
            &mut peers,
            &task,
            (&model, 0.7),
            Some(verifier),
            honest::Deviation::None,
        )
        .await
        .unwrap();
        let signed: Vec<f64> = (honest.result.sum.iter())
            .map(|&v| ring().to_signed(v) as f64)
            .collect();
        let rms = (signed.iter().map(|v| v * v).sum::<f64>() / signed.len() as f64).sqrt();
        match with_policy {
            false => assert_eq!(rms, 0.0, "{signed:?}"),
            true => assert!(rms > 400.0, "{signed:?}"),
        }
        shut_down(&mut setup, &peers).await;
    }
}

/// The release header's epsilon, or the refusal.
async fn release_epsilon(peer: &mut Peer) -> Result<f64, String> {
    match next(peer).await.expect("an answer") {
        client_message::Body::ReleaseHeader(h) => {
            for _ in 0..h.num_chunks {
                next(peer).await.expect("a chunk");
            }
            Ok(h.release.unwrap().epsilon)
        }
        client_message::Body::TaskFailed(f) => Err(f.reason),
        other => panic!("unexpected {other:?}"),
    }
}

/// A task under `ldp-gaussian` at `epsilon`, round `round`.
fn gaussian_task(round: u64, epsilon: f64) -> RoundTask {
    RoundTask {
        round,
        secagg: None,
        local_privacy: Some(LocalPrivacy {
            mechanism: "ldp-gaussian".into(),
            parameters: [
                ("epsilon".into(), epsilon),
                ("delta".into(), 1e-5),
                ("clip_bound".into(), 1.0),
            ]
            .into(),
        }),
        ..task(false)
    }
}

/// A task under `ldp-laplace` at `epsilon`, round `round`.
fn laplace_task(round: u64, epsilon: f64) -> RoundTask {
    RoundTask {
        round,
        secagg: None,
        local_privacy: Some(LocalPrivacy {
            mechanism: "ldp-laplace".into(),
            parameters: [
                ("epsilon".into(), epsilon),
                ("clip_bound".into(), 1.0),
                ("steps".into(), 1.0),
            ]
            .into(),
        }),
        ..task(false)
    }
}

/// The task asks for epsilon 50 per release. A client without flags or policy releases at 50;
/// under a policy whose largest release is 4 it releases at 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_asks_for_a_larger_epsilon() {
    for with_policy in [false, true] {
        let fleet = Fleet {
            signed: true,
            policy: with_policy.then(policy),
        };
        let mut setup = setup_fleet(&format!("epsilon-{with_policy}"), 1, fleet).await;
        let mut peers = setup.peers(1).await;
        let peer = peers.values_mut().next().unwrap();
        send_task(peer, &gaussian_task(1, 50.0), &[0.0; PARAMS]).await;
        let epsilon = release_epsilon(peer).await.unwrap();
        assert_eq!(epsilon, if with_policy { 4.0 } else { 50.0 });
        shut_down(&mut setup, &peers).await;
    }
}

/// A crafted model: one weight near 3e38, which makes training overflow for some examples
/// only; then a model within bounds with a learning rate of 1e30, which makes every client's
/// training diverge. Two clients with different data answer each alike: a refusal with the
/// same reason before training, then a release (the zero update through the mechanism), never
/// a message that depends on their examples.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_sends_a_crafted_model() {
    let mut setup = setup_fleet("crafted", 2, Fleet::default()).await;
    let mut peers = setup.peers(2).await;
    let mut crafted = vec![0.0; PARAMS];
    crafted[1] = 3e38;
    for peer in peers.values() {
        send_task(peer, &gaussian_task(1, 2.0), &crafted).await;
    }
    let mut reasons = Vec::new();
    for peer in peers.values_mut() {
        reasons.push(release_epsilon(peer).await.unwrap_err());
    }
    assert_eq!(reasons[0], reasons[1]);
    assert!(
        reasons[0].contains("refused before training"),
        "{reasons:?}"
    );
    let mut diverging = gaussian_task(2, 2.0);
    diverging.config.as_mut().unwrap().learning_rate = 1e30;
    for peer in peers.values() {
        send_task(peer, &diverging, &[1.0; PARAMS]).await;
    }
    for peer in peers.values_mut() {
        assert_eq!(release_epsilon(peer).await, Ok(2.0));
    }
    shut_down(&mut setup, &peers).await;
}

/// The total cap holds across a restart: two Laplace releases at epsilon 4 (8 of the policy's
/// 10), then the client is killed and started again; the third release (12) is refused. Without
/// a cap the restarted client releases again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_outspends_a_restarted_client() {
    for with_policy in [false, true] {
        let fleet = Fleet {
            signed: true,
            policy: with_policy.then(policy),
        };
        let mut setup = setup_fleet(&format!("spend-{with_policy}"), 1, fleet).await;
        let mut peers = setup.peers(1).await;
        for round in 1..=2 {
            let peer = peers.values_mut().next().unwrap();
            send_task(peer, &laplace_task(round, 4.0), &[0.0; PARAMS]).await;
            assert_eq!(release_epsilon(peer).await, Ok(4.0));
        }
        setup.restart(0);
        let mut peers = setup.peers(1).await;
        let peer = peers.values_mut().next().unwrap();
        send_task(peer, &laplace_task(3, 4.0), &[0.0; PARAMS]).await;
        match (with_policy, release_epsilon(peer).await) {
            (false, Ok(epsilon)) => assert_eq!(epsilon, 4.0),
            (true, Err(reason)) => assert!(reason.contains("budget is spent"), "{reason}"),
            (_, other) => panic!("policy {with_policy}: {other:?}"),
        }
        shut_down(&mut setup, &peers).await;
    }
}
