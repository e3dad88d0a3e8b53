//! `[data]`: the dataset and how a simulation splits it.

use fl_datasets::{DataSource, PartitionScheme};
use serde::{Deserialize, Serialize};

/// `[data]`: the dataset and, for simulations, how it is split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DataSection {
    /// `mnist:DIR` (IDX, plain or `.gz`) or `csv:FILE`; the server evaluates on its test split.
    /// MNIST files are checked against `SHA256SUMS.decompressed` when the folder has one (the
    /// shipped copy does): a corrupted file is refused with its expected and actual digest.
    pub source: DataSource,
    /// For `fl sim`: `iid` shuffles and cuts K equal parts; `shards` sorts by label, cuts 2K
    /// shards and deals two to each client (McMahan et al.; Geyer et al.), each client holding
    /// max(N/K, 600) examples (when 2K shards need more than N examples the sorted data is
    /// reused cyclically, as the paper does for K = 1000 and 10000); `dirichlet:ALPHA` splits
    /// every class across clients in Dirichlet(ALPHA) proportions (small ALPHA, strong label
    /// skew).
    pub partition: PartitionScheme,
    /// Seed of the partition (a simulation device, not a privacy mechanism): every client
    /// process of a simulation must use the same.
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
