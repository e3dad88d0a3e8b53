//! Every shipped configuration parses and passes start-up validation (including, for private
//! runs, that the budget allows at least one round).

use fl_server::config::RunConfig;
use std::path::Path;

#[test]
fn shipped_configs_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            RunConfig::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            seen += 1;
        }
    }
    assert!(
        seen >= 5,
        "expected the quickstart and the Geyer configs, found {seen}"
    );
}
