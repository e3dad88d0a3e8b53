//! Client-side privacy rounds refuse uploads that do not match them: a SignDS upload with an
//! index out of range, a duplicated index, more than h indices or a sign other than +-1; a dense
//! update in a SignDS round; an ldp-gaussian upload with no release, a looser epsilon than the
//! round's, or too little noise for what it claims. Each time the hostile client gets
//! INVALID_ARGUMENT naming the problem, nothing of its upload is applied (the round counts 2 of
//! 3 results), and the run goes on.

use crate::support;

use fl_privacy::{GaussianLdp, LocalKind, LocalMechanism, Release};
use fl_proto::v1::{LocalRelease, SignDsUpload, client_message};
use fl_server::config::{PrivacyMode, RunConfig};
use support::{Behaviour, run_with_evil_client};
use tonic::Code;

/// SignDS on the blobs' logistic model (d = 10): k = 3, h = 2.
fn signds(c: &mut RunConfig) {
    c.privacy.mode = PrivacyMode::Local(LocalKind::SignDs);
    c.local.set("epsilon", 2.0);
    c.local.set("top_k", 0.3);
    c.local.set("output_dimensions", 2);
    c.local.set("global_learning_rate", 0.5);
}

fn gaussian(c: &mut RunConfig) {
    c.privacy.mode = PrivacyMode::Local(LocalKind::Gaussian);
    c.local.set("epsilon", 4.0);
    c.local.set("delta", 1e-5);
    c.local.set("clip_bound", 1.0);
}

fn sign_upload(
    round: u64,
    sign: i32,
    indices: Vec<u64>,
    epsilon: f64,
) -> Vec<client_message::Body> {
    vec![client_message::Body::SigndsUpload(SignDsUpload {
        round,
        sign,
        indices,
        release: Some(LocalRelease::from(&Release {
            kind: LocalKind::SignDs,
            epsilon,
            delta: 0.0,
            noise: 0.0,
            sensitivity: 0.0,
        })),
    })]
}

fn dense(round: u64, n: usize, release: Option<Release>) -> Vec<client_message::Body> {
    support::dense_upload(round, &vec![0.0; n], release.as_ref())
}

/// Runs the federation with `evil`; checks the refusal names `expected` and that the round
/// absorbed only the two honest uploads.
async fn refused(configure: fn(&mut RunConfig), evil: Behaviour, expected: &str) {
    let (status, metrics, done) = run_with_evil_client(configure, evil).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains(expected), "{status:?}");
    assert_eq!(done, 2);
    assert_eq!(
        (metrics[0].sampled, metrics[0].completed, metrics[0].dropped),
        (3, 2, 1)
    );
    assert_eq!((metrics[1].sampled, metrics[1].completed), (2, 2));
    // Two honest clients, one release each per round.
    assert!(metrics[1].local_epsilon.unwrap() > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signds_index_out_of_range_is_refused() {
    refused(
        signds,
        |r, n| sign_upload(r, 1, vec![0, n as u64], 2.0),
        "out of range",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signds_duplicate_index_is_refused() {
    refused(
        signds,
        |r, _| sign_upload(r, -1, vec![3, 3], 2.0),
        "appears twice",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signds_more_than_h_indices_are_refused() {
    refused(
        signds,
        |r, _| sign_upload(r, 1, vec![1, 2, 3], 2.0),
        "at most h = 2",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signds_non_sign_value_is_refused() {
    refused(
        signds,
        |r, _| sign_upload(r, 0, vec![1], 2.0),
        "must be -1 or +1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signds_looser_epsilon_is_refused() {
    refused(
        signds,
        |r, _| sign_upload(r, 1, vec![1], 3.0),
        "above the round's",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dense_update_in_a_signds_round_is_refused() {
    let evil: Behaviour = |r, n| {
        dense(
            r,
            n,
            Some(Release {
                kind: LocalKind::SignDs,
                epsilon: 2.0,
                delta: 0.0,
                noise: 0.0,
                sensitivity: 0.0,
            }),
        )
    };
    refused(signds, evil, "send a SignDsUpload").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprotected_update_in_an_ldp_round_is_refused() {
    refused(
        gaussian,
        |r, n| dense(r, n, None),
        "must be protected with ldp-gaussian",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_with_too_little_noise_is_refused() {
    let evil: Behaviour = |r, n| {
        let honest = LocalMechanism::Gaussian(GaussianLdp {
            epsilon: 4.0,
            delta: 1e-5,
            clip_bound: 1.0,
        })
        .accounted_release()
        .unwrap();
        let thin = Release {
            noise: honest.noise / 2.0,
            ..honest
        };
        dense(r, n, Some(thin))
    };
    refused(gaussian, evil, "does not give").await;
}
