//! The `fl-client` binary refuses unusable command lines with a clear message and a failing exit
//! status, before touching the network.

use std::process::Command;

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fl-client"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn refuses_bad_data_and_partition_specs() {
    let mnist = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/mnist");
    let data = format!("mnist:{mnist}");
    let cases: [(&[&str], &str); 5] = [
        (
            &["--data", "ftp:somewhere"],
            "expected `mnist:DIR` or `csv:FILE`",
        ),
        (&["--data", "mnist:/nonexistent"], "nonexistent"),
        (
            &["--data", &data, "--partition", "shards:10:10"],
            "index must be below K",
        ),
        (
            &["--data", &data, "--simulate", "2"],
            "--simulate needs --partition",
        ),
        (
            &[
                "--data",
                &data,
                "--partition",
                "shards:10:9",
                "--simulate",
                "2",
            ],
            "runs past K",
        ),
    ];
    for (args, expected) in cases {
        let (ok, stderr) = run(args);
        assert!(!ok, "{args:?} should fail");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}
