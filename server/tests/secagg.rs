//! Secure aggregation against a hostile client over real gRPC streams. The hostile client runs
//! the real protocol (`fl_secagg::ClientRound`) and breaks it at one stage: bad key bytes,
//! a low-order or non-canonical key, shares that do not open, a replayed or stale stage message, a plain update, a share for a peer that is not its
//! neighbour, a masked input of the wrong length or sent too early, a forged share, or a second
//! answer to the unmasking stage. Each time it gets a clear gRPC error, and the round's unmasked
//! sum still equals the plain sum of the survivors' inputs exactly.

use crate::support;

use fl_proto::v1::{
    ClientMessage, MaskedInputHeader, RevealedShare, SealedShare, SecAggCheck, SecAggKeys,
    SecAggReveal, SecAggShares, client_message, server_message,
};
use fl_proto::{chunk_count, encode_word_chunks, ring_words};
use fl_secagg::{ClientRound, PlainInputs, Proceed, Ring, SealedShares};
use fl_server::config::PrivacyMode;
use fl_server::output::RoundMetrics;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use support::blobs;
use tonic::Code;

/// How the hostile client breaks the protocol in round 1.
#[derive(Clone, Copy, Debug)]
enum Deviation {
    ShortKey,
    LowOrderCipherKey,
    ZeroMaskKey,
    NonCanonicalKey,
    GarbageShares,
    StaleRound,
    KeysTwice,
    PlainUpdate,
    EarlyMaskedInput,
    ShareForStranger,
    MaskedWrongLength,
    ForgedShare,
    RevealTwice,
}

/// A point of order 8 on Curve25519 (little-endian u-coordinate, as libsodium lists it).
const ORDER_8: [u8; 32] = [
    0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae, 0x16, 0x56, 0xe3, 0xfa, 0xf1, 0x9f, 0xc4, 0x6a,
    0xda, 0x09, 0x8d, 0xeb, 0x9c, 0x32, 0xb1, 0xfd, 0x86, 0x62, 0x05, 0x16, 0x5f, 0x49, 0xb8, 0x00,
];

fn body(b: client_message::Body) -> ClientMessage {
    ClientMessage { body: Some(b) }
}

fn masked(round: u64, ring: Ring, y: &[u64]) -> Vec<client_message::Body> {
    let words = ring_words(ring, y);
    let mut out = vec![client_message::Body::MaskedInputHeader(MaskedInputHeader {
        round,
        num_words: words.len() as u64,
        num_chunks: chunk_count(words.len()),
    })];
    out.extend(encode_word_chunks(round, &words).map(client_message::Body::UpdateChunk));
    out
}

/// Runs 3 honest clients and one that deviates as `how`; returns the status the hostile client
/// got (OK when training ended without an error for it) and the run's metrics.
async fn run(how: Deviation) -> (tonic::Status, Vec<RoundMetrics>) {
    let out = std::env::temp_dir().join(format!("fl-secagg-{}-{how:?}", std::process::id()));
    let mut c = support::evil_config(&out);
    c.server.clients = 4;
    c.server.clients_per_round = 4.0.into();
    c.privacy.mode = PrivacyMode::SecAgg;
    c.privacy.clip_bound = 10.0;
    c.secagg.stage_timeout_secs = 20.0;
    let data = Arc::new(blobs(400));
    let oracle = Arc::new(PlainInputs::default());
    let support::TestServer {
        endpoint,
        handle: server,
        stop: _stop_tx,
        ..
    } = support::start_server(c, data.clone(), None, Some(oracle.clone())).await;
    let good = support::spawn_clients(&endpoint, &data, 3, Some(oracle.clone()));

    let (me, tx, mut inbound) = support::raw_session(&endpoint, "hostile").await;
    let mut rng = StdRng::seed_from_u64(9);
    let ring = Ring::new(32).unwrap();
    let mut protocol: Option<(u64, usize, ClientRound)> = None;
    let status = loop {
        let m = match inbound.message().await {
            Ok(Some(m)) => m,
            Ok(None) => break tonic::Status::new(Code::Ok, "the stream ended without an error"),
            Err(status) => break status,
        };
        if let Some(server_message::Body::Shutdown(_)) = m.body {
            break tonic::Status::new(Code::Ok, "training finished without an error");
        }
        let mut send = Vec::new();
        match m.body {
            Some(server_message::Body::Task(t)) => {
                let round = t.round;
                let n = t.num_values as usize;
                let tag = support::secure_tag(&mut inbound, &t).await;
                let p = ClientRound::new((tag, me), ring, None, &mut rng);
                let keys = p.advertise();
                let mut advert = SecAggKeys {
                    round,
                    cipher_public: keys.cipher_public.to_vec(),
                    mask_public: keys.mask_public.to_vec(),
                    signed: None,
                };
                match how {
                    Deviation::ShortKey => advert.cipher_public.pop().map(|_| ()).unwrap(),
                    Deviation::StaleRound => advert.round = round + 7,
                    Deviation::LowOrderCipherKey => advert.cipher_public = ORDER_8.to_vec(),
                    Deviation::ZeroMaskKey => advert.mask_public = vec![0; 32],
                    Deviation::NonCanonicalKey => advert.mask_public[31] |= 0x80,
                    _ => {}
                }
                match how {
                    Deviation::PlainUpdate => {
                        send.extend(support::dense_upload(round, &vec![0.0; n], None))
                    }
                    Deviation::EarlyMaskedInput => send.extend(masked(round, ring, &vec![0; n])),
                    Deviation::KeysTwice => {
                        send.push(client_message::Body::SecaggKeys(advert.clone()));
                        send.push(client_message::Body::SecaggKeys(advert));
                    }
                    _ => send.push(client_message::Body::SecaggKeys(advert)),
                }
                protocol = Some((round, n, p));
            }
            Some(server_message::Body::SecaggNeighbours(hood)) => {
                let (round, _, p) = protocol.as_mut().unwrap();
                let hood = fl_secagg::Neighbourhood {
                    threshold: hood.threshold as usize,
                    members: (hood.members.iter())
                        .map(|m| fl_secagg::Member {
                            id: m.client_id,
                            name: m.name.clone(),
                            keys: m.keys.as_slice().try_into().unwrap(),
                        })
                        .collect(),
                    neighbours: hood
                        .neighbours
                        .iter()
                        .map(|k| k.try_into().unwrap())
                        .collect(),
                };
                let mut shares: Vec<SealedShare> = p
                    .share_keys(hood, &mut rng)
                    .unwrap()
                    .iter()
                    .map(SealedShare::from)
                    .collect();
                if let Deviation::ShareForStranger = how {
                    shares[0].to = 9999;
                }
                if let Deviation::GarbageShares = how {
                    for s in &mut shares {
                        rng.fill(&mut s.ciphertext[..]);
                    }
                }
                send.push(client_message::Body::SecaggShares(SecAggShares {
                    round: *round,
                    shares,
                }));
            }
            Some(server_message::Body::SecaggShareInbox(inbox)) => {
                let (round, _, p) = protocol.as_mut().unwrap();
                let shares: Vec<SealedShares> =
                    inbox.shares.iter().map(|s| s.try_into().unwrap()).collect();
                let refused = p.check_shares(&shares).unwrap();
                send.push(client_message::Body::SecaggCheck(SecAggCheck {
                    round: *round,
                    refused,
                }));
            }
            Some(server_message::Body::SecaggProceed(proceed)) => {
                let (round, n, p) = protocol.as_mut().unwrap();
                let proceed = Proceed {
                    excluded: proceed.excluded,
                    unpaired: proceed.unpaired,
                };
                let x = vec![0u64; *n];
                oracle.record(*round, me, x.clone());
                let mut y = p.masked_input(&proceed, &x).unwrap();
                if let Deviation::MaskedWrongLength = how {
                    y.pop();
                }
                send.extend(masked(*round, ring, &y));
            }
            Some(server_message::Body::SecaggSurvivors(s)) => {
                let (round, _, p) = protocol.as_mut().unwrap();
                let mut shares: Vec<RevealedShare> = p
                    .unmask(&s.survivors)
                    .unwrap()
                    .iter()
                    .map(RevealedShare::from)
                    .collect();
                if let Deviation::ForgedShare = how {
                    shares[0].share[20] ^= 1;
                }
                let reveal = SecAggReveal {
                    round: *round,
                    shares,
                };
                if let Deviation::RevealTwice = how {
                    send.push(client_message::Body::SecaggReveal(reveal.clone()));
                }
                send.push(client_message::Body::SecaggReveal(reveal));
            }
            _ => {}
        }
        for b in send {
            if tx.send(body(b)).await.is_err() {
                break;
            }
        }
    };
    drop(tx);
    let summary = support::finished(server).await;
    for g in good {
        g.await.unwrap().expect("honest clients finish normally");
    }
    assert_eq!(summary.rounds_completed, 2);
    let metrics = support::read_metrics(&out);
    std::fs::remove_dir_all(&out).unwrap();
    (status, metrics)
}

/// Round 1 recovered an exact sum of `survivors` inputs; round 2 ran with the 3 honest clients.
fn assert_exact(metrics: &[RoundMetrics], survivors: usize) {
    let first = metrics[0].secagg.as_ref().unwrap();
    assert_eq!(first.aborted, None, "{metrics:?}");
    assert_eq!(first.survivors, survivors, "{metrics:?}");
    assert_eq!(first.max_abs_error, Some(0), "{metrics:?}");
    let second = metrics[1].secagg.as_ref().unwrap();
    assert_eq!((second.survivors, second.max_abs_error), (3, Some(0)));
}

fn expect(status: &tonic::Status, code: Code, text: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    assert!(status.message().contains(text), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_keys_are_refused() {
    let (status, metrics) = run(Deviation::ShortKey).await;
    expect(
        &status,
        Code::InvalidArgument,
        "cipher_public must be 32 bytes",
    );
    assert_exact(&metrics, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_order_cipher_key_is_refused_by_the_server() {
    let (status, metrics) = run(Deviation::LowOrderCipherKey).await;
    expect(&status, Code::InvalidArgument, "is a low-order point");
    assert_exact(&metrics, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_all_zero_mask_key_is_refused_by_the_server() {
    let (status, metrics) = run(Deviation::ZeroMaskKey).await;
    expect(&status, Code::InvalidArgument, "is a low-order point");
    assert_exact(&metrics, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_canonical_key_is_refused_by_the_server() {
    let (status, metrics) = run(Deviation::NonCanonicalKey).await;
    expect(&status, Code::InvalidArgument, "is not canonical");
    assert_exact(&metrics, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_that_do_not_open_exclude_their_sender_and_the_sum_stays_exact() {
    let (status, metrics) = run(Deviation::GarbageShares).await;
    expect(
        &status,
        Code::FailedPrecondition,
        "too few neighbours could open your shares",
    );
    assert_exact(&metrics, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_message_for_another_round_is_refused() {
    let (status, metrics) = run(Deviation::StaleRound).await;
    expect(&status, Code::InvalidArgument, "current round is 1");
    assert_exact(&metrics, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_stage_message_is_refused() {
    let (status, metrics) = run(Deviation::KeysTwice).await;
    // If the other clients had already answered, stage 0 closed on the first copy and the second
    // is refused as out of stage instead.
    if status.message().contains("during share-keys") {
        expect(
            &status,
            Code::FailedPrecondition,
            "advertise-keys message arrived",
        );
    } else {
        expect(&status, Code::FailedPrecondition, "already answered");
    }
    assert_exact(&metrics, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_update_is_refused_in_a_secure_round() {
    let (status, metrics) = run(Deviation::PlainUpdate).await;
    expect(&status, Code::FailedPrecondition, "uses secure aggregation");
    assert_exact(&metrics, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_masked_input_before_its_stage_is_refused() {
    let (status, metrics) = run(Deviation::EarlyMaskedInput).await;
    expect(
        &status,
        Code::FailedPrecondition,
        "masked-input message arrived during advertise-keys",
    );
    assert_exact(&metrics, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_for_a_stranger_is_refused() {
    let (status, metrics) = run(Deviation::ShareForStranger).await;
    expect(
        &status,
        Code::InvalidArgument,
        "client 9999 is not a neighbour",
    );
    assert_exact(&metrics, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_masked_input_of_the_wrong_length_is_refused_and_its_masks_recovered() {
    let (status, metrics) = run(Deviation::MaskedWrongLength).await;
    expect(&status, Code::InvalidArgument, "masked input has");
    assert_exact(&metrics, 3);
    assert_eq!(metrics[0].secagg.as_ref().unwrap().dropouts_recovered, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_share_is_refused_and_the_sum_stays_exact() {
    let (status, metrics) = run(Deviation::ForgedShare).await;
    expect(
        &status,
        Code::InvalidArgument,
        "does not match its commitment",
    );
    assert_exact(&metrics, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_unmasking_answer_is_refused_and_the_sum_stays_exact() {
    let (status, metrics) = run(Deviation::RevealTwice).await;
    // While the round is open the duplicate is refused. Once the round has closed it is only
    // late and is ignored: the client goes on to round 2 and repeats itself there, where the
    // duplicate is refused, or ignored again if the run is over by then.
    if status.code() != Code::Ok {
        expect(&status, Code::FailedPrecondition, "already answered");
    }
    let first = metrics[0].secagg.as_ref().unwrap();
    assert_eq!((first.survivors, first.max_abs_error), (4, Some(0)));
    let second = metrics[1].secagg.as_ref().unwrap();
    assert!((3..=4).contains(&second.survivors), "{metrics:?}");
    assert_eq!(second.max_abs_error, Some(0));
}
