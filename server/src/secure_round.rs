//! The network side of a secure-aggregation round: carries the stage messages between the
//! clients and `fl_common::secagg::ServerRound`, with a deadline per stage, and (in simulation)
//! drops a chosen fraction of the clients at a chosen stage.

use crate::ServerError;
use crate::config::DropoutStage;
use crate::output::SecAggRoundMetrics;
use crate::registry::ClientId;
use crate::rounds::RoundLoop;
use crate::service::{Event, SecAggMessage, for_log, send_all};
use fl_common::secagg::{
    GraphKind, PlainInputs, Quantizer, SecAggError, ServerRound, Stage, auto_degree,
};
use fl_proto::ring_elements;
use fl_proto::v1::{
    PeerKeys, SealedShare, SecAggNeighbours, SecAggProceed, SecAggShareInbox, SecAggSurvivors,
    ServerMessage, server_message,
};
use prost::Message;
use rand::seq::IteratorRandom;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::Status;

/// What a secure-aggregation round yields to the round loop.
pub struct SecureTally {
    /// The decoded sum and |U3|, unless the round aborted.
    pub sum: Option<(Vec<f32>, usize)>,
    /// Bytes received.
    pub bytes_up: u64,
    /// Bytes of stage messages sent.
    pub bytes_down: u64,
    /// The round's figures.
    pub metrics: SecAggRoundMetrics,
}

/// A round's fixed inputs.
pub struct SecureRoundPlan {
    /// The fixed-point code the clients use.
    pub quantizer: Quantizer,
    /// Fewest answers per stage.
    pub min_survivors: usize,
    /// Simulation only: the plain inputs, to measure the error of the unmasked sum.
    pub oracle: Option<Arc<PlainInputs>>,
}

fn status_of(e: &SecAggError) -> Status {
    match e {
        SecAggError::WrongStage { .. }
        | SecAggError::NotParticipant(_)
        | SecAggError::Duplicate(_) => Status::failed_precondition(e.to_string()),
        _ => Status::invalid_argument(e.to_string()),
    }
}

fn send_to(lp: &RoundLoop, client: ClientId, body: server_message::Body) -> u64 {
    let message = ServerMessage { body: Some(body) };
    let size = message.encoded_len() as u64;
    match lp.shared.registry().outbox(client) {
        Some(outbox) => {
            send_all(outbox, vec![message]);
            size
        }
        None => 0,
    }
}

impl RoundLoop {
    /// Runs the stages (keys, shares, check, masked input, unmasking) of round `round` over the
    /// `sampled` clients (whose tasks are sent).
    pub(crate) async fn collect_secure(
        &mut self,
        round: u64,
        sampled: &BTreeSet<ClientId>,
        t0: Instant,
        plan: SecureRoundPlan,
    ) -> Result<SecureTally, ServerError> {
        let cfg = self.config.secagg.clone();
        let graph = match cfg.graph {
            crate::config::SecAggGraph::Complete => GraphKind::Complete,
            crate::config::SecAggGraph::Regular if cfg.degree == 0 => {
                GraphKind::Regular(auto_degree(sampled.len()))
            }
            crate::config::SecAggGraph::Regular => GraphKind::Regular(cfg.degree),
        };
        let ring = plan.quantizer.ring;
        let dim = self.spec.num_params();
        let mut server = ServerRound::new(
            round,
            ring,
            dim,
            graph,
            cfg.threshold,
            plan.min_survivors,
            sampled.iter().copied(),
        );
        let mut tally = SecureTally {
            sum: None,
            bytes_up: 0,
            bytes_down: 0,
            metrics: SecAggRoundMetrics::default(),
        };
        // Clients gone from this round: disconnected, failed, refused, or dropped by the injector.
        let mut gone: BTreeSet<ClientId> = BTreeSet::new();
        let mut deadline = t0 + Duration::from_secs_f64(self.config.server.round_timeout_secs);
        let outcome = loop {
            let stage = server.stage();
            self.wait_stage(round, &mut server, &mut gone, deadline, &mut tally, &plan)
                .await?;
            deadline = Instant::now() + Duration::from_secs_f64(cfg.stage_timeout_secs);
            let closed = match stage {
                Stage::AdvertiseKeys => server.close_keys(&mut self.rng).map(|hoods| {
                    hoods
                        .into_iter()
                        .map(|(u, hood)| {
                            let body = server_message::Body::SecaggNeighbours(SecAggNeighbours {
                                round,
                                threshold: hood.threshold as u32,
                                neighbours: hood.neighbours.iter().map(PeerKeys::from).collect(),
                            });
                            (u, body)
                        })
                        .collect::<Vec<_>>()
                }),
                Stage::ShareKeys => server.close_shares().map(|inboxes| {
                    inboxes
                        .into_iter()
                        .map(|(u, inbox)| {
                            let body = server_message::Body::SecaggShareInbox(SecAggShareInbox {
                                round,
                                shares: inbox.iter().map(SealedShare::from).collect(),
                            });
                            (u, body)
                        })
                        .collect()
                }),
                Stage::CheckShares => server.close_checks().map(|proceed| {
                    for &v in server.excluded() {
                        gone.insert(v);
                        self.reject(
                            v,
                            Status::failed_precondition(format!(
                                "excluded from round {round}: too few neighbours could open \
                                 your shares"
                            )),
                        );
                    }
                    proceed
                        .into_iter()
                        .map(|(u, p)| {
                            let body = server_message::Body::SecaggProceed(SecAggProceed {
                                round,
                                excluded: p.excluded,
                                unpaired: p.unpaired,
                            });
                            (u, body)
                        })
                        .collect()
                }),
                Stage::MaskedInput => server.close_masked().map(|survivors| {
                    let body = server_message::Body::SecaggSurvivors(SecAggSurvivors {
                        round,
                        survivors: survivors.clone(),
                    });
                    survivors.into_iter().map(|u| (u, body.clone())).collect()
                }),
                Stage::Unmasking => break server.finish(),
                Stage::Done => unreachable!("the loop ends at Unmasking"),
            };
            let messages = match closed {
                Ok(m) => m,
                Err(e) => break Err(e),
            };
            // The injector's clients never see the next stage's message, as if they had dropped.
            if cfg.sim_dropout > 0.0 && server.stage() == injected_at(cfg.sim_dropout_stage) {
                let candidates: Vec<ClientId> = messages
                    .iter()
                    .map(|(u, _)| *u)
                    .filter(|u| !gone.contains(u))
                    .collect();
                let count = (cfg.sim_dropout * candidates.len() as f64).round() as usize;
                let dropped = candidates.into_iter().choose_multiple(&mut self.rng, count);
                tracing::info!(round, stage = %server.stage(), dropped = dropped.len(), "dropout injector");
                gone.extend(dropped);
            }
            for (u, body) in messages.into_iter().filter(|(u, _)| !gone.contains(u)) {
                tally.bytes_down += send_to(self, u, body);
            }
        };
        match outcome {
            Ok(result) => {
                let m = &mut tally.metrics;
                m.survivors = result.survivors.len();
                m.dropouts_recovered = result.dropouts_recovered;
                if let Some(oracle) = &plan.oracle {
                    m.max_abs_error =
                        oracle
                            .sum(round, ring, &result.survivors, dim)
                            .map(|plain| {
                                plain
                                    .iter()
                                    .zip(&result.sum)
                                    .map(|(&p, &s)| ring.to_signed(ring.sub(s, p)).unsigned_abs())
                                    .max()
                                    .unwrap_or(0)
                            });
                }
                tally.sum = Some((plan.quantizer.decode(&result.sum), result.survivors.len()));
            }
            Err(e) => {
                tracing::warn!(round, error = %e, "secure aggregation round aborted; model unchanged");
                tally.metrics.aborted = Some(e.to_string());
            }
        }
        Ok(tally)
    }

    /// Feeds one stage's messages to `server` until every expected client answered or left, or
    /// the deadline passed.
    async fn wait_stage(
        &mut self,
        round: u64,
        server: &mut ServerRound,
        gone: &mut BTreeSet<ClientId>,
        deadline: Instant,
        tally: &mut SecureTally,
        plan: &SecureRoundPlan,
    ) -> Result<(), ServerError> {
        let ring = plan.quantizer.ring;
        while server.pending().iter().any(|c| !gone.contains(c)) {
            let event = tokio::select! {
                e = tokio::time::timeout_at(deadline.into(), self.events.recv()) => e,
                _ = self.stop.changed() => return Ok(()),
            };
            let event = match event {
                Err(_) => {
                    tracing::warn!(round, stage = %server.stage(), "stage deadline passed");
                    return Ok(());
                }
                Ok(None) => return Err(ServerError::Internal("event channel closed".into())),
                Ok(Some(e)) => e,
            };
            match event {
                Event::SecAgg {
                    client,
                    round: r,
                    message,
                    bytes,
                } => {
                    tally.bytes_up += bytes;
                    if gone.contains(&client) {
                        continue;
                    }
                    if r < round {
                        // A slow client's message of an earlier round: too late, not hostile.
                        tracing::info!(round, client, late = r, "late stage message ignored");
                        continue;
                    }
                    if r != round {
                        gone.insert(client);
                        self.reject(
                            client,
                            Status::invalid_argument(format!(
                                "stage message for round {r}, but the current round is {round}"
                            )),
                        );
                        continue;
                    }
                    let result = match message {
                        SecAggMessage::Keys(keys) => server.receive_keys(client, keys),
                        SecAggMessage::Shares(shares) => server.receive_shares(client, shares),
                        SecAggMessage::Check(refused) => server.receive_check(client, refused),
                        SecAggMessage::Masked(words) => match ring_elements(ring, &words) {
                            Ok(y) => server.receive_masked(client, &y),
                            Err(e) => Err(SecAggError::BadMaskedInput {
                                from: client,
                                problem: e.to_string(),
                            }),
                        },
                        SecAggMessage::Reveal(reveals) => server.receive_reveal(client, reveals),
                    };
                    if let Err(e) = result {
                        gone.insert(client);
                        self.reject(client, status_of(&e));
                    }
                }
                Event::Update { client, .. } | Event::Sign { client, .. } => {
                    gone.insert(client);
                    self.reject(
                        client,
                        Status::failed_precondition(
                            "this round uses secure aggregation: send the stage messages, not a \
                             plain update",
                        ),
                    );
                }
                Event::Failed {
                    client,
                    round: r,
                    reason,
                } => {
                    if r == round && gone.insert(client) {
                        tracing::warn!(round, client, reason = %for_log(&reason), "client failed its task");
                    }
                }
                Event::Disconnected(client) => {
                    gone.insert(client);
                }
                Event::Connected(_) => {}
            }
        }
        Ok(())
    }
}

/// The stage whose message the injector's clients do not receive.
fn injected_at(stage: DropoutStage) -> Stage {
    match stage {
        DropoutStage::BeforeShares => Stage::ShareKeys,
        DropoutStage::AfterShares => Stage::CheckShares,
        DropoutStage::AfterMasked => Stage::Unmasking,
    }
}
