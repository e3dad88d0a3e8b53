//! The aggregator tier end to end: a coordinator and two aggregators in this process, each
//! aggregator serving its own clients on its own port. The same federation run flat and through
//! the aggregators spends the same ledger, event for event, and trains as well.

use crate::support;

use fl_authority::policy::{FederationPolicy, MinDegree, PolicyMode};
use fl_authority::{Authority, Identity};
use fl_client::{ClientOptions, TrainingSlots};
use fl_datasets::Dataset;
use fl_privacy::Sampling;
use fl_secagg::{Credentials, Verifier};
use fl_server::config::{ModelKind, PrivacyMode, RunConfig};
use fl_server::ledger::LedgerEntry;
use fl_server::output::{GroupOutcome, Summary};
use fl_server::{ServerError, UpstreamOptions};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use support::blobs;
use tokio::sync::watch;
use tokio::task::JoinHandle;

const K: usize = 6;

/// Central DP on K = 6 clients, m = 4, 4 rounds. The noise comes from the OS, so the accuracy
/// varies from run to run: at z = 1 the mean update's noise (z S / m = 0.25 per coordinate)
/// left a tier run at 0.73 once in 15; at z = 0.2 (0.05) 31 runs gave 1.0 flat and tiered.
fn central_config(out: &Path) -> RunConfig {
    let mut c = support::small_config(out, K, 4.0, 4);
    c.server.seed = Some(9);
    c.model.kind = ModelKind::Logistic;
    c.privacy.mode = PrivacyMode::Central;
    c.privacy.sampling = Sampling::Fixed;
    c.privacy.noise_multiplier = 0.2.into();
    c.privacy.clip_bound = 1.0;
    c.privacy.epsilon = 1000.0;
    c.privacy.delta = 1e-5;
    c
}

/// Starts an aggregator named `name` for the coordinator at `upstream` on a free port, checking
/// signed rounds under `authority` if given; returns its endpoint, its task and its stop switch.
async fn start_aggregator(
    upstream: &str,
    name: &str,
    authority: Option<&Path>,
) -> (
    String,
    JoinHandle<Result<(), ServerError>>,
    watch::Sender<bool>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stop_rx) = watch::channel(false);
    let mut config = RunConfig::default();
    config.server.round_timeout_secs = 20.0;
    config.secagg.authority = authority.map(Path::to_owned);
    let options = UpstreamOptions {
        url: upstream.to_owned(),
        name: name.to_owned(),
        token: SECRET.into(),
        ca: None,
    };
    let handle = tokio::spawn(fl_server::aggregate(listener, config, options, stop_rx));
    (format!("http://127.0.0.1:{port}"), handle, stop)
}

/// Honest clients `range` of [`support::client_data`] against `endpoint`.
fn clients(endpoint: &str, data: &Arc<Dataset>, range: std::ops::Range<usize>) {
    let slots = TrainingSlots::new(2);
    for i in range {
        let opts = support::client_options(endpoint, i, &slots);
        tokio::spawn(fl_client::run_client(opts, support::client_data(data, i)));
    }
}

/// Waits (up to 30 s) for a coordinator that never gets its clients to give up, as it must.
async fn gives_up_waiting_for_clients(handle: JoinHandle<Result<Summary, ServerError>>) {
    let ended = tokio::time::timeout(Duration::from_secs(30), handle).await;
    let refused = ended.unwrap().unwrap();
    assert!(
        matches!(refused, Err(ServerError::NotEnoughClients { .. })),
        "{refused:?}"
    );
}

/// The summary of a server that must finish within 120 s.
async fn summary(handle: JoinHandle<Result<Summary, ServerError>>) -> Summary {
    tokio::time::timeout(Duration::from_secs(120), handle)
        .await
        .expect("the coordinator finishes")
        .unwrap()
        .unwrap()
}

/// Waits (up to 30 s) for an aggregator's task to end, without error.
async fn stopped(task: JoinHandle<Result<(), ServerError>>) {
    let ended = tokio::time::timeout(Duration::from_secs(30), task).await;
    ended
        .expect("an aggregator stops when training is over")
        .unwrap()
        .unwrap();
}

/// The privacy events of a run folder's ledger.
fn events(out: &Path) -> Vec<LedgerEntry> {
    let mut entries = fl_server::ledger::read(&out.join("ledger.jsonl")).unwrap();
    for e in &mut entries {
        e.prev.clear();
    }
    entries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_aggregators_spend_the_flat_ledger_and_train_as_well() {
    let base = std::env::temp_dir().join(format!("fl-tier-{}", std::process::id()));
    let data = Arc::new(blobs(600));

    let flat_out = base.join("flat");
    let flat = support::start_server(central_config(&flat_out), data.clone(), None, None).await;
    clients(&flat.endpoint, &data, 0..K);
    let flat_summary = summary(flat.handle).await;

    let tier_out = base.join("tier");
    let mut config = central_config(&tier_out);
    config.server.aggregators = 2;
    config.server.aggregator_token = Some(fl_server::credentials::Token::new(SECRET));
    let coordinator = support::start_server(config, data.clone(), None, None).await;
    let (a, a_task, _a_stop) = start_aggregator(&coordinator.endpoint, "agg-a", None).await;
    let (b, b_task, _b_stop) = start_aggregator(&coordinator.endpoint, "agg-b", None).await;
    clients(&a, &data, 0..3);
    clients(&b, &data, 3..K);
    let tier_summary = summary(coordinator.handle).await;
    for task in [a_task, b_task] {
        stopped(task).await;
    }

    assert_eq!(tier_summary.rounds_completed, 4);
    assert_eq!(flat_summary.rounds_completed, 4);
    assert_eq!(events(&tier_out), events(&flat_out));
    // Every sampled client's update went through its aggregator: 4 rounds of m = 4.
    assert_eq!(tier_summary.client_updates, 16);
    let (flat_acc, tier_acc) = (
        flat_summary.test_accuracy.unwrap(),
        tier_summary.test_accuracy.unwrap(),
    );
    assert!(
        tier_acc > 0.9 && flat_acc > 0.9,
        "flat {flat_acc}, tier {tier_acc}"
    );
    // Each metrics line says what each aggregator did in the round.
    for line in support::read_metrics(&tier_out) {
        let names: Vec<&str> = line.groups.iter().map(|g| g.aggregator.as_str()).collect();
        let summed: usize = line.groups.iter().map(|g| g.completed).sum();
        assert_eq!(summed, line.completed, "{line:?}");
        assert!(
            names.iter().all(|n| ["agg-a", "agg-b"].contains(n)),
            "{names:?}"
        );
        assert!(
            line.groups
                .iter()
                .all(|g| g.outcome == GroupOutcome::Summed)
        );
        assert!(line.groups.iter().all(|g| g.seconds.is_some()));
    }
    std::fs::remove_dir_all(&base).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregator_with_the_wrong_token_and_a_direct_client_are_refused() {
    let base = std::env::temp_dir().join(format!("fl-tier-token-{}", std::process::id()));
    let mut config = central_config(&base);
    config.server.aggregators = 1;
    config.server.aggregator_token = Some(fl_server::credentials::Token::new("the-right-one"));
    config.server.join_timeout_secs = 3.0;
    let data = Arc::new(blobs(600));
    let coordinator = support::start_server(config, data.clone(), None, None).await;
    let (_, task, stop) = start_aggregator(&coordinator.endpoint, "agg-a", None).await;
    // A client that connects to the coordinator itself is told where to go.
    let opts = support::client_options(&coordinator.endpoint, 0, &TrainingSlots::new(1));
    let direct = fl_client::run_client(opts, support::client_data(&data, 0)).await;
    let refusal = direct.map(|_| ()).unwrap_err().to_string();
    assert!(refusal.contains("coordinates aggregators"), "{refusal}");
    gives_up_waiting_for_clients(coordinator.handle).await;
    stop.send(true).unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(stopped, Err(ServerError::Interrupted)),
        "{stopped:?}"
    );
    let _ = std::fs::remove_dir_all(&base);
}

/// The signed federation of [`signed_secure_groups_sum_their_survivors_and_the_ledger_charges_the_smallest_group`]:
/// its authority, the public key's file and the policy (a group of 4, at least 3 of them
/// surviving each stage, meets it).
fn signed_federation(dir: &Path) -> (Authority, std::path::PathBuf, FederationPolicy) {
    std::fs::create_dir_all(dir).unwrap();
    let authority = Authority::generate().unwrap();
    let public = dir.join("authority.pub");
    let hex = format!("{}\n", hex::encode(authority.public().to_bytes()));
    std::fs::write(&public, hex).unwrap();
    let policy = FederationPolicy {
        federation: "tier".into(),
        serial: 1,
        modes: [PolicyMode::SecAgg].into(),
        min_clients: 3,
        min_degree: MinDegree::AtLeast(3),
        min_threshold: 0.7,
        min_noise_multiplier: 0.0,
        max_release_epsilon: 4.0,
        max_total_epsilon: 40.0,
        max_delta: 1e-5,
        max_model_magnitude: 1e4,
    };
    (authority, public, policy)
}

/// Signed secure aggregation with distributed noise through two aggregators of four certified
/// clients each, under a policy every client checks against its group: every group runs its own
/// signed round, and the coordinator, which sees each group's sum, charges each round for the
/// fewest survivors of the smallest group, never settled lower.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signed_secure_groups_sum_their_survivors_and_the_ledger_charges_the_smallest_group() {
    use fl_privacy::PrivacyEvent;
    let base = std::env::temp_dir().join(format!("fl-tier-secure-{}", std::process::id()));
    let (authority, public, policy) = signed_federation(&base.join("authority"));
    let policy_file = base.join("authority/policy.toml");
    let signed = authority.sign_policy(policy.clone()).unwrap();
    std::fs::write(&policy_file, signed.to_toml()).unwrap();
    let run = base.join("run");
    let data = Arc::new(blobs(800));
    let mut config = support::small_config(&run, 8, 8.0, 3);
    config.server.seed = Some(4);
    config.model.kind = ModelKind::Logistic;
    config.privacy.mode = PrivacyMode::SecAgg;
    config.privacy.sampling = Sampling::Fixed;
    config.privacy.noise_multiplier = 0.3.into();
    config.privacy.epsilon = 1000.0;
    config.privacy.delta = 1e-5;
    config.secagg.noise = fl_server::config::SecAggNoise::Distributed;
    config.secagg.authority = Some(public.clone());
    config.secagg.policy = Some(policy_file);
    config.secagg.threshold = 0.7;
    config.secagg.stage_timeout_secs = 20.0;
    config.server.aggregators = 2;
    config.server.aggregator_token = Some(fl_server::credentials::Token::new(SECRET));
    // The policy holds for each group: half of a group of 4 is below its min_clients.
    config.secagg.min_survivors = 0.5;
    let refused = config.validate_for_server().unwrap_err().to_string();
    assert!(refused.contains("min_clients is 3"), "{refused}");
    config.secagg.min_survivors = 0.75;
    config.validate_for_server().unwrap();
    let coordinator = support::start_server(config, data.clone(), None, None).await;
    let (a, a_task, _a_stop) =
        start_aggregator(&coordinator.endpoint, "agg-a", Some(&public)).await;
    let (b, b_task, _b_stop) =
        start_aggregator(&coordinator.endpoint, "agg-b", Some(&public)).await;
    let verifier = Verifier::new(authority.public(), None).unwrap();
    let (slots, policy) = (TrainingSlots::new(2), Arc::new(policy));
    for i in 0..8 {
        let endpoint = if i < 4 { &a } else { &b };
        let identity = Identity::generate().unwrap();
        let certificate = authority.certify(&format!("site-{i}"), &identity.public());
        let credentials = Credentials::new(identity, certificate.unwrap(), verifier.clone());
        let opts = ClientOptions {
            credentials: Some(Arc::new(credentials.unwrap())),
            policy: Some(policy.clone()),
            state: Some(base.join(format!("client-{i}"))),
            ..support::client_options(endpoint, i, &slots)
        };
        tokio::spawn(fl_client::run_client(opts, support::client_data(&data, i)));
    }
    let summary = summary(coordinator.handle).await;
    for task in [a_task, b_task] {
        stopped(task).await;
    }

    assert_eq!(summary.rounds_completed, 3);
    assert_eq!(summary.secagg.as_ref().map(|s| s.signed), Some(true));
    let accuracy = summary.test_accuracy.unwrap();
    assert!(accuracy > 0.8, "{accuracy}");
    for line in support::read_metrics(&run) {
        let secagg = line.secagg.as_ref().expect("a secure round");
        assert_eq!((secagg.survivors, &secagg.aborted), (8, &None), "{line:?}");
        let groups = &line.groups;
        assert_eq!(groups.len(), 2, "{line:?}");
        let summed = |g: &fl_server::output::GroupMetrics| {
            g.outcome == GroupOutcome::Summed && g.completed == 4
        };
        assert!(groups.iter().all(summed), "{line:?}");
    }
    // n_min = ceil(0.75 * 4) = 3 for a group of 4, where one server with all 8 would charge
    // ceil(0.75 * 8) = 6; and no settlement, as the aggregators count the survivors.
    let charged: Vec<(u64, u64)> = (events(&run).iter())
        .map(|e| match &e.event {
            PrivacyEvent::DistributedDiscreteGaussian(d) => (e.round, d.clients),
            other => panic!("round {}: {other:?}", e.round),
        })
        .collect();
    assert_eq!(charged, vec![(1, 3), (2, 3), (3, 3)]);
    std::fs::remove_dir_all(&base).unwrap();
}

/// What a scripted aggregator lies about in its round-1 sum (the round's S is 1, and each
/// group has 3 clients sampled).
#[derive(Debug, Clone, Copy)]
enum Lie {
    /// A sum labelled clipped to S = 100.
    Clip,
    /// Three contributors and a sum of norm sqrt(d) (every value 1): 3 S at most could come.
    Oversized,
    /// Ten contributors (weight 10) for three sampled clients, a small sum.
    Inflated,
}

/// A scripted aggregator on the coordinator's `Tier` service: it reports three clients, answers
/// round 1 with a sum that lies as `lie` says, and never answers round 2.
async fn misbehaving_aggregator(endpoint: String, lie: Lie) {
    use fl_proto::v1::tier_client::TierClient;
    use fl_proto::v1::{
        AggregatorHello, AggregatorMessage, GroupResult, Population, aggregator_message::Body,
        coordinator_message,
    };
    let message = |body| AggregatorMessage { body: Some(body) };
    let mut tier = TierClient::connect(endpoint).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let hello = AggregatorHello {
        name: "agg-evil".into(),
        token: SECRET.into(),
    };
    tx.send(message(Body::Hello(hello))).await.unwrap();
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut incoming = tier.aggregate(stream).await.unwrap().into_inner();
    let population = Population {
        clients: vec![1, 2, 3],
    };
    tx.send(message(Body::Population(population)))
        .await
        .unwrap();
    while let Ok(Some(next)) = incoming.message().await {
        let Some(coordinator_message::Body::Task(task)) = next.body else {
            continue;
        };
        let round = task.task.as_ref().unwrap().round;
        let n = task.task.as_ref().unwrap().num_values as usize;
        if round != 1 {
            continue;
        }
        let (clip_bound, contributors, value) = match lie {
            Lie::Clip => (100.0, 3, 50.0),
            Lie::Oversized => (1.0, 3, 1.0),
            Lie::Inflated => (1.0, 10, 1e-4),
        };
        let result = GroupResult {
            round,
            contributors,
            weight: contributors as f64,
            num_values: n as u64,
            num_chunks: fl_proto::chunk_count(n),
            clip_bound,
            ..GroupResult::default()
        };
        tx.send(message(Body::Result(result))).await.unwrap();
        for chunk in fl_proto::encode_chunks(round, &vec![value; n]) {
            tx.send(message(Body::SumChunk(chunk))).await.unwrap();
        }
    }
}

/// One aggregator lies as `lie` says in round 1 and then goes silent: its group is refused in
/// round 1 and timed out in round 2, and each round completes with the honest group's three
/// results and is charged once.
async fn a_lying_then_silent_aggregator(lie: Lie) {
    let base = std::env::temp_dir().join(format!("fl-tier-{lie:?}-{}", std::process::id()));
    let data = Arc::new(blobs(600));
    let mut config = central_config(&base);
    config.server.rounds = 2;
    config.server.clients_per_round = 6.0.into();
    config.server.round_timeout_secs = 4.0;
    config.server.aggregators = 2;
    config.server.aggregator_token = Some(fl_server::credentials::Token::new(SECRET));
    let coordinator = support::start_server(config, data.clone(), None, None).await;
    tokio::spawn(misbehaving_aggregator(coordinator.endpoint.clone(), lie));
    let (b, b_task, _b_stop) = start_aggregator(&coordinator.endpoint, "agg-b", None).await;
    clients(&b, &data, 3..K);
    let summary = summary(coordinator.handle).await;
    stopped(b_task).await;

    assert_eq!(summary.rounds_completed, 2);
    let lines = support::read_metrics(&base);
    let outcome = |line: &fl_server::output::RoundMetrics, name: &str| {
        let group = line.groups.iter().find(|g| g.aggregator == name).unwrap();
        (group.outcome, group.completed)
    };
    assert_eq!(
        outcome(&lines[0], "agg-evil"),
        (GroupOutcome::Refused, 0),
        "{lie:?}"
    );
    assert_eq!(outcome(&lines[1], "agg-evil"), (GroupOutcome::TimedOut, 0));
    for line in &lines {
        assert_eq!(
            outcome(line, "agg-b"),
            (GroupOutcome::Summed, 3),
            "{line:?}"
        );
        assert_eq!((line.sampled, line.completed), (6, 3), "{line:?}");
        assert!(line.applied, "{line:?}");
    }
    let rounds: Vec<u64> = events(&base).iter().map(|e| e.round).collect();
    assert_eq!(rounds, vec![1, 2]);
    std::fs::remove_dir_all(&base).unwrap();
}

/// A sum clipped to another bound than the round's is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lying_then_silent_aggregator_costs_its_group_only() {
    a_lying_then_silent_aggregator(Lie::Clip).await;
}

/// A sum of norm sqrt(d) from three clients clipped to S = 1 is refused: it would have set the
/// next model for every group.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malicious_aggregator_sends_an_oversized_sum() {
    a_lying_then_silent_aggregator(Lie::Oversized).await;
}

/// Ten contributors claimed for a group of three sampled clients are refused: an inflated count
/// would satisfy the release's minimum.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malicious_aggregator_inflates_its_count() {
    a_lying_then_silent_aggregator(Lie::Inflated).await;
}

/// Opens an Aggregate stream to `endpoint` as `name` presenting `token`: its incoming half
/// once the coordinator welcomed it (and the outgoing half, which keeps it open), or the
/// refusal.
async fn open_as(
    endpoint: &str,
    (name, token): (&str, &str),
) -> Result<
    (
        tonic::Streaming<fl_proto::v1::CoordinatorMessage>,
        tokio::sync::mpsc::Sender<fl_proto::v1::AggregatorMessage>,
    ),
    tonic::Status,
> {
    use fl_proto::v1::tier_client::TierClient;
    use fl_proto::v1::{AggregatorHello, AggregatorMessage, aggregator_message::Body};
    let mut tier = TierClient::connect(endpoint.to_owned()).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let hello = AggregatorHello {
        name: name.into(),
        token: token.into(),
    };
    let opening = AggregatorMessage {
        body: Some(Body::Hello(hello)),
    };
    tx.send(opening).await.unwrap();
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut incoming = tier.aggregate(stream).await?.into_inner();
    let welcome = incoming.message().await?.and_then(|m| m.body);
    assert!(
        matches!(
            welcome,
            Some(fl_proto::v1::coordinator_message::Body::Welcome(_))
        ),
        "{welcome:?}"
    );
    Ok((incoming, tx))
}

/// The shared token of the tier tests' coordinators.
const SECRET: &str = "aggregator-secret";

/// A coordinator of two aggregators: a second stream under a connected aggregator's name (with
/// the right token) is refused, so it cannot take over that group, and so is a third
/// aggregator; once the first stream has ended, its name is admitted again (a restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_aggregator_takes_over_a_live_name() {
    let base = std::env::temp_dir().join(format!("fl-tier-takeover-{}", std::process::id()));
    let mut config = central_config(&base);
    config.server.aggregators = 2;
    config.server.aggregator_token = Some(fl_server::credentials::Token::new(SECRET));
    config.server.join_timeout_secs = 5.0;
    let data = Arc::new(blobs(600));
    let coordinator = support::start_server(config, data, None, None).await;
    let endpoint = coordinator.endpoint.clone();
    let first = open_as(&endpoint, ("agg-x", SECRET)).await.unwrap();
    let taken = open_as(&endpoint, ("agg-x", SECRET))
        .await
        .map(drop)
        .unwrap_err();
    assert_eq!(taken.code(), tonic::Code::AlreadyExists, "{taken:?}");
    assert!(taken.message().contains("connected already"), "{taken:?}");
    let _second = open_as(&endpoint, ("agg-y", SECRET)).await.unwrap();
    let third = open_as(&endpoint, ("agg-z", SECRET))
        .await
        .map(drop)
        .unwrap_err();
    assert!(
        third.message().contains("as many as server.aggregators"),
        "{third:?}"
    );
    drop(first);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while open_as(&endpoint, ("agg-x", SECRET)).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "agg-x never admitted again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gives_up_waiting_for_clients(coordinator.handle).await;
    let _ = std::fs::remove_dir_all(&base);
}

/// Under an aggregators' enrollment each token admits its own name only: agg-b's token does not
/// admit agg-a, nor a name nobody enrolled, and the shared token of the other tests admits none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_aggregator_presents_another_names_token() {
    use fl_server::credentials::{Digest, EnrollmentList};
    let base = std::env::temp_dir().join(format!("fl-tier-enrolled-{}", std::process::id()));
    std::fs::create_dir_all(&base).unwrap();
    let mut list = EnrollmentList::default();
    for (name, token) in [("agg-a", "token-of-agg-a"), ("agg-b", "token-of-agg-b")] {
        list.enroll(name, Some(Digest::of(token.as_bytes())), None)
            .unwrap();
    }
    let file = base.join("aggregators.toml");
    std::fs::write(&file, list.to_toml()).unwrap();
    let mut config = central_config(&base.join("run"));
    config.server.aggregators = 2;
    config.server.aggregator_enrollment = Some(file);
    config.server.join_timeout_secs = 5.0;
    let coordinator = support::start_server(config, Arc::new(blobs(600)), None, None).await;
    let endpoint = coordinator.endpoint.clone();
    for refused in [
        ("agg-a", "token-of-agg-b"),
        ("agg-c", "token-of-agg-b"),
        ("agg-a", SECRET),
    ] {
        let status = open_as(&endpoint, refused).await.map(drop).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{refused:?}");
    }
    let _a = open_as(&endpoint, ("agg-a", "token-of-agg-a"))
        .await
        .unwrap();
    let _b = open_as(&endpoint, ("agg-b", "token-of-agg-b"))
        .await
        .unwrap();
    gives_up_waiting_for_clients(coordinator.handle).await;
    let _ = std::fs::remove_dir_all(&base);
}
