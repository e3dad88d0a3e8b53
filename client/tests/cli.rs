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

/// A client that cannot reach its server says so once, not once per retry, and then the
/// outcome: 3 s of retries (about ten attempts) give one "not connected yet" line, each line
/// naming the client, and the error line with the reason.
#[test]
fn retries_are_said_once_and_name_the_client() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mnist = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/mnist");
    let server = format!("http://127.0.0.1:{port}");
    let (ok, said) = run(&[
        "--server",
        &server,
        "--data",
        &format!("mnist:{mnist}"),
        "--partition",
        "shards:4:0",
        "--connect-timeout",
        "3",
    ]);
    assert!(!ok, "{said}");
    assert_eq!(said.matches("not connected yet").count(), 1, "{said}");
    let logged = said.lines().filter(|l| l.contains(" INFO "));
    assert!(logged.clone().count() >= 2, "{said}");
    assert!(
        logged
            .into_iter()
            .all(|l| l.contains("client{name=client-0}")),
        "{said}"
    );
    assert!(
        said.lines()
            .last()
            .unwrap()
            .starts_with("error: client 0: no server answers"),
        "{said}"
    );
}
