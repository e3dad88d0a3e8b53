//! The collection of a coordinator of aggregators (the aggregator tier): each aggregator with
//! clients sampled into the round gets its part ([`TieredCollection::dispatch`]), runs the
//! collection of its clients' uploads, and sends back its group's partial aggregate, which the
//! strategy stack absorbs as one [`Upload::Group`]. An aggregator lost mid-round costs the round
//! its group's results, as its clients' dropping out would: the round completes with the other
//! groups under the run's release rule, and its ledger entry, spent before any task went out,
//! stands (a sum of fewer clients is the same mechanism of the same sensitivity).

use super::{RoundWork, Tally};
use crate::edge::clients::{Clients, Next, SentPart};
use crate::error::ServerError;
use crate::identity::ids::{ClientId, GroupId};
use crate::records::output::{GroupMetrics, GroupOutcome};
use crate::round::events::{Event, GroupReport};
use crate::round::rejection::Rejection;
use crate::round::strategy::{GroupRule, GroupSum, Upload};
use fl_model::CheckedUpdate;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The share of a round's timeout an aggregator waits for its clients: what is left is for its
/// report to reach the coordinator.
const GROUP_SHARE_OF_TIMEOUT: f64 = 0.9;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct TieredCollection {
    /// How long a round waits for its groups' results.
    pub round_timeout: Duration,
    /// How each group sums its clients' updates.
    pub rule: GroupRule,
    /// The parts of the current round sent to the groups whose results are awaited.
    sent: BTreeMap<GroupId, SentPart>,
}

impl TieredCollection {
    /// Groups summing under `rule`, each round waiting `round_timeout` for them.
    pub(crate) fn new(round_timeout: Duration, rule: GroupRule) -> Self {
        Self {
            round_timeout,
            rule,
            sent: BTreeMap::new(),
        }
    }

    /// Sends each aggregator with clients in `sampled` its part of the round over `global`;
    /// returns the bytes sent.
    pub(crate) fn dispatch(
        &mut self,
        clients: &Clients,
        sampled: &BTreeSet<ClientId>,
        global: &[f32],
    ) -> u64 {
        let timeout = self.round_timeout.mul_f64(GROUP_SHARE_OF_TIMEOUT);
        let (bytes, sent) = clients.send_group_tasks(sampled, global, (self.rule, timeout));
        self.sent = sent;
        bytes
    }

    /// Collects the groups' partial aggregates until every group answered or was lost, or the
    /// deadline; the tally holds each group's figures.
    pub(crate) async fn collect(
        &mut self,
        clients: &mut Clients,
        mut work: RoundWork<'_>,
    ) -> Result<Tally, ServerError> {
        let round = work.ctx.round;
        let deadline = work.started + self.round_timeout;
        let mut tally = Tally::new(work.global.len());
        let mut waiting = std::mem::take(&mut self.sent);
        while !waiting.is_empty() {
            let event = match clients.next_before(deadline).await? {
                Next::Deadline => {
                    tracing::warn!(round, groups = waiting.len(), "round deadline passed");
                    break;
                }
                Next::Stopped => break,
                Next::Event(event) => event,
            };
            match event {
                Event::Group { group, report } if report.round == round => {
                    let Some(part) = waiting.remove(&group) else {
                        continue;
                    };
                    let figures = answered(part, &report);
                    let outcome = absorb(clients, &mut work, &mut tally, (group, report));
                    tally.groups.push(ended(figures, outcome));
                }
                Event::Group { group, report } => {
                    tracing::info!(
                        round,
                        group,
                        late = report.round,
                        "group result not awaited: ignored"
                    );
                }
                Event::GroupLost(group) => {
                    let Some(part) = waiting.remove(&group) else {
                        continue;
                    };
                    tracing::warn!(
                        round,
                        group,
                        aggregator = part.aggregator,
                        "aggregator lost mid-round: its group is dropped"
                    );
                    tally.groups.push(unanswered(part, GroupOutcome::Lost));
                }
                // No client of this process's own is sampled under a tier.
                Event::Update { client, .. } | Event::Sign { client, .. } => {
                    clients.reject(client, Rejection::NotExpected { client, round });
                }
                _ => {}
            }
        }
        let timed_out = waiting.into_values();
        (tally.groups).extend(timed_out.map(|p| unanswered(p, GroupOutcome::TimedOut)));
        Ok(tally)
    }
}

/// The figures of a part its aggregator answered with `report`, its sum taken.
fn answered(part: SentPart, report: &GroupReport) -> GroupMetrics {
    GroupMetrics {
        seconds: Some(part.at.elapsed().as_secs_f64()),
        completed: report.contributors as usize,
        dropped: report.dropped as usize,
        refused: report.refused as usize,
        ..unanswered(part, GroupOutcome::Summed)
    }
}

/// `figures` once the part ended with `outcome`: a refused sum counts none of its results, as
/// an unanswered part.
fn ended(figures: GroupMetrics, outcome: GroupOutcome) -> GroupMetrics {
    if outcome == GroupOutcome::Summed {
        return figures;
    }
    GroupMetrics {
        completed: 0,
        dropped: figures.sampled,
        outcome,
        ..figures
    }
}

/// The figures of a part its aggregator did not answer: every sampled client dropped.
fn unanswered(part: SentPart, outcome: GroupOutcome) -> GroupMetrics {
    GroupMetrics {
        aggregator: part.aggregator,
        connected: part.connected,
        sampled: part.sampled,
        completed: 0,
        dropped: part.sampled,
        refused: 0,
        seconds: None,
        outcome,
    }
}

/// Absorbs group `group`'s partial aggregate into the strategy stack and counts its figures; a
/// refused one is logged and costs the round its group.
fn absorb(
    clients: &Clients,
    work: &mut RoundWork<'_>,
    tally: &mut Tally,
    (group, report): (GroupId, GroupReport),
) -> GroupOutcome {
    let round = work.ctx.round;
    tally.bytes_up += report.bytes_up;
    tally.stage_bytes_down += report.bytes_down;
    clients.add_refused(report.refused as usize);
    let Some(sum) = report.sum else {
        return GroupOutcome::Summed;
    };
    let summed = CheckedUpdate::new(sum).map_err(Into::into).and_then(|sum| {
        let upload = Upload::Group(GroupSum {
            sum,
            weight: report.weight,
            contributors: report.contributors as usize,
            clip_bound: report.clip_bound,
        });
        work.strategy.absorb(&work.ctx, upload)
    });
    match summed {
        Ok(()) => {
            tally.count_group(report.contributors as usize, report.losses);
            GroupOutcome::Summed
        }
        Err(e) => {
            tracing::error!(round, group, error = %e, "group result refused");
            GroupOutcome::Refused
        }
    }
}
