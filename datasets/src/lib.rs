//! Datasets: loading (MNIST IDX, CSV), the in-memory [`Dataset`] and the [`Shape`] of one
//! example, augmentation, and partitioning across clients.
//!
//! **Owns** examples and labels. **Imports** no crate of the workspace: a model, a mechanism or
//! a protocol reads a dataset, never the other way round.

#![deny(missing_docs)]

mod augment;
mod csv;
mod mnist;
mod partition;
mod shape;

pub use self::csv::load_csv;
pub use augment::shift_images;
pub use mnist::{Split, load_mnist};
pub use partition::{Partition, PartitionScheme};
pub use shape::Shape;

use multiversion::multiversion;
use ndarray::{Array2, ArrayView1, CowArray, Ix2};
use std::ops::Range;
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
    features: Features,
    labels: Vec<u32>,
    num_classes: usize,
    shape: Shape,
}

/// How a dataset keeps its features.
#[derive(Debug, Clone)]
enum Features {
    /// Real values, as given.
    Real(Array2<f32>),
    /// 8-bit intensities p, each standing for the feature p / 255 ([`intensity`]): images as
    /// their files hold them. A quarter of the memory of `Real` (MNIST's training features: 47
    /// MB instead of 188), and a quarter of the bytes a training batch copies from memory where a
    /// client's examples are cold (2-core AMD EPYC, 2026-11-28).
    Intensities(Array2<u8>),
}

/// The feature an 8-bit intensity stands for: p / 255, in [0, 1].
#[inline(always)]
fn intensity(p: u8) -> f32 {
    f32::from(p) / 255.0
}

/// out <- the features of the intensities `bytes`. Compiled per x86-64 SIMD level
/// (`multiversion`, as the model crate's aggregation passes): baseline x86-64 converts and divides
/// four values at a time, and this runs over every batch a client trains on.
#[multiversion(targets = "simd")]
fn intensities_into(out: &mut [f32], bytes: &[u8]) {
    for (o, &p) in out.iter_mut().zip(bytes) {
        *o = intensity(p);
    }
}

/// Appends the features of the intensities `row` to `out`.
fn extend_with_intensities(out: &mut Vec<f32>, row: ArrayView1<'_, u8>) {
    let start = out.len();
    out.resize(start + row.len(), 0.0);
    let out = &mut out[start..];
    match row.as_slice() {
        Some(bytes) => intensities_into(out, bytes),
        None => (out.iter_mut().zip(row)).for_each(|(o, &p)| *o = intensity(p)),
    }
}

impl Features {
    /// (examples, features per example).
    fn dim(&self) -> (usize, usize) {
        match self {
            Features::Real(x) => x.dim(),
            Features::Intensities(x) => x.dim(),
        }
    }
}

impl Dataset {
    /// Builds a dataset; `labels` must have one entry per row of `features`, each below
    /// `num_classes`.
    pub fn new(
        features: Array2<f32>,
        labels: Vec<u32>,
        num_classes: usize,
    ) -> Result<Self, DataError> {
        Self::with_features(Features::Real(features), labels, num_classes)
    }

    /// Builds a dataset of 8-bit intensities, each byte p the feature p / 255 (an image's
    /// pixels); `labels` as for [`Dataset::new`].
    pub fn from_intensities(
        intensities: Array2<u8>,
        labels: Vec<u32>,
        num_classes: usize,
    ) -> Result<Self, DataError> {
        Self::with_features(Features::Intensities(intensities), labels, num_classes)
    }

    fn with_features(
        features: Features,
        labels: Vec<u32>,
        num_classes: usize,
    ) -> Result<Self, DataError> {
        let (rows, columns) = features.dim();
        if rows != labels.len() {
            return Err(DataError::Spec(format!(
                "{rows} feature rows but {} labels",
                labels.len()
            )));
        }
        if let Some(bad) = labels.iter().find(|&&l| l as usize >= num_classes) {
            return Err(DataError::Spec(format!(
                "label {bad} outside 0..{num_classes}"
            )));
        }
        Ok(Self {
            shape: Shape::flat(columns),
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
        let rows = ndarray::Axis(0);
        Self {
            features: match &self.features {
                Features::Real(x) => Features::Real(x.select(rows, indices)),
                Features::Intensities(x) => Features::Intensities(x.select(rows, indices)),
            },
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
        self.features.dim().1
    }

    /// Number of classes (labels are `0..num_classes`).
    pub fn num_classes(&self) -> usize {
        self.num_classes
    }

    /// The features of the examples `range`, one row per example: borrowed when they are kept
    /// as real values, converted when they are kept as intensities.
    pub fn rows(&self, range: Range<usize>) -> CowArray<'_, f32, Ix2> {
        match &self.features {
            Features::Real(x) => x.slice(ndarray::s![range, ..]).into(),
            Features::Intensities(x) => {
                let bytes = x.slice(ndarray::s![range, ..]);
                let mut out = Vec::with_capacity(bytes.len());
                for row in bytes.rows() {
                    extend_with_intensities(&mut out, row);
                }
                Array2::from_shape_vec(bytes.dim(), out)
                    .expect("one feature per intensity")
                    .into()
            }
        }
    }

    /// Appends the features of example `i` to `out`.
    pub fn extend_with_row(&self, i: usize, out: &mut Vec<f32>) {
        match &self.features {
            Features::Real(x) => {
                let row = x.row(i);
                // Rows of a standard-layout matrix are contiguous: one memcpy each.
                match row.as_slice() {
                    Some(values) => out.extend_from_slice(values),
                    None => out.extend(row.iter()),
                }
            }
            Features::Intensities(x) => extend_with_intensities(out, x.row(i)),
        }
    }

    /// Asks the CPU to start loading example `i`'s features into its caches (a hint: nothing
    /// happens off x86-64), so that a later [`Dataset::extend_with_row`] does not wait for
    /// memory. A sampled client's examples are cold: the Geyer K = 1000 job's clients hold 470
    /// MB of intensities, and a training batch's copy waited on them row after row
    /// (2-core AMD EPYC, 2026-11-28: the copy fell from 1.7% to 0.3% of the Geyer round's CPU).
    pub fn prefetch_row(&self, i: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let (start, len) = match &self.features {
                Features::Real(x) => (
                    x.row(i).as_ptr().cast::<i8>(),
                    x.ncols() * std::mem::size_of::<f32>(),
                ),
                Features::Intensities(x) => (x.row(i).as_ptr().cast::<i8>(), x.ncols()),
            };
            for offset in (0..len).step_by(64) {
                // SAFETY: a prefetch reads nothing into the program and never faults, whatever
                // the address; these lie inside the row (or its matrix) anyway.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset)) };
            }
        }
    }

    /// All labels.
    pub fn labels(&self) -> &[u32] {
        &self.labels
    }
}

/// Where a dataset comes from, parsed from `mnist:DIR` or `csv:FILE`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::ShapeBuilder;

    /// A dataset of intensities reads as the real dataset of p / 255 through every accessor, for
    /// every byte value, in a row-major and a column-major (rows not contiguous) layout, and after
    /// `subset`.
    #[test]
    fn intensities_read_as_their_real_values() {
        let (n, d) = (7, 40);
        let bytes = Array2::from_shape_fn((n, d), |(i, j)| ((i * d + j) * 37 % 256) as u8);
        let real = bytes.mapv(|p| f32::from(p) / 255.0);
        let labels: Vec<u32> = (0..n as u32).map(|i| i % 3).collect();
        let expected = Dataset::new(real, labels.clone(), 3).unwrap();
        let mut column_major = Array2::zeros((n, d).f());
        column_major.assign(&bytes);
        assert!(column_major.row(0).as_slice().is_none());
        for kept in [bytes, column_major] {
            let data = Dataset::from_intensities(kept, labels.clone(), 3).unwrap();
            assert_eq!(data.num_features(), d);
            assert_eq!(data.rows(0..n), expected.rows(0..n));
            assert_eq!(data.rows(2..5), expected.rows(2..5));
            let (mut got, mut want) = (Vec::new(), Vec::new());
            for i in [4, 0, 6] {
                data.extend_with_row(i, &mut got);
                expected.extend_with_row(i, &mut want);
            }
            assert_eq!(got, want);
            let picked = [5, 1];
            assert_eq!(
                data.subset(&picked).rows(0..2),
                expected.subset(&picked).rows(0..2)
            );
        }
        let every_byte = Array2::from_shape_fn((1, 256), |(_, j)| j as u8);
        let data = Dataset::from_intensities(every_byte, vec![0], 1).unwrap();
        let values = data.rows(0..1);
        assert_eq!(values[[0, 0]], 0.0);
        assert_eq!(values[[0, 255]], 1.0);
        assert!((0..256).all(|j| values[[0, j]] == j as f32 / 255.0));
    }

    #[test]
    fn intensities_need_one_label_per_row() {
        let bytes = Array2::<u8>::zeros((3, 2));
        assert!(Dataset::from_intensities(bytes.clone(), vec![0, 1], 2).is_err());
        assert!(Dataset::from_intensities(bytes, vec![0, 1, 2], 2).is_err());
    }
}
