//! The run folder: `metrics.jsonl` (a line per round), `summary.json` and `model.safetensors`.
//! Files are written to a temporary name and renamed, so a reader never sees half a file.

use crate::records::local_accounts::{ClientSpend, LocalPrivacySummary};
use crate::records::model_file;
use fl_model::Model;
use fl_privacy::Budget;
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One round's figures: a line of `metrics.jsonl`. Privacy fields are null for a non-private run.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, schemars::JsonSchema)]
pub struct RoundMetrics {
    /// Round number, from 1 (the server step in an asynchronous run).
    pub round: u64,
    /// Clients with a live stream when the round was planned.
    #[serde(default)]
    pub connected: usize,
    /// Clients sampled (asynchronous: clients sent the model during the step).
    pub sampled: usize,
    /// Results absorbed into the aggregate.
    pub completed: usize,
    /// Sampled clients that gave no usable result (gone, timed out, failed or refused;
    /// asynchronous: clients that stopped training during the step without an upload).
    pub dropped: usize,
    /// Clients whose messages the round refused (malformed, out of turn, or not what the round's
    /// mechanism asks for); their streams were ended.
    #[serde(default)]
    pub refused: usize,
    /// Whether the global model changed (at least `min_clients` results, and a sound aggregate).
    pub applied: bool,
    /// Why the round left the model unchanged, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// Clip bound S (central DP only).
    pub clip_bound: Option<f64>,
    /// Standard deviation of the noise added (central DP only).
    pub noise_std: Option<f64>,
    /// Epsilon spent so far (private runs only).
    pub epsilon: Option<f64>,
    /// Largest composed local epsilon of any client so far (client-side mechanisms only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_epsilon: Option<f64>,
    /// IADMM's rho for the next round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rho: Option<f64>,
    /// Delta so far (private runs only).
    pub delta: Option<f64>,
    /// Accuracy of the global model on the test set after the round (null for an external
    /// model, which the server cannot run).
    pub test_accuracy: Option<f64>,
    /// Its mean cross-entropy.
    pub test_loss: Option<f64>,
    /// Mean training loss the clients reported (not verified).
    pub train_loss: Option<f64>,
    /// Between-clients variance V_c (Geyer et al.), when computed.
    pub v_c: Option<f64>,
    /// Update scale U_s (Geyer et al.), when computed.
    pub u_s: Option<f64>,
    /// Encoded bytes received from clients this round.
    pub bytes_up: u64,
    /// Encoded bytes sent to clients this round.
    pub bytes_down: u64,
    /// Wall-clock seconds of the round, evaluation included.
    pub seconds: f64,
    /// Secure-aggregation figures (secure-aggregation runs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secagg: Option<SecAggRoundMetrics>,
    /// A verified round's figures (`privacy.mode = "verified"` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<VerifiedRoundMetrics>,
    /// Federated evaluation of the model the round started from (the model after the round
    /// before), on the clients' own examples (`eval.federated`, rounds it asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub federated_eval: Option<FederatedEval>,
    /// The buffer's figures (asynchronous runs only, where each line is a server step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer: Option<BufferMetrics>,
    /// Each aggregator's part of the round (a coordinator of aggregators only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupMetrics>,
}

/// One aggregator's part of a round of the aggregator tier.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, schemars::JsonSchema)]
pub struct GroupMetrics {
    /// The aggregator's name (its `--name`).
    pub aggregator: String,
    /// Its clients with a live stream when the round was sent.
    pub connected: usize,
    /// Its clients sampled into the round.
    pub sampled: usize,
    /// Results it summed.
    pub completed: usize,
    /// Its sampled clients that gave it no result.
    pub dropped: usize,
    /// Clients it refused during the round.
    pub refused: usize,
    /// Seconds from sending it the round to receiving its sum (none when it did not answer).
    pub seconds: Option<f64>,
    /// How its part ended.
    pub outcome: GroupOutcome,
}

/// How an aggregator's part of a round ended.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GroupOutcome {
    /// Its sum entered the aggregate.
    Summed,
    /// Its sum was refused (the wrong clip or length); its group counts as dropped.
    Refused,
    /// Its stream ended before it answered; its group counts as dropped.
    Lost,
    /// It had not answered by the round's deadline.
    TimedOut,
}

impl GroupOutcome {
    /// Its name in a metrics line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Summed => "summed",
            Self::Refused => "refused",
            Self::Lost => "lost",
            Self::TimedOut => "timed_out",
        }
    }
}

/// A server step of asynchronous buffered aggregation.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq, schemars::JsonSchema)]
pub struct BufferMetrics {
    /// M: the updates a step waits for.
    pub size: usize,
    /// Clients training when the step was taken (at most P).
    pub training: usize,
    /// The step's updates by staleness: entry s counts those trained on the model s steps old.
    pub staleness: Vec<u64>,
    /// Updates refused during the step for being older than `buffer.max_staleness`.
    pub too_stale: usize,
}

impl BufferMetrics {
    /// Counts an update that entered the buffer `staleness` steps stale.
    pub(crate) fn count(&mut self, staleness: u64) {
        let s = staleness as usize;
        if self.staleness.len() <= s {
            self.staleness.resize(s + 1, 0);
        }
        self.staleness[s] += 1;
    }
}

/// The n-weighted means of the clients' figures on their own examples.
#[derive(
    Debug, Clone, Copy, Default, Serialize, serde::Deserialize, PartialEq, schemars::JsonSchema,
)]
pub struct FederatedEval {
    /// Clients whose figures are in the means.
    pub clients: usize,
    /// Their examples, n = sum n_k.
    pub examples: u64,
    /// sum n_k acc_k / n.
    pub accuracy: f64,
    /// sum n_k loss_k / n.
    pub loss: f64,
}

impl FederatedEval {
    /// Adds one client's figures: mean `loss` and `accuracy` over its `examples`. The count
    /// saturates rather than wraps (the framer bounds each report, so it never should).
    pub fn add(&mut self, loss: f64, accuracy: f64, examples: u64) {
        let (n, k) = (self.examples as f64, examples as f64);
        // Running n-weighted means: m' = (n m + k x) / (n + k).
        self.loss = (n * self.loss + k * loss) / (n + k);
        self.accuracy = (n * self.accuracy + k * accuracy) / (n + k);
        self.examples = self.examples.saturating_add(examples);
        self.clients += 1;
    }
}

/// What a round spent of the privacy budget, for a person: `epsilon 1.23 of 8 (delta 1e-5)`,
/// `delta 2.1e-4 of 1e-3 (epsilon 8)`, or a local mode's largest client epsilon.
pub fn spent_text(m: &RoundMetrics, budget: Option<&Budget>) -> Option<String> {
    match (budget, m.epsilon, m.delta) {
        (Some(Budget::Epsilon { epsilon, delta }), Some(spent), _) => {
            Some(format!("epsilon {spent:.3} of {epsilon} (delta {delta:e})"))
        }
        (Some(Budget::Delta { epsilon, delta }), _, Some(spent)) => Some(format!(
            "delta {spent:.3e} of {delta:e} (epsilon {epsilon})"
        )),
        _ => (m.local_epsilon).map(|e| format!("largest client epsilon {e:.3}")),
    }
}

/// One line for a person about a published round of `rounds`: its accuracy, what it spent
/// against `budget`, and its seconds.
pub fn round_line(m: &RoundMetrics, rounds: u64, budget: Option<&Budget>) -> String {
    let mut line = format!("round {}/{rounds}", m.round);
    if let Some(a) = m.test_accuracy {
        line.push_str(&format!(": accuracy {a:.4}"));
    }
    if let Some(reason) = &m.skipped {
        line.push_str(&format!(" (skipped: {reason})"));
    }
    if let Some(spent) = spent_text(m, budget) {
        line.push_str(&format!(", {spent}"));
    }
    line.push_str(&format!(", {:.1} s", m.seconds));
    line
}

/// One secure-aggregation round.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq, schemars::JsonSchema)]
pub struct SecAggRoundMetrics {
    /// |U3|: clients whose masked input is in the sum.
    pub survivors: usize,
    /// |U2 \ U3|: clients that shared keys, dropped, and whose masks were removed.
    pub dropouts_recovered: usize,
    /// Largest |unmasked sum - plain sum| over coordinates, in ring units (simulation only: 0
    /// when the sum is exact).
    pub max_abs_error: Option<u64>,
    /// Why the round aborted, if it did.
    pub aborted: Option<String>,
}

/// A verified round's figures: the uploads, how many were summed, and why the others were not.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq, schemars::JsonSchema)]
pub struct VerifiedRoundMetrics {
    /// Verified uploads received.
    pub uploads: usize,
    /// Uploads whose proof verified, summed.
    pub accepted: usize,
    /// Uploads excluded, by reason: `malformed`, `sealed` (the helper's share does not open for
    /// this round and client), `binding` (shares made for another round, client or upload),
    /// `proof` (the norm bound's proof does not verify).
    pub excluded: std::collections::BTreeMap<String, usize>,
    /// Seconds from the last upload to the verified sum (both aggregators' checks).
    pub verify_seconds: f64,
    /// Why the round released no sum, if it did not (the helper refused or deviated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aborted: Option<String>,
}

impl SecAggSummary {
    /// Adds one round.
    pub fn add(&mut self, round: &SecAggRoundMetrics) {
        if round.aborted.is_some() {
            self.aborted_rounds += 1;
            return;
        }
        self.rounds += 1;
        self.dropouts_recovered += round.dropouts_recovered as u64;
        if let Some(e) = round.max_abs_error {
            self.max_abs_error = Some(self.max_abs_error.unwrap_or(0).max(e));
        }
    }
}

/// `summary.json`'s `secagg` object.
#[derive(Debug, Clone, Default, Serialize, PartialEq, schemars::JsonSchema)]
pub struct SecAggSummary {
    /// Whether the rounds were signed: every client certified by the federation authority, the
    /// variant that holds against a server deviating from the protocol (`secagg.authority`, or
    /// `secagg.sim_signed` in `fl sim`).
    pub signed: bool,
    /// Rounds whose secure sum was recovered.
    pub rounds: u64,
    /// Rounds that aborted (too few survivors).
    pub aborted_rounds: u64,
    /// Dropped clients whose masks were removed, over all rounds.
    pub dropouts_recovered: u64,
    /// Largest error of any round (simulation only; 0 when every sum was exact).
    pub max_abs_error: Option<u64>,
}

/// Why the run ended.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StoppedBy {
    /// All configured rounds ran.
    Rounds,
    /// The privacy budget would have been exceeded.
    Budget,
    /// The operator stopped it (SIGINT or SIGTERM); it can be resumed from its checkpoint.
    Interrupted,
    /// An error ended it.
    Error,
}

/// `summary.json`: the run's result, with keys that scripts may rely on.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Summary {
    /// Rounds whose aggregate updated the model.
    pub rounds_completed: u64,
    /// Test accuracy of the final model (null for an external model).
    pub test_accuracy: Option<f64>,
    /// Test loss of the final model (null for an external model).
    pub test_loss: Option<f64>,
    /// Epsilon spent (null for a non-private run).
    pub epsilon: Option<f64>,
    /// Delta (null for a non-private run).
    pub delta: Option<f64>,
    /// Accountant used (null for a non-private run).
    pub accountant: Option<String>,
    /// Client sampling: `fixed` (exactly m of the connected clients).
    pub sampling: String,
    /// Clipping mode (null without clipping).
    pub clip_mode: Option<String>,
    /// True when the clip bound itself leaks data (the non-private median).
    pub clip_bound_leaks: bool,
    /// True when participants were drawn from a seeded, reproducible generator (`--seed`): the
    /// accountant assumes secret sampling, so the run's epsilon and delta are not a guarantee.
    pub sampling_seeded: bool,
    /// Why training ended.
    pub stopped_by: StoppedBy,
    /// Updates received over the run (the paper's communication cost).
    pub client_updates: u64,
    /// Encoded bytes received from clients.
    pub bytes_up: u64,
    /// Encoded bytes sent to clients.
    pub bytes_down: u64,
    /// Wall-clock seconds from the first round to the end.
    pub wall_seconds: f64,
    /// The model architecture, e.g. `784-600-100-10`.
    pub model: String,
    /// The resolved configuration.
    pub config: serde_json::Value,
    /// Client-side privacy figures (client-side mechanisms only; per client in
    /// `local_privacy.json`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_privacy: Option<LocalPrivacySummary>,
    /// Secure-aggregation totals (secure-aggregation runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secagg: Option<SecAggSummary>,
}

/// Writes the files of one run folder.
#[derive(Debug)]
pub struct RunFolder {
    dir: PathBuf,
    metrics: std::fs::File,
}

impl RunFolder {
    /// Reopens the run folder of an interrupted run whose checkpoint holds round
    /// `checkpointed` and its metrics line `last`: `metrics.jsonl` keeps the lines of rounds up
    /// to it (a later line belongs to a round that runs again; a line cut by the crash is
    /// dropped), gets `last` if the crash came before it was written, and is appended to.
    pub fn reopen(
        dir: &Path,
        checkpointed: u64,
        last: Option<&RoundMetrics>,
    ) -> std::io::Result<Self> {
        let path = dir.join("metrics.jsonl");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut keep = 0;
        let mut recorded = 0;
        for line in text.split_inclusive('\n') {
            match serde_json::from_str::<RoundMetrics>(line.trim_end()) {
                Ok(m) if line.ends_with('\n') && m.round <= checkpointed => {
                    keep += line.len();
                    recorded = m.round;
                }
                _ => break,
            }
        }
        let metrics = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        metrics.set_len(keep as u64)?;
        metrics.sync_all()?;
        let mut folder = Self {
            dir: dir.to_owned(),
            metrics,
        };
        if let Some(last) = last.filter(|m| m.round > recorded) {
            folder.append_round(last)?;
        }
        Ok(folder)
    }

    /// Creates (or reuses) `dir` and starts a fresh `metrics.jsonl`.
    pub fn create(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let metrics = std::fs::File::create(dir.join("metrics.jsonl"))?;
        Ok(Self {
            dir: dir.to_owned(),
            metrics,
        })
    }

    /// The rounds `metrics.jsonl` holds (a reopened run's earlier ones), in order.
    pub fn rounds(&self) -> std::io::Result<Vec<RoundMetrics>> {
        let text = std::fs::read_to_string(self.dir.join("metrics.jsonl"))?;
        text.lines()
            .map(|line| serde_json::from_str(line).map_err(std::io::Error::other))
            .collect()
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends a round's line and flushes it to disk.
    pub fn append_round(&mut self, metrics: &RoundMetrics) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(metrics).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.metrics.write_all(&line)?;
        self.metrics.sync_data()
    }

    /// Writes `summary.json`.
    pub fn write_summary(&self, summary: &Summary) -> std::io::Result<()> {
        let text = serde_json::to_vec_pretty(summary).map_err(std::io::Error::other)?;
        write_atomic(&self.dir.join("summary.json"), &text)
    }

    /// Writes each client's local privacy figures as `local_privacy.json`.
    pub fn write_local_privacy(&self, clients: &[ClientSpend]) -> std::io::Result<()> {
        let text = serde_json::to_vec_pretty(clients).map_err(std::io::Error::other)?;
        write_atomic(&self.dir.join("local_privacy.json"), &text)
    }

    /// Writes the model as `model.safetensors` (see [`model_file`]).
    pub fn write_model(&self, spec: &Model, params: &[f32]) -> std::io::Result<()> {
        let bytes = model_file::encode(spec, params)?;
        write_atomic(&self.dir.join("model.safetensors"), &bytes)
    }
}

pub use fl_common::durable::write_atomic;

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts past u64::MAX saturate instead of wrapping to a small number.
    #[test]
    fn federated_evaluation_counts_saturate() {
        let mut eval = FederatedEval::default();
        eval.add(0.5, 0.9, 600);
        eval.add(0.5, 0.9, u64::MAX);
        eval.add(0.5, 0.9, 600);
        assert_eq!((eval.clients, eval.examples), (3, u64::MAX));
    }
}
