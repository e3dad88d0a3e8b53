//! Every shipped configuration parses and passes start-up validation (including, for private
//! runs, that the budget allows at least one round), and its network fits MNIST.

use fl_datasets::DataSource;
use fl_model::Shape;
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

/// The run configuration of the Kubernetes manifests (`deploy/k8s/config.yaml`'s `run.toml`)
/// parses and passes start-up validation, with its run folder on the server's volume.
#[test]
fn the_kubernetes_run_config_is_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let yaml = std::fs::read_to_string(root.join("deploy/k8s/config.yaml")).unwrap();
    let toml: String = (yaml.lines())
        .skip_while(|l| l.trim() != "run.toml: |")
        .skip(1)
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();
    assert!(toml.contains("[server]"), "no run.toml in config.yaml");
    let path = std::env::temp_dir().join(format!("fl-k8s-run-{}.toml", std::process::id()));
    std::fs::write(&path, toml).unwrap();
    let config = RunConfig::load(&path).unwrap_or_else(|e| panic!("deploy/k8s/config.yaml: {e}"));
    std::fs::remove_file(&path).unwrap();
    assert!(config.server.out.starts_with("/runs"));
    assert_eq!(config.server.listen, "0.0.0.0:50051");
}

/// A configuration's relative paths resolve against its own folder, so the shipped configs find
/// the shipped MNIST from any current directory; an override on the command line stays relative
/// to the current directory.
#[test]
fn a_configs_relative_paths_resolve_against_its_folder() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/quickstart.toml");
    for name in [
        "quickstart",
        "geyer-k100",
        "secagg",
        "ldp-laplace",
        "dp-ftrl",
    ] {
        let path = path.with_file_name(format!("{name}.toml"));
        let config = RunConfig::load(&path).unwrap();
        let DataSource::Mnist(dir) = &config.data.source else {
            panic!("{name}: not MNIST")
        };
        assert!(dir.starts_with(path.parent().unwrap()), "{}", dir.display());
        assert!(
            dir.join("train-labels-idx1-ubyte.gz").is_file(),
            "{name}: {}",
            dir.display()
        );
    }
    let overridden = RunConfig::load_with(&path, &["data.source=\"mnist:elsewhere\"".into()]);
    assert_eq!(
        overridden.unwrap().data.source.to_string(),
        "mnist:elsewhere"
    );
}
