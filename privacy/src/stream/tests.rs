//! Every listed stream, through [`AnyStream`]: its charges for planning are what its ledger
//! events compose to, step by step, and its settings read from their name or their table.

use super::*;
use crate::{Accountant, RdpAccountant, Sampling};

/// A run of 100 clients, 10 per step, 40 steps, at z = 2, without a budget.
fn run() -> StreamRun {
    StreamRun {
        noise_multiplier: 2.0,
        one_pass: Some(10),
        buffer: None,
        rounds: 40,
        momentum: 0.0,
        ledger: None,
    }
}

/// Each stream of the list at its defaults, and the two of this crate's first with settings of
/// their own.
fn every_stream() -> Vec<AnyStream> {
    let tables = [
        "{ tree = { rounds = 3 } }",
        "{ banded = { min_separation = 4, bands = 2, max_participations = 3 } }",
    ];
    let texts = StreamSettings::NAMES.iter().copied().chain(tables);
    let plan = |text| {
        let settings: StreamSettings = serde_json::from_value(json_of(text)).unwrap();
        AnyStream::plan(&settings, &run()).unwrap()
    };
    texts.map(plan).collect()
}

/// A TOML-like value written as JSON: a quoted name, or a table.
fn json_of(text: &str) -> serde_json::Value {
    match text.strip_prefix('{') {
        None => serde_json::Value::String(text.into()),
        Some(_) => {
            let json = text
                .replace(" = ", "\": ")
                .replace("{ ", "{ \"")
                .replace(", ", ", \"");
            serde_json::from_str(&json).unwrap()
        }
    }
}

/// `charges(n)` composes to what the events of steps 1..=n compose to, in the RDP accountant,
/// and `steps_within` is its inverse: the most steps whose charges fit.
#[test]
fn the_charges_a_stream_plans_with_are_its_events() {
    for stream in every_stream() {
        let mut steps = stream.clone();
        let mut events = RdpAccountant::default();
        for n in 1..=40u64 {
            steps.advance();
            events.compose(&steps.event(), 1);
            let Charges { charge, count } = stream.charges(n);
            assert_eq!((charge.q, charge.sampling), (1.0, Sampling::Poisson));
            let mut planned = RdpAccountant::default();
            planned.compose(&charge.into(), count);
            let (a, b) = (events.epsilon(1e-5), planned.epsilon(1e-5));
            assert!(
                (a - b).abs() <= 1e-9 * a.max(1.0),
                "{stream:?}, {n}: {a} vs {b}"
            );
            let within = stream.steps_within(count, 1000);
            assert!(within >= n, "{stream:?}: {count} charges cover {n} steps");
            assert!(stream.charges(within).count <= count, "{stream:?}, {n}");
        }
    }
}

/// A name reads as its table's defaults and writes back as the name; a table with an unknown
/// key is refused naming it; two tables are refused.
#[test]
fn settings_read_from_a_name_or_one_table() {
    let read = |text: &str| serde_json::from_value::<StreamSettings>(json_of(text));
    for name in StreamSettings::NAMES {
        let settings = read(name).unwrap();
        assert_eq!(settings.name(), *name);
        assert_eq!(serde_json::to_value(&settings).unwrap(), json_of(name));
    }
    let table = read("{ tree = { rounds = 3 } }").unwrap();
    assert_eq!(
        serde_json::to_string(&table).unwrap(),
        r#"{"tree":{"rounds":3}}"#
    );
    let unknown = read("{ banded = { bandz = 3 } }").unwrap_err().to_string();
    assert!(unknown.contains("unknown field `bandz`"), "{unknown}");
    let two = serde_json::json!({"tree": {}, "banded": {}});
    let two = serde_json::from_value::<StreamSettings>(two).unwrap_err();
    assert!(two.to_string().contains("not two"), "{two}");
    assert!(read("fractal").unwrap_err().to_string().contains("tree"));
}

/// A period that cannot be defaulted must be given, and asynchronous steps must fill.
#[test]
fn periods_default_to_one_pass_and_asynchronous_steps_must_fill() {
    let mut unknown = run();
    unknown.one_pass = None;
    let tree = StreamSettings::default();
    let err = AnyStream::plan(&tree, &unknown).unwrap_err();
    assert!(err.0.contains("rounds is needed"), "{err}");
    let mut buffered = run();
    buffered.buffer = Some((10, 100));
    let eleven = StreamSettings::Tree(TreeSettings { rounds: Some(11) });
    let err = AnyStream::plan(&eleven, &buffered).unwrap_err();
    assert!(
        err.0.contains("rounds (11) times the buffer's size (10)"),
        "{err}"
    );
}
