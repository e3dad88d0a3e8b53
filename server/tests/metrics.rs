//! The Prometheus endpoint: scraped after each round of a private run, it reports the rounds,
//! the connected clients and the epsilon spent.

use crate::support;

use fl_server::config::PrivacyMode;
use std::sync::{Arc, Mutex};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_the_rounds() {
    let out = std::env::temp_dir().join(format!("fl-metrics-{}", std::process::id()));
    let metrics_addr = support::free_loopback_addr();
    let mut config = support::evil_config(&out);
    config.server.metrics_listen = Some(metrics_addr.clone());
    config.privacy.mode = PrivacyMode::Central;
    config.privacy.noise_multiplier = 2.0.into();
    let data = Arc::new(support::blobs(300));
    let scraped = Arc::new(Mutex::new(Vec::new()));
    let (seen, addr) = (scraped.clone(), metrics_addr.clone());
    // The observer runs on the round loop's worker: the blocking scrape hands that worker's
    // queued tasks (the metrics endpoint among them) to another thread first.
    let observer: fl_server::Observer = Arc::new(move |_round| {
        let text = tokio::task::block_in_place(|| support::http_get(&addr, "/metrics", None));
        seen.lock().unwrap().push(text);
    });
    let support::TestServer {
        endpoint,
        handle: server,
        stop: _stop_tx,
        ..
    } = support::start_server(config, data.clone(), Some(observer), None).await;
    let clients = support::spawn_clients(&endpoint, &data, 3, None);
    let summary = server.await.unwrap().unwrap();
    for c in clients {
        c.await.unwrap().unwrap();
    }
    let scraped = scraped.lock().unwrap();
    assert_eq!(scraped.len(), 2);
    for (i, text) in scraped.iter().enumerate() {
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        for line in [
            format!("fl_rounds_total {}", i + 1),
            format!("fl_round {}", i + 1),
            "fl_clients_connected 3".to_string(),
            format!("fl_client_updates_total {}", 3 * (i + 1)),
            format!("fl_round_duration_seconds_count {}", i + 1),
        ] {
            assert!(text.contains(&line), "{line} missing from\n{text}");
        }
    }
    let exported: f64 = scraped[1]
        .lines()
        .find_map(|l| l.strip_prefix("fl_epsilon_spent "))
        .unwrap()
        .parse()
        .unwrap();
    let epsilon = summary.epsilon.unwrap();
    assert!(
        (exported - epsilon).abs() <= 1e-12 * epsilon,
        "{exported} vs {epsilon}"
    );
    std::fs::remove_dir_all(&out).unwrap();
}
