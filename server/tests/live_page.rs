//! The live run page from the outside: it answers only with the operator's token, and what it
//! shows of a private run is exactly what the release boundary has let out, the published
//! rounds as `metrics.jsonl` has them and the ledger entries of those rounds only, never the
//! next round's entry, which the ledger holds before the round is published.

use crate::support;

use fl_server::config::PrivacyMode;
use fl_server::credentials::Token;
use fl_server::output::RoundMetrics;
use std::path::Path;
use std::sync::{Arc, Mutex};

const TOKEN: &str = "an operator token long enough to be a secret";
/// `Basic base64("ops:" + TOKEN)`.
const BASIC: &str = "Basic b3BzOmFuIG9wZXJhdG9yIHRva2VuIGxvbmcgZW5vdWdoIHRvIGJlIGEgc2VjcmV0";

/// The body of an HTTP response that must have status 200.
fn body(response: &str) -> &str {
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response.split_once("\r\n\r\n").unwrap().1
}

/// The rounds of the ledger file, in order.
fn ledger_rounds(out: &Path) -> Vec<u64> {
    let text = std::fs::read_to_string(out.join("ledger.jsonl")).unwrap();
    (text.lines())
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["round"].as_u64())
        .map(Option::unwrap)
        .collect()
}

/// The run folder and configuration of a 3-client federation of `rounds` rounds with its page on
/// a free loopback port.
fn with_page(name: &str, rounds: u64) -> (std::path::PathBuf, fl_server::config::RunConfig) {
    let out = std::env::temp_dir().join(format!("fl-live-page-{name}-{}", std::process::id()));
    let mut config = support::evil_config(&out);
    config.server.rounds = rounds;
    config.server.page_listen = Some(support::free_loopback_addr());
    (out, config)
}

/// What the page's JSON and the run folder held when round `round` was published.
struct Seen {
    round: u64,
    /// Round 1 only: the answers to requests with and without credentials.
    answers: Vec<(&'static str, String)>,
    page: serde_json::Value,
    metrics: Vec<RoundMetrics>,
    ledger_file: Vec<u64>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_published_rounds_behind_the_operator_token() {
    let (out, mut config) = with_page("shows", 3);
    let page_addr = config.server.page_listen.clone().unwrap();
    config.server.metrics_listen = Some(support::free_loopback_addr());
    config.server.operator_token = Some(Token::new(TOKEN));
    config.privacy.mode = PrivacyMode::Central;
    config.privacy.noise_multiplier = 2.0.into();
    let metrics_addr = config.server.metrics_listen.clone().unwrap();
    let data = Arc::new(support::blobs(300));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (record, addr, dir) = (seen.clone(), page_addr.clone(), out.clone());
    let metrics = metrics_addr.clone();
    // The observer runs on the round loop's worker, right after the page and metrics.jsonl got
    // the round: the blocking request hands that worker's queued tasks to another thread first.
    let observer: fl_server::Observer = Arc::new(move |m| {
        let bearer = format!("Bearer {TOKEN}");
        let response =
            tokio::task::block_in_place(|| support::http_get(&addr, "/api/run", Some(&bearer)));
        let requests = [
            ("page without a token", &addr, "/", None),
            (
                "wrong bearer",
                &addr,
                "/api/run",
                Some("Bearer not-the-token"),
            ),
            (
                "wrong password",
                &addr,
                "/api/run",
                Some("Basic b3BzOm5vcGU="),
            ),
            ("metrics without a token", &metrics, "/metrics", None),
            ("page", &addr, "/", Some(BASIC)),
            ("script", &addr, "/page.js", Some(BASIC)),
            ("metrics", &metrics, "/metrics", Some(bearer.as_str())),
        ];
        let answers = (requests.into_iter())
            .filter(|_| m.round == 1)
            .map(|(what, at, path, auth)| {
                let got = tokio::task::block_in_place(|| support::http_get(at, path, auth));
                (what, got)
            })
            .collect();
        record.lock().unwrap().push(Seen {
            round: m.round,
            answers,
            page: serde_json::from_str(body(&response)).unwrap(),
            metrics: support::read_metrics(&dir),
            ledger_file: ledger_rounds(&dir),
        });
    });
    let server = support::start_server(config, data.clone(), Some(observer), None).await;
    let clients = support::spawn_clients(&server.endpoint, &data, 3, None);
    let summary = support::finished(server.handle).await;
    for c in clients {
        c.await.unwrap().unwrap();
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    let answer = |what: &str| {
        let (_, response) = seen[0].answers.iter().find(|(w, _)| *w == what).unwrap();
        response.as_str()
    };
    // Refused without the token or with a wrong one, on the metrics endpoint too.
    for what in [
        "page without a token",
        "wrong bearer",
        "wrong password",
        "metrics without a token",
    ] {
        let response = answer(what);
        assert!(response.starts_with("HTTP/1.1 401"), "{what}: {response}");
        assert!(response.contains("www-authenticate: Basic"), "{response}");
    }
    // A browser's Basic credentials open the page and its script; a Bearer token the metrics.
    assert!(body(answer("page")).contains("<script src=\"page.js\""));
    assert!(answer("page").contains("content-security-policy: default-src 'none'"));
    assert!(body(answer("script")).contains("api/run"));
    assert!(body(answer("metrics")).contains("fl_rounds_total"));
    for s in seen.iter() {
        let run = &s.page["run"];
        assert_eq!(run["mode"], "central");
        assert_eq!(run["budget"]["epsilon"]["epsilon"], 8.0);
        assert!(run["config"]["server"].get("operator_token").is_none());
        // Exactly the rounds published so far, as metrics.jsonl has them.
        let rounds: Vec<RoundMetrics> = serde_json::from_value(s.page["rounds"].clone()).unwrap();
        assert_eq!(rounds, s.metrics, "round {}", s.round);
        assert_eq!(rounds.last().unwrap().round, s.round);
        // The ledger entries of published rounds only, though the file may hold the next one.
        let shown: Vec<u64> = (s.page["ledger"].as_array().unwrap().iter())
            .map(|e| e["round"].as_u64().unwrap())
            .collect();
        let published: Vec<u64> = (s.ledger_file.iter().copied())
            .filter(|&r| r <= s.round)
            .collect();
        assert_eq!(shown, published, "round {}", s.round);
        assert_eq!(s.page["connected"], 3);
    }
    // Rounds 1 and 2 were published after round 2's and 3's entries were written.
    assert_eq!(seen[0].ledger_file, [1, 2]);
    assert_eq!(seen[1].ledger_file, [1, 2, 3]);
    assert_eq!(
        seen[2].page["rounds"][0]["epsilon"].as_f64(),
        seen[2].metrics[0].epsilon
    );
    assert_eq!(summary.rounds_completed, 3);
    std::fs::remove_dir_all(&out).unwrap();
}

/// `GET /api/run?after=N` leaves out the rounds the page already has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_asks_only_for_new_rounds() {
    let (out, config) = with_page("after", 2);
    let page_addr = config.server.page_listen.clone().unwrap();
    let data = Arc::new(support::blobs(300));
    let after = Arc::new(Mutex::new(None));
    let (record, addr) = (after.clone(), page_addr.clone());
    let observer: fl_server::Observer = Arc::new(move |m| {
        if m.round == 2 {
            let response =
                tokio::task::block_in_place(|| support::http_get(&addr, "/api/run?after=1", None));
            *record.lock().unwrap() = Some(body(&response).to_owned());
        }
    });
    let server = support::start_server(config, data.clone(), Some(observer), None).await;
    let clients = support::spawn_clients(&server.endpoint, &data, 3, None);
    support::finished(server.handle).await;
    for c in clients {
        c.await.unwrap().unwrap();
    }
    let page: serde_json::Value =
        serde_json::from_str(after.lock().unwrap().as_deref().unwrap()).unwrap();
    let rounds = page["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 1);
    assert_eq!(rounds[0]["round"], 2);
    // A run without a ledger shows none.
    assert!(page["run"]["budget"].is_null());
    assert_eq!(page["ledger"].as_array().unwrap().len(), 0);
    std::fs::remove_dir_all(&out).unwrap();
}
