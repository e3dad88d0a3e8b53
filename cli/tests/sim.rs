//! `fl sim` runs the real server and clients over loopback and writes a complete run folder whose
//! summary has every key the run folder reference promises to scripts (docs/src/reference/run-folder.md).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `fl sim` on a config made of `body` with the shipped MNIST as data split by
/// `partition`; returns the run folder (inside `dir`) and its parsed `summary.json`. No client
/// is reported dropped, not even as it hangs up after its Shutdown (every client of these runs
/// is honest; a simulated dropout leaves a round, not its stream).
fn sim(dir: &Path, partition: &str, body: &str) -> (PathBuf, serde_json::Value) {
    std::fs::create_dir_all(dir).unwrap();
    let mnist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    let config = dir.join("run.toml");
    let data = format!(
        "[data]\nsource = \"mnist:{}\"\npartition = \"{partition}\"\n",
        mnist.display()
    );
    std::fs::write(&config, format!("{body}\n{data}")).unwrap();
    let out = dir.join("run");
    let run = Command::new(env!("CARGO_BIN_EXE_fl"))
        .arg("sim")
        .arg("--config")
        .arg(&config)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{log}");
    assert!(!log.contains("dropping client"), "{log}");
    // A signed simulation says so as it starts.
    let signed = log.contains("secure rounds signed by an authority");
    assert_eq!(signed, body.contains("sim_signed = true"), "{log}");
    let summary =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    (out, summary)
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("fl-sim-{name}-{}", std::process::id()))
}

#[test]
fn sim_writes_a_complete_run_folder() {
    let dir = temp("plain");
    let (out, summary) = sim(
        &dir,
        "dirichlet:1.0",
        "[server]\nclients = 5\nclients_per_round = 3\n\
         rounds = 3\nseed = 1\n[model]\nkind = \"logistic\"\n[train]\nepochs = 1\nbatch_size = 50",
    );
    for file in [
        "metrics.jsonl",
        "summary.json",
        "model.safetensors",
        "accuracy.svg",
    ] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    for key in [
        "rounds_completed",
        "test_accuracy",
        "test_loss",
        "epsilon",
        "delta",
        "accountant",
        "sampling",
        "clip_mode",
        "clip_bound_leaks",
        "stopped_by",
        "client_updates",
        "bytes_up",
        "bytes_down",
        "wall_seconds",
        "config",
    ] {
        assert!(summary.get(key).is_some(), "summary.json lacks `{key}`");
    }
    assert_eq!(summary["rounds_completed"], 3);
    assert_eq!(summary["client_updates"], 9);
    assert_eq!(summary["config"]["server"]["clients"], 5);
    assert_eq!(summary["config"]["data"]["partition"], "dirichlet:1");
    assert!(
        summary["test_accuracy"].as_f64().unwrap() > 0.6,
        "{summary}"
    );
    let svg = std::fs::read_to_string(out.join("accuracy.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("<polyline"),
        "no curve in the plot"
    );
    // Compared by epsilon, a run without privacy is named as such, with the axes that work.
    let compared = Command::new(env!("CARGO_BIN_EXE_fl"))
        .args(["compare", "--x", "epsilon", "--out"])
        .arg(dir.join("c.svg"))
        .arg(format!("plain={}", out.display()))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&compared.stderr);
    assert!(!compared.status.success());
    assert!(said.contains("is not a private run"), "{said}");
    assert!(said.contains("--x round or --x megabytes"), "{said}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn private_sim_reports_its_privacy_and_plots_it() {
    let dir = temp("private");
    let (out, summary) = sim(
        &dir,
        "iid",
        "[server]\nclients = 5\nclients_per_round = 3\nrounds = 3\n\
         [model]\nkind = \"logistic\"\n[train]\nepochs = 1\nbatch_size = 50\n\
         [privacy]\nmode = \"central\"\nnoise_multiplier = 2.0\nepsilon = 50.0",
    );
    // The privacy plot draws the budget, and its rounds are whole numbers (the y labels carry
    // a decimal point, so a bare "2" is an x tick).
    let svg = std::fs::read_to_string(out.join("privacy.svg")).unwrap();
    let texts: Vec<&str> = svg.lines().map(str::trim).collect();
    assert!(texts.contains(&"budget"), "no budget line");
    assert!(
        ["1", "2", "3"].iter().all(|t| texts.contains(t)),
        "round ticks"
    );
    assert!(
        !texts.contains(&"0.5") && !texts.contains(&"2.5"),
        "fractional round ticks"
    );
    assert!(out.join("ledger.jsonl").is_file());
    assert_eq!(summary["accountant"], "pld");
    assert_eq!(summary["sampling"], "poisson");
    assert_eq!(summary["clip_mode"], "fixed");
    assert!(summary["epsilon"].as_f64().unwrap() > 0.0);
    assert_eq!(summary["delta"], 1e-5);
    // `fl plot` says what it wrote; a ledger that is not there is named.
    let fl = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_fl"))
            .args(args)
            .output()
            .unwrap()
    };
    let plotted = fl(&["plot", out.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&plotted.stdout);
    for file in ["accuracy.svg", "privacy.svg"] {
        let line = format!("wrote {}", out.join(file).display());
        assert!(said.lines().any(|l| l == line), "{said}");
    }
    std::fs::remove_file(out.join("ledger.jsonl")).unwrap();
    let missing = fl(&["privacy", "ledger", out.to_str().unwrap(), "--verify"]);
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success());
    assert!(
        said.contains(&out.join("ledger.jsonl").display().to_string()),
        "{said}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A deployment's config runs as a simulation unchanged: its TLS settings are for network
/// connections, and the simulated clients connect in-process. The key and certificate named here
/// do not exist, so the run also shows they are not read.
#[test]
fn sim_runs_a_config_that_sets_tls() {
    let dir = temp("tls");
    let (missing_cert, missing_key) = (dir.join("absent-cert.pem"), dir.join("absent-key.pem"));
    let (_, summary) = sim(
        &dir,
        "iid",
        &format!(
            "[server]\nclients = 3\nclients_per_round = 3\nrounds = 2\n\
             tls_cert = \"{}\"\ntls_key = \"{}\"\n\
             [model]\nkind = \"logistic\"\n[train]\nepochs = 1\nbatch_size = 50",
            missing_cert.display(),
            missing_key.display()
        ),
    );
    assert_eq!(summary["rounds_completed"], 2, "{summary}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Secure aggregation over real gRPC streams: 10 of 10 clients per round, 30% of them dropped by
/// the injector after sharing their keys. Every round's unmasked sum equals the survivors' plain
/// quantised sum exactly (error 0), the dropped clients' masks are all recovered, and the model
/// still learns.
#[test]
fn secure_aggregation_sums_are_exact_under_dropouts() {
    let dir = temp("secagg");
    let (_, summary) = sim(
        &dir,
        "iid",
        "[server]\nclients = 10\nclients_per_round = 10\nrounds = 3\nseed = 2\n\
         [model]\nkind = \"logistic\"\n[train]\nepochs = 1\nbatch_size = 20\n\
         [privacy]\nmode = \"secagg\"\nclip_bound = 10.0\n\
         [secagg]\nsim_dropout = 0.3\nsim_dropout_stage = \"after-shares\"",
    );
    let secagg = &summary["secagg"];
    assert_eq!(secagg["rounds"], 3, "{summary}");
    assert_eq!(secagg["aborted_rounds"], 0);
    assert_eq!(secagg["dropouts_recovered"], 9);
    assert_eq!(secagg["max_abs_error"], 0);
    assert_eq!(summary["client_updates"], 21);
    assert!(summary["epsilon"].is_null());
    assert!(
        summary["test_accuracy"].as_f64().unwrap() > 0.6,
        "{summary}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `secagg.sim_signed`: the simulation makes its own authority (only its public key is written)
/// and certifies its clients; the signed rounds on a SecAgg+ graph stay exact with a client lost
/// after masking (its neighbours still gather t signatures on the survivor set).
#[test]
fn signed_secure_aggregation_runs_in_a_simulation() {
    let dir = temp("secagg-signed");
    let (out, summary) = sim(
        &dir,
        "iid",
        "[server]\nclients = 12\nclients_per_round = 12\nrounds = 2\nseed = 4\n\
         [model]\nkind = \"logistic\"\n[train]\nepochs = 1\nbatch_size = 20\n\
         [privacy]\nmode = \"secagg\"\nclip_bound = 10.0\n\
         [secagg]\ngraph = \"regular\"\ndegree = 6\nsim_signed = true\n\
         sim_dropout = 0.1\nsim_dropout_stage = \"after-masked\"",
    );
    let secagg = &summary["secagg"];
    assert_eq!(secagg["signed"], true, "{summary}");
    assert_eq!(secagg["rounds"], 2, "{summary}");
    assert_eq!(secagg["aborted_rounds"], 0, "{summary}");
    assert_eq!(secagg["max_abs_error"], 0);
    let public = std::fs::read_to_string(out.join("sim-authority.pub")).unwrap();
    assert_eq!(public.trim().len(), 64);
    let files: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!files.iter().any(|f| f.ends_with(".key")), "{files:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The distributed discrete Gaussian over a 64-bit ring and a SecAgg+ regular graph: sums stay
/// exact (the noise is part of each client's input) with a client lost after masking, and the
/// ledger accounts every round with the distributed mechanism.
#[test]
fn distributed_noise_on_a_sparse_graph_is_exact_and_accounted() {
    let dir = temp("secagg-ddg");
    let (out, summary) = sim(
        &dir,
        "iid",
        "[server]\nclients = 12\nclients_per_round = 12\nrounds = 2\nseed = 3\n\
         [model]\nkind = \"logistic\"\n[train]\nepochs = 1\nbatch_size = 20\n\
         [privacy]\nmode = \"secagg\"\nsampling = \"fixed\"\nnoise_multiplier = 0.5\n\
         clip_bound = 1.0\nepsilon = 1000.0\ndelta = 1e-5\n\
         [secagg]\nnoise = \"distributed\"\nbits = 64\ngraph = \"regular\"\ndegree = 6\n\
         sim_dropout = 0.1\nsim_dropout_stage = \"after-masked\"",
    );
    let secagg = &summary["secagg"];
    assert_eq!(secagg["signed"], false, "{summary}");
    assert_eq!(secagg["rounds"], 2, "{summary}");
    assert_eq!(secagg["max_abs_error"], 0);
    assert!(summary["epsilon"].as_f64().unwrap() > 0.0);
    // Each round is charged for its fewest survivors (n_min = 6 of 12) before it runs, then
    // settled for the survivors whose noise is in its sum; the ledger alone gives the summary's
    // epsilon.
    let ledger: Vec<serde_json::Value> = std::fs::read_to_string(out.join("ledger.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let charges: Vec<_> = ledger.iter().filter(|e| e["clients"] == 6).collect();
    let settlements: Vec<_> = ledger.iter().filter(|e| e["survivors"].is_u64()).collect();
    assert_eq!((charges.len(), settlements.len()), (2, 2), "{ledger:?}");
    for s in settlements {
        assert_eq!(s["charged"]["clients"], 6, "{s}");
        assert!(s["survivors"].as_u64().unwrap() > 6, "{s}");
    }
    let replayed = Command::new(env!("CARGO_BIN_EXE_fl"))
        .args(["privacy", "ledger", "--delta", "1e-5", "--json"])
        .arg(out.join("ledger.jsonl"))
        .output()
        .unwrap();
    let replayed: serde_json::Value = serde_json::from_slice(&replayed.stdout).unwrap();
    assert_eq!(replayed["epsilon"], summary["epsilon"]);
    assert_eq!(replayed["rounds"], 2);
    // Without a flag, the run's own delta (the documented `fl privacy ledger RUN_DIR`).
    let own = Command::new(env!("CARGO_BIN_EXE_fl"))
        .args(["privacy", "ledger", "--json"])
        .arg(&out)
        .output()
        .unwrap();
    let own: serde_json::Value = serde_json::from_slice(&own.stdout).unwrap();
    assert_eq!(own["epsilon"], summary["epsilon"], "{own}");
    assert_eq!(own["delta"], summary["delta"], "{own}");
    assert_eq!(own["at"], "the run's privacy.delta", "{own}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Each client-side mechanism trains logistic regression on MNIST (IID clients, all sampled every
/// round, a loose per-round epsilon) above 0.5 accuracy, and the summary reports every client's
/// composed local loss: one release per round each, `rounds` x eps for the pure mechanisms,
/// between eps and `rounds` x eps for the Gaussian one (RDP composition). SignDS, which needs many
/// clients, runs 1000 of them, and its uploads are a few bytes.
#[test]
fn client_side_mechanisms_train_and_account_per_client() {
    let runs = [
        (
            "ldp-gaussian",
            20,
            5,
            "[train]\nepochs = 1\nbatch_size = 10\n[privacy]\nmode = \"ldp-gaussian\"\n\
             [local]\nepsilon = 50.0\nclip_bound = 1.0\n",
        ),
        (
            "ldp-laplace",
            20,
            5,
            "[train]\nepochs = 1\nbatch_size = 3000\nlearning_rate = 5.0\n\
             [privacy]\nmode = \"ldp-laplace\"\n[local]\nepsilon = 5.0\nclip_bound = 10.0\n",
        ),
        (
            "iadmm",
            20,
            5,
            "[train]\nalgorithm = \"iadmm\"\n[admm]\nrho = 0.01\n\
             [privacy]\nmode = \"ldp-laplace\"\n[local]\nepsilon = 5.0\nclip_bound = 10.0\n",
        ),
        (
            "signds",
            1000,
            10,
            "[train]\nepochs = 1\nbatch_size = 10\n[privacy]\nmode = \"signds\"\n\
             [local]\nepsilon = 8.0\nratio = 0.1\nglobal_learning_rate = 2.0\n",
        ),
    ];
    for (name, clients, rounds, body) in runs {
        let dir = temp(name);
        let head = format!(
            "[server]\nclients = {clients}\nclients_per_round = {clients}\nrounds = {rounds}\n\
             seed = 3\n[model]\nkind = \"logistic\"\n"
        );
        let (out, summary) = sim(&dir, "iid", &format!("{head}{body}"));
        let accuracy = summary["test_accuracy"].as_f64().unwrap();
        assert!(accuracy > 0.5, "{name}: accuracy {accuracy}");
        let local = &summary["local_privacy"];
        let eps = local["epsilon_per_round"].as_f64().unwrap();
        let max = local["max_epsilon"].as_f64().unwrap();
        let all = rounds as f64 * eps;
        assert_eq!(local["clients"], clients, "{name}");
        assert_eq!(local["max_releases"], rounds, "{name}");
        if name == "ldp-gaussian" {
            assert!(max > eps && max < all, "{name}: {max}");
        } else {
            assert!((max - all).abs() < 1e-9, "{name}: {max}");
        }
        let per_client: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(out.join("local_privacy.json")).unwrap())
                .unwrap();
        assert_eq!(per_client.len(), clients);
        if name == "signds" {
            let per_upload = summary["bytes_up"].as_f64().unwrap() / (clients * rounds) as f64;
            assert!(per_upload < 200.0, "{per_upload} bytes per SignDS upload");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A small private run (central noise, Poisson sampling, a budget no run here reaches) of
/// `rounds` rounds on the shipped MNIST, written as `dir/run.toml`.
fn private_config(dir: &Path, rounds: u64) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let mnist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    let config = dir.join("run.toml");
    let body = format!(
        "[server]\nclients = 5\nclients_per_round = 3\nrounds = {rounds}\n\
         [model]\nkind = \"logistic\"\n[train]\nepochs = 1\nbatch_size = 50\n\
         [data]\nsource = \"mnist:{}\"\npartition = \"iid\"\n\
         [privacy]\nmode = \"central\"\nsampling = \"poisson\"\nnoise_multiplier = 1.0\n\
         clip_bound = 1.0\nepsilon = 1000.0\ndelta = 1e-5\n",
        mnist.display()
    );
    std::fs::write(&config, body).unwrap();
    config
}

/// `fl sim` with `args`, to its end.
fn fl_sim(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fl"))
        .arg("sim")
        .args(args)
        .output()
        .unwrap()
}

/// The same command again refuses the folder of a private run, naming it and both ways on, and
/// leaves its ledger as it was; `--overwrite` starts over and keeps the old ledger beside it.
#[test]
fn a_rerun_never_erases_a_private_run() {
    let dir = temp("rerun");
    let config = private_config(&dir, 2);
    let out = dir.join("run");
    let args = [
        "--config".as_ref(),
        config.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
    ];
    let first = fl_sim(&args);
    assert!(first.status.success(), "{first:?}");
    let ledger = std::fs::read_to_string(out.join("ledger.jsonl")).unwrap();
    assert_eq!(ledger.lines().count(), 2);
    let again = fl_sim(&args);
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success());
    for part in [
        out.display().to_string().as_str(),
        "--resume",
        "--overwrite",
    ] {
        assert!(said.contains(part), "{said}");
    }
    assert_eq!(said.matches("holds a run").count(), 1, "said once: {said}");
    assert_eq!(
        std::fs::read_to_string(out.join("ledger.jsonl")).unwrap(),
        ledger
    );
    let overwrite = [&args[..], &["--overwrite".as_ref()]].concat();
    let replaced = fl_sim(&overwrite);
    assert!(replaced.status.success(), "{replaced:?}");
    let archived: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("ledger-replaced-"))
        .collect();
    assert_eq!(archived.len(), 1, "{archived:?}");
    assert_eq!(std::fs::read_to_string(&archived[0]).unwrap(), ledger);
    // The new ledger verifies against its checkpoint; with its first line edited it does not.
    let verify = || {
        Command::new(env!("CARGO_BIN_EXE_fl"))
            .args(["privacy", "ledger", "--verify"])
            .arg(&out)
            .output()
            .unwrap()
    };
    let verified = verify();
    assert!(verified.status.success(), "{verified:?}");
    assert!(String::from_utf8_lossy(&verified.stdout).contains("lines = 2"));
    let path = out.join("ledger.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replacen("\"noise_multiplier\":1.0", "\"noise_multiplier\":2.0", 1),
    )
    .unwrap();
    let refused = verify();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("line 2"),
        "{refused:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each ledger line's round and mechanism (q, noise, sampling), in order.
fn ledger_events(out: &Path) -> Vec<(u64, String, String, String)> {
    let text = std::fs::read_to_string(out.join("ledger.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let field = |k: &str| v[k].to_string();
            let round = v["round"].as_u64().unwrap();
            (
                round,
                field("q"),
                field("noise_multiplier"),
                field("sampling"),
            )
        })
        .collect()
}

/// SIGINT ends `fl sim` in order (the round in progress discarded, the folder written, exit
/// 130, the command that resumes it printed), and `fl sim --resume` ends with the ledger of an
/// uninterrupted run: as many rounds, the same q and noise each round.
#[test]
fn an_interrupted_sim_resumes_to_the_ledger_of_an_uninterrupted_run() {
    const ROUNDS: u64 = 40;
    let dir = temp("interrupt");
    let config = private_config(&dir, ROUNDS);
    let out = dir.join("run");
    let sim = Command::new(env!("CARGO_BIN_EXE_fl"))
        .args(["sim", "--config"])
        .arg(&config)
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let metrics = out.join("metrics.jsonl");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::fs::read_to_string(&metrics).map_or(true, |m| m.lines().count() < 2) {
        assert!(std::time::Instant::now() < deadline, "no round recorded");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let pid = sim.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let ended = sim.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&ended.stderr);
    assert_eq!(ended.status.code(), Some(130), "{said}");
    assert!(
        said.contains(&format!("fl sim --resume {}", out.display())),
        "{said}"
    );
    // Not a terminal: one line per round, with its accuracy and the privacy spent.
    assert!(
        said.contains(&format!("round 1/{ROUNDS}: accuracy")),
        "{said}"
    );
    assert!(said.contains("epsilon"), "{said}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["stopped_by"], "interrupted");
    let cut = summary["rounds_completed"].as_u64().unwrap();
    assert!(cut < ROUNDS, "the run ended before the signal: {summary}");

    let resumed = fl_sim(&["--resume".as_ref(), out.as_os_str()]);
    assert!(resumed.status.success(), "{resumed:?}");
    let whole = dir.join("whole");
    let args = [
        "--config".as_ref(),
        config.as_os_str(),
        "--out".as_ref(),
        whole.as_os_str(),
    ];
    assert!(fl_sim(&args).status.success());
    let (events, expected) = (ledger_events(&out), ledger_events(&whole));
    assert_eq!(events.len() as u64, ROUNDS);
    assert_eq!(events, expected);
    let final_: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(final_["rounds_completed"], ROUNDS);
    assert_eq!(final_["stopped_by"], "rounds");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A busy port for the live page: the error names the listener and its address, once, and no
/// half-made run folder is left behind.
#[test]
fn a_busy_page_port_is_named_and_leaves_no_folder() {
    let dir = temp("busy");
    let config = private_config(&dir, 2);
    let out = dir.join("run");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let ended = fl_sim(&[
        "--config".as_ref(),
        config.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
        "--page-listen".as_ref(),
        addr.as_ref(),
    ]);
    let said = String::from_utf8_lossy(&ended.stderr);
    assert!(!ended.status.success());
    let named = format!("the live run page cannot listen on {addr}");
    assert_eq!(said.matches(&named).count(), 1, "{said}");
    assert_eq!(said.matches("in use").count(), 1, "said once: {said}");
    assert!(!out.exists(), "a half-made run folder");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_slow_fleet_makes_each_round_wait_for_its_clients() {
    // Every client waits 1.5 s after training (a log-normal of spread 0); logistic regression
    // trains in milliseconds, so a round without the wait takes a small part of that.
    let dir = temp("speeds");
    let (out, _) = sim(
        &dir,
        "iid",
        "[server]\nclients = 4\nclients_per_round = 4\nrounds = 2\n\
         sim_speeds = \"lognormal:1.5:0\"\n[model]\nkind = \"logistic\"\n\
         [train]\nepochs = 1\nbatch_size = 50",
    );
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2);
    for line in metrics.lines() {
        let m: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(m["seconds"].as_f64().unwrap() >= 1.5, "{line}");
        assert_eq!(m["completed"], 4, "{line}");
    }
    std::fs::remove_dir_all(dir).ok();
}
