//! Prometheus metrics of the server (the `prometheus-client` crate, OpenMetrics text), served at
//! `GET /metrics` on `server.metrics_listen` when it is set: rounds, clients connected, privacy
//! spent, round duration, accuracy and traffic, and in asynchronous runs the staleness of updates
//! and the clients training. Nothing about an individual client is exported.

use crate::edge::shared::Shared;
use crate::records::output::{GroupMetrics, GroupOutcome, RoundMetrics};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets, linear_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// The server's metrics.
#[derive(Debug)]
pub(crate) struct Telemetry {
    registry: Registry,
    rounds: Counter,
    rounds_applied: Counter,
    client_updates: Counter,
    clients_dropped: Counter,
    bytes_received: Counter,
    bytes_sent: Counter,
    current_round: Gauge,
    clients_connected: Gauge,
    epsilon: Gauge<f64, AtomicU64>,
    delta: Gauge<f64, AtomicU64>,
    local_epsilon: Gauge<f64, AtomicU64>,
    accuracy: Gauge<f64, AtomicU64>,
    round_seconds: Histogram,
    buffer: BufferSeries,
    tier: TierMetrics,
}

/// The asynchronous runs' figures.
#[derive(Debug)]
struct BufferSeries {
    update_staleness: Histogram,
    clients_training: Gauge,
    updates_too_stale: Counter,
}

impl Default for BufferSeries {
    fn default() -> Self {
        Self {
            // Staleness 0, 1, 2, ... 15 steps.
            update_staleness: Histogram::new(linear_buckets(0.0, 1.0, 16)),
            clients_training: Gauge::default(),
            updates_too_stale: Counter::default(),
        }
    }
}

/// The labels of an aggregator's series: its name, and for failures how its part ended.
type Labels = Vec<(&'static str, String)>;

/// Each aggregator's figures (a coordinator of aggregators).
#[derive(Debug, Default)]
struct TierMetrics {
    clients: Family<Labels, Gauge>,
    round_seconds: Family<Labels, Gauge<f64, AtomicU64>>,
    dropped: Family<Labels, Counter>,
    failures: Family<Labels, Counter>,
}

impl Default for Telemetry {
    fn default() -> Self {
        let mut t = Self {
            registry: Registry::with_prefix("fl"),
            rounds: Counter::default(),
            rounds_applied: Counter::default(),
            client_updates: Counter::default(),
            clients_dropped: Counter::default(),
            bytes_received: Counter::default(),
            bytes_sent: Counter::default(),
            current_round: Gauge::default(),
            clients_connected: Gauge::default(),
            epsilon: Gauge::default(),
            delta: Gauge::default(),
            local_epsilon: Gauge::default(),
            accuracy: Gauge::default(),
            // 0.1 s to about 7 minutes.
            round_seconds: Histogram::new(exponential_buckets(0.1, 2.0, 13)),
            buffer: BufferSeries::default(),
            tier: TierMetrics::default(),
        };
        let r = &mut t.registry;
        r.register("rounds", "Rounds finished", t.rounds.clone());
        r.register(
            "rounds_applied",
            "Rounds whose aggregate updated the model",
            t.rounds_applied.clone(),
        );
        r.register(
            "client_updates",
            "Client results absorbed into aggregates",
            t.client_updates.clone(),
        );
        r.register(
            "clients_dropped",
            "Sampled clients that gave no usable result",
            t.clients_dropped.clone(),
        );
        r.register(
            "received_bytes",
            "Encoded bytes received from clients in rounds",
            t.bytes_received.clone(),
        );
        r.register(
            "sent_bytes",
            "Encoded bytes sent to clients in rounds",
            t.bytes_sent.clone(),
        );
        r.register("round", "The last round finished", t.current_round.clone());
        r.register(
            "clients_connected",
            "Clients with a live session",
            t.clients_connected.clone(),
        );
        r.register(
            "epsilon_spent",
            "Central epsilon spent so far (at the budget's delta)",
            t.epsilon.clone(),
        );
        r.register("delta_spent", "Central delta so far", t.delta.clone());
        r.register(
            "local_epsilon_max",
            "Largest composed local epsilon of any client",
            t.local_epsilon.clone(),
        );
        r.register(
            "test_accuracy",
            "Test accuracy of the global model",
            t.accuracy.clone(),
        );
        r.register(
            "round_duration_seconds",
            "Wall-clock duration of a round, evaluation included",
            t.round_seconds.clone(),
        );
        t.register_buffer();
        t.register_tier();
        t
    }
}

impl Telemetry {
    /// Registers the asynchronous runs' metrics.
    fn register_buffer(&mut self) {
        let r = &mut self.registry;
        r.register(
            "update_staleness",
            "Server steps between the model an update was trained on and the step it entered \
             (asynchronous runs)",
            self.buffer.update_staleness.clone(),
        );
        r.register(
            "clients_training",
            "Clients training when the last server step was taken (asynchronous runs)",
            self.buffer.clients_training.clone(),
        );
        r.register(
            "updates_too_stale",
            "Updates refused past buffer.max_staleness (asynchronous runs)",
            self.buffer.updates_too_stale.clone(),
        );
    }

    /// Registers the aggregator tier's metrics, labelled by aggregator.
    fn register_tier(&mut self) {
        let (r, t) = (&mut self.registry, &self.tier);
        r.register(
            "aggregator_clients",
            "An aggregator's clients connected when it was last sent a round (label aggregator: its name)",
            t.clients.clone(),
        );
        r.register(
            "aggregator_round_seconds",
            "Seconds from sending an aggregator its last answered round to its sum",
            t.round_seconds.clone(),
        );
        r.register(
            "aggregator_clients_dropped",
            "An aggregator's sampled clients that gave no result",
            t.dropped.clone(),
        );
        r.register(
            "aggregator_failures",
            "Rounds an aggregator's part failed, by outcome (lost, refused, timed_out)",
            t.failures.clone(),
        );
    }
}

impl Telemetry {
    /// Records a finished round.
    pub(crate) fn observe(&self, m: &RoundMetrics) {
        self.rounds.inc();
        if m.applied {
            self.rounds_applied.inc();
        }
        self.client_updates.inc_by(m.completed as u64);
        self.clients_dropped.inc_by(m.dropped as u64);
        self.bytes_received.inc_by(m.bytes_up);
        self.bytes_sent.inc_by(m.bytes_down);
        self.current_round.set(m.round as i64);
        if let Some(accuracy) = m.test_accuracy {
            self.accuracy.set(accuracy);
        }
        self.round_seconds.observe(m.seconds);
        if let Some(e) = m.epsilon {
            self.epsilon.set(e);
        }
        if let Some(d) = m.delta {
            self.delta.set(d);
        }
        if let Some(e) = m.local_epsilon {
            self.local_epsilon.set(e);
        }
        if let Some(b) = &m.buffer {
            for (s, &n) in b.staleness.iter().enumerate() {
                (0..n).for_each(|_| self.buffer.update_staleness.observe(s as f64));
            }
            self.buffer.clients_training.set(b.training as i64);
            self.buffer.updates_too_stale.inc_by(b.too_stale as u64);
        }
        m.groups.iter().for_each(|g| self.tier.observe(g));
    }

    /// The OpenMetrics text of every metric, with the live client count.
    pub(crate) fn render(&self, clients_connected: usize) -> String {
        self.clients_connected.set(clients_connected as i64);
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

impl TierMetrics {
    /// Records an aggregator's part of a round.
    fn observe(&self, g: &GroupMetrics) {
        let name: Labels = vec![("aggregator", g.aggregator.clone())];
        self.clients.get_or_create(&name).set(g.connected as i64);
        self.dropped.get_or_create(&name).inc_by(g.dropped as u64);
        if let Some(seconds) = g.seconds {
            self.round_seconds.get_or_create(&name).set(seconds);
        }
        if g.outcome != GroupOutcome::Summed {
            let labels = [name, vec![("outcome", g.outcome.as_str().to_owned())]].concat();
            self.failures.get_or_create(&labels).inc();
        }
    }
}

/// The router of `GET /metrics` (served by [`crate::operator::endpoint`]).
pub(crate) fn router(telemetry: Arc<Telemetry>, shared: Arc<Shared>) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || async move {
            let connected = shared.registry().connected().len();
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )],
                telemetry.render(connected),
            )
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An aggregator's part: 40 clients connected, 5 sampled, one dropped when it answered.
    fn group(name: &str, outcome: GroupOutcome) -> GroupMetrics {
        let answered = outcome == GroupOutcome::Summed;
        GroupMetrics {
            aggregator: name.into(),
            connected: 40,
            sampled: 5,
            completed: if answered { 4 } else { 0 },
            dropped: if answered { 1 } else { 5 },
            refused: 0,
            seconds: answered.then_some(0.25),
            outcome,
        }
    }

    /// A round with every optional figure: a buffer, and two aggregators, one of them lost.
    fn full_round() -> RoundMetrics {
        RoundMetrics {
            round: 3,
            connected: 12,
            sampled: 10,
            completed: 9,
            dropped: 1,
            refused: 1,
            applied: true,
            skipped: None,
            clip_bound: None,
            noise_std: None,
            epsilon: Some(1.25),
            local_epsilon: None,
            rho: None,
            delta: Some(1e-5),
            test_accuracy: Some(0.5),
            test_loss: Some(1.0),
            train_loss: None,
            v_c: None,
            u_s: None,
            bytes_up: 100,
            bytes_down: 200,
            seconds: 0.3,
            secagg: None,
            verified: None,
            federated_eval: None,
            buffer: Some(crate::records::output::BufferMetrics {
                size: 9,
                training: 4,
                staleness: vec![3, 5, 1],
                too_stale: 2,
            }),
            groups: vec![
                group("agg-a", GroupOutcome::Summed),
                group("agg-b", GroupOutcome::Lost),
            ],
        }
    }

    #[test]
    fn rounds_show_in_the_exposition() {
        let t = Telemetry::default();
        let m = full_round();
        t.observe(&m);
        t.observe(&m);
        let text = t.render(7);
        for line in [
            "fl_rounds_total 2",
            "fl_client_updates_total 18",
            "fl_round 3",
            "fl_clients_connected 7",
            "fl_epsilon_spent 1.25",
            "fl_round_duration_seconds_count 2",
            "fl_update_staleness_count 18",
            "fl_update_staleness_sum 14.0",
            "fl_clients_training 4",
            "fl_updates_too_stale_total 4",
            "fl_aggregator_clients{aggregator=\"agg-a\"} 40",
            "fl_aggregator_round_seconds{aggregator=\"agg-a\"} 0.25",
            "fl_aggregator_clients_dropped_total{aggregator=\"agg-a\"} 2",
            "fl_aggregator_clients_dropped_total{aggregator=\"agg-b\"} 10",
            "fl_aggregator_failures_total{aggregator=\"agg-b\",outcome=\"lost\"} 2",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }

    /// Every metric `deploy/grafana-dashboard.json` queries is one the server exposes.
    #[test]
    fn the_grafana_dashboard_queries_exposed_metrics() {
        let dashboard = include_str!("../../../deploy/grafana-dashboard.json");
        let text = Telemetry::default().render(0);
        let mut names: Vec<&str> = dashboard
            .match_indices("fl_")
            .map(|(at, _)| {
                let rest = &dashboard[at..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                    .unwrap_or(rest.len());
                &rest[..end]
            })
            .collect();
        names.sort_unstable();
        names.dedup();
        assert!(names.len() >= 10, "{names:?}");
        for name in names {
            let exposed = text.lines().any(|l| {
                l.strip_prefix(name)
                    .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
            });
            assert!(exposed, "the dashboard queries {name}, not in\n{text}");
        }
    }

    /// The metrics reference of the book, from the registry's own HELP and TYPE lines (after a
    /// round that has every series, labelled ones included).
    fn reference_page() -> String {
        let t = Telemetry::default();
        t.observe(&full_round());
        let text = t.render(0);
        let mut page = String::from(
            "# Prometheus metrics\n\n\
             `fl-server` serves these at `GET /metrics` when `server.metrics_listen` is set\n\
             (OpenMetrics text, behind `server.operator_token` when one is set). No metric is about\n\
             one client. Generated from the server's registry.\n\n\
             | Series | Type | Meaning |\n|---|---|---|\n",
        );
        let mut help = "";
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                help = rest.split_once(' ').map_or("", |(_, h)| h);
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
                let series = match kind {
                    "counter" => format!("`{name}_total`"),
                    "histogram" => format!("`{name}_bucket`, `{name}_sum`, `{name}_count`"),
                    _ => format!("`{name}`"),
                };
                page.push_str(&format!(
                    "| {series} | {kind} | {} |\n",
                    help.trim_end_matches('.')
                ));
            }
        }
        page
    }

    /// docs/src/reference/metrics.md is what the registry says.
    #[test]
    fn the_metrics_reference_is_current() {
        let test = "cargo test -p fl-server --lib the_metrics_reference_is_current";
        let (dir, page) = (env!("CARGO_MANIFEST_DIR"), reference_page());
        fl_common::generated_docs::assert_fresh(dir, "docs/src/reference/metrics.md", &page, test);
    }
}
