//! The collection of a coordinator of aggregators (the aggregator tier): each aggregator with
//! clients sampled into the round gets its part ([`TieredCollection::dispatch`]), runs the
//! collection of its clients' uploads, and sends back its group's partial aggregate, which the
//! strategy stack absorbs as one [`Upload::Group`]. An aggregator lost mid-round costs the round
//! its group's results, as its clients' dropping out would: the round completes with the other
//! groups under the run's release rule, and its ledger entry, spent before any task went out,
//! stands (a sum of fewer clients is the same mechanism of the same sensitivity).
//!
//! Under secure aggregation each group runs the protocol among its sampled clients with the
//! round's one task (code, noise, H(task)) and sends back the decoded sum of its survivors; the
//! coordinator adds the groups' sums into the round's secure sum ([`SecureTotal`]) and hands the
//! strategy stack that alone, as a one-process secure round does.

use super::group_intake::{Expected, SumRule, check_group};
use super::{Prepared, RoundWork, SecureCollection, Tally};
use crate::edge::clients::{Clients, Next, SentPart};
use crate::error::ServerError;
use crate::identity::ids::{ClientId, GroupId};
use crate::records::output::SecAggRoundMetrics;
use crate::records::output::{GroupMetrics, GroupOutcome};
use crate::round::events::{Event, GroupReport};
use crate::round::policy::RoundPlan;
use crate::round::rejection::Rejection;
use crate::round::strategy::{GroupRule, GroupSum, SecureRule, SumInput, Upload};
use fl_secagg::Calibration;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The share of a round's timeout an aggregator waits for its clients: what is left is for its
/// report to reach the coordinator.
const GROUP_SHARE_OF_TIMEOUT: f64 = 0.9;

/// See the module documentation.
pub(crate) struct TieredCollection {
    /// How long a round waits for its groups' results.
    pub round_timeout: Duration,
    /// How each group sums its clients' updates.
    pub rule: GroupRule,
    /// The secure rounds' calibration, when the groups run secure aggregation.
    secure: Option<SecureCollection>,
    /// The parts of the current round sent to the groups whose results are awaited.
    sent: BTreeMap<GroupId, SentPart>,
}

impl TieredCollection {
    /// Groups summing under `rule`, each round waiting `round_timeout` for them; `secure`
    /// calibrates their secure rounds.
    pub(crate) fn new(
        round_timeout: Duration,
        rule: GroupRule,
        secure: Option<SecureCollection>,
    ) -> Self {
        Self {
            round_timeout,
            rule,
            secure,
            sent: BTreeMap::new(),
        }
    }

    /// A secure round's code and noise, for its groups' sizes.
    pub(crate) fn prepare(&self, plan: &RoundPlan) -> Result<Prepared, ServerError> {
        match &self.secure {
            Some(secure) => secure.prepare(plan),
            None => Ok(Prepared::default()),
        }
    }

    /// Whether the groups run secure aggregation.
    pub(crate) fn secure_signed(&self) -> Option<bool> {
        self.secure.as_ref().map(SecureCollection::signed)
    }

    /// Sends each aggregator with clients in `sampled` its part of the round over `global`,
    /// with the floor of survivors `calibration` was planned for; returns the bytes sent.
    pub(crate) fn dispatch(
        &mut self,
        clients: &Clients,
        (sampled, global): (&BTreeSet<ClientId>, &[f32]),
        calibration: Option<&Calibration>,
    ) -> u64 {
        let timeout = self.round_timeout.mul_f64(GROUP_SHARE_OF_TIMEOUT);
        let rule = GroupRule {
            secure: (self.rule.secure).map(|secure| SecureRule {
                min_survivors: calibration.map_or(0, |c| c.min_survivors),
                ..secure
            }),
            ..self.rule
        };
        let (bytes, sent) = clients.send_group_tasks(sampled, global, (rule, timeout));
        self.sent = sent;
        bytes
    }

    /// Collects the groups' partial aggregates until every group answered or was lost, or the
    /// deadline; the tally holds each group's figures.
    pub(crate) async fn collect(
        &mut self,
        clients: &mut Clients,
        mut work: RoundWork<'_>,
        prepared: Prepared,
    ) -> Result<Tally, ServerError> {
        let round = work.ctx.round;
        let deadline = work.started + self.round_timeout;
        let mut tally = Tally::new(work.global.len());
        let mut total = (prepared.calibration).map(|c| SecureTotal::new(c, work.global.len()));
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
                    let (dim, sampled) = (work.global.len(), part.sampled);
                    let figures = answered(part, &report);
                    tally.bytes_up += report.bytes_up;
                    tally.stage_bytes_down += report.bytes_down;
                    clients.add_refused(report.refused as usize);
                    let outcome = match &mut total {
                        Some(total) => total.add((group, report), sampled),
                        None => {
                            let rule = SumRule::Plain {
                                clip: self.rule.clip_bound,
                                weighted: self.rule.weight_by_examples,
                            };
                            let expected = Expected { dim, sampled, rule };
                            absorb(&mut work, &mut tally, (group, report), expected)
                        }
                    };
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
                // No client of this process's own is sampled under a tier: its uploads refused.
                Event::Update { client, .. }
                | Event::Sign { client, .. }
                | Event::SecAgg { client, .. }
                | Event::Verified { client, .. } => {
                    clients.reject(client, Rejection::NotExpected { client, round });
                }
                Event::Connected(_) | Event::Disconnected(_) | Event::Failed { .. } => {}
            }
        }
        let timed_out = waiting.into_values();
        (tally.groups).extend(timed_out.map(|p| unanswered(p, GroupOutcome::TimedOut)));
        if let Some(total) = total {
            total.absorb(&mut work, &mut tally);
        }
        Ok(tally)
    }
}

/// The secure groups' decoded sums of a round, added up: the round's secure sum.
struct SecureTotal {
    calibration: Calibration,
    sum: Vec<f32>,
    /// Groups whose sum is in.
    groups: usize,
    metrics: SecAggRoundMetrics,
}

impl SecureTotal {
    /// No group's sum yet, of a round under `calibration` over `dim` values.
    fn new(calibration: Calibration, dim: usize) -> Self {
        Self {
            calibration,
            sum: vec![0.0; dim],
            groups: 0,
            metrics: SecAggRoundMetrics::default(),
        }
    }

    /// Adds group `group`'s sum, one of its `sampled` clients' survivors; one that no such
    /// survivors could send under the round's code and noise is refused ([`check_group`]).
    fn add(&mut self, (group, report): (GroupId, GroupReport), sampled: usize) -> GroupOutcome {
        let (contributors, recovered) = (report.contributors, report.dropouts_recovered);
        let expected = Expected {
            dim: self.sum.len(),
            sampled,
            rule: SumRule::Secure(&self.calibration),
        };
        let sum = match check_group(report, expected) {
            Ok(Some(sum)) => sum,
            Ok(None) => return GroupOutcome::Summed,
            Err(refusal) => {
                tracing::error!(group, %refusal, "group secure sum refused");
                return GroupOutcome::Refused;
            }
        };
        (self.sum.iter_mut().zip(sum.iter())).for_each(|(t, v)| *t += v);
        self.groups += 1;
        self.metrics.survivors += contributors as usize;
        self.metrics.dropouts_recovered += recovered as usize;
        GroupOutcome::Summed
    }

    /// Hands the strategy stack the round's secure sum, as a one-process round does.
    fn absorb(self, work: &mut RoundWork<'_>, tally: &mut Tally) {
        let (round, survivors) = (work.ctx.round, self.metrics.survivors);
        let mut metrics = self.metrics;
        if self.groups == 0 {
            metrics.aborted = Some("no group's secure sum came back".into());
            tally.secagg = Some(metrics);
            return;
        }
        let q = self.calibration.quantizer;
        let input = SumInput {
            sum: self.sum,
            contributors: survivors,
            clip_bound: q.clip,
            sensitivity: q.decoded_sensitivity(work.global.len()),
            noise_std: self.calibration.noise_std(survivors),
        };
        match work.strategy.absorb(&work.ctx, Upload::Sum(input)) {
            Ok(()) => tally.completed = survivors,
            Err(e) => tracing::error!(round, error = %e, "the strategy refused the groups' sum"),
        }
        tally.secagg = Some(metrics);
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

/// Absorbs group `group`'s partial aggregate into the strategy stack and counts its figures,
/// once [`check_group`] found it one the group's clients could send as `expected`; a refused
/// one is logged and costs the round its group.
fn absorb(
    work: &mut RoundWork<'_>,
    tally: &mut Tally,
    (group, report): (GroupId, GroupReport),
    expected: Expected,
) -> GroupOutcome {
    let round = work.ctx.round;
    let (weight, contributors) = (report.weight, report.contributors as usize);
    let (clip_bound, losses) = (report.clip_bound, report.losses);
    let summed = match check_group(report, expected) {
        Ok(None) => return GroupOutcome::Summed,
        Ok(Some(sum)) => {
            let upload = Upload::Group(GroupSum {
                sum,
                weight,
                contributors,
                clip_bound,
            });
            work.strategy
                .absorb(&work.ctx, upload)
                .map_err(|e| e.to_string())
        }
        Err(refusal) => Err(refusal.to_string()),
    };
    match summed {
        Ok(()) => {
            tally.count_group(contributors, losses);
            GroupOutcome::Summed
        }
        Err(error) => {
            tracing::error!(round, group, %error, "group result refused");
            GroupOutcome::Refused
        }
    }
}
