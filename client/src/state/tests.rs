//! The client's state file: what it remembers across restarts and faults.

use super::*;
use fl_authority::policy::{MinDegree, PolicyMode};
use fl_common::durable::{WriteStep, write_atomic_with};
use fl_privacy::{GaussianLdp, LaplaceLdp, LocalMechanism};

/// A Gaussian release at epsilon 1 and `delta`, C = 1.
fn gaussian(delta: f64) -> Release {
    let clip_bound = 1.0;
    let m = GaussianLdp {
        epsilon: 1.0,
        delta,
        clip_bound,
    };
    LocalMechanism::Gaussian(m).accounted_release().unwrap()
}

/// A pure release of `epsilon`.
fn pure(epsilon: f64) -> Release {
    let (clip_bound, steps) = (1.0, 1);
    let m = LaplaceLdp {
        epsilon,
        clip_bound,
        steps,
    };
    LocalMechanism::Laplace(m).accounted_release().unwrap()
}

fn policy(serial: u64) -> FederationPolicy {
    FederationPolicy {
        federation: "hospitals".into(),
        serial,
        modes: PolicyMode::all().into_iter().collect(),
        min_clients: 4,
        min_degree: MinDegree::Complete,
        min_threshold: 0.7,
        min_noise_multiplier: 0.0,
        max_release_epsilon: 4.0,
        max_total_epsilon: 5.0,
        max_delta: 1e-5,
        max_model_magnitude: 100.0,
    }
}

#[test]
fn state_files_are_named_by_federation_and_client_in_safe_characters() {
    let dir = Path::new("state");
    let policy = FederationPolicy {
        federation: "hospitals/2026".into(),
        ..policy(1)
    };
    assert_eq!(
        state_file(dir, Some(&policy), "site 1"),
        dir.join("hospitals_2026--site_1.json")
    );
    assert_eq!(
        state_file(dir, None, "a.b-c"),
        dir.join("local--a.b-c.json")
    );
}

fn file(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fl-state-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir.join("hospitals--site-1.json")
}

/// The cap holds across a restart: what was spent is read back, and a release past the
/// cap is refused.
#[test]
fn spend_and_attempts_survive_a_restart() {
    let path = file("restart");
    let release = pure(2.0);
    let mut state = ClientState::open(Some(path.clone()), Some(&policy(1)), None).unwrap();
    state.record(&release).unwrap();
    state.record(&release).unwrap();
    state.take_part(7, 3, None).unwrap();
    drop(state);
    let mut again = ClientState::open(Some(path.clone()), Some(&policy(1)), None).unwrap();
    assert_eq!(again.releases(), 2);
    assert_eq!(again.epsilon(), 4.0);
    let refused = again.record(&release).unwrap_err();
    assert!(
        matches!(
            refused,
            StateError::BudgetSpent {
                total: 6.0,
                cap: 5.0,
                ..
            }
        ),
        "{refused}"
    );
    let twice = again.take_part(7, 3, None).unwrap_err();
    assert!(
        matches!(twice, StateError::AlreadyTookPart { last: 3, run: 7 }),
        "{twice}"
    );
    assert!(again.take_part(7, 2, None).is_err());
    again.take_part(7, 4, None).unwrap();
    again.take_part(8, 1, None).unwrap();
    let elsewhere = FederationPolicy {
        federation: "elsewhere".into(),
        ..policy(1)
    };
    drop(again);
    let other = ClientState::open(Some(path.clone()), Some(&elsewhere), None).unwrap_err();
    assert!(
        matches!(&other, StateError::OtherFederation { found, .. } if found == "hospitals"),
        "{other}"
    );
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// Once a client has held serial 3 of its federation's policy, serial 2 is refused (also
/// after a restart), and serial 3 and 4 are taken.
#[test]
fn an_older_policy_is_refused_after_a_newer_one() {
    let path = file("serial");
    drop(ClientState::open(Some(path.clone()), Some(&policy(3)), None).unwrap());
    let older = ClientState::open(Some(path.clone()), Some(&policy(2)), None).unwrap_err();
    assert!(
        matches!(
            older,
            StateError::OlderPolicy {
                serial: 2,
                seen: 3,
                ..
            }
        ),
        "{older}"
    );
    assert!(older.to_string().contains("older than serial 3"), "{older}");
    ClientState::open(Some(path.clone()), Some(&policy(3)), None).unwrap();
    ClientState::open(Some(path.clone()), Some(&policy(4)), None).unwrap();
    assert!(ClientState::open(Some(path.clone()), Some(&policy(3)), None).is_err());
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// Two clients cannot share one state file: the second is refused while the first holds
/// it, and takes it once the first has ended.
#[test]
fn a_state_file_is_held_by_one_client() {
    let path = file("lock");
    let first = ClientState::open(Some(path.clone()), Some(&policy(1)), None).unwrap();
    let second = ClientState::open(Some(path.clone()), Some(&policy(1)), None).unwrap_err();
    assert!(matches!(second, StateError::InUse { .. }), "{second}");
    drop(first);
    ClientState::open(Some(path.clone()), Some(&policy(1)), None).unwrap();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// Under a policy the releases compose at its max_delta, whatever delta one release was
/// made at: a release at delta 0.5 does not lower the total of the others (without a
/// policy the composition's delta is the largest released, and it does).
#[test]
fn releases_compose_at_the_policys_delta() {
    let (small, large) = (gaussian(1e-5), gaussian(0.5));
    let total = |policy: Option<&FederationPolicy>| {
        let mut state = ClientState::open(None, policy, Some(1e9)).unwrap();
        for _ in 0..40 {
            state.record(&small).unwrap();
        }
        let before = state.epsilon();
        state.record(&large).unwrap();
        (before, state.epsilon())
    };
    let generous = FederationPolicy {
        max_total_epsilon: 1e9,
        ..policy(1)
    };
    let (before, after) = total(Some(&generous));
    assert!(after > before, "{before} then {after}");
    let (before, after) = total(None);
    assert!(after < before, "{before} then {after}");
}

/// A fault at each step of the state's write: the spend is refused (so the release does
/// not leave), and the state read back after it never holds less than what was sent.
#[test]
fn a_fault_at_any_step_of_the_write_never_undercounts() {
    let release = pure(1.0);
    for step in WriteStep::ALL {
        let path = file(&format!("fault-{step:?}"));
        let mut state = ClientState::open(Some(path.clone()), Some(&policy(1)), None).unwrap();
        state.record(&release).unwrap();
        let sent = state.releases();
        state.write = Box::new(move |path, bytes| {
            write_atomic_with(path, bytes, |s| match s == step {
                true => Err(std::io::Error::other("injected")),
                false => Ok(()),
            })
        });
        let refused = state.record(&release).unwrap_err();
        assert!(matches!(refused, StateError::Write { .. }), "{refused}");
        drop(state);
        let again = ClientState::open(Some(path.clone()), Some(&policy(1)), None).unwrap();
        assert!(again.releases() >= sent, "{step:?}: {}", again.releases());
        assert!(again.epsilon() >= 1.0, "{step:?}");
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}
