//! End to end with real binaries: one `fl-server` process and several `fl-client` processes on
//! loopback (the server binds port 0 and prints the address), a few rounds of FedAvg on MNIST;
//! accuracy rises and the run folder is complete. `fl-client` refuses unusable privacy limits.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn bin(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_fl-server")).with_file_name(name);
    assert!(
        path.exists(),
        "{} missing: build the workspace's binaries first (`cargo test --workspace` does)",
        path.display()
    );
    path
}

/// Kills the child when the test ends, whatever happens.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait(child: &mut Reaper, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "process did not finish within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn server_and_client_processes_train_mnist() {
    let mnist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    let out = std::env::temp_dir().join(format!("fl-processes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let data = format!("mnist:{}", mnist.display());
    let mut server = Reaper(
        Command::new(bin("fl-server"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--clients",
                "4",
                "--clients-per-round",
                "3",
            ])
            .args([
                "--rounds",
                "4",
                "--model",
                "logistic",
                "--epochs",
                "1",
                "--batch-size",
                "50",
            ])
            .args(["--lr", "0.05", "--seed", "7", "--data", &data])
            .arg("--out")
            .arg(&out)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(server.0.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();

    // Three processes: two single clients and one simulating two clients.
    let client = |index: usize, simulate: usize| {
        Reaper(
            Command::new(bin("fl-client"))
                .args(["--server", &format!("http://{addr}"), "--data", &data])
                .args(["--partition", &format!("iid:4:{index}")])
                .args(["--simulate", &simulate.to_string(), "--seed", "3"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let mut clients = [client(0, 1), client(1, 1), client(2, 2)];

    assert!(wait(&mut server, Duration::from_secs(240)).success());
    for c in &mut clients {
        assert!(
            wait(c, Duration::from_secs(30)).success(),
            "client exit status"
        );
    }

    for file in ["metrics.jsonl", "summary.json", "model.safetensors"] {
        assert!(
            out.join(file).is_file(),
            "{file} missing from the run folder"
        );
    }
    let accuracies: Vec<f64> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["test_accuracy"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert_eq!(accuracies.len(), 4);
    assert!(
        accuracies[3] > accuracies[0] && accuracies[3] > 0.75,
        "accuracy did not rise: {accuracies:?}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["rounds_completed"], 4);
    assert_eq!(summary["client_updates"], 12);
    assert_eq!(summary["stopped_by"], "rounds");
    assert_eq!(summary["test_accuracy"].as_f64().unwrap(), accuracies[3]);
    for key in ["epsilon", "delta", "accountant", "clip_mode"] {
        assert!(
            summary[key].is_null(),
            "{key} should be null in a non-private run"
        );
    }
    let model = std::fs::read(out.join("model.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(model[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&model[8..8 + header_len]).unwrap();
    assert_eq!(
        header["layers.0.weight"]["shape"],
        serde_json::json!([784, 10])
    );
    std::fs::remove_dir_all(&out).unwrap();
}

/// `fl-client` refuses unusable privacy limits before it loads data or connects.
#[test]
fn client_refuses_unusable_privacy_limits() {
    for (flag, value, message) in [
        ("--epsilon", "0", "local epsilon = 0"),
        ("--epsilon", "-1", "local epsilon = -1"),
        ("--clip-bound", "0", "clip bound C = 0"),
        ("--delta", "1", "local delta = 1"),
    ] {
        let out = Command::new(bin("fl-client"))
            .args(["--data", "mnist:/nonexistent", "--privacy", "ldp-gaussian"])
            .arg(format!("{flag}={value}"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {value} accepted");
        assert!(stderr.contains(message), "{flag} {value}: {stderr}");
    }
}
