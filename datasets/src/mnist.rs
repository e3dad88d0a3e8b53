//! MNIST in its original IDX format, plain or gzip-compressed, checked against
//! `SHA256SUMS.decompressed` when the directory has one (the shipped `data/mnist/` does).
//!
//! IDX layout (LeCun et al.): a big-endian magic `0x0000_08NN` whose last byte is the number of
//! dimensions, the dimensions as big-endian u32, then the u8 values. Pixels are scaled to [0, 1].

use super::{DataError, Dataset, read_file};
use crate::Shape;
use flate2::read::GzDecoder;
use ndarray::Array2;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Name of the checksum file listing the SHA-256 of each decompressed IDX file.
const SUMS_FILE: &str = "SHA256SUMS.decompressed";

/// Which half of MNIST to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// The 60,000 training images.
    Train,
    /// The 10,000 test images.
    Test,
}

impl Split {
    fn prefix(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "t10k",
        }
    }
}

/// Loads one split of MNIST from `dir`, which holds the IDX files (plain or with `.gz`).
pub fn load_mnist(dir: &Path, split: Split) -> Result<Dataset, DataError> {
    let sums = read_sums(dir)?;
    let images = read_idx(dir, &format!("{}-images-idx3-ubyte", split.prefix()), &sums)?;
    let labels = read_idx(dir, &format!("{}-labels-idx1-ubyte", split.prefix()), &sums)?;
    let (img_dims, pixels) = parse_idx(&images.0, images.1, 3)?;
    let (lab_dims, label_bytes) = parse_idx(&labels.0, labels.1, 1)?;
    if img_dims[0] != lab_dims[0] {
        return Err(DataError::Format {
            path: images.0,
            message: format!("{} images but {} labels", img_dims[0], lab_dims[0]),
        });
    }
    let n = img_dims[0];
    let intensities = Array2::from_shape_vec((n, img_dims[1] * img_dims[2]), pixels.to_vec())
        .expect("IDX dimensions were checked against the payload length");
    let shape = Shape {
        height: img_dims[1],
        width: img_dims[2],
        channels: 1,
    };
    Dataset::from_intensities(
        intensities,
        label_bytes.iter().map(|&l| u32::from(l)).collect(),
        10,
    )?
    .with_shape(shape)
}

/// Checksums listed in `dir/SHA256SUMS.decompressed` (file name -> lower-case hex), empty when
/// the directory has no such file.
fn read_sums(dir: &Path) -> Result<Vec<(String, String)>, DataError> {
    let path = dir.join(SUMS_FILE);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = String::from_utf8_lossy(&read_file(&path)?).into_owned();
    Ok(text
        .lines()
        .filter_map(|line| {
            let (hash, name) = line.split_once(char::is_whitespace)?;
            Some((
                name.trim().trim_start_matches('*').to_owned(),
                hash.to_ascii_lowercase(),
            ))
        })
        .collect())
}

/// Reads `dir/name` or `dir/name.gz`, decompressed, and verifies it against `sums` when the
/// checksum file exists (a file it does not list is then refused).
fn read_idx(
    dir: &Path,
    name: &str,
    sums: &[(String, String)],
) -> Result<(PathBuf, Vec<u8>), DataError> {
    let plain = dir.join(name);
    let gz = dir.join(format!("{name}.gz"));
    let (path, bytes) = if plain.exists() {
        let bytes = read_file(&plain)?;
        (plain, bytes)
    } else {
        let compressed = read_file(&gz)?;
        let mut bytes = Vec::new();
        GzDecoder::new(compressed.as_slice())
            .read_to_end(&mut bytes)
            .map_err(|source| DataError::Io {
                path: gz.clone(),
                source,
            })?;
        (gz, bytes)
    };
    if !sums.is_empty() {
        let expected = sums
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, h)| h.clone())
            .ok_or_else(|| DataError::Format {
                path: path.clone(),
                message: format!("{name} is not listed in {SUMS_FILE}"),
            })?;
        let actual = hex(&Sha256::digest(&bytes));
        if actual != expected {
            return Err(DataError::Checksum {
                path,
                expected,
                actual,
            });
        }
    }
    Ok((path, bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Splits an IDX file into its dimensions and its u8 payload, requiring `ndims` dimensions.
fn parse_idx(
    path: &Path,
    bytes: Vec<u8>,
    ndims: usize,
) -> Result<(Vec<usize>, Vec<u8>), DataError> {
    let bad = |message: String| DataError::Format {
        path: path.to_owned(),
        message,
    };
    let header = 4 + 4 * ndims;
    if bytes.len() < header {
        return Err(bad(format!(
            "{} bytes is shorter than the IDX header",
            bytes.len()
        )));
    }
    // Magic: two zero bytes, type 0x08 (unsigned byte), number of dimensions.
    if bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 0x08 || bytes[3] as usize != ndims {
        return Err(bad(format!(
            "IDX magic {:02x?} is not unsigned-byte data with {ndims} dimensions",
            &bytes[..4]
        )));
    }
    let dims: Vec<usize> = (0..ndims)
        .map(|i| {
            let o = 4 + 4 * i;
            u32::from_be_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]) as usize
        })
        .collect();
    let expected = dims.iter().product::<usize>();
    if bytes.len() - header != expected {
        return Err(bad(format!(
            "dimensions {dims:?} need {expected} bytes of data, file has {}",
            bytes.len() - header
        )));
    }
    let mut payload = bytes;
    payload.drain(..header);
    Ok((dims, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist")
    }

    #[test]
    fn loads_the_shipped_test_split_with_checksums() {
        let test = load_mnist(&shipped(), Split::Test).unwrap();
        assert_eq!(test.len(), 10_000);
        assert_eq!(test.num_features(), 784);
        let mut counts = [0usize; 10];
        for &l in test.labels() {
            counts[l as usize] += 1;
        }
        // Label counts from data/mnist/README.md.
        assert_eq!(
            counts,
            [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
        );
        assert!(
            test.rows(0..test.len())
                .iter()
                .all(|&p| (0.0..=1.0).contains(&p))
        );
    }

    #[test]
    fn refuses_a_file_whose_checksum_does_not_match() {
        let dir = std::env::temp_dir().join(format!("fl-mnist-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["t10k-images-idx3-ubyte.gz", SUMS_FILE] {
            std::fs::copy(shipped().join(name), dir.join(name)).unwrap();
        }
        // A valid IDX label file, but not MNIST's: 1 label.
        std::fs::write(
            dir.join("t10k-labels-idx1-ubyte"),
            [0, 0, 8, 1, 0, 0, 0, 1, 3],
        )
        .unwrap();
        let err = load_mnist(&dir, Split::Test).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(err, DataError::Checksum { .. }), "{err}");
    }

    #[test]
    fn refuses_truncated_or_mistyped_idx() {
        let p = Path::new("x");
        assert!(parse_idx(p, vec![0, 0, 8, 1, 0, 0, 0, 2, 1], 1).is_err());
        assert!(parse_idx(p, vec![0, 0, 9, 1, 0, 0, 0, 1, 1], 1).is_err());
        assert!(parse_idx(p, vec![0, 0, 8], 1).is_err());
        assert_eq!(
            parse_idx(p, vec![0, 0, 8, 1, 0, 0, 0, 1, 7], 1).unwrap(),
            (vec![1], vec![7])
        );
    }
}
