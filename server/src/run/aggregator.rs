//! An aggregator (`fl-server --role aggregator`, the aggregator tier). Once its coordinator has
//! welcomed it, it serves its clients as a server does (Join, Session, TLS, tokens, enrollment
//! and revocation), reports its connected clients upstream whenever they change, and for each
//! round the coordinator gives it runs the collection of its sampled clients' uploads into the
//! group's sum ([`GroupSummer`]: clipped to the coordinator's S under central DP) and sends that
//! sum back. It keeps no ledger, no checkpoint and no secret of its clients, and mints no
//! identity the coordinator would trust beyond its group: the coordinator samples, adds the
//! noise once and keeps the ledger. When its stream to the coordinator ends (the coordinator
//! restarts, or the network breaks) it keeps its clients and reconnects.

use crate::config::RunConfig;
use crate::edge::clients::{Clients, Next};
use crate::edge::transport::{self, Listener};
use crate::edge::upstream::{GroupOrder, Order, Reports, Upstream, UpstreamOptions};
use crate::error::ServerError;
use crate::identity::ids::ClientId;
use crate::round::events::{Event, GroupReport};
use crate::round::rejection::Rejection;
use crate::round::strategy::{GroupSummer, RoundContext};
use crate::run::collection::{PlainCollection, RoundWork};
use crate::run::start;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often the connected clients are compared with what was last reported upstream.
const POPULATION_EVERY: Duration = Duration::from_millis(250);
/// The longest wait between two attempts to reach the coordinator.
const MOST_BACKOFF: Duration = Duration::from_secs(5);

/// Why serving one stream to the coordinator ended.
enum Served {
    /// Training is over.
    Finished,
    /// The operator stopped the aggregator.
    Stopped,
    /// The stream ended or failed: reconnect.
    Lost(ServerError),
}

/// Runs an aggregator on `listener` under `config`'s `[server]` section until its coordinator
/// says training is over or `stop` is set.
pub(crate) async fn run_aggregator(
    listener: Listener,
    config: RunConfig,
    options: UpstreamOptions,
    stop: watch::Receiver<bool>,
) -> Result<(), ServerError> {
    let Some(mut upstream) = reach(&options, stop.clone()).await else {
        return Err(ServerError::Interrupted);
    };
    let num_params = upstream.num_params;
    let (shared, events) = start::shared_state(&config, None, num_params)?;
    let (done_tx, done_rx) = watch::channel(false);
    let done = transport::signalled(done_rx.clone());
    let serving = transport::spawn_grpc(&config.server, listener, shared.clone(), done)?;
    start::spawn_edge_upkeep(&config, &shared, done_rx);
    let mut clients = Clients::new(shared, events, stop.clone());
    let round_grace = Duration::from_secs_f64(config.server.reconnect_grace_secs);
    let ended = loop {
        tracing::info!(
            group = upstream.group,
            "serving clients for the coordinator"
        );
        let lost = match serve(&mut upstream, &mut clients, round_grace).await {
            Served::Finished => break Ok(false),
            Served::Stopped => break Ok(true),
            Served::Lost(e) => e,
        };
        tracing::warn!(error = %lost, "lost the coordinator: reconnecting");
        upstream = match reach(&options, stop.clone()).await {
            Some(u) if u.num_params == num_params => u,
            Some(u) => {
                let reason = format!("a model of {} values, not {num_params}", u.num_params);
                break Err(ServerError::Upstream {
                    url: options.url.clone(),
                    reason,
                });
            }
            None => break Ok(true),
        };
    };
    if let Ok(resuming) = ended {
        clients.shutdown_all(0, resuming);
    }
    let _ = done_tx.send(true);
    transport::drain(serving).await;
    ended.map(|_| ())
}

/// Opens the stream to the coordinator, retrying with a growing wait; `None` once `stop` is set.
async fn reach(options: &UpstreamOptions, mut stop: watch::Receiver<bool>) -> Option<Upstream> {
    let mut wait = Duration::from_millis(100);
    loop {
        match Upstream::open(options).await {
            Ok(upstream) => return Some(upstream),
            Err(e) => tracing::info!(error = %e, retry_in = ?wait, "coordinator not reached"),
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return None,
        }
        wait = (wait * 2).min(MOST_BACKOFF);
    }
}

/// Serves the coordinator's orders on one stream: the rounds, the population reports, and the
/// clients' events between rounds.
async fn serve(upstream: &mut Upstream, clients: &mut Clients, grace: Duration) -> Served {
    let mut reported: Option<Vec<ClientId>> = None;
    let mut tick = tokio::time::interval(POPULATION_EVERY);
    let reports = upstream.reports.clone();
    loop {
        let done = tokio::select! {
            order = upstream.orders.recv() => match order {
                Some(Ok(Order::Round(order))) => round(clients, &reports, *order, grace).await,
                Some(Ok(Order::Finished)) => return Served::Finished,
                Some(Err(e)) => Err(e),
                None => Err(reports.lost("the stream ended")),
            },
            _ = tick.tick() => {
                let now = clients.connected();
                let changed = reported.as_ref() != Some(&now);
                reported = Some(now.clone());
                match changed {
                    true => reports.population(now).await,
                    false => Ok(()),
                }
            }
            next = clients.next_before(Instant::now() + POPULATION_EVERY) => match next {
                Ok(Next::Stopped) => return Served::Stopped,
                Ok(Next::Event(event)) => {
                    between_rounds(clients, event);
                    Ok(())
                }
                Ok(Next::Deadline) => Ok(()),
                Err(e) => Err(e),
            },
        };
        if let Err(e) = done {
            return Served::Lost(e);
        }
    }
}

/// A client's event outside a round: an upload has no round to go to.
fn between_rounds(clients: &Clients, event: Event) {
    if let Event::Update { client, .. }
    | Event::Sign { client, .. }
    | Event::SecAgg { client, .. } = event
    {
        clients.reject(client, Rejection::NoRound);
    }
}

/// Runs the group's part of a round and sends its partial aggregate upstream.
async fn round(
    clients: &mut Clients,
    reports: &Reports,
    order: GroupOrder,
    grace: Duration,
) -> Result<(), ServerError> {
    let started = Instant::now();
    let round = order.task.round;
    let live: BTreeSet<ClientId> = clients.connected().into_iter().collect();
    // A sampled client without a stream here is dropped at once.
    let sampled: BTreeSet<ClientId> = order.clients.intersection(&live).copied().collect();
    clients.start_round(&order.task, &order.model);
    let sent: u64 = sampled
        .iter()
        .map(|&id| clients.send_task(id, || None))
        .sum();
    let mut summer = GroupSummer::new(order.model.len(), order.rule);
    let collection = PlainCollection {
        round_timeout: order.timeout,
        reconnect_grace: grace.min(order.timeout),
        update_moments: false,
    };
    let work = RoundWork {
        ctx: RoundContext {
            round,
            expected_clients: sampled.len().max(1) as f64,
            noise_multiplier: None,
            stream_step: None,
        },
        sampled: &sampled,
        started,
        strategy: &mut summer,
        global: &order.model,
        evaluate: order.task.evaluate,
        task_digest: None,
    };
    let tally = collection.collect(clients, work).await?;
    let group = summer.take().unwrap_or_else(|e| {
        tracing::error!(round, error = %e, "the group's sum is not finite: nothing is sent");
        None
    });
    let contributors = group.as_ref().map_or(0, |g| g.contributors);
    let report = GroupReport {
        round,
        contributors: contributors as u64,
        weight: group.as_ref().map_or(0.0, |g| g.weight),
        sum: group.map(|g| g.sum.into_values()),
        clip_bound: order.rule.clip_bound,
        dropped: order.clients.len().saturating_sub(contributors) as u64,
        refused: clients.take_refused() as u64,
        bytes_up: tally.bytes_up,
        bytes_down: sent + tally.stage_bytes_down,
        losses: (tally.train_loss_sum, tally.losses as u64),
    };
    tracing::info!(
        round,
        sampled = sampled.len(),
        contributors,
        seconds = started.elapsed().as_secs_f64(),
        "group round done"
    );
    reports.result(report).await
}
