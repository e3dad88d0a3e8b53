//! The configuration as a whole: defaults, unknown keys, overrides.

use super::*;
use fl_common::schedule::Schedule;
use fl_datasets::PartitionScheme;
use fl_model::Shape;

#[test]
fn parses_partial_files_over_defaults() {
    let c: RunConfig = toml::from_str(
        "[server]\nclients = 20\nclients_per_round = 5\n[model]\nkind = \"logistic\"\n\
         [data]\npartition = \"dirichlet:0.3\"\n",
    )
    .unwrap();
    c.validate().unwrap();
    assert_eq!(c.server.clients, 20);
    assert_eq!(c.server.rounds, 50);
    assert_eq!(c.data.partition, PartitionScheme::Dirichlet { alpha: 0.3 });
    assert_eq!(
        c.model.spec(Shape::flat(784), 10).unwrap().num_params(),
        7850
    );
}

#[test]
fn refuses_unknown_keys_and_inconsistent_values() {
    assert!(toml::from_str::<RunConfig>("[server]\nclient = 3\n").is_err());
    assert!(toml::from_str::<RunConfig>("[data]\nsource = \"ftp:x\"\n").is_err());
    let mut c = RunConfig::default();
    c.server.clients_per_round = Schedule::Constant(101.0);
    assert!(
        c.validate()
            .unwrap_err()
            .to_string()
            .contains("clients_per_round")
    );
    let mut c = RunConfig::default();
    c.train.learning_rate = f32::NAN;
    assert!(c.validate().is_err());
    let mut c = RunConfig::default();
    c.server.min_clients = 11;
    assert!(c.validate().is_err());
}

/// A privacy setting under privacy.mode = "none" (the quickstart's) is refused, naming the key
/// and the fix, whatever its value: an epsilon must give privacy or an error.
#[test]
fn a_privacy_setting_without_a_privacy_mode_is_refused() {
    let dir = std::env::temp_dir().join(format!("fl-no-mode-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.toml");
    std::fs::write(
        &path,
        "[server]\nclients = 20\n[privacy]\nmode = \"none\"\n",
    )
    .unwrap();
    RunConfig::load_with(&path, &[]).unwrap();
    for set in [
        "privacy.epsilon=2",
        "privacy.delta=2",
        "privacy.clip_bound=-1",
        "local.epsilon=-5",
        "local.top_k=10",
    ] {
        let refused = RunConfig::load_with(&path, &[set.to_string()]).unwrap_err();
        let key = set.split('=').next().unwrap();
        let said = refused.to_string();
        assert!(
            said.contains(&format!("{key} is set, but privacy.mode")),
            "{said}"
        );
        assert!(said.contains("choose a mode"), "{said}");
    }
    let chosen = [
        "privacy.mode=central".to_string(),
        "privacy.epsilon=200".to_string(),
    ];
    RunConfig::load_with(&path, &chosen).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A key written for another mode than the run's is named in one line with the modes that read
/// it; keys every mode may read are not.
#[test]
fn a_key_another_mode_reads_is_said_to_be_ignored() {
    let table: toml::Table = toml::from_str(
        "[privacy]\nmode = \"central\"\nepsilon = 8.0\nnoise = \"banded\"\n\
         [local]\nepsilon = 2.0\n[secagg]\nthreshold = 0.7\npolicy = \"policy.toml\"\n",
    )
    .unwrap();
    let config: RunConfig = table.clone().try_into().unwrap();
    let mut lines = super::ignored_keys(&table, &config);
    lines.sort();
    assert_eq!(
        lines,
        [
            "local.epsilon is ignored: only privacy.mode = \"ldp-gaussian\" or \"ldp-laplace\" \
             or \"signds\" reads it, this run's is \"central\"",
            "privacy.noise is ignored: only privacy.mode = \"dp-ftrl\" reads it, this run's is \
             \"central\"",
            "secagg.threshold is ignored: only privacy.mode = \"secagg\" reads it, this run's is \
             \"central\"",
        ]
    );
}

/// An out-of-range value is refused in a section the run's mode does not read, too.
#[test]
fn a_section_the_mode_does_not_read_is_range_checked() {
    let central: RunConfig = toml::from_str("[privacy]\nmode = \"central\"\n").unwrap();
    central.validate().unwrap();
    for (section, bad) in [
        ("local", "epsilon = -5.0"),
        ("local", "steps = 0"),
        ("local", "top_k = 10.0"),
    ] {
        let text = format!("[privacy]\nmode = \"central\"\n[{section}]\n{bad}\n");
        let config: RunConfig = toml::from_str(&text).unwrap();
        assert!(config.validate().is_err(), "{section}: {bad}");
    }
}

#[test]
fn overrides_set_keys_in_any_section() {
    let dir = std::env::temp_dir().join(format!("fl-override-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.toml");
    std::fs::write(&path, "[server]\nclients = 20\n").unwrap();
    let set = |o: &[&str]| {
        let o: Vec<String> = o.iter().map(|s| s.to_string()).collect();
        RunConfig::load_with(&path, &o)
    };
    let c = set(&[
        "privacy.mode=ldp-gaussian",
        "local.epsilon=2.5",
        "data.partition=iid",
        "server.rounds=7",
    ])
    .unwrap();
    let local = toml::Value::try_from(&c.local).unwrap();
    assert_eq!(local["epsilon"].as_float(), Some(2.5));
    assert_eq!(c.data.partition, PartitionScheme::Iid);
    assert_eq!((c.server.clients, c.server.rounds), (20, 7));
    assert!(set(&["epsilon=2"]).is_err());
    assert!(set(&["local.nonsense=2"]).is_err());
    assert!(set(&["server.clients=0"]).is_err());
    // An override that does not fit is named by its flag, not blamed on the file, with the key
    // that was probably meant, or the expected value in words.
    let typo = set(&["server.rounds=3", "server.clients_per_rnd=20"]).unwrap_err();
    assert_eq!(
        typo.to_string(),
        "--set server.clients_per_rnd=20: unknown field `clients_per_rnd`; did you mean \
         `clients_per_round`?"
    );
    let unused = set(&["secagg.threshold=1.5"]).unwrap_err().to_string();
    assert!(
        unused.contains("secagg.threshold must be in (0.5, 1]"),
        "{unused}"
    );
    let negative = set(&["server.rounds=-3"]).unwrap_err().to_string();
    assert!(
        negative.starts_with("--set server.rounds=-3: "),
        "{negative}"
    );
    assert!(
        negative.ends_with("expected a whole number of 0 or more"),
        "{negative}"
    );
    std::fs::write(&path, "[server]\nclients_per_rnd = 20\n").unwrap();
    let in_file = set(&[]).unwrap_err().to_string();
    assert!(
        in_file.starts_with(&path.display().to_string()),
        "{in_file}"
    );
    assert!(
        in_file.ends_with("did you mean `clients_per_round`?"),
        "{in_file}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The live run page binds beyond loopback only behind the operator's token.
#[test]
fn a_page_beyond_loopback_needs_the_operator_token() {
    let mut c = RunConfig::default();
    for open in ["127.0.0.1:8080", "[::1]:0", "localhost:8080"] {
        c.server.page_listen = Some(open.into());
        c.validate().unwrap();
    }
    c.server.page_listen = Some("0.0.0.0:8080".into());
    let refused = c.validate().unwrap_err().to_string();
    assert!(refused.contains("server.operator_token"), "{refused}");
    c.server.operator_token = Some(crate::identity::credentials::Token::new(
        "an operator's secret",
    ));
    c.validate().unwrap();
}

/// A server beyond loopback with no token, enrollment or client CA is said to be open to anyone
/// (its start-up logs it at error level); any one of the three, or loopback, closes it.
#[test]
fn a_server_open_to_anyone_is_named() {
    let mut s = RunConfig::default().server;
    s.listen = "0.0.0.0:50051".into();
    let open = super::open_door(&s).unwrap();
    assert!(
        open.contains("anyone who reaches 0.0.0.0:50051 can join"),
        "{open}"
    );
    let mut token = s.clone();
    token.token = Some(crate::identity::credentials::Token::new(
        "a long enough secret",
    ));
    let mut enrolled = s.clone();
    enrolled.enrollment = Some("clients.toml".into());
    let mut client_ca = s.clone();
    client_ca.tls_client_ca = Some("ca.pem".into());
    let mut local = s.clone();
    local.listen = "127.0.0.1:50051".into();
    for closed in [token, enrolled, client_ca, local] {
        assert_eq!(super::open_door(&closed), None, "{closed:?}");
    }
}

/// The aggregator tier takes the modes whose aggregate is a sum its groups can form, secure
/// aggregation's included, and refuses the rest at start-up; and it never starts without the
/// aggregators' token (fail-closed: anyone could register as an aggregator).
#[test]
fn the_tier_runs_the_summing_modes_and_refuses_the_rest() {
    let tiered = |mode: PrivacyMode, edit: &dyn Fn(&mut RunConfig)| {
        let mut c = RunConfig::default();
        c.server.aggregators = 2;
        c.server.aggregator_token = Some(crate::identity::credentials::Token::new("secret"));
        c.privacy.mode = mode;
        c.privacy.sampling = fl_privacy::Sampling::Fixed;
        c.privacy.epsilon = 1000.0;
        edit(&mut c);
        c.validate_for_server().map_err(|e| e.to_string())
    };
    tiered(PrivacyMode::None, &|_| {}).unwrap();
    tiered(PrivacyMode::Central, &|_| {}).unwrap();
    for noise in [
        SecAggNoise::None,
        SecAggNoise::Central,
        SecAggNoise::Distributed,
    ] {
        tiered(PrivacyMode::SecAgg, &|c| c.secagg.noise = noise).unwrap();
    }
    let open = tiered(PrivacyMode::None, &|c| c.server.aggregator_token = None).unwrap_err();
    assert!(
        open.contains("needs server.aggregator_enrollment"),
        "{open}"
    );
    let refused = [
        tiered(PrivacyMode::Local(fl_privacy::LocalKind::Gaussian), &|_| {}),
        tiered(PrivacyMode::SecAgg, &|c| c.secagg.sim_dropout = 0.2),
        tiered(PrivacyMode::None, &|c| c.eval.federated = true),
    ];
    for r in refused {
        let message = r.unwrap_err();
        assert!(message.contains("aggregator"), "{message}");
    }
}

/// A noise stream's table is set by file or by `--set` (into a stream given by its name too),
/// and an old flat key still reads, into the same table.
#[test]
fn a_stream_table_is_set_by_file_by_override_and_by_its_old_key() {
    let dir = std::env::temp_dir().join(format!("fl-stream-table-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.toml");
    let base = "[server]\nclients = 100\nclients_per_round = 10\n[privacy]\nmode = \"dp-ftrl\"\n\
                noise_multiplier = 5.0\n";
    std::fs::write(&path, format!("{base}[privacy.noise.banded]\nbands = 2\n")).unwrap();
    let banded = |min_separation, bands| {
        fl_privacy::StreamSettings::Banded(fl_privacy::BandedSettings {
            min_separation,
            bands,
            max_participations: None,
        })
    };
    let read = |sets: &[&str]| {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        RunConfig::load_with(&path, &sets).unwrap().privacy.noise
    };
    assert_eq!(read(&[]), banded(None, Some(2)));
    let set = read(&["privacy.noise.banded.min_separation=5"]);
    assert_eq!(set, banded(Some(5), Some(2)));
    std::fs::write(&path, format!("{base}noise = \"banded\"\n")).unwrap();
    let into_a_name = read(&["privacy.noise.banded.min_separation=5"]);
    assert_eq!(into_a_name, banded(Some(5), None));
    assert_eq!(read(&["privacy.min_separation=5"]), banded(Some(5), None));
    let tree = fl_privacy::TreeSettings { rounds: Some(3) };
    std::fs::write(&path, format!("{base}tree_rounds = 3\n")).unwrap();
    assert_eq!(read(&[]), fl_privacy::StreamSettings::Tree(tree));
    std::fs::remove_dir_all(&dir).unwrap();
}
