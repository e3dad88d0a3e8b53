//! An aggregator (`fl-server --role aggregator`, the aggregator tier). Once its coordinator has
//! welcomed it, it serves its clients as a server does (Join, Session, TLS, tokens, enrollment
//! and revocation), reports its connected clients upstream whenever they change, and for each
//! round the coordinator gives it runs the collection of its sampled clients' uploads into the
//! group's sum ([`GroupSummer`]: clipped to the coordinator's S under central DP) and sends that
//! sum back. It keeps no ledger, no checkpoint and no secret of its clients, and mints no
//! identity the coordinator would trust beyond its group: the coordinator samples, adds the
//! noise once and keeps the ledger. When its stream to the coordinator ends (the coordinator
//! restarts, or the network breaks) it keeps its clients and reconnects.
//!
//! When the coordinator's rounds are secure, the group runs secure aggregation among its sampled
//! clients ([`SecureCollection`], as a one-process server does) with the round's task and the
//! coordinator's settings, and forwards only the decoded sum of its survivors: it holds a server's
//! view of its group, no more. Signed rounds check the clients' certificates under the authority
//! of its own `secagg.authority`.

use crate::config::{RunConfig, SecureSettings};
use crate::edge::clients::{Clients, Next};
use crate::edge::transport::{self, Listener};
use crate::edge::upstream::{GroupOrder, Order, Reports, Upstream, UpstreamOptions};
use crate::error::ServerError;
use crate::identity::ids::ClientId;
use crate::round::events::{Event, GroupReport};
use crate::round::rejection::Rejection;
use crate::round::strategy::{GroupSummer, RoundContext, SecureRule};
use crate::run::collection::{PlainCollection, Prepared, RoundWork, SecureCollection, Tally};
use crate::run::{build, start};
use fl_secagg::Calibration;
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
    let duty = Duty {
        grace: Duration::from_secs_f64(config.server.reconnect_grace_secs),
        secure: build::aggregator_secure_settings(&config)?,
    };
    let (shared, events) = start::shared_state(&config, None, num_params)?;
    let (done_tx, done_rx) = watch::channel(false);
    let done = transport::signalled(done_rx.clone());
    let serving = transport::spawn_grpc(&config.server, listener, shared.clone(), done)?;
    start::spawn_edge_upkeep(&config, &shared, done_rx);
    let mut clients = Clients::new(shared, events, stop.clone());
    let ended = loop {
        tracing::info!(
            group = upstream.group,
            "serving clients for the coordinator"
        );
        let lost = match serve(&mut upstream, &mut clients, &duty).await {
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

/// What an aggregator brings to each round beyond the coordinator's order.
struct Duty {
    /// How long a client that lost its stream may take to come back within a round.
    grace: Duration,
    /// Its own secure-aggregation settings: the authority that certifies the clients of signed
    /// rounds (the rest each order sets).
    secure: SecureSettings,
}

/// Serves the coordinator's orders on one stream: the rounds, the population reports, and the
/// clients' events between rounds.
async fn serve(upstream: &mut Upstream, clients: &mut Clients, duty: &Duty) -> Served {
    let mut reported: Option<Vec<ClientId>> = None;
    let mut tick = tokio::time::interval(POPULATION_EVERY);
    let reports = upstream.reports.clone();
    loop {
        let done = tokio::select! {
            order = upstream.orders.recv() => match order {
                Some(Ok(Order::Round(order))) => round(clients, &reports, *order, duty).await,
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
    | Event::SecAgg { client, .. }
    | Event::Verified { client, .. } = event
    {
        clients.reject(client, Rejection::NoRound);
    }
}

/// Runs the group's part of a round and sends its partial aggregate upstream.
async fn round(
    clients: &mut Clients,
    reports: &Reports,
    order: GroupOrder,
    duty: &Duty,
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
        task_digest: order.task.secure_digest(&order.model),
    };
    let tally = match order.rule.secure {
        None => {
            let collection = PlainCollection {
                round_timeout: order.timeout,
                reconnect_grace: duty.grace.min(order.timeout),
                update_moments: false,
            };
            collection.collect(clients, work).await?
        }
        Some(rule) => secure_part(clients, work, (&order, rule), duty).await?,
    };
    let group = summer.take().unwrap_or_else(|e| {
        tracing::error!(round, error = %e, "the group's sum is not finite: nothing is sent");
        None
    });
    let contributors = group.as_ref().map_or(0, |g| g.contributors);
    let clip_bound = group
        .as_ref()
        .map_or(order.rule.clip_bound, |g| g.clip_bound);
    let report = GroupReport {
        round,
        contributors: contributors as u64,
        weight: group.as_ref().map_or(0.0, |g| g.weight),
        sum: group.map(|g| g.sum.into_values()),
        clip_bound,
        dropped: order.clients.len().saturating_sub(contributors) as u64,
        refused: clients.take_refused() as u64,
        bytes_up: tally.bytes_up,
        bytes_down: sent + tally.stage_bytes_down,
        losses: (tally.train_loss_sum, tally.losses as u64),
        dropouts_recovered: tally.secagg.map_or(0, |s| s.dropouts_recovered as u64),
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

/// Runs secure aggregation among the group's sampled clients under the coordinator's `rule`
/// and the round's task, into `work.strategy`.
async fn secure_part(
    clients: &mut Clients,
    work: RoundWork<'_>,
    (order, rule): (&GroupOrder, SecureRule),
    duty: &Duty,
) -> Result<Tally, ServerError> {
    let round = order.task.round;
    let Some(task) = &order.task.secure else {
        return Err(ServerError::Internal(
            "a secure order without its code".into(),
        ));
    };
    if task.signed && duty.secure.verifier.is_none() {
        tracing::error!(
            round,
            "a signed round, and this aggregator has no secagg.authority: its group sits it out"
        );
        return Ok(Tally::new(0));
    }
    let min_survivors = rule.survivors_of(work.sampled.len());
    let calibration = Calibration {
        quantizer: task.quantizer,
        min_survivors,
        calibrated_for: min_survivors,
        // The coordinator accounts the noise; the group only sums.
        ddg: None,
    };
    let collection = SecureCollection {
        settings: SecureSettings {
            bits: task.quantizer.ring.bits(),
            threshold: rule.threshold,
            min_survivors: rule.min_survivor_fraction,
            degree: rule.degree,
            stage_timeout: rule.stage_timeout,
            dropout: (0.0, duty.secure.dropout.1),
            verifier: duty.secure.verifier.clone(),
            policy: None,
        },
        round_timeout: order.timeout,
        clip: task.quantizer.clip,
        dim: order.model.len(),
        oracle: None,
        run: task.run,
        grouped: false,
    };
    let prepared = Prepared {
        calibration: Some(calibration),
        signed: task.signed,
        federation: task.federation.clone(),
        run: task.run,
        verified: None,
    };
    // The stages draw only the (simulation's) dropout injector's choices, which is off here.
    let mut rng = rand::SeedableRng::from_os_rng();
    collection.collect(clients, work, prepared, &mut rng).await
}
