//! The plan's refusals: every invalid combination of keys is refused at start-up, naming them.

use super::*;
use crate::config::{
    Aggregator, Algorithm, ClipMode, PrivacyMode, RunConfig, SecAggNoise, TrimmedMeanSettings,
};
use fl_common::schedule::Schedule;
use fl_privacy::{
    AnyStream, BandedSettings, BandedStream, GaussianRound, LocalKind, NoiseStream, PrivacyEvent,
    SignDsLdp, StreamSettings, TreeSettings, TreeStream, UnsampledGaussian, max_rounds,
};

fn private() -> RunConfig {
    let mut c = RunConfig::default();
    c.privacy.mode = PrivacyMode::Central;
    c
}

/// The accountant of `c`'s ledger.
fn accountant(c: &RunConfig) -> AccountantKind {
    c.plan().unwrap().ledger().unwrap().accountant
}

/// The client-side mechanism of `c` for a model of `dim` parameters.
fn mechanism(c: &RunConfig, dim: usize) -> Result<LocalMechanism, ConfigError> {
    c.plan()?.local().expect("a local mode").resolve(dim)
}

/// The noise of a secure plan.
fn secure_noise(plan: &PrivacyPlan) -> &SecureNoise {
    match plan {
        PrivacyPlan::Secure(s) => &s.noise,
        other => panic!("not a secure plan: {other:?}"),
    }
}

fn refused(c: &RunConfig) -> String {
    c.validate().unwrap_err().to_string()
}

#[test]
fn private_runs_refuse_bad_privacy_settings_at_start_up() {
    private().validate().unwrap();
    let mut c = private();
    c.privacy.noise_multiplier = 0.0.into();
    assert!(refused(&c).contains("sigma > 0"));
    let mut c = private();
    c.privacy.noise_multiplier = (-1.0).into();
    assert!(refused(&c).contains("noise_multiplier"));
    let mut c = private();
    c.privacy.delta = 1.0;
    assert!(refused(&c).contains("delta"));
    let mut c = private();
    c.privacy.delta = 0.0;
    assert!(refused(&c).contains("delta"));
    let mut c = private();
    c.privacy.epsilon = -2.0;
    assert!(refused(&c).contains("epsilon"));
    // q = m / K > 1.
    let mut c = private();
    c.server.clients_per_round = 150.0.into();
    assert!(refused(&c).contains("clients_per_round"));
    let mut c = private();
    c.privacy.clip_bound = 0.0;
    assert!(refused(&c).contains("clip_bound"));
}

#[test]
fn a_budget_spent_by_the_first_round_is_refused() {
    let mut c = private();
    c.privacy.noise_multiplier = 0.1.into();
    c.privacy.epsilon = 0.5;
    assert!(
        refused(&c).contains("already spent by round 1"),
        "{}",
        refused(&c)
    );
}

#[test]
fn the_accountant_defaults_to_pld_for_poisson_and_pld_refuses_fixed_sampling() {
    let mut c = private();
    c.privacy.sampling = Sampling::Poisson;
    assert_eq!(accountant(&c), AccountantKind::Pld);
    c.privacy.sampling = Sampling::Fixed;
    assert_eq!(accountant(&c), AccountantKind::Rdp);
    c.privacy.accountant = Some(AccountantKind::Pld);
    assert!(refused(&c).contains("Poisson"), "{}", refused(&c));
}

#[test]
fn inconsistent_schedules_are_refused() {
    let mut c = private();
    c.privacy.noise_multiplier = Schedule::Steps {
        steps: vec![(3, 1.0)],
    };
    assert!(refused(&c).contains("round 1"));
    let mut c = private();
    c.server.clients_per_round = Schedule::Steps {
        steps: vec![(1, 10.0), (20, 10.0), (10, 30.0)],
    };
    assert!(refused(&c).contains("strictly"));
    let mut c = private();
    c.privacy.clip = ClipMode::Quantile;
    c.privacy.clip_count_noise = Some(0.2);
    assert!(refused(&c).contains("sigma_b"));
}

#[test]
fn secure_aggregation_settings_are_checked() {
    let mut c = RunConfig::default();
    c.privacy.mode = PrivacyMode::SecAgg;
    c.validate().unwrap();
    assert!(c.plan().unwrap().ledger().is_none());
    c.secagg.noise = SecAggNoise::Distributed;
    assert!(refused(&c).contains("a fixed number of participants"));
    c.privacy.sampling = Sampling::Fixed;
    // Accounted at z/2: z = 1 spends the default budget in one round, z = 4 does not.
    assert!(refused(&c).contains("already spent by round 1"));
    c.privacy.noise_multiplier = 4.0.into();
    c.validate().unwrap();
    // Calibrated for more survivors than the fewest: charged up front for the fewest, so
    // the first round is checked at z sqrt(f / f_c) (4 sqrt(0.05) / 2 = 0.45 spends it).
    let mut expected = c.clone();
    expected.secagg.calibrate_for = Some(1.0);
    expected.validate().unwrap();
    expected.secagg.min_survivors = 0.05;
    assert!(refused(&expected).contains("already spent by round 1"));
    expected.secagg.calibrate_for = Some(0.04);
    assert!(refused(&expected).contains("calibrate_for"));
    let plan = c.plan().unwrap();
    assert!(
        plan.ledger().is_some() && matches!(secure_noise(&plan), SecureNoise::Distributed { .. })
    );
    c.secagg.noise = SecAggNoise::Central;
    let mut poisson = c.clone();
    poisson.privacy.sampling = Sampling::Poisson;
    assert!(refused(&poisson).contains("needs privacy.sampling = \"fixed\""));
    let mut central = c.clone();
    central.secagg.calibrate_for = Some(1.0);
    assert!(refused(&central).contains("calibrate_for"));
    assert!(matches!(
        secure_noise(&c.plan().unwrap()),
        SecureNoise::Central(_)
    ));
    let mut bad = c.clone();
    bad.secagg.bits = 16;
    assert!(refused(&bad).contains("bits"));
    let mut bad = c.clone();
    bad.secagg.threshold = 0.5;
    assert!(refused(&bad).contains("threshold"));
    let mut bad = c.clone();
    bad.privacy.clip = ClipMode::Median;
    assert!(refused(&bad).contains("fixed"));
    let mut bad = c;
    bad.secagg.sim_dropout = 1.0;
    assert!(refused(&bad).contains("sim_dropout"));
}

/// Secure aggregation's central noise under zero-out neighbours: its rounds are accounted
/// without sampling at sensitivity S, with PLD by default. z = 1.36 then allows 8 rounds at
/// (8, 1e-3), as `fl privacy sigma --unsampled zero-out` plans; replace-one at q = 1 allows
/// fewer (its sensitivity is 2S).
#[test]
fn secure_central_noise_under_zero_out_is_accounted_without_sampling() {
    let mut c = RunConfig::default();
    c.privacy.mode = PrivacyMode::SecAgg;
    c.secagg.noise = SecAggNoise::Central;
    c.privacy.sampling = Sampling::Fixed;
    c.server.clients_per_round = (c.server.clients as f64).into();
    c.privacy.noise_multiplier = 1.36.into();
    c.privacy.epsilon = 8.0;
    c.privacy.delta = 1e-3;
    let rounds = |c: &RunConfig| {
        let plan = c.plan().unwrap();
        let SecureNoise::Central(noise) = secure_noise(&plan) else {
            panic!("central noise")
        };
        let event = match noise.accounting {
            CentralAccounting::Unsampled(neighbours) => PrivacyEvent::from(UnsampledGaussian {
                noise_multiplier: 1.36,
                neighbours,
            }),
            CentralAccounting::Sampled => PrivacyEvent::from(GaussianRound {
                q: 1.0,
                noise_multiplier: 1.36,
                sampling: Sampling::Fixed,
            }),
        };
        let ledger = plan.ledger().unwrap();
        (
            ledger.accountant,
            max_rounds(ledger.accountant, &event, &ledger.budget, 100).unwrap(),
        )
    };
    assert_eq!(rounds(&c), (AccountantKind::Rdp, 1));
    c.secagg.neighbours = fl_privacy::Neighbours::ZeroOut;
    assert_eq!(rounds(&c), (AccountantKind::Pld, 8));
}

/// DP-FTRL: one z, a fixed S, trees of K/m rounds unless set, PLD by default; a first node
/// that spends the budget is refused.
#[test]
fn dp_ftrl_settings_are_checked() {
    let mut c = RunConfig::default();
    c.privacy.mode = PrivacyMode::DpFtrl;
    c.server.clients = 100;
    c.server.clients_per_round = 30.0.into();
    c.privacy.noise_multiplier = 3.0.into();
    let PrivacyPlan::Ftrl(plan) = c.plan().unwrap() else {
        panic!("a DP-FTRL plan")
    };
    let trees = AnyStream::Tree(TreeStream::new(3.0, 3));
    assert_eq!((&plan.stream, plan.noise_multiplier), (&trees, 3.0));
    assert_eq!(plan.ledger.accountant, AccountantKind::Pld);
    // A server needs stable identities; a simulation enrolls its own clients.
    let without = c.validate_for_server().unwrap_err().to_string();
    assert!(without.contains("needs server.enrollment"), "{without}");
    let mut enrolled = c.clone();
    enrolled.server.enrollment = Some("clients.toml".into());
    enrolled.validate_for_server().unwrap();
    let mut bad = c.clone();
    bad.privacy.noise_multiplier = Schedule::Linear { linear: (3.0, 4.0) };
    assert!(refused(&bad).contains("one privacy.noise_multiplier"));
    let mut bad = c.clone();
    bad.privacy.clip = ClipMode::Quantile;
    assert!(refused(&bad).contains("clip = \"fixed\""));
    let mut bad = c.clone();
    bad.privacy.noise = StreamSettings::Tree(TreeSettings { rounds: Some(0) });
    assert!(refused(&bad).contains("[privacy.noise.tree] rounds must be at least 1"));
    let mut bad = c.clone();
    bad.privacy.noise_multiplier = 0.2.into();
    assert!(refused(&bad).contains("already spent by round 1"));
    c.eval.federated = true;
    assert!(refused(&c).contains("federated"));
}

/// Banded DP-FTRL: b = K/m and p = b unless set, p <= b, k >= 1; the factorization is
/// optimised for the steps the budget allows (fewer than the rounds).
#[test]
fn banded_settings_are_checked() {
    let banded = |settings| StreamSettings::Banded(settings);
    let mut c = RunConfig::default();
    c.privacy.mode = PrivacyMode::DpFtrl;
    c.privacy.noise = banded(BandedSettings::default());
    (c.server.clients, c.server.clients_per_round) = (100, 25.0.into());
    (c.server.rounds, c.privacy.noise_multiplier) = (100_000, 3.0.into());
    let PrivacyPlan::Ftrl(plan) = c.plan().unwrap() else {
        panic!("a DP-FTRL plan")
    };
    let AnyStream::Banded(mut stream) = plan.stream else {
        panic!("a banded stream")
    };
    stream.advance();
    let first = stream.event();
    assert_eq!((first.bands, first.min_separation), (4, 4));
    assert_eq!(first.max_participations, None);
    let budget_ends = BandedStream::new(first, 100_000, 0.0).factorization();
    assert_eq!(stream.factorization().bands(), 4);
    assert_ne!(
        stream.factorization(),
        budget_ends,
        "optimised for fewer steps"
    );
    let refusals = [
        (
            BandedSettings {
                bands: Some(5),
                ..Default::default()
            },
            "bands (5) must be",
        ),
        (
            BandedSettings {
                bands: Some(0),
                ..Default::default()
            },
            "bands (0) must be",
        ),
        (
            BandedSettings {
                min_separation: Some(0),
                ..Default::default()
            },
            "min_separation must",
        ),
        (
            BandedSettings {
                max_participations: Some(0),
                ..Default::default()
            },
            "max_participations",
        ),
    ];
    for (settings, why) in refusals {
        let mut bad = c.clone();
        bad.privacy.noise = banded(settings);
        let refusal = refused(&bad);
        assert!(
            refusal.contains("configuration: [privacy.noise.banded] ") && refusal.contains(why),
            "{refusal}"
        );
    }
}

#[test]
fn robust_options_go_only_where_the_server_sees_updates() {
    let with = |mode, norm: Option<f64>, aggregator: &Aggregator| {
        let mut c = RunConfig::default();
        c.privacy.mode = mode;
        c.robust.max_update_norm = norm;
        c.robust.aggregator = aggregator.clone();
        c.validate()
    };
    let trimmed = &Aggregator::TrimmedMean(Default::default());
    let mean = &Aggregator::default();
    assert!(with(PrivacyMode::None, Some(10.0), trimmed).is_ok());
    let gaussian = PrivacyMode::Local(LocalKind::Gaussian);
    assert!(with(gaussian, None, trimmed).is_ok());
    assert!(with(gaussian, Some(10.0), mean).is_err());
    assert!(with(PrivacyMode::Central, None, trimmed).is_err());
    assert!(with(PrivacyMode::SecAgg, None, trimmed).is_err());
    assert!(with(PrivacyMode::None, Some(-1.0), mean).is_err());
    let half = Aggregator::TrimmedMean(TrimmedMeanSettings { trim_fraction: 0.5 });
    let refused = with(PrivacyMode::None, None, &half)
        .unwrap_err()
        .to_string();
    assert!(refused.contains("[robust.aggregator.trimmed-mean] trim_fraction must be in"));
}

#[test]
fn client_side_settings_are_checked() {
    let mut c = RunConfig::default();
    c.privacy.mode = PrivacyMode::Local(LocalKind::Gaussian);
    c.validate().unwrap();
    assert!(c.plan().unwrap().ledger().is_none());
    assert!(matches!(
        mechanism(&c, 100).unwrap(),
        LocalMechanism::Gaussian(_)
    ));
    let mut bad = c.clone();
    bad.local.set("epsilon", 0.0);
    assert!(refused(&bad).contains("local epsilon = 0 must be a positive number"));
    let mut bad = c.clone();
    bad.local.set("clip_bound", -1.0);
    assert!(refused(&bad).contains("clip bound C = -1 must be a positive number"));
    let mut bad = c.clone();
    bad.local.set("delta", 1.0);
    assert!(refused(&bad).contains("local delta = 1 must be in (0, 1)"));
    let mut bad = c.clone();
    bad.local.set("stepz", 1);
    assert!(refused(&bad).contains("[local] has no key `stepz`"));
    // IADMM works without noise or with Laplace noise only.
    let mut bad = c.clone();
    bad.train.algorithm = Algorithm::Iadmm;
    assert!(refused(&bad).contains("iadmm"));
    bad.privacy.mode = PrivacyMode::Local(LocalKind::Laplace);
    bad.validate().unwrap();
    bad.admm.rho = 0.0;
    assert!(refused(&bad).contains("rho > 0"));
    let mut signds = c;
    signds.privacy.mode = PrivacyMode::Local(LocalKind::SignDs);
    signds.local.set("output_dimensions", 5);
    signds.validate().unwrap();
    let expected = SignDsLdp {
        epsilon: 1.0,
        k: 10,
        h: 5,
    };
    assert_eq!(
        mechanism(&signds, 1000).unwrap(),
        LocalMechanism::SignDs(expected)
    );
    // h above k.
    signds.local.set("output_dimensions", 11);
    assert!(mechanism(&signds, 1000).is_err());
    signds.local.set("top_k", 1.5);
    assert!(refused(&signds).contains("top_k"));
}
