//! The example as a user runs it: its binary, three processes, against a server on the example's
//! own configuration; the federation trains, every process exits 0, and the clients log.

use fl_server::config::RunConfig;
use std::path::Path;
use std::process::Stdio;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sites_with_their_own_training_code_train_the_servers_model() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("own-trainer-{}", std::process::id()));
    let mut config = RunConfig::load(&here.join("server.toml")).unwrap();
    config.server.out = out.clone();
    config.server.rounds = 3;
    let test = config.data.source.load_test().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (_stop, stop) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(fl_server::serve(
        listener,
        config,
        Some(test.into()),
        None,
        None,
        stop,
    ));
    // Thirty shares of MNIST, three of them taking part: 2,000 images a site keeps the test short.
    let sites: Vec<_> = (0..3)
        .map(|site| {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_own-trainer"))
                .args(["--server", &format!("http://127.0.0.1:{port}")])
                .args(["--site", &site.to_string(), "--sites", "30"])
                .arg("--data")
                .arg(here.join("../../data/mnist"))
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        })
        .collect();
    let summary = server.await.unwrap().unwrap();
    for site in sites {
        let done = site.wait_with_output().await.unwrap();
        let log = String::from_utf8_lossy(&done.stderr);
        assert!(done.status.success(), "{log}");
        assert!(log.contains("the server ended training"), "{log}");
    }
    assert_eq!(summary.rounds_completed, 3);
    // Softmax regression reaches about 0.9 on MNIST; three rounds of one epoch over 6,000
    // images get most of the way.
    let accuracy = summary.test_accuracy.unwrap();
    assert!(accuracy > 0.8, "test accuracy {accuracy}");
    std::fs::remove_dir_all(&out).unwrap();
}
