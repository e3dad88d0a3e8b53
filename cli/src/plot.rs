//! Plots of a run folder from its `metrics.jsonl`: `accuracy.svg` (test accuracy per round) and,
//! for a private run, `privacy.svg` (the privacy spent per round).

use anyhow::Context;
use plotters::prelude::*;
use std::path::Path;

/// Reads `(round, key)` pairs from a run folder's `metrics.jsonl`, skipping rounds where `key` is
/// null.
pub fn read_series(run: &Path, key: &str) -> anyhow::Result<Vec<(f64, f64)>> {
    let path = run.join("metrics.jsonl");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut points = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)?;
        let round = v["round"]
            .as_f64()
            .with_context(|| format!("{}: line without `round`", path.display()))?;
        if let Some(y) = v[key].as_f64() {
            points.push((round, y));
        }
    }
    Ok(points)
}

/// Draws one line chart of `points` into `out`.
fn line_chart(
    out: &Path,
    title: &str,
    y_desc: &str,
    points: Vec<(f64, f64)>,
    y_range: std::ops::Range<f64>,
) -> anyhow::Result<()> {
    let last_round = points.last().map_or(1.0, |p| p.0).max(1.0);
    let root = SVGBackend::new(out, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(65)
        .build_cartesian_2d(0.0..last_round, y_range)?;
    chart
        .configure_mesh()
        .x_desc("round")
        .y_desc(y_desc)
        .draw()?;
    chart.draw_series(LineSeries::new(points, &BLUE))?;
    root.present()
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

/// Writes `accuracy.svg`, and `privacy.svg` when the run is private.
pub fn plot_run(run: &Path, title: &str) -> anyhow::Result<()> {
    let accuracy = read_series(run, "test_accuracy")?;
    line_chart(
        &run.join("accuracy.svg"),
        title,
        "test accuracy",
        accuracy,
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
            "epsilon spent",
            epsilon,
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
            "log10 delta (at fixed epsilon)",
            log,
            lo..hi,
        )
    }
}
