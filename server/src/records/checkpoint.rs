//! Crash safety: after every round the server writes `checkpoint.safetensors` in the run folder,
//! atomically (temporary file, fsync, rename, fsync of the directory; [`write_atomic`]). It holds
//! the global model, the strategy's tensors (IADMM's primals and duals) and, in the metadata, the
//! round, the run's counters, the configuration and the strategy's other state (the adaptive clip
//! bound, rho).
//!
//! `fl-server --resume DIR` continues from it with the round after the checkpoint's. The privacy
//! ledger is not in the checkpoint: it is its own append-only file, synced when a round starts,
//! before anything of the round can leave the server, and a resumed run composes every entry in
//! it again, so the privacy spent after a crash is never lower than before it. A round's new model
//! leaves the server only after its checkpoint is durable, so a round spent but not checkpointed
//! released nothing: it runs again under its existing ledger entry (when the mechanism is the same;
//! otherwise both entries count), and its lines in `metrics.jsonl` are replaced.

use crate::config::RunConfig;
use crate::config::moved_keys;
use crate::identity::ids::ClientId;
use crate::identity::ids::Identities;
use crate::records::file_digest;
use crate::records::output::{RoundMetrics, write_atomic};
use fl_privacy::LocalLedger;
use safetensors::tensor::TensorView;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::Path;

/// The checkpoint's file name in the run folder.
pub const FILE: &str = "checkpoint.safetensors";
/// Metadata key of [`Progress`].
const META: &str = "fl.checkpoint";
/// Tensor name of the global model.
const MODEL: &str = "model";
/// Prefix of the strategy's tensors.
const STRATEGY: &str = "strategy.";

/// What a run has done, as of its checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// The last round whose model is in the checkpoint.
    pub round: u64,
    /// Rounds whose aggregate updated the model.
    pub rounds_completed: u64,
    /// Uploads absorbed.
    pub client_updates: u64,
    /// Bytes received from clients.
    pub bytes_up: u64,
    /// Bytes sent to clients.
    pub bytes_down: u64,
    /// Wall-clock seconds of training so far.
    pub wall_seconds: f64,
    /// The run's configuration.
    pub config: RunConfig,
    /// The strategy's state other than tensors.
    pub strategy: serde_json::Value,
    /// The enrolled clients' ids and the next id to hand out.
    #[serde(default)]
    pub clients: Identities,
    /// Each client's composed local privacy loss (runs with a client-side mechanism).
    #[serde(default)]
    pub local_ledgers: BTreeMap<ClientId, LocalLedger>,
    /// The metrics line of `round`: written to `metrics.jsonl` only after this checkpoint is
    /// durable, and again on resume if the crash came in between. Its `test_accuracy` and
    /// `test_loss` are not kept here (the evaluation runs after the checkpoint, while the next
    /// round trains): a resume evaluates the checkpoint's model again.
    #[serde(default)]
    pub last_round: Option<RoundMetrics>,
    /// The privacy ledger's head when the checkpoint was written (runs that keep one): a resume
    /// refuses a ledger that no longer holds it.
    #[serde(default)]
    pub ledger: Option<crate::records::ledger::Head>,
}

/// A checkpoint: the progress, the global model and the strategy's tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Counters, configuration, strategy scalars.
    pub progress: Progress,
    /// w after `progress.round`.
    pub model: Vec<f32>,
    /// The strategy's tensors.
    pub tensors: Vec<(String, Vec<f32>)>,
}

impl Checkpoint {
    /// Bundles a round's end state.
    pub fn new(progress: Progress, model: &[f32], strategy: StrategyState) -> Self {
        Self {
            progress: Progress {
                strategy: strategy.scalars,
                local_ledgers: strategy.local_ledgers,
                ..progress
            },
            model: model.to_vec(),
            tensors: strategy.tensors,
        }
    }

    /// The strategy state it holds.
    pub fn strategy_state(&self) -> StrategyState {
        StrategyState {
            scalars: self.progress.strategy.clone(),
            tensors: self.tensors.clone(),
            local_ledgers: self.progress.local_ledgers.clone(),
        }
    }

    /// Writes `dir/checkpoint.safetensors` atomically.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let mut named = vec![(MODEL.to_string(), bytes(&self.model))];
        for (name, values) in &self.tensors {
            named.push((format!("{STRATEGY}{name}"), bytes(values)));
        }
        let views = named
            .iter()
            .map(|(name, data)| {
                TensorView::new(safetensors::Dtype::F32, vec![data.len() / 4], data)
                    .map(|view| (name.clone(), view))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(std::io::Error::other)?;
        let meta = serde_json::to_string(&self.progress).map_err(std::io::Error::other)?;
        let mut metadata = HashMap::from([(META.to_string(), meta)]);
        let shapes: Vec<[usize; 1]> = named.iter().map(|(_, d)| [d.len() / 4]).collect();
        let parts = (named.iter().zip(&shapes))
            .map(|((name, data), shape)| file_digest::Part {
                name,
                dtype: format!("{:?}", safetensors::Dtype::F32),
                shape,
                data,
            })
            .collect();
        let digest = file_digest::of(parts, &metadata);
        metadata.insert(file_digest::KEY.into(), digest);
        let file =
            safetensors::tensor::serialize(views, Some(metadata)).map_err(std::io::Error::other)?;
        write_atomic(&dir.join(FILE), &file)
    }

    /// Whether `dir` holds a checkpoint.
    pub fn exists(dir: &Path) -> bool {
        dir.join(FILE).is_file()
    }

    /// Reads `dir/checkpoint.safetensors`.
    pub fn read(dir: &Path) -> std::io::Result<Self> {
        let invalid = |e: String| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {e}", dir.join(FILE).display()),
            )
        };
        let file = std::fs::read(dir.join(FILE))?;
        let (_, header) =
            safetensors::SafeTensors::read_metadata(&file).map_err(|e| invalid(e.to_string()))?;
        let meta = header
            .metadata()
            .as_ref()
            .and_then(|m| m.get(META))
            .ok_or_else(|| invalid("no checkpoint metadata".into()))?;
        let mut progress: serde_json::Value =
            serde_json::from_str(meta).map_err(|e| invalid(e.to_string()))?;
        // A checkpoint written before DP-FTRL's keys moved reads as one written after.
        moved_keys::move_checkpoint_keys(&mut progress["config"])
            .map_err(|e| invalid(e.to_string()))?;
        let progress: Progress =
            serde_json::from_value(progress).map_err(|e| invalid(e.to_string()))?;
        let st =
            safetensors::SafeTensors::deserialize(&file).map_err(|e| invalid(e.to_string()))?;
        match file_digest::check(&st, header.metadata().as_ref()) {
            Ok(true) => {}
            Ok(false) => return Err(invalid("no content digest".into())),
            Err(e) => return Err(invalid(e)),
        }
        let floats = |data: &[u8]| -> Vec<f32> {
            data.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        };
        let mut model = None;
        let mut tensors = Vec::new();
        for (name, view) in st.tensors() {
            if view.dtype() != safetensors::Dtype::F32 {
                return Err(invalid(format!("tensor {name} is not f32")));
            }
            if name == MODEL {
                model = Some(floats(view.data()));
            } else if let Some(rest) = name.strip_prefix(STRATEGY) {
                tensors.push((rest.to_string(), floats(view.data())));
            }
        }
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Self {
            progress,
            model: model.ok_or_else(|| invalid("no model tensor".into()))?,
            tensors,
        })
    }
}

/// What a strategy carries from one round to the next, for checkpoints.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StrategyState {
    /// Small values (an adaptive clip bound, rho).
    pub scalars: serde_json::Value,
    /// Named tensors (IADMM's per-client primals and duals).
    pub tensors: Vec<(String, Vec<f32>)>,
    /// Each client's composed local privacy loss (local modes).
    pub local_ledgers: BTreeMap<ClientId, LocalLedger>,
}

impl StrategyState {
    /// A copy of the tensor named `name`, if the state holds one.
    pub fn tensor(&self, name: &str) -> Option<Vec<f32>> {
        (self.tensors.iter())
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The progress of a run at round 7, with every field set.
    fn progress() -> Progress {
        Progress {
            round: 7,
            rounds_completed: 6,
            client_updates: 60,
            bytes_up: 1234,
            bytes_down: 5678,
            wall_seconds: 1.5,
            config: RunConfig::default(),
            strategy: serde_json::Value::Null,
            clients: Identities {
                names: [("hospital-1".to_string(), 4)].into(),
                next_id: 9,
            },
            local_ledgers: [(4, LocalLedger::default())].into(),
            last_round: None,
            ledger: Some(crate::records::ledger::Head::default()),
        }
    }

    #[test]
    fn a_checkpoint_reads_back_as_written() {
        let dir = std::env::temp_dir().join(format!("fl-checkpoint-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let progress = progress();
        let state = StrategyState {
            scalars: serde_json::json!({"rho": 0.5}),
            tensors: vec![("a".into(), vec![1.0, -2.0]), ("b".into(), vec![3.5])],
            local_ledgers: [(4, LocalLedger::default())].into(),
        };
        let written = Checkpoint::new(progress, &[0.25, f32::MIN_POSITIVE, -0.0], state.clone());
        written.write(&dir).unwrap();
        let read = Checkpoint::read(&dir).unwrap();
        assert_eq!(read, written);
        assert_eq!(read.strategy_state(), state);
        std::fs::write(dir.join(FILE), b"garbage").unwrap();
        assert!(Checkpoint::read(&dir).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A flipped byte in the model's weights, or a truncated file, is refused, naming the file;
    /// the untouched file reads back.
    #[test]
    fn a_damaged_checkpoint_is_refused() {
        let dir = std::env::temp_dir().join(format!("fl-checkpoint-flip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let progress = progress();
        let model: Vec<f32> = (0..1000).map(|i| i as f32 / 7.0).collect();
        Checkpoint::new(progress, &model, StrategyState::default())
            .write(&dir)
            .unwrap();
        let path = dir.join(FILE);
        let good = std::fs::read(&path).unwrap();
        Checkpoint::read(&dir).unwrap();
        let mut flipped = good.clone();
        let at = flipped.len() - 400;
        flipped[at] ^= 0x40;
        std::fs::write(&path, &flipped).unwrap();
        let e = Checkpoint::read(&dir).unwrap_err().to_string();
        assert!(
            e.contains(FILE) && e.contains("does not match its digest"),
            "{e}"
        );
        std::fs::write(&path, &good[..good.len() - 4]).unwrap();
        let e = Checkpoint::read(&dir).unwrap_err().to_string();
        assert!(e.contains(FILE), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
