//! A client that misbehaves (wrong-length update, NaN or infinite values, an update for another
//! round, garbage chunks, an upload that stalls, a bad token) gets a clear gRPC error and is dropped from the round; the
//! round and the server go on with the well-behaved clients.

use crate::support;

use fl_proto::encode_chunks;
use fl_proto::v1::federation_client::FederationClient;
use fl_proto::v1::{ClientMessage, JoinRequest, PartitionRequest, TensorChunk, client_message};
use fl_server::output::RoundMetrics;
use std::sync::Arc;
use std::time::Duration;
use support::Behaviour;
use tonic::Code;

/// The federation of [`support::run_with_evil_client`], unchanged.
async fn run_with_evil_client(evil: Behaviour) -> (tonic::Status, Vec<RoundMetrics>, u64) {
    support::run_with_evil_client(|_| {}, evil).await
}

/// The evil client was dropped from round 1 and the run finished with the two others.
fn assert_round_went_on(metrics: &[RoundMetrics], rounds_completed: u64) {
    assert_eq!(rounds_completed, 2);
    assert_eq!(metrics.len(), 2);
    assert_eq!(
        (metrics[0].sampled, metrics[0].completed, metrics[0].dropped),
        (3, 2, 1)
    );
    assert_eq!((metrics[1].sampled, metrics[1].completed), (2, 2));
    assert!(metrics[1].test_accuracy > Some(0.9), "{metrics:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_length_update_is_refused() {
    let (status, metrics, done) =
        run_with_evil_client(|round, n| support::dense_upload(round, &vec![0.0; n + 1], None))
            .await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("values, the model has"),
        "{status:?}"
    );
    assert_round_went_on(&metrics, done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nan_update_is_refused() {
    let (status, metrics, done) = run_with_evil_client(|round, n| {
        let mut v = vec![0.0; n];
        v[n / 2] = f32::NAN;
        support::dense_upload(round, &v, None)
    })
    .await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("NaN"), "{status:?}");
    assert_round_went_on(&metrics, done);
    // The round counts the refusal, and the next one no longer has the refused client.
    let counts = |m: &RoundMetrics| (m.connected, m.refused);
    assert_eq!((counts(&metrics[0]), counts(&metrics[1])), ((3, 1), (2, 0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infinite_update_is_refused() {
    let (status, metrics, done) = run_with_evil_client(|round, n| {
        let mut v = vec![0.0; n];
        v[0] = f32::NEG_INFINITY;
        support::dense_upload(round, &v, None)
    })
    .await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("inf"), "{status:?}");
    assert_round_went_on(&metrics, done);
}

/// A plain upload whose header claims `examples` for training, or for an evaluation too.
fn upload_claiming(
    round: u64,
    n: usize,
    examples: u64,
    evaluated: bool,
) -> Vec<client_message::Body> {
    let mut bodies = support::dense_upload(round, &vec![0.0; n], None);
    if let client_message::Body::UpdateHeader(h) = &mut bodies[0] {
        h.num_examples = if evaluated { 100 } else { examples };
        h.evaluation = evaluated.then_some(fl_proto::v1::ClientEvaluation {
            loss: 0.5,
            accuracy: 0.5,
            num_examples: examples,
        });
    }
    bodies
}

/// A client claiming u64::MAX examples for its evaluation is refused: the round's federated
/// evaluation counts the two honest clients' examples only (it once wrapped to a small number).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evaluation_of_u64_max_examples_is_refused() {
    let (status, metrics, done) = support::run_with_evil_client(
        |c| c.eval.federated = true,
        |round, n| upload_claiming(round, n, u64::MAX, true),
    )
    .await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("example count"), "{status:?}");
    assert_round_went_on(&metrics, done);
    let eval = metrics[0].federated_eval.expect("round 1 evaluated");
    assert_eq!(eval.clients, 2, "{eval:?}");
    assert!(eval.examples > 0 && eval.examples <= 200, "{eval:?}");
}

/// A client claiming u64::MAX training examples (a FedAvg weight that would drown the others)
/// is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_of_u64_max_examples_is_refused() {
    let (status, metrics, done) =
        run_with_evil_client(|round, n| upload_claiming(round, n, u64::MAX, false)).await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("example count"), "{status:?}");
    assert_round_went_on(&metrics, done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_for_another_round_is_refused() {
    let (status, metrics, done) =
        run_with_evil_client(|round, n| support::dense_upload(round + 1, &vec![0.0; n], None))
            .await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("current round is 1"),
        "{status:?}"
    );
    assert_round_went_on(&metrics, done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_chunk_is_refused() {
    let (status, metrics, done) = run_with_evil_client(|round, n| {
        vec![
            support::update_header(round, n, None),
            client_message::Body::UpdateChunk(TensorChunk {
                round,
                index: 0,
                data: vec![0xAB; 7].into(),
            }),
        ]
    })
    .await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("malformed update"), "{status:?}");
    assert_round_went_on(&metrics, done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunk_without_header_is_refused() {
    let (status, metrics, done) = run_with_evil_client(|round, n| {
        encode_chunks(round, &vec![0.0; n])
            .map(client_message::Body::UpdateChunk)
            .collect()
    })
    .await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("without an UpdateHeader"),
        "{status:?}"
    );
    assert_round_went_on(&metrics, done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_stalls_is_cut_off() {
    let (status, metrics, done) = support::run_with_evil_client(
        |c| {
            c.server.upload_stall_secs = 1.0;
            c.server.reconnect_grace_secs = 0.0;
        },
        // The header announces the update, then nothing follows.
        |round, n| vec![support::update_header(round, n, None)],
    )
    .await;
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("upload stalled"), "{status:?}");
    assert_round_went_on(&metrics, done);
}

/// Every value 1e38: finite, so it passes validation, but 100 of them overflow an f32 sum.
fn huge_update(round: u64, n: usize) -> Vec<client_message::Body> {
    support::dense_upload(round, &vec![1e38; n], None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_finite_update_never_reaches_the_model() {
    let (status, metrics, done) = run_with_evil_client(huge_update).await;
    assert_eq!(status.code(), Code::Ok, "{status:?}");
    assert_eq!(done, 0);
    for m in &metrics {
        assert!(
            !m.applied,
            "round {} released a poisoned aggregate",
            m.round
        );
        assert!(m.test_loss.is_some_and(f64::is_finite), "{m:?}");
        let reason = m.skipped.as_deref().unwrap_or_default();
        assert!(reason.contains("beyond the bound 1e6"), "{m:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_norm_bound_refuses_a_huge_update() {
    let (status, metrics, done) =
        support::run_with_evil_client(|c| c.robust.max_update_norm = Some(100.0), huge_update)
            .await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("exceeds robust.max_update_norm"),
        "{status:?}"
    );
    assert_round_went_on(&metrics, done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trimmed_mean_outvotes_a_huge_update() {
    let (status, metrics, done) = support::run_with_evil_client(
        |c| {
            // m = 3, b = 1: the coordinate-wise median.
            let median = fl_server::config::TrimmedMeanSettings {
                trim_fraction: 0.34,
            };
            c.robust.aggregator = fl_server::config::Aggregator::TrimmedMean(median);
        },
        |round, n| support::dense_upload(round, &vec![1e30; n], None),
    )
    .await;
    assert_eq!(status.code(), Code::Ok, "{status:?}");
    assert_eq!(done, 2);
    for m in &metrics {
        assert_eq!((m.completed, m.skipped.as_deref()), (3, None), "{m:?}");
    }
    assert!(metrics[1].test_accuracy > Some(0.9), "{metrics:?}");
}

/// A server on the hostile-test config changed by `configure`, writing to a fresh temporary
/// folder `name`: (the folder, its endpoint, its task, its stop switch).
async fn evil_server(
    name: &str,
    configure: impl FnOnce(&mut fl_server::config::RunConfig),
) -> (
    std::path::PathBuf,
    String,
    tokio::task::JoinHandle<Result<fl_server::output::Summary, fl_server::ServerError>>,
    tokio::sync::watch::Sender<bool>,
) {
    let out = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let mut c = support::evil_config(&out);
    configure(&mut c);
    let server = support::start_server(c, Arc::new(support::blobs(10)), None, None).await;
    (out, server.endpoint, server.handle, server.stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_cannot_join() {
    let (out, endpoint, server, stop_tx) = evil_server("fl-bad-token", |c| {
        c.server.token = Some(fl_server::credentials::Token::new("s3cret"));
    })
    .await;
    let mut grpc = FederationClient::connect(endpoint).await.unwrap();
    for token in ["", "s3cre", "wrong!"] {
        let err = grpc
            .join(JoinRequest {
                token: token.into(),
                name: "intruder".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
        let err = grpc
            .assign_partition(PartitionRequest {
                token: token.into(),
                count: 1,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
    }
    // With the token, partition indices come out in request order.
    for (count, first) in [(1, 0), (3, 1), (2, 4)] {
        let reply = grpc
            .assign_partition(PartitionRequest {
                token: "s3cret".into(),
                count,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.first, first);
    }
    let ok = grpc
        .join(JoinRequest {
            token: "s3cret".into(),
            name: "member".into(),
        })
        .await;
    assert!(ok.is_ok());
    stop_tx.send(true).unwrap();
    let result = server.await.unwrap();
    assert!(matches!(result, Err(fl_server::ServerError::Interrupted)));
    // The run folder holds the token's digest, never the token.
    let checkpoint = std::fs::read(out.join("checkpoint.safetensors")).unwrap();
    let text = String::from_utf8_lossy(&checkpoint);
    let digest = fl_server::credentials::Digest::of(b"s3cret").to_string();
    assert!(!text.contains("s3cret") && text.contains(&digest));
    std::fs::remove_dir_all(&out).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_beyond_the_rate_are_refused() {
    let (out, endpoint, server, stop_tx) = evil_server("fl-join-rate", |c| {
        c.server.join_rate = 0.1;
        c.server.join_burst = 3;
    })
    .await;
    let mut grpc = FederationClient::connect(endpoint).await.unwrap();
    let mut codes = Vec::new();
    for _ in 0..5 {
        let join = grpc
            .join(JoinRequest {
                token: String::new(),
                name: "eager".into(),
            })
            .await;
        codes.push(join.map_or_else(|e| e.code(), |_| Code::Ok));
    }
    assert_eq!(
        codes,
        [
            Code::Ok,
            Code::Ok,
            Code::Ok,
            Code::ResourceExhausted,
            Code::ResourceExhausted
        ]
    );
    stop_tx.send(true).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    let _ = std::fs::remove_dir_all(&out);
}

/// Client-supplied strings cannot fill the server's log: a 1 MB name in a Join and a 1 MB
/// `TaskFailed` reason are refused with INVALID_ARGUMENT (the caps are 256 and 4096 bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_names_and_reasons_are_refused() {
    let (out, endpoint, server, stop_tx) = evil_server("fl-long-strings", |_| {}).await;
    let long = "x".repeat(1 << 20);
    let err = support::raw_join(&endpoint, &long, "").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        support::raw_join(&endpoint, &"x".repeat(256), "")
            .await
            .is_ok()
    );
    let (_, tx, mut inbound) = support::raw_session(&endpoint, "failing").await;
    let failed = client_message::Body::TaskFailed(fl_proto::v1::TaskFailed {
        round: 1,
        reason: long,
    });
    tx.send(ClientMessage { body: Some(failed) }).await.unwrap();
    let status = loop {
        match tokio::time::timeout(Duration::from_secs(10), inbound.message()).await {
            Ok(Ok(Some(_))) => continue,
            Ok(Err(status)) => break status,
            other => panic!("the stream must end with a status, got {other:?}"),
        }
    };
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    stop_tx.send(true).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    let _ = std::fs::remove_dir_all(&out);
}

/// Bytes that are not the message a method expects are the sender's fault: INVALID_ARGUMENT,
/// never INTERNAL (which would tell operators the server is at fault).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_requests_are_invalid_arguments() {
    use tonic::codec::{Codec, EncodeBuf, Encoder};

    /// Sends raw bytes as the request; reads a `JoinReply`.
    #[derive(Default)]
    struct RawCodec;
    struct RawEncoder;
    impl Encoder for RawEncoder {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
            bytes::BufMut::put_slice(buf, &item);
            Ok(())
        }
    }
    impl Codec for RawCodec {
        type Encode = Vec<u8>;
        type Decode = fl_proto::v1::JoinReply;
        type Encoder = RawEncoder;
        type Decoder = tonic_prost::ProstDecoder<fl_proto::v1::JoinReply>;
        fn encoder(&mut self) -> RawEncoder {
            RawEncoder
        }
        fn decoder(&mut self) -> Self::Decoder {
            tonic_prost::ProstDecoder::default()
        }
    }

    let (out, endpoint, server, stop_tx) = evil_server("fl-undecodable", |_| {}).await;
    let channel = tonic::transport::Endpoint::from_shared(endpoint)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    // Field 1 (the token) announced with 127 bytes, none of which follow.
    for garbage in [vec![0x0a, 0x7f], vec![0xff; 16]] {
        grpc.ready().await.unwrap();
        let path = http::uri::PathAndQuery::from_static("/flp.v1.Federation/Join");
        let status = grpc
            .unary(tonic::Request::new(garbage.clone()), path, RawCodec)
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{garbage:?}: {status:?}"
        );
    }
    stop_tx.send(true).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    let _ = std::fs::remove_dir_all(&out);
}

/// Connections that never send the HTTP/2 preface (silent, or a few bytes of it) are closed
/// within the handshake timeout, and the server still serves a real client afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_within_the_handshake_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (out, endpoint, server, stop_tx) = evil_server("fl-silent", |c| {
        c.server.handshake_timeout_secs = 1.0;
    })
    .await;
    let address = endpoint.trim_start_matches("http://").to_string();
    let mut silent = Vec::new();
    for i in 0..50 {
        let mut tcp = tokio::net::TcpStream::connect(&address).await.unwrap();
        if i % 2 == 1 {
            // The server may already have closed it on a stalled machine: that is the point.
            let _ = tcp.write_all(b"PRI * HTTP/2.0").await;
        }
        silent.push(tcp);
    }
    // Each is closed by the server: a read sees the end of the stream (or a reset).
    for tcp in &mut silent {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut byte)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "a silent connection is still open after 5 s: {read:?}"
        );
    }
    assert!(support::raw_join(&endpoint, "late", "").await.is_ok());
    stop_tx.send(true).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    let _ = std::fs::remove_dir_all(&out);
}

/// A second Session for the same client ends the first with ABORTED and a reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_session_ends_with_a_clear_status() {
    let (out, endpoint, server, stop_tx) = evil_server("fl-superseded", |_| {}).await;
    let joined = support::raw_join(&endpoint, "twice", "").await.unwrap();
    let (_tx1, mut first) = support::raw_hello(&endpoint, &joined).await.unwrap();
    let (_tx2, _second) = support::raw_hello(&endpoint, &joined).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), first.message())
        .await
        .expect("the superseded stream ends");
    let status = ended.expect_err("it ends with a status");
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(status.message().contains("superseded"), "{status:?}");
    stop_tx.send(true).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    let _ = std::fs::remove_dir_all(&out);
}

/// Joins that never open a Session are bounded (beyond `max_idle_clients` Join is refused) and
/// forgotten after `forget_after_secs`, after which joining works again and a forgotten identity
/// is told to join again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_without_sessions_are_bounded_and_forgotten() {
    let (out, endpoint, server, stop_tx) = evil_server("fl-idle-joins", |c| {
        c.server.reconnect_grace_secs = 0.0;
        // Long enough that the six joins below are all made within it, even on a loaded machine.
        c.server.forget_after_secs = 5.0;
        c.server.max_idle_clients = 5;
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(support::raw_join(&endpoint, "idle", "").await.unwrap());
    }
    let refused = support::raw_join(&endpoint, "idle", "").await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("no session open"), "{refused:?}");
    // Forgotten after the grace period (the sweep runs every quarter of it): joining works again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while support::raw_join(&endpoint, "idle", "").await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "idle joins never forgotten"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gone = support::raw_hello(&endpoint, &held[0]).await.unwrap_err();
    assert_eq!(gone.code(), Code::Unauthenticated, "{gone:?}");
    assert!(gone.message().contains("call Join first"), "{gone:?}");
    stop_tx.send(true).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    let _ = std::fs::remove_dir_all(&out);
}
