//! The live run page, served on `server.page_listen` by [`crate::operator::endpoint`]: `GET /` is one small
//! page (HTML, a script and a style sheet compiled into the server: no build step, nothing fetched
//! from elsewhere, so it works with no internet) that polls `GET /api/run?after=N` every second
//! and draws the rounds, test accuracy and loss, the privacy spent against the budget (the line
//! where training stops), the clients connected, sampled, dropped and refused per round, the
//! privacy mode with its parameters and the ledger's last entries.
//!
//! It shows what the release boundary allows and nothing more, by construction: [`LivePage`] is
//! fed only by the coordinator's `publish`, after the round's checkpoint, metrics line and ledger
//! entries are durable, with the same line `metrics.jsonl` gets, and only the ledger entries of
//! published rounds (a round's entry is written before its tasks go out, so the ledger holds the
//! next round's before this one is published). The one live figure, the clients connected, is
//! the one the metrics endpoint exports too.

use crate::config::RunConfig;
use crate::edge::shared::Shared;
use crate::records::ledger::{Ledger, LedgerEntry};
use crate::records::output::{RoundMetrics, StoppedBy};
use axum::extract::Query;
use axum::http::header;
use axum::response::IntoResponse;
use fl_model::Model;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex, MutexGuard};

/// Where the page listens when its flag is given without an address: this host only.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8080";

/// Ledger entries the page shows (the ledger keeps a few more, see `Ledger::recent_through`).
const LEDGER_TAIL: usize = 10;

/// The page's own files.
const PAGE_HTML: &str = include_str!("page.html");
const PAGE_JS: &str = include_str!("page.js");
const PAGE_CSS: &str = include_str!("page.css");

/// Nothing but the page's own files and its JSON: no inline script, no other origin, no frames.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// What the page shows: the run's description, fixed at the start, and the published rounds.
#[derive(Debug)]
pub(crate) struct LivePage {
    run: RunDescription,
    state: Mutex<PageState>,
}

/// The run as configured.
#[derive(Debug, Serialize)]
struct RunDescription {
    /// `privacy.mode`.
    mode: String,
    /// The model, e.g. `784-600-100-10`.
    model: String,
    /// K.
    clients: usize,
    /// m_t, a number or a schedule.
    clients_per_round: String,
    /// T.
    rounds: u64,
    /// The budget the ledger enforces: training stops before it would be exceeded.
    budget: Option<fl_privacy::Budget>,
    /// The accountant that reads the ledger.
    accountant: Option<String>,
    /// The `[privacy]` section.
    privacy: serde_json::Value,
    /// The whole resolved configuration, without the tokens' digests.
    config: serde_json::Value,
}

/// What the coordinator has published.
#[derive(Debug)]
struct PageState {
    rounds: Vec<RoundMetrics>,
    ledger: Vec<LedgerEntry>,
    finished: Option<StoppedBy>,
}

/// `GET /api/run`'s answer.
#[derive(Serialize)]
struct Snapshot<'a> {
    run: &'a RunDescription,
    /// Clients with a live stream now.
    connected: usize,
    /// Why training ended, once it has.
    finished: Option<StoppedBy>,
    /// The published rounds after the query's `after`.
    rounds: &'a [RoundMetrics],
    /// The last ledger entries of published rounds, oldest first.
    ledger: &'a [LedgerEntry],
}

/// `GET /api/run`'s query.
#[derive(Debug, Deserialize)]
struct SnapshotQuery {
    /// Rounds up to this one are left out (the page has them).
    #[serde(default)]
    after: u64,
}

impl LivePage {
    /// The page of the run `config` describes, training `model` under `ledger`; `earlier` are
    /// the rounds a resumed run recorded before (from its `metrics.jsonl`).
    pub(crate) fn new(
        config: &RunConfig,
        model: &Model,
        ledger: Option<&Ledger>,
        earlier: Vec<RoundMetrics>,
    ) -> std::io::Result<Self> {
        let mut whole = serde_json::to_value(config)?;
        if let Some(server) = whole.get_mut("server").and_then(|s| s.as_object_mut()) {
            server.remove("token");
            server.remove("operator_token");
        }
        // Described, not acted on: the sections as the configuration file has them.
        let privacy = serde_json::to_value(&config.privacy)?;
        let run = RunDescription {
            mode: privacy["mode"].as_str().unwrap_or_default().to_owned(),
            model: model.to_string(),
            clients: config.server.clients,
            clients_per_round: config.server.clients_per_round.to_string(),
            rounds: config.server.rounds,
            budget: ledger.map(|l| l.terms().budget),
            accountant: ledger.map(|l| l.accountant_name().to_owned()),
            privacy,
            config: whole,
        };
        let last = earlier.last().map_or(0, |m| m.round);
        let state = PageState {
            rounds: earlier,
            ledger: ledger_tail(ledger, last),
            finished: None,
        };
        Ok(Self {
            run,
            state: Mutex::new(state),
        })
    }

    /// Adds a round the coordinator published, with the ledger's entries up to it.
    pub(crate) fn publish(&self, metrics: &RoundMetrics, ledger: Option<&Ledger>) {
        let mut state = self.state();
        state.rounds.push(metrics.clone());
        state.ledger = ledger_tail(ledger, metrics.round);
    }

    /// Marks the run as ended.
    pub(crate) fn finish(&self, stopped_by: StoppedBy) {
        self.state().finished = Some(stopped_by);
    }

    /// The JSON of the page after round `after`, with `connected` clients live.
    fn snapshot(&self, after: u64, connected: usize) -> String {
        let state = self.state();
        let first = state.rounds.partition_point(|m| m.round <= after);
        let snapshot = Snapshot {
            run: &self.run,
            connected,
            finished: state.finished,
            rounds: &state.rounds[first..],
            ledger: &state.ledger,
        };
        // Plain data (numbers, strings, maps with string keys) always serialises.
        serde_json::to_string(&snapshot).unwrap_or_default()
    }

    fn state(&self) -> MutexGuard<'_, PageState> {
        // The state is replaced whole under the lock: a panic elsewhere leaves it consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The last [`LEDGER_TAIL`] entries of `ledger` up to round `round`.
fn ledger_tail(ledger: Option<&Ledger>, round: u64) -> Vec<LedgerEntry> {
    let Some(ledger) = ledger else {
        return Vec::new();
    };
    let entries: Vec<LedgerEntry> = ledger.recent_through(round).cloned().collect();
    entries[entries.len().saturating_sub(LEDGER_TAIL)..].to_vec()
}

/// The router of the page, its files and `GET /api/run`.
pub(crate) fn router(page: Arc<LivePage>, shared: Arc<Shared>) -> axum::Router {
    let file = |content_type: &'static str, body: &'static str| {
        axum::routing::get(move || async move { served(content_type, body) })
    };
    axum::Router::new()
        .route("/", file("text/html; charset=utf-8", PAGE_HTML))
        .route("/page.js", file("text/javascript; charset=utf-8", PAGE_JS))
        .route("/page.css", file("text/css; charset=utf-8", PAGE_CSS))
        .route(
            "/api/run",
            axum::routing::get(move |Query(q): Query<SnapshotQuery>| async move {
                let connected = shared.registry().connected().len();
                served("application/json", page.snapshot(q.after, connected))
            }),
        )
}

/// A response of `content_type` that no cache keeps and no other page can frame or script.
fn served(content_type: &'static str, body: impl IntoResponse) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
}
