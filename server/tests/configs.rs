//! Every shipped configuration parses and passes start-up validation (including, for private
//! runs, that the budget allows at least one round), and its network fits MNIST.

use fl_common::data::DataSource;
use fl_common::model::Shape;
use fl_server::config::RunConfig;
use std::path::Path;

#[test]
fn shipped_configs_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let config =
                RunConfig::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if let DataSource::Mnist(_) = config.data.source {
                let digit = Shape {
                    height: 28,
                    width: 28,
                    channels: 1,
                };
                (config.model.spec(digit, 10))
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
            seen += 1;
        }
    }
    assert!(
        seen >= 5,
        "expected the quickstart and the Geyer configs, found {seen}"
    );
}
