//! Plots of a run folder from its `metrics.jsonl`: `accuracy.svg` (test accuracy per round) and,
//! for a private run, `privacy.svg` (the privacy spent per round); and the test accuracy of several
//! runs on one chart, against rounds or against the bytes exchanged.

use anyhow::Context;
use plotters::prelude::*;
use std::path::Path;

/// The parsed lines of a run folder's `metrics.jsonl`.
fn read_rows(run: &Path) -> anyhow::Result<Vec<serde_json::Value>> {
    let path = run.join("metrics.jsonl");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("parsing {}", path.display())))
        .collect()
}

/// Reads `(round, key)` pairs from a run folder's `metrics.jsonl`, skipping rounds where `key` is
/// null.
pub fn read_series(run: &Path, key: &str) -> anyhow::Result<Vec<(f64, f64)>> {
    let mut points = Vec::new();
    for v in read_rows(run)? {
        let round = v["round"]
            .as_f64()
            .with_context(|| format!("{}: line without `round`", run.display()))?;
        if let Some(y) = v[key].as_f64() {
            points.push((round, y));
        }
    }
    Ok(points)
}

/// The x axis of a comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum XAxis {
    /// Rounds.
    Round,
    /// Megabytes sent and received by the server so far.
    Megabytes,
    /// The epsilon spent so far (private runs).
    Epsilon,
}

/// `(x, test accuracy)` of a run along `x`.
fn accuracy_along(run: &Path, x: XAxis) -> anyhow::Result<Vec<(f64, f64)>> {
    let mut sent = 0.0;
    read_rows(run)?
        .into_iter()
        .map(|v| {
            let field = |k: &str| {
                v[k].as_f64()
                    .with_context(|| format!("{}: line without `{k}`", run.display()))
            };
            sent += field("bytes_up")? + field("bytes_down")?;
            let at = match x {
                XAxis::Round => field("round")?,
                XAxis::Megabytes => sent / 1e6,
                XAxis::Epsilon => field("epsilon")?,
            };
            Ok((at, field("test_accuracy")?))
        })
        .collect()
}

/// Colours of successive series.
const PALETTE: [RGBColor; 8] = [
    BLUE,
    RED,
    GREEN,
    MAGENTA,
    CYAN,
    BLACK,
    RGBColor(255, 140, 0),
    RGBColor(128, 128, 128),
];

/// Draws labelled line series into `out` (a legend when there is more than one).
fn line_chart(
    out: &Path,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    series: Vec<(String, Vec<(f64, f64)>)>,
    y_range: std::ops::Range<f64>,
) -> anyhow::Result<()> {
    let x_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let root = SVGBackend::new(out, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(65)
        .build_cartesian_2d(0.0..x_max, y_range)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()?;
    let labelled = series.len() > 1;
    for (i, (label, points)) in series.into_iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let drawn = chart.draw_series(LineSeries::new(points, &colour))?;
        if labelled {
            drawn
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
        }
    }
    if labelled {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()?;
    }
    root.present()
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

/// Draws the test accuracy of `runs` (label, run folder) against `x` into `out`.
pub fn compare_runs(
    runs: &[(String, std::path::PathBuf)],
    x: XAxis,
    title: &str,
    out: &Path,
) -> anyhow::Result<()> {
    let series = runs
        .iter()
        .map(|(label, run)| Ok((label.clone(), accuracy_along(run, x)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let x_desc = match x {
        XAxis::Round => "round",
        XAxis::Megabytes => "MB exchanged (up + down)",
        XAxis::Epsilon => "epsilon spent",
    };
    line_chart(out, title, (x_desc, "test accuracy"), series, 0.0..1.0)
}

/// Draws a sweep's table (`scripts/epsilon-sweep.sh`'s tab-separated `label`, `epsilon`,
/// `test_accuracy` columns) into `out`: each label's final test accuracy against its budget's
/// epsilon.
pub fn plot_sweep(table: &Path, title: &str, out: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(table).with_context(|| format!("reading {}", table.display()))?;
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines
        .next()
        .context("an empty table")?
        .split('\t')
        .collect();
    let column = |name: &str| {
        (header.iter().position(|h| *h == name))
            .with_context(|| format!("{}: no `{name}` column", table.display()))
    };
    let (label, eps, acc) = (
        column("label")?,
        column("epsilon")?,
        column("test_accuracy")?,
    );
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for line in lines {
        let f: Vec<&str> = line.split('\t').collect();
        let number = |i: usize| -> anyhow::Result<f64> {
            let v = f.get(i).with_context(|| format!("short line `{line}`"))?;
            v.parse().with_context(|| format!("`{v}` in `{line}`"))
        };
        let point = (number(eps)?, number(acc)?);
        match series.iter_mut().find(|(l, _)| l == f[label]) {
            Some((_, points)) => points.push(point),
            None => series.push((f[label].to_owned(), vec![point])),
        }
    }
    for (_, points) in &mut series {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let labels = ("epsilon (budget)", "final test accuracy");
    line_chart(out, title, labels, series, 0.0..1.0)
}

/// Writes `accuracy.svg`, and `privacy.svg` when the run is private.
pub fn plot_run(run: &Path, title: &str) -> anyhow::Result<()> {
    let accuracy = read_series(run, "test_accuracy")?;
    let one = |points| vec![(String::new(), points)];
    line_chart(
        &run.join("accuracy.svg"),
        title,
        ("round", "test accuracy"),
        one(accuracy),
        0.0..1.0,
    )?;
    let epsilon = read_series(run, "epsilon")?;
    let delta = read_series(run, "delta")?;
    if epsilon.is_empty() {
        return Ok(());
    }
    // One of the two is the budget's fixed value; plot the one that grows.
    let varies = |s: &[(f64, f64)]| s.windows(2).any(|w| w[0].1 != w[1].1);
    if varies(&epsilon) || !varies(&delta) {
        let top = epsilon.iter().map(|p| p.1).fold(0.0, f64::max) * 1.1 + 1e-9;
        line_chart(
            &run.join("privacy.svg"),
            title,
            ("round", "epsilon spent"),
            one(epsilon),
            0.0..top,
        )
    } else {
        let log: Vec<(f64, f64)> = delta
            .into_iter()
            .map(|(r, d)| (r, d.max(1e-300).log10()))
            .collect();
        let lo = log
            .iter()
            .map(|p| p.1)
            .fold(f64::INFINITY, f64::min)
            .floor();
        let hi = log
            .iter()
            .map(|p| p.1)
            .fold(f64::NEG_INFINITY, f64::max)
            .ceil()
            + 0.5;
        line_chart(
            &run.join("privacy.svg"),
            title,
            ("round", "log10 delta (at fixed epsilon)"),
            one(log),
            lo..hi,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sweep's table becomes one line per label, with the labels in the legend; a table
    /// without the needed columns is refused by name.
    #[test]
    fn a_sweep_table_is_drawn_a_line_per_label() {
        let dir = std::env::temp_dir().join(format!("fl-sweep-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let table = dir.join("results.tsv");
        std::fs::write(
            &table,
            "label\tepsilon\tdelta\tsigma\trounds\ttest_accuracy\n\
             central\t8\t1e-5\t1.6\t117\t0.94\ncentral\t2\t1e-5\t3.1\t117\t0.90\n\
             dp-ftrl\t8\t1e-5\t5.2\t100\t0.91\n",
        )
        .unwrap();
        let out = dir.join("sweep.svg");
        plot_sweep(&table, "sweep", &out).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.contains("central") && svg.contains("dp-ftrl"));
        std::fs::write(&table, "label\teps\n").unwrap();
        let refused = plot_sweep(&table, "sweep", &out).unwrap_err().to_string();
        assert!(refused.contains("`epsilon`"), "{refused}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
