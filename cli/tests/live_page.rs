//! The live run page in a real browser: headless Chromium (Debian's `chromium`, which `.ci/run`
//! installs; `CHROMIUM` names another binary) opens the page of a running `fl sim` once two rounds
//! are done, runs its script, and the rounds it shows carry the test accuracy and epsilon of
//! `metrics.jsonl`; a coordinator's page lists its aggregators. Ignored by `cargo test`, as it
//! needs the browser:
//! `cargo test -p fl-cli --test live_page -- --ignored`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the simulation gets to start its page and run two rounds, and the browser to load it.
const DEADLINE: Duration = Duration::from_secs(180);

/// A child process killed when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `[privacy]` table of the run: a round-based run is central DP with a budget far off; an
/// asynchronous one has no mode (the buffer is what its page draws), and so no privacy keys,
/// which the server would refuse under mode `none`.
fn privacy(pacing: &str) -> &'static str {
    if pacing.is_empty() {
        "[privacy]\nmode = \"central\"\nnoise_multiplier = 2.0\naccountant = \"rdp\"\n\
         epsilon = 1000.0\n"
    } else {
        "[privacy]\nmode = \"none\"\n"
    }
}

/// Starts `fl sim` of a long private run in `dir` with its page on a free loopback port; returns
/// the process and the page's URL, read from its log.
fn start_sim(dir: &Path, pacing: &str) -> (Killed, String) {
    let mnist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    let config = dir.join("run.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nclients = 5\nclients_per_round = 3\nrounds = 100000\n\
             page_listen = \"127.0.0.1:0\"\n{pacing}\
             [model]\nkind = \"logistic\"\n[train]\nepochs = 1\nbatch_size = 50\n\
             {}\
             [data]\nsource = \"mnist:{}\"\npartition = \"iid\"\n",
            privacy(pacing),
            mnist.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fl"))
        .args(["sim", "--config"])
        .arg(&config)
        .arg("--out")
        .arg(dir.join("run"))
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let sim = Killed(child);
    // The line `... operator endpoint what=live run page url=http://127.0.0.1:PORT/`; the rest
    // of the log is read on, so that the simulation never writes into a closed pipe. A
    // simulation that ends before it names its page sends its whole log instead.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut log = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some((_, url)) = line.split_once("live run page url=") {
                let _ = tx.send(Ok(url.trim().to_owned()));
            }
            log += &line;
            log.push('\n');
        }
        let _ = tx.send(Err(log));
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(Ok(url)) => (sim, url),
        Ok(Err(log)) => panic!("fl sim ended before it named its page:\n{log}"),
        Err(e) => panic!("fl sim names its page in time: {e}"),
    }
}

/// The complete lines of `metrics.jsonl` in `run` (the server may be appending the next one).
fn metrics_lines(run: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap_or_default();
    let complete = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
    (complete.lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Waits until `metrics.jsonl` in `run` has `rounds` lines.
fn wait_for_rounds(run: &Path, rounds: usize, started: Instant) {
    loop {
        if metrics_lines(run).len() >= rounds {
            return;
        }
        assert!(started.elapsed() < DEADLINE, "no {rounds} rounds in time");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The page's DOM once Chromium has run its script for a few (virtual) seconds.
fn rendered(url: &str, profile: &Path) -> String {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into());
    let mut child = Command::new(&chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{chromium}: {e} (apt-get install chromium)"));
    let mut stdout = child.stdout.take().unwrap();
    let browser = Killed(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut dom = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut dom);
        let _ = tx.send(dom);
    });
    let dom = rx.recv_timeout(DEADLINE).expect("chromium answers in time");
    drop(browser);
    dom
}

/// The text of the first `<td class="{class}">` in `row`.
fn cell<'a>(row: &'a str, class: &str) -> &'a str {
    let open = format!("<td class=\"{class}\">");
    let start = row
        .find(&open)
        .unwrap_or_else(|| panic!("no {class} in {row}"))
        + open.len();
    let end = row[start..].find("</td>").unwrap() + start;
    &row[start..end]
}

#[test]
#[ignore = "needs Debian's chromium: .ci/run installs it and runs this test"]
fn chromium_shows_the_rounds_of_a_running_sim() {
    let dir = std::env::temp_dir().join(format!("fl-live-page-browser-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let started = Instant::now();
    let (sim, url) = start_sim(&dir, "");
    let run = dir.join("run");
    wait_for_rounds(&run, 2, started);
    let dom = rendered(&url, &dir.join("profile"));
    // Every round the page shows was in metrics.jsonl before; read it after the browser.
    let metrics = metrics_lines(&run);
    drop(sim);

    let rows: Vec<&str> = dom.split("<tr data-round=\"").skip(1).collect();
    assert!(rows.len() >= 2, "fewer than two rounds on the page:\n{dom}");
    for row in &rows {
        let round: usize = row[..row.find('"').unwrap()].parse().unwrap();
        let line = &metrics[round - 1];
        assert_eq!(line["round"], round);
        let accuracy = format!("{:.4}", line["test_accuracy"].as_f64().unwrap());
        let epsilon = format!("{:.4}", line["epsilon"].as_f64().unwrap());
        assert_eq!(cell(row, "accuracy"), accuracy, "round {round}");
        assert_eq!(cell(row, "epsilon"), epsilon, "round {round}");
    }
    // The newest round heads the table and the tile; the budget is drawn as the stop line.
    let newest: usize = rows[0][..rows[0].find('"').unwrap()].parse().unwrap();
    assert!(dom.contains(&format!(
        "<span id=\"round\" class=\"value\">{newest}</span>"
    )));
    assert!(dom.contains("budget ε = 1000: training stops before this line"));
    assert!(dom.contains("<span id=\"mode\" class=\"badge\">central</span>"));
    assert!(
        dom.contains("<figure id=\"buffer-figure\" hidden=\"\">"),
        "rounds have no buffer"
    );
    assert!(
        dom.contains("<section id=\"aggregators-section\" hidden=\"\">"),
        "a flat run has no aggregators"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An asynchronous run: the page draws its buffer (clients training, staleness) per server
/// step and names the buffer's size.
#[test]
#[ignore = "needs Debian's chromium: .ci/run installs it and runs this test"]
fn chromium_draws_the_buffer_of_an_asynchronous_sim() {
    let dir = std::env::temp_dir().join(format!("fl-live-page-async-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let started = Instant::now();
    let pacing = "aggregation = \"async\"\n[buffer]\nconcurrency = 3\nsize = 2\n";
    let (sim, url) = start_sim(&dir, pacing);
    wait_for_rounds(&dir.join("run"), 2, started);
    let dom = rendered(&url, &dir.join("profile"));
    drop(sim);
    assert!(
        dom.contains("<figure id=\"buffer-figure\">"),
        "no buffer figure:\n{dom}"
    );
    for legend in ["clients training", "median staleness", "max staleness"] {
        assert!(dom.contains(legend), "no {legend} on the page:\n{dom}");
    }
    assert!(dom.contains("K = 5, buffer of 2"), "{dom}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A workspace binary next to `fl` (`cargo test --workspace` builds them all).
fn binary(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_BIN_EXE_fl")).with_file_name(name)
}

/// Starts `fl-server` with `args`; returns it, the address it printed on its first line, and the
/// receiving end of its log lines.
fn start_server(args: &[&str]) -> (Killed, String, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(binary("fl-server"))
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let server = Killed(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut first = String::new();
    BufReader::new(stdout).read_line(&mut first).unwrap();
    let addr = first
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| {
            panic!("unexpected first line {first:?}");
        });
    (server, addr.to_owned(), rx)
}

/// A coordinator of two aggregators, each with two clients: the page lists each aggregator with
/// its clients and rounds.
#[test]
#[ignore = "needs Debian's chromium: .ci/run installs it and runs this test"]
fn chromium_shows_each_aggregator_of_a_tier() {
    let dir = std::env::temp_dir().join(format!("fl-live-page-tier-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mnist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    let data = format!("mnist:{}", mnist.display());
    let run = dir.join("run");
    let out = run.display().to_string();
    let started = Instant::now();
    let coordinator_args = [
        "--listen",
        "127.0.0.1:0",
        "--clients",
        "4",
        "--clients-per-round",
        "4",
        "--rounds",
        "100000",
        "--model",
        "logistic",
        "--data",
        &data,
        "--out",
        &out,
        "--aggregators",
        "2",
        "--aggregator-token",
        "secret",
        "--page-listen",
        "127.0.0.1:0",
    ];
    let (coordinator, upstream, log) = start_server(&coordinator_args);
    let url = loop {
        let line = log
            .recv_timeout(DEADLINE)
            .expect("the coordinator logs its page");
        if let Some((_, url)) = line.split_once("live run page url=") {
            break url.trim().to_owned();
        }
    };
    std::thread::spawn(move || log.into_iter().for_each(drop));
    let upstream = format!("http://{upstream}");
    let mut processes = vec![coordinator];
    for (name, first) in [("agg-a", "0"), ("agg-b", "2")] {
        let args = [
            "--role",
            "aggregator",
            "--upstream",
            &upstream,
            "--name",
            name,
            "--listen",
            "127.0.0.1:0",
            "--aggregator-token",
            "secret",
        ];
        let (aggregator, addr, _) = start_server(&args);
        let client = Command::new(binary("fl-client"))
            .args(["--server", &format!("http://{addr}"), "--data", &data])
            .args(["--partition", &format!("iid:4:{first}"), "--simulate", "2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        processes.extend([aggregator, Killed(client)]);
    }
    wait_for_rounds(&run, 2, started);
    let dom = rendered(&url, &dir.join("profile"));
    drop(processes);
    assert!(
        dom.contains("<section id=\"aggregators-section\">"),
        "no aggregators on the page:\n{dom}"
    );
    for name in ["agg-a", "agg-b"] {
        let at = dom.find(&format!("<tr data-aggregator=\"{name}\">"));
        let row = &dom[at.unwrap_or_else(|| panic!("no {name} row:\n{dom}"))..];
        let row = &row[..row.find("</tr>").unwrap()];
        let cells: Vec<&str> = (row.split("<td>").skip(1))
            .map(|c| &c[..c.find("</td>").unwrap()])
            .collect();
        // name, clients, last and median seconds, rounds summed, clients dropped, failures
        assert_eq!(cells.len(), 7, "{row}");
        assert_eq!((cells[0], cells[1]), (name, "2"), "{row}");
        assert!(cells[4].parse::<u64>().unwrap() >= 1, "{row}");
        assert_eq!((cells[5], cells[6]), ("0", "none"), "{row}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
