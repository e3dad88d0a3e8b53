//! End to end with real binaries: one `fl-server` process and several `fl-client` processes on
//! loopback (the server binds port 0 and prints the address), a few rounds of FedAvg on MNIST;
//! accuracy rises and the run folder is complete. SIGTERM stops a training server in order.
//! `fl-client` refuses unusable privacy limits.

use crate::procs;

use procs::{bin, signal, start_client, start_server, wait};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

#[test]
fn server_and_client_processes_train_mnist() {
    let out = std::env::temp_dir().join(format!("fl-processes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let data = procs::mnist();
    let out_arg = out.display().to_string();
    let (mut server, addr) = start_server(
        "server",
        &[
            "--listen",
            "127.0.0.1:0",
            "--clients",
            "4",
            "--clients-per-round",
            "3",
            "--rounds",
            "4",
            "--model",
            "logistic",
            "--epochs",
            "1",
            "--batch-size",
            "50",
            "--lr",
            "0.05",
            "--seed",
            "7",
            "--data",
            &data,
            "--out",
            &out_arg,
        ],
    );

    // Three processes: two single clients and one simulating two clients.
    let client = |index: usize, simulate: usize| {
        let partition = format!("iid:4:{index}");
        let simulate = simulate.to_string();
        start_client(
            &format!("client-{index}"),
            &addr,
            &[
                "--partition",
                &partition,
                "--simulate",
                &simulate,
                "--seed",
                "3",
            ],
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

/// SIGTERM (docker's and Kubernetes' stop) ends a training server in order: it exits by itself,
/// with its summary and checkpoint written, instead of being killed by the signal.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn sigterm_stops_a_training_server_in_order() {
    use std::os::unix::process::ExitStatusExt;
    let out = std::env::temp_dir().join(format!("fl-sigterm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let data = procs::mnist();
    let out_arg = out.display().to_string();
    let (mut server, addr) = start_server(
        "sigterm-server",
        &[
            "--listen",
            "127.0.0.1:0",
            "--clients",
            "2",
            "--clients-per-round",
            "2",
            "--rounds",
            "1000",
            "--model",
            "logistic",
            "--data",
            &data,
            "--out",
            &out_arg,
        ],
    );
    let mut client = start_client(
        "sigterm-client",
        &addr,
        &["--partition", "iid:2:0", "--simulate", "2"],
    );
    let metrics = out.join("metrics.jsonl");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while std::fs::read_to_string(&metrics).map_or(true, |m| m.lines().count() < 2) {
        assert!(std::time::Instant::now() < deadline, "no round recorded");
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(&server, libc::SIGTERM);
    let status = wait(&mut server, Duration::from_secs(30));
    assert_eq!(status.signal(), None, "killed by the signal: {status:?}");
    // Ended by itself, saying it was interrupted (128 + SIGTERM's 15) and how to resume.
    assert_eq!(status.code(), Some(143), "{status:?}");
    let mut said = String::new();
    std::io::Read::read_to_string(server.0.stdout.as_mut().unwrap(), &mut said).unwrap();
    assert!(said.contains("interrupted by SIGTERM"), "{said}");
    assert!(
        said.contains(&format!("fl-server --resume {out_arg}")),
        "{said}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let rounds = summary["rounds_completed"].as_u64().unwrap();
    assert!((2..1000).contains(&rounds), "{summary}");
    assert_eq!(summary["stopped_by"], "interrupted");
    assert!(out.join("checkpoint.safetensors").is_file());
    // Told the server will be resumed, the clients wait to reconnect instead of exiting.
    assert!(client.0.try_wait().unwrap().is_none(), "the client exited");
    std::fs::remove_dir_all(&out).unwrap();
}

/// What the server printed on stdout after its address line.
fn stdout_of(server: &mut procs::Reaper) -> String {
    let mut said = String::new();
    std::io::Read::read_to_string(server.0.stdout.as_mut().unwrap(), &mut said).unwrap();
    said
}

/// Ctrl-C before the first round and again in the middle of the run: each time the server
/// exits 130 with its resume command, the client process (never restarted) waits, and the
/// resumed server finishes the run with it.
#[test]
fn interrupted_servers_resume_with_the_same_client_processes() {
    let out = std::env::temp_dir().join(format!("fl-interrupt-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let (addr, data, out_arg) = (
        procs::reusable_address(),
        procs::mnist(),
        out.display().to_string(),
    );
    let fresh = [
        "--listen",
        &addr,
        "--clients",
        "2",
        "--clients-per-round",
        "2",
        "--rounds",
        "3",
        "--model",
        "logistic",
        "--data",
        &data,
        "--out",
        &out_arg,
    ];
    let resume = ["--resume", out_arg.as_str(), "--listen", &addr];
    let interrupt = |server: &mut procs::Reaper, when: &str| {
        signal(server, libc::SIGINT);
        assert_eq!(wait(server, Duration::from_secs(30)).code(), Some(130));
        let said = stdout_of(server);
        assert!(said.contains(when), "{said}");
        assert!(
            said.contains(&format!("resume with: fl-server --resume {out_arg}")),
            "{said}"
        );
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let until = |done: &dyn Fn() -> bool| {
        while !done() {
            assert!(std::time::Instant::now() < deadline, "timed out");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // Round 0's checkpoint is written once the server has started (its signal handler set).
    let (mut server, _) = start_server("interrupt-1", &fresh);
    until(&|| out.join("checkpoint.safetensors").is_file());
    interrupt(&mut server, "before a round");

    let (mut server, _) = start_server("interrupt-2", &resume);
    let mut client = start_client(
        "interrupt-client",
        &addr,
        &["--partition", "iid:2:0", "--simulate", "2"],
    );
    let rounds =
        || std::fs::read_to_string(out.join("metrics.jsonl")).map_or(0, |m| m.lines().count());
    until(&|| rounds() >= 1);
    interrupt(&mut server, "interrupted by SIGINT after");
    assert!(client.0.try_wait().unwrap().is_none(), "the client exited");

    let (mut server, _) = start_server("interrupt-3", &resume);
    assert!(wait(&mut server, Duration::from_secs(120)).success());
    assert!(wait(&mut client, Duration::from_secs(60)).success());
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        (
            summary["rounds_completed"].as_u64(),
            summary["stopped_by"].as_str()
        ),
        (Some(3), Some("rounds"))
    );
    std::fs::remove_dir_all(&out).unwrap();
}

/// `--resume-existing` (what a Kubernetes StatefulSet runs): the first start trains the configured
/// run; after SIGTERM the same command resumes it from its checkpoint instead of starting over,
/// so the run's metrics lines before the restart stay the first lines after it.
#[test]
fn resume_existing_continues_the_run_in_its_folder() {
    let dir = std::env::temp_dir().join(format!("fl-resume-existing-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("run");
    let config = dir.join("run.toml");
    let body = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nclients = 2\nclients_per_round = 2\nrounds = 1000\n\
         out = \"{}\"\n[model]\nkind = \"logistic\"\n[data]\nsource = \"{}\"\n",
        out.display(),
        procs::mnist()
    );
    std::fs::write(&config, body).unwrap();
    let metrics = out.join("metrics.jsonl");
    let read = || std::fs::read_to_string(&metrics).unwrap_or_default();
    // Runs the server until the metrics file has more than `lines` lines, then stops it.
    let run_past = |name: &str, lines: usize| {
        let args = ["--config", config.to_str().unwrap(), "--resume-existing"];
        let (mut server, addr) = start_server(name, &args);
        let client = start_client(name, &addr, &["--partition", "iid:2:0", "--simulate", "2"]);
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while read().lines().count() <= lines {
            assert!(
                std::time::Instant::now() < deadline,
                "no new round recorded"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        signal(&server, libc::SIGTERM);
        assert_eq!(wait(&mut server, Duration::from_secs(30)).code(), Some(143));
        // The client waits for the server's return; the next start has a new port.
        drop(client);
        read()
    };
    let before = run_past("resume-existing-1", 1);
    let after = run_past("resume-existing-2", before.lines().count());
    assert!(
        after.starts_with(&before),
        "the restarted server began a new run:\n{before}\n---\n{after}"
    );
    // The same command with a changed setting is refused, naming it, not resumed without it.
    let changed = Command::new(bin("fl-server"))
        .args([
            "--config",
            config.to_str().unwrap(),
            "--resume-existing",
            "--rounds",
            "3",
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&changed.stderr);
    assert_eq!(changed.status.code(), Some(1), "{said}");
    assert!(
        said.contains("differs from the one given in server.rounds"),
        "{said}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--resume DIR` keeps the run's configuration: a flag it would ignore (`--rounds`) is
/// refused, naming it, before anything starts; and a run that finished (its summary says it
/// stopped after its rounds) is said to be finished at once, not waited on.
#[test]
fn a_resume_refuses_what_it_would_ignore_and_a_finished_run() {
    let dir = std::env::temp_dir().join(format!("fl-resume-refusals-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let resume = |args: &[&str]| {
        let out = Command::new(bin("fl-server"))
            .arg("--resume")
            .arg(&dir)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, said) = resume(&["--rounds", "3", "--lr", "0.5"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("--rounds, --lr would be ignored"), "{said}");
    std::fs::write(dir.join("summary.json"), r#"{"stopped_by": "budget"}"#).unwrap();
    let (code, said) = resume(&[]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("has finished (its privacy budget is spent)"),
        "{said}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every flag the Kubernetes manifests pass (`deploy/k8s/`, and the tier's in `deploy/k8s-tier/`)
/// is one the binaries take.
#[test]
fn the_kubernetes_manifests_pass_known_flags() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifests = [
        ("server.yaml", "fl-server"),
        ("clients.yaml", "fl-client"),
        ("../k8s-tier/aggregators.yaml", "fl-server"),
        ("../k8s-tier/kustomization.yaml", "fl-server"),
    ];
    for (manifest, binary) in manifests {
        let yaml = std::fs::read_to_string(root.join("deploy/k8s").join(manifest)).unwrap();
        let help = Command::new(bin(binary)).arg("--help").output().unwrap();
        let help = String::from_utf8(help.stdout).unwrap();
        let flags: Vec<&str> = (yaml.lines())
            .filter_map(|l| l.trim().strip_prefix("- --"))
            .map(|f| f.split('=').next().unwrap())
            .collect();
        assert!(flags.len() >= 4, "{manifest}: {flags:?}");
        for flag in flags {
            assert!(
                help.contains(&format!("--{flag} ")) || help.contains(&format!("--{flag}\n")),
                "{manifest}: {binary} has no --{flag}"
            );
        }
    }
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

/// `fl-server` refuses, before it announces an address, what would fail or destroy later: a
/// folder that holds a run (its ledger left as it was), and an external model whose file it
/// cannot take. Each error is said once, naming what to do.
#[test]
fn a_server_refuses_before_it_listens() {
    let dir = std::env::temp_dir().join(format!("fl-refuse-early-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ledger = "{\"round\":1}\n";
    std::fs::write(dir.join("ledger.jsonl"), ledger).unwrap();
    let run = |args: &[&str]| {
        Command::new(bin("fl-server"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--model",
                "logistic",
                "--data",
                &procs::mnist(),
            ])
            .args(args)
            .output()
            .unwrap()
    };
    let out = dir.display().to_string();
    let refused = run(&["--out", &out]);
    let (said, printed) = (
        String::from_utf8_lossy(&refused.stderr),
        String::from_utf8_lossy(&refused.stdout),
    );
    assert!(!refused.status.success());
    assert!(!printed.contains("listening on"), "{printed}");
    for part in [out.as_str(), "--resume", "--overwrite"] {
        assert!(said.contains(part), "{said}");
    }
    assert_eq!(said.matches("holds a run").count(), 1, "{said}");
    assert_eq!(
        std::fs::read_to_string(dir.join("ledger.jsonl")).unwrap(),
        ledger
    );

    // A float tensor of another width cannot be the f32 flat vector.
    let init = dir.join("init.safetensors");
    let wide =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F64, vec![1], &[0u8; 8]).unwrap();
    std::fs::write(
        &init,
        safetensors::tensor::serialize([("w", wide)], None).unwrap(),
    )
    .unwrap();
    let config = dir.join("external.toml");
    let body = format!(
        "[server]\nout = \"{}\"\n[model]\nkind = \"external\"\ninit = \"{}\"\n",
        dir.join("external-run").display(),
        init.display()
    );
    std::fs::write(&config, body).unwrap();
    let refused = Command::new(bin("fl-server"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(!String::from_utf8_lossy(&refused.stdout).contains("listening on"));
    assert!(said.contains("tensor w is F64"), "{said}");
    assert!(!dir.join("external-run").exists(), "a half-made run folder");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A start-up that fails, on a busy port or without its test data, leaves no run folder and no
/// `runs/latest`; a start-up that succeeds makes both.
#[test]
fn a_failed_start_up_leaves_no_run_folder() {
    let cwd = std::env::temp_dir().join(format!("fl-failed-start-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cwd);
    std::fs::create_dir_all(&cwd).unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_addr = busy.local_addr().unwrap().to_string();
    let server = |listen: &str, data: &str| {
        let mut command = Command::new(bin("fl-server"));
        command.current_dir(&cwd);
        command.args(["--listen", listen, "--model", "logistic", "--data", data]);
        command.args([
            "--clients",
            "1",
            "--clients-per-round",
            "1",
            "--rounds",
            "1",
        ]);
        command
    };
    let runs = cwd.join("runs");
    let listing = || -> Vec<String> {
        (std::fs::read_dir(&runs).into_iter().flatten().flatten())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    for (listen, data, cause) in [
        (busy_addr.as_str(), procs::mnist(), "cannot listen"),
        (
            "127.0.0.1:0",
            "mnist:no-such-folder".into(),
            "no-such-folder",
        ),
    ] {
        let failed = server(listen, &data).output().unwrap();
        let said = String::from_utf8_lossy(&failed.stderr);
        assert!(!failed.status.success());
        assert!(said.contains(cause), "{said}");
        assert_eq!(listing(), Vec::<String>::new(), "after: {said}");
    }
    drop(busy);
    // A server that starts (and then waits for its client) makes its folder and the link.
    let mut started = procs::Reaper(
        (server("127.0.0.1:0", &procs::mnist()).stdout(std::process::Stdio::piped()))
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(started.0.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("listening on"), "{line}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::fs::read_link(runs.join("latest")).is_err() {
        assert!(std::time::Instant::now() < deadline, "no runs/latest");
        std::thread::sleep(Duration::from_millis(50));
    }
    let latest = std::fs::read_link(runs.join("latest")).unwrap();
    assert!(runs.join(&latest).is_dir());
    assert_eq!(listing().len(), 2, "{:?}", listing());
    drop(started);
    std::fs::remove_dir_all(&cwd).unwrap();
}

/// An enrollment file with an unknown key is refused before the server listens, on one line
/// naming the file and the key.
#[test]
fn a_bad_enrollment_file_is_refused_before_listening() {
    let dir = std::env::temp_dir().join(format!("fl-bad-enrollment-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("clients.toml");
    std::fs::write(&file, "[[client]]\nname = \"hospital-1\"\ntokn = \"x\"\n").unwrap();
    let out = Command::new(bin("fl-server"))
        .args(["--listen", "127.0.0.1:0", "--out"])
        .arg(dir.join("run"))
        .arg("--enrollment")
        .arg(&file)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stdout.contains("listening on"), "{stdout}");
    let error: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(error.len(), 1, "{stderr}");
    assert!(error[0].contains("unknown field `tokn`"), "{stderr}");
    assert!(error[0].contains(&file.display().to_string()), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}
