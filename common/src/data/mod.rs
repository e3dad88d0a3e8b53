//! Datasets: loading (MNIST IDX, CSV), the in-memory [`Dataset`], and partitioning across clients.

mod augment;
mod csv;
mod mnist;
mod partition;

pub use self::csv::load_csv;
pub use augment::shift_images;
pub use mnist::{Split, load_mnist};
pub use partition::{Partition, PartitionScheme};

use crate::model::Shape;
use ndarray::{Array2, ArrayView1};
use std::path::PathBuf;

/// Why a dataset could not be loaded or partitioned.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// Reading a file failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file's decompressed SHA-256 does not match its checksum file.
    #[error("{path}: SHA-256 {actual} does not match {expected} from SHA256SUMS.decompressed")]
    Checksum {
        /// The file.
        path: PathBuf,
        /// Expected digest (hex).
        expected: String,
        /// Digest of what was read (hex).
        actual: String,
    },
    /// The file's contents are not what its format requires.
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A data or partition specification string could not be parsed or is inconsistent.
    #[error("{0}")]
    Spec(String),
}

/// Labelled examples in memory: one row of features per example.
#[derive(Debug, Clone)]
pub struct Dataset {
    features: Array2<f32>,
    labels: Vec<u32>,
    num_classes: usize,
    shape: Shape,
}

impl Dataset {
    /// Builds a dataset; `labels` must have one entry per row of `features`, each below
    /// `num_classes`.
    pub fn new(
        features: Array2<f32>,
        labels: Vec<u32>,
        num_classes: usize,
    ) -> Result<Self, DataError> {
        if features.nrows() != labels.len() {
            return Err(DataError::Spec(format!(
                "{} feature rows but {} labels",
                features.nrows(),
                labels.len()
            )));
        }
        if let Some(bad) = labels.iter().find(|&&l| l as usize >= num_classes) {
            return Err(DataError::Spec(format!(
                "label {bad} outside 0..{num_classes}"
            )));
        }
        Ok(Self {
            shape: Shape::flat(features.ncols()),
            features,
            labels,
            num_classes,
        })
    }

    /// The same examples, each row read as an image of `shape` (HWC); `shape` must hold exactly
    /// the features of a row.
    pub fn with_shape(mut self, shape: Shape) -> Result<Self, DataError> {
        if shape.len() != self.num_features() {
            return Err(DataError::Spec(format!(
                "a {}x{}x{} image is not {} features",
                shape.height,
                shape.width,
                shape.channels,
                self.num_features()
            )));
        }
        self.shape = shape;
        Ok(self)
    }

    /// The examples `indices` (each below [`Dataset::len`]), in that order, as a dataset of
    /// their own.
    pub fn subset(&self, indices: &[usize]) -> Dataset {
        Self {
            features: self.features.select(ndarray::Axis(0), indices),
            labels: indices.iter().map(|&i| self.labels[i]).collect(),
            num_classes: self.num_classes,
            shape: self.shape,
        }
    }

    /// The shape of one example: an image's height, width and channels, or a flat vector.
    pub fn example_shape(&self) -> Shape {
        self.shape
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there are no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Number of features per example.
    pub fn num_features(&self) -> usize {
        self.features.ncols()
    }

    /// Number of classes (labels are `0..num_classes`).
    pub fn num_classes(&self) -> usize {
        self.num_classes
    }

    /// All features, one row per example.
    pub fn features(&self) -> &Array2<f32> {
        &self.features
    }

    /// Features of example `i`.
    pub fn row(&self, i: usize) -> ArrayView1<'_, f32> {
        self.features.row(i)
    }

    /// All labels.
    pub fn labels(&self) -> &[u32] {
        &self.labels
    }
}

/// Where a dataset comes from, parsed from `mnist:DIR` or `csv:FILE`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DataSource {
    /// MNIST in IDX format (plain or `.gz`) in a directory.
    Mnist(PathBuf),
    /// A CSV file: label column first, then the features.
    Csv(PathBuf),
}

impl DataSource {
    /// Loads the training examples (for CSV, the whole file).
    pub fn load_train(&self) -> Result<Dataset, DataError> {
        match self {
            DataSource::Mnist(dir) => load_mnist(dir, Split::Train),
            DataSource::Csv(file) => load_csv(file),
        }
    }

    /// Loads the test examples (for CSV, the whole file).
    pub fn load_test(&self) -> Result<Dataset, DataError> {
        match self {
            DataSource::Mnist(dir) => load_mnist(dir, Split::Test),
            DataSource::Csv(file) => load_csv(file),
        }
    }
}

impl std::str::FromStr for DataSource {
    type Err = DataError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some(("mnist", dir)) if !dir.is_empty() => Ok(DataSource::Mnist(dir.into())),
            Some(("csv", file)) if !file.is_empty() => Ok(DataSource::Csv(file.into())),
            _ => Err(DataError::Spec(format!(
                "data source `{s}`: expected `mnist:DIR` or `csv:FILE`"
            ))),
        }
    }
}

impl TryFrom<String> for DataSource {
    type Error = DataError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<DataSource> for String {
    fn from(d: DataSource) -> String {
        d.to_string()
    }
}

impl std::fmt::Display for DataSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DataSource::Mnist(dir) => write!(f, "mnist:{}", dir.display()),
            DataSource::Csv(file) => write!(f, "csv:{}", file.display()),
        }
    }
}

/// Reads a whole file, naming it in the error.
fn read_file(path: &std::path::Path) -> Result<Vec<u8>, DataError> {
    std::fs::read(path).map_err(|source| DataError::Io {
        path: path.to_owned(),
        source,
    })
}
