//! A minimal CSV loader for tabular datasets: one example per line, the integer class label in
//! the first column and numeric features after it. A first line that does not parse as numbers is
//! taken as a header and skipped. Written by hand because the format needed is this narrow subset
//! (no quoting, numbers only); a full CSV crate would add nothing but a dependency.

use super::{DataError, Dataset, read_file};
use ndarray::Array2;
use std::path::Path;

/// Loads a CSV file of `label,feature,feature,...` lines. The number of classes is the largest
/// label plus one.
pub fn load_csv(path: &Path) -> Result<Dataset, DataError> {
    let text = String::from_utf8(read_file(path)?).map_err(|_| DataError::Format {
        path: path.to_owned(),
        message: "not UTF-8 text".into(),
    })?;
    parse_csv(&text).map_err(|message| DataError::Format {
        path: path.to_owned(),
        message,
    })
}

fn parse_csv(text: &str) -> Result<Dataset, String> {
    let mut labels = Vec::new();
    let mut values = Vec::new();
    let mut width = None;
    for (lineno, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut fields = line.split(',').map(str::trim);
        let label = fields.next().unwrap_or_default();
        let label: u32 = match label.parse() {
            Ok(l) => l,
            Err(_) if lineno == 0 => continue, // header
            Err(_) => {
                return Err(format!(
                    "line {}: label `{label}` is not a non-negative integer",
                    lineno + 1
                ));
            }
        };
        let start = values.len();
        for f in fields {
            let v: f32 = f
                .parse()
                .map_err(|_| format!("line {}: feature `{f}` is not a number", lineno + 1))?;
            if !v.is_finite() {
                return Err(format!("line {}: feature `{f}` is not finite", lineno + 1));
            }
            values.push(v);
        }
        let n = values.len() - start;
        match width {
            None if n == 0 => return Err(format!("line {}: no features", lineno + 1)),
            None => width = Some(n),
            Some(w) if w != n => {
                return Err(format!(
                    "line {}: {n} features, earlier lines have {w}",
                    lineno + 1
                ));
            }
            Some(_) => {}
        }
        labels.push(label);
    }
    let width = width.ok_or("no examples")?;
    let num_classes = *labels.iter().max().expect("at least one example") as usize + 1;
    let features = Array2::from_shape_vec((labels.len(), width), values)
        .expect("every row was checked to have `width` features");
    Dataset::new(features, labels, num_classes).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_with_and_without_header() {
        let d = parse_csv("label,a,b\n1,0.5,2\n0, -1 ,3\n\n2,0,0\n").unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(d.num_features(), 2);
        assert_eq!(d.num_classes(), 3);
        assert_eq!(d.labels(), &[1, 0, 2]);
        assert_eq!(
            d.rows(1..2).iter().copied().collect::<Vec<_>>(),
            vec![-1.0, 3.0]
        );
        assert_eq!(parse_csv("0,1\n1,2").unwrap().len(), 2);
    }

    #[test]
    fn refuses_ragged_rows_bad_numbers_and_empty_files() {
        assert!(parse_csv("0,1,2\n1,2\n").unwrap_err().contains("line 2"));
        assert!(parse_csv("0,1\nx,2\n").unwrap_err().contains("label"));
        assert!(parse_csv("0,abc\n").unwrap_err().contains("feature"));
        assert!(parse_csv("0,NaN\n").unwrap_err().contains("finite"));
        assert!(parse_csv("").is_err());
        assert!(parse_csv("3\n").is_err());
    }
}
