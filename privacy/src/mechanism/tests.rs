//! Every listed mechanism, by its name: its default settings make a round's mechanism that
//! checks, travels on the wire and back unchanged, is tightened only by a client's limits, and
//! admits the release it records itself; and a release of another kind is refused.

use super::*;
use crate::LocalLedger;

/// d of the model every mechanism is resolved for.
const DIM: usize = 5000;

/// Every listed mechanism with its default settings.
fn every_mechanism() -> Vec<LocalMechanism> {
    let resolve = |&kind| LocalSettings::default_of(kind).resolve(DIM).unwrap();
    LocalKind::ALL.iter().map(resolve).collect()
}

#[test]
fn every_mechanism_is_named_and_found_by_its_name() {
    for &kind in LocalKind::ALL {
        assert_eq!(kind.name().parse::<LocalKind>(), Ok(kind));
        assert!(!kind.description().is_empty(), "{kind}");
        let settings = LocalSettings::default_of(kind);
        assert_eq!((settings.kind(), settings.validate()), (kind, Ok(())));
    }
    assert!("ldp".parse::<LocalKind>().is_err());
}

#[test]
fn every_mechanism_travels_and_checks() {
    for m in every_mechanism() {
        m.check(DIM).unwrap();
        let back = LocalMechanism::from_parameters(m.name(), &m.parameters()).unwrap();
        assert_eq!(back, m, "{}", m.name());
        assert_eq!(m.tightened(&ClientLimits::default()), m, "{}", m.name());
    }
}

#[test]
fn a_client_limit_never_loosens_a_mechanism() {
    let own = ClientLimits {
        epsilon: Some(0.25),
        delta: Some(1e-9),
        clip: None,
    };
    for m in every_mechanism() {
        let tight = m.tightened(&own);
        assert_eq!(tight.epsilon(), 0.25, "{}", m.name());
        assert!(tight.composed_delta() <= m.composed_delta(), "{}", m.name());
        m.admits(&tight.accounted_release().unwrap()).unwrap();
    }
}

#[test]
fn every_mechanism_admits_its_own_release_and_no_other_kind() {
    let mechanisms = every_mechanism();
    for m in &mechanisms {
        let own = m.accounted_release().unwrap();
        m.admits(&own).unwrap();
        let mut ledger = LocalLedger::default();
        ledger.record(&own);
        assert!(ledger.epsilon(1e-5) > 0.0, "{}", m.name());
        for other in mechanisms.iter().filter(|o| o.kind() != m.kind()) {
            let theirs = other.accounted_release().unwrap();
            assert!(
                matches!(m.admits(&theirs), Err(LocalPrivacyError::Mismatch { .. })),
                "{} admits {}",
                m.name(),
                other.name()
            );
        }
    }
}
