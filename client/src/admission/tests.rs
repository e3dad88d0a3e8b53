//! Admission's rules, each on a task a server could send.

use super::*;
use crate::engine::tests::{local, task};
use crate::trainer::SgdTrainer;
use fl_authority::policy::MinDegree;
use fl_privacy::{GaussianLdp, LaplaceLdp, LocalKind};
use fl_secagg::Ring;

fn policy(modes: &[PolicyMode]) -> FederationPolicy {
    FederationPolicy {
        federation: "hospitals".into(),
        serial: 1,
        modes: modes.iter().copied().collect(),
        min_clients: 4,
        min_degree: MinDegree::AtLeast(3),
        min_threshold: 0.7,
        min_noise_multiplier: 4.0,
        max_release_epsilon: 4.0,
        max_total_epsilon: 10.0,
        max_delta: 1e-5,
        max_model_magnitude: 1e4,
    }
}

fn trainer() -> SgdTrainer {
    SgdTrainer::new(local())
}

fn plain() -> Task {
    task(None)
}

fn secure(federation: &str) -> SecureTask {
    SecureTask {
        quantizer: Quantizer {
            ring: Ring::new(32).unwrap(),
            clip: 1.0,
            scale: 1000.0,
        },
        noise_variance: 0,
        signed: true,
        federation: federation.into(),
        run: 7,
        min_survivors: 4,
    }
}

/// Admits `task` for a signing client under `policy`, with nothing spent.
fn admit_under(task: &Task, policy: Option<&FederationPolicy>) -> Result<Protection, Refusal> {
    admit_holding(task, policy, ClientPrivacy::default())
}

/// [`admit_under`] for a client with `privacy`.
fn admit_holding(
    task: &Task,
    policy: Option<&FederationPolicy>,
    privacy: ClientPrivacy,
) -> Result<Protection, Refusal> {
    let trainer = trainer();
    let state = ClientState::open(None, policy, None).unwrap();
    let ours = Ours {
        privacy: &privacy,
        policy,
        signing: true,
        pinned: None,
        trainer: &trainer,
        state: &state,
    };
    admit(task, &vec![0.0; task.tensor_len()], &ours)
}

/// Under a policy, a round of a kind it does not list is refused naming the rule, whatever
/// the task leaves out: a plain round (also a central-DP one, which ships the same raw
/// update), federated evaluation, IADMM, a local mechanism not listed. Without a policy
/// the plain round is admitted, as before.
#[test]
fn a_policy_client_refuses_every_kind_of_round_its_policy_does_not_list() {
    let secure_only = policy(&[PolicyMode::SecAgg]);
    let refused = admit_under(&plain(), Some(&secure_only)).unwrap_err();
    assert!(matches!(
        refused,
        Refusal::NotAllowed {
            mode: PolicyMode::Plain,
            ..
        }
    ));
    assert!(
        refused.to_string().contains("does not allow plain rounds"),
        "{refused}"
    );
    assert_eq!(
        admit_under(&plain(), None).unwrap(),
        Protection::Plain { evaluate: false }
    );
    let evaluate = Task {
        evaluate: true,
        ..plain()
    };
    let trusted = policy(&[PolicyMode::Plain]);
    let refused = admit_under(&evaluate, Some(&trusted)).unwrap_err();
    assert!(
        matches!(refused, Refusal::EvaluationUnderPolicy { .. }),
        "{refused}"
    );
    let laplace = LocalMechanism::Laplace(LaplaceLdp {
        epsilon: 1.0,
        clip_bound: 1.0,
        steps: 1,
    });
    let admm = Task {
        local: Some(laplace),
        admm: Some(AdmmStep {
            rho: 1.0,
            total_examples: 100,
        }),
        ..plain()
    };
    let local_only = policy(&[PolicyMode::Local(LocalKind::Laplace)]);
    let refused = admit_under(&admm, Some(&local_only)).unwrap_err();
    assert!(matches!(
        refused,
        Refusal::NotAllowed {
            mode: PolicyMode::Iadmm,
            ..
        }
    ));
    let gaussian = Task {
        local: Some(LocalMechanism::Gaussian(GaussianLdp {
            epsilon: 1.0,
            delta: 1e-6,
            clip_bound: 1.0,
        })),
        ..plain()
    };
    let refused = admit_under(&gaussian, Some(&local_only)).unwrap_err();
    assert!(matches!(
        refused,
        Refusal::NotAllowed {
            mode: PolicyMode::Local(LocalKind::Gaussian),
            ..
        }
    ));
    let secure = Task {
        secure: Some(secure("hospitals")),
        ..plain()
    };
    let refused = admit_under(&secure, Some(&local_only)).unwrap_err();
    assert!(matches!(
        refused,
        Refusal::NotAllowed {
            mode: PolicyMode::SecAgg,
            ..
        }
    ));
    assert!(matches!(
        admit_under(&secure, Some(&secure_only)).unwrap(),
        Protection::Secure { .. }
    ));
}

/// A policy that lists `verified` and not `secagg` makes its clients refuse unverified secure
/// rounds; a verified round is admitted only by a client holding a helper key, and not under a
/// policy that does not list it.
#[test]
fn a_policy_can_require_verified_rounds() {
    let verified_only = policy(&[PolicyMode::Verified]);
    let secure = Task {
        secure: Some(secure("hospitals")),
        ..plain()
    };
    let refused = admit_under(&secure, Some(&verified_only)).unwrap_err();
    assert!(matches!(
        refused,
        Refusal::NotAllowed {
            mode: PolicyMode::SecAgg,
            ..
        }
    ));
    let verified = Task {
        verified: Some(VerifiedTask {
            clip: 1.0,
            federation: "hospitals".into(),
            run: 7,
            min_clients: 2,
        }),
        ..plain()
    };
    let holding = ClientPrivacy {
        helper_key: Some(fl_secagg::verified::HelperKey::generate().1.to_bytes()),
        ..ClientPrivacy::default()
    };
    let admitted = admit_holding(&verified, Some(&verified_only), holding);
    assert!(matches!(admitted.unwrap(), Protection::Verified { .. }));
    let keyless = admit_under(&verified, Some(&verified_only)).unwrap_err();
    assert!(matches!(keyless, Refusal::NoHelperKey));
    let refused = admit_holding(&verified, Some(&policy(&[PolicyMode::SecAgg])), holding);
    assert!(matches!(
        refused.unwrap_err(),
        Refusal::NotAllowed {
            mode: PolicyMode::Verified,
            ..
        }
    ));
}

/// A task at delta 0.5 (and epsilon 4) is released at the policy's max_delta: the noise
/// is calibrated for (4, 1e-5), not for the server's delta.
#[test]
fn a_tasks_delta_is_clamped_to_the_policys() {
    let task = Task {
        local: Some(LocalMechanism::Gaussian(GaussianLdp {
            epsilon: 4.0,
            delta: 0.5,
            clip_bound: 1.0,
        })),
        ..plain()
    };
    let p = policy(&[PolicyMode::Local(LocalKind::Gaussian)]);
    let Protection::Local { mechanism, release } = admit_under(&task, Some(&p)).unwrap() else {
        panic!("not a local release");
    };
    let expected = LocalMechanism::Gaussian(GaussianLdp {
        epsilon: 4.0,
        delta: 1e-5,
        clip_bound: 1.0,
    });
    assert_eq!(mechanism, expected);
    assert_eq!(
        release,
        LocalMechanism::Gaussian(GaussianLdp {
            epsilon: 4.0,
            delta: 1e-5,
            clip_bound: 1.0
        })
        .accounted_release()
        .unwrap()
    );
    let unclamped = LocalMechanism::Gaussian(GaussianLdp {
        epsilon: 4.0,
        delta: 0.5,
        clip_bound: 1.0,
    })
    .accounted_release()
    .unwrap();
    assert!(
        release.noise > 3.0 * unclamped.noise,
        "{release:?} {unclamped:?}"
    );
}

/// A secure round is charged at the policy's floor: at z = 4 one round costs each client
/// epsilon 2.18 (RDP of its own discrete Gaussian, sensitivity 2 (gamma S + sqrt d)),
/// below the per-release 4; a policy at z = 1 makes it cost more than 4, and the round is
/// refused naming the rule.
#[test]
fn a_secure_round_is_charged_at_the_policys_floor() {
    let task = Task {
        secure: Some(secure("hospitals")),
        ..plain()
    };
    let p = policy(&[PolicyMode::SecAgg]);
    let Protection::Secure {
        charge: Some(charge),
        noise_variance,
        ..
    } = admit_under(&task, Some(&p)).unwrap()
    else {
        panic!("not charged");
    };
    assert_eq!(noise_variance, 16_000_000);
    let epsilon = ClientState::open(None, Some(&p), None)
        .unwrap()
        .cost(&charge);
    assert!(epsilon > 2.0 && epsilon < 3.0, "{epsilon}");
    let weak = FederationPolicy {
        min_noise_multiplier: 1.0,
        ..p
    };
    let refused = admit_under(&task, Some(&weak)).unwrap_err();
    assert!(
        matches!(refused, Refusal::SecureRoundTooCostly { .. }),
        "{refused}"
    );
}
