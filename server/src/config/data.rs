//! `[data]`: the dataset and how a simulation splits it.

use fl_common::data::{DataSource, PartitionScheme};
use serde::{Deserialize, Serialize};

/// `[data]`: the dataset and, for simulations, how it is split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DataSection {
    /// `mnist:DIR` or `csv:FILE` (the server reads the test split).
    pub source: DataSource,
    /// For `fl sim`: `iid`, `shards` or `dirichlet:ALPHA`.
    pub partition: PartitionScheme,
    /// Seed of the partition (a simulation device, not a privacy mechanism).
    pub partition_seed: u64,
}

impl Default for DataSection {
    fn default() -> Self {
        Self {
            source: DataSource::Mnist("data/mnist".into()),
            partition: PartitionScheme::Shards,
            partition_seed: 0,
        }
    }
}
