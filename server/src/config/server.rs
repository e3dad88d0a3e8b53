//! `[server]`: networking, rounds and outputs.

use super::{Cadence, ConfigError};
use crate::identity::credentials::Token;
use fl_common::pace::Speeds;
use fl_common::schedule::Schedule;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `[server]`: networking, rounds and outputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// Address to listen on (`fl sim` always uses a free loopback port instead).
    pub listen: String,
    /// K: clients expected; the first round starts once K are connected.
    pub clients: usize,
    /// m_t: clients sampled per round (all connected ones when fewer are connected); a number
    /// or a schedule. Under Poisson sampling each client is included with q_t = m_t / K.
    pub clients_per_round: Schedule,
    /// Fewest results for a round to update the model; otherwise the round is skipped. Not
    /// under `privacy.mode = "central"`: a central round always releases its noised sum.
    pub min_clients: usize,
    /// T: number of rounds (server steps under `aggregation = "async"`).
    pub rounds: u64,
    /// `sync` (rounds of m_t sampled clients) or `async` (buffered asynchronous aggregation, see
    /// `[buffer]`; `clients_per_round` is then unused).
    pub aggregation: Cadence,
    /// Seconds a round waits for results before dropping the sampled clients that have not
    /// answered.
    pub round_timeout_secs: f64,
    /// Seconds to wait for K clients before giving up.
    pub join_timeout_secs: f64,
    /// Run folder for the ledger, metrics, checkpoint, summary and model; a new run refuses one
    /// that holds a run. Empty (the default): a new folder `runs/NAME-YYYYMMDD-HHMMSS` per
    /// run, which `runs/latest` points to.
    pub out: PathBuf,
    /// Seed for sampling and initialisation; reproducible experiments only, never for privacy.
    pub seed: Option<u64>,
    /// Enrollment token every client must present at Join (in clear, or as `sha256:HEX`; always
    /// written out as its digest); none admits any client. Excludes `enrollment`. `fl-server`
    /// takes it from `FL_TOKEN` too, which keeps it out of process listings.
    pub token: Option<Token>,
    /// Enrollment file naming each client with its own token or certificate (`fl enroll`
    /// writes it); a client revoked there loses its session within a second.
    pub enrollment: Option<PathBuf>,
    /// Seconds a sampled client that lost its stream has to come back with the same identity and
    /// receive its task again before the round counts it as dropped (plain rounds; 0: dropped at
    /// once).
    pub reconnect_grace_secs: f64,
    /// Seconds a client may pause in the middle of sending a tensor before it is dropped.
    pub upload_stall_secs: f64,
    /// Seconds a new connection has to send its first bytes (the HTTP/2 preface, or the TLS
    /// ClientHello) before it is closed.
    pub handshake_timeout_secs: f64,
    /// Seconds a client without a live stream (joined but never opened its Session, or gone) is
    /// remembered; after that it must join again.
    pub forget_after_secs: f64,
    /// Most clients without a live stream held at once; Join is refused with RESOURCE_EXHAUSTED
    /// beyond it.
    pub max_idle_clients: usize,
    /// Address of the Prometheus endpoint (`GET /metrics`); none serves no metrics.
    pub metrics_listen: Option<String>,
    /// Address of the live run page (`GET /`: rounds, accuracy, privacy spent); none serves no
    /// page. An address beyond loopback needs `operator_token`.
    pub page_listen: Option<String>,
    /// The operator's token (in clear, or as `sha256:HEX`; always written out as its digest):
    /// when set, the live run page and the metrics endpoint answer only requests that present
    /// it, as the password of HTTP Basic authentication or as `Authorization: Bearer TOKEN`.
    pub operator_token: Option<Token>,
    /// Joins (and partition requests) allowed per second from one address; more get
    /// RESOURCE_EXHAUSTED and retry later.
    pub join_rate: f64,
    /// Joins one address may make at once before `join_rate` applies.
    pub join_burst: u32,
    /// PEM certificate (chain) of the server: TLS is on when it and `tls_key` are set.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// PEM certificate of the CA that signs client certificates: with it, only clients that
    /// present a certificate from this CA can connect (mutual TLS).
    pub tls_client_ca: Option<PathBuf>,
    /// The aggregator tier: how many aggregators (`fl-server --role aggregator`) this server
    /// coordinates. With any, the population is their clients, K counts over all of them, and
    /// each round's sampled clients are sent their task and summed by their aggregator; 0
    /// (the default): the server serves its clients itself.
    pub aggregators: usize,
    /// The token aggregators present to the coordinator (in clear, or as `sha256:HEX`), one
    /// for all of them; with `aggregators`, this or `aggregator_enrollment` is required (a
    /// coordinator admits no aggregator without either). `fl-server` takes it from
    /// `FL_AGGREGATOR_TOKEN` too.
    pub aggregator_token: Option<Token>,
    /// The aggregators' enrollment file (`fl enroll --file FILE NAME` for each): each
    /// aggregator presents its own token, which admits it under its own name only. Read at
    /// start-up; takes the place of `aggregator_token`.
    pub aggregator_enrollment: Option<PathBuf>,
    /// `fl sim` only: how fast each simulated client is, drawn per client from
    /// `data.partition_seed` (a simulation device): `uniform`; `lognormal:MEDIAN_SECS:SIGMA`,
    /// each client waiting a delay of its own after every training, ln(delay) ~ N(ln MEDIAN,
    /// SIGMA^2); or `slow:FRACTION:FACTOR`, that share of the clients FACTOR times slower.
    /// `fl-client --simulate --speeds` builds the same fleet.
    pub sim_speeds: Speeds,
    /// `fl sim` only: how many simulated clients are compromised (the first ones by index). In
    /// secure and verified rounds each sends the model-replacement attack's update,
    /// `sim_attack_scale` (0 - w_t), without the clip its round asks for (a simulation device,
    /// to measure what the verified mode stops).
    pub sim_attackers: usize,
    /// `fl sim` only: gamma, the compromised clients' scale (default: the clients per round of
    /// round 1, m / eta with FedAvg's eta = 1).
    pub sim_attack_scale: Option<f64>,
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:50051".into(),
            clients: 100,
            clients_per_round: Schedule::Constant(10.0),
            min_clients: 1,
            rounds: 50,
            aggregation: Cadence::Sync,
            round_timeout_secs: 300.0,
            join_timeout_secs: 600.0,
            out: PathBuf::new(),
            seed: None,
            token: None,
            enrollment: None,
            reconnect_grace_secs: 10.0,
            upload_stall_secs: 60.0,
            handshake_timeout_secs: 10.0,
            forget_after_secs: 120.0,
            max_idle_clients: 20_000,
            metrics_listen: None,
            page_listen: None,
            operator_token: None,
            join_rate: 100.0,
            join_burst: 2000,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            aggregators: 0,
            aggregator_token: None,
            aggregator_enrollment: None,
            sim_speeds: Speeds::Uniform,
            sim_attackers: 0,
            sim_attack_scale: None,
        }
    }
}

impl ServerSection {
    /// The ranges of the counts and durations, each with the message that names its key.
    fn range_checks(&self) -> Vec<(bool, String)> {
        let s = self;
        let m = &s.clients_per_round;
        vec![
            (
                s.clients >= 1,
                "server.clients (K) must be at least 1".to_string(),
            ),
            (s.rounds >= 1, "server.rounds must be at least 1".into()),
            (
                s.min_clients >= 1
                    && (s.aggregation == Cadence::Async
                        || m.values()
                            .iter()
                            .all(|&v| s.min_clients as f64 <= v.round())),
                format!(
                    "server.min_clients ({}) must be between 1 and clients_per_round ({m})",
                    s.min_clients
                ),
            ),
            (
                s.round_timeout_secs > 0.0 && s.round_timeout_secs.is_finite(),
                "server.round_timeout_secs must be positive".into(),
            ),
            (
                s.join_timeout_secs > 0.0 && s.join_timeout_secs.is_finite(),
                "server.join_timeout_secs must be positive".into(),
            ),
            (
                s.reconnect_grace_secs >= 0.0 && s.reconnect_grace_secs.is_finite(),
                "server.reconnect_grace_secs must be 0 or more".into(),
            ),
            (
                s.upload_stall_secs > 0.0 && s.upload_stall_secs.is_finite(),
                "server.upload_stall_secs must be positive".into(),
            ),
            (
                s.handshake_timeout_secs > 0.0 && s.handshake_timeout_secs.is_finite(),
                "server.handshake_timeout_secs must be positive".into(),
            ),
            (
                s.forget_after_secs.is_finite()
                    && s.forget_after_secs >= s.reconnect_grace_secs
                    && s.forget_after_secs > 0.0,
                "server.forget_after_secs must be positive and at least reconnect_grace_secs"
                    .into(),
            ),
            (
                s.max_idle_clients >= 1,
                "server.max_idle_clients must be at least 1".into(),
            ),
        ]
    }

    /// The keys that must agree with one another.
    fn consistency_checks(&self) -> Vec<(bool, String)> {
        let s = self;
        vec![
            (
                s.token.is_none() || s.enrollment.is_none(),
                "server.token and server.enrollment exclude each other: enrolled clients each \
                 have their own token"
                    .into(),
            ),
            (
                s.join_rate > 0.0 && s.join_rate.is_finite() && s.join_burst >= 1,
                "server.join_rate must be positive and server.join_burst at least 1".into(),
            ),
            (
                s.page_listen.as_deref().is_none_or(is_loopback) || s.operator_token.is_some(),
                format!(
                    "server.page_listen {:?} is reachable beyond this host: set \
                     server.operator_token (fl-server --operator-token, or FL_OPERATOR_TOKEN) \
                     so that only operators can read the run",
                    s.page_listen.as_deref().unwrap_or_default()
                ),
            ),
            (
                s.tls_cert.is_some() == s.tls_key.is_some()
                    && (s.tls_client_ca.is_none() || s.tls_cert.is_some()),
                "server.tls_cert and server.tls_key go together, and tls_client_ca needs them"
                    .into(),
            ),
        ]
    }

    /// Checks the server's ranges and consistency.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let s = self;
        let m = &s.clients_per_round;
        let checks = self
            .range_checks()
            .into_iter()
            .chain(self.consistency_checks());
        if let Some((_, message)) = checks.into_iter().find(|(ok, _)| !ok) {
            return Err(ConfigError::Invalid(message));
        }
        // Asynchronous steps sample nobody: m_t is unused.
        if s.aggregation == Cadence::Async {
            return Ok(());
        }
        m.check(
            "server.clients_per_round",
            |v| v.round() >= 1.0 && v.round() <= s.clients as f64,
            &format!("between 1 and clients (K = {})", s.clients),
        )
        .map_err(ConfigError::Invalid)
    }
}

/// Why a server listening as `s` says admits anyone who reaches it, if it does: an address
/// beyond loopback with no token, no enrollment and no client CA. What its start-up warns.
pub fn open_door(s: &ServerSection) -> Option<String> {
    let guarded = s.token.is_some() || s.enrollment.is_some() || s.tls_client_ca.is_some();
    (!guarded && !is_loopback(&s.listen)).then(|| {
        format!(
            "anyone who reaches {} can join, be sampled and read every model: no token, no \
             enrollment and no client CA is set; give FL_TOKEN (--token), --enrollment or \
             --tls-client-ca",
            s.listen
        )
    })
}

/// Whether `addr` (`HOST:PORT`) names a loopback address: a loopback IP, or `localhost`.
pub fn is_loopback(addr: &str) -> bool {
    match addr.parse::<std::net::SocketAddr>() {
        Ok(a) => a.ip().is_loopback(),
        Err(_) => addr
            .rsplit_once(':')
            .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost")),
    }
}
