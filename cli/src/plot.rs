//! Plots of a run folder: `accuracy.svg` (test accuracy per round) from `metrics.jsonl`.

use anyhow::Context;
use plotters::prelude::*;
use std::path::Path;

/// Reads `(round, test_accuracy)` from a run folder's `metrics.jsonl`.
pub fn read_accuracy(run: &Path) -> anyhow::Result<Vec<(f64, f64)>> {
    let path = run.join("metrics.jsonl");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)?;
            let field = |k: &str| {
                v[k].as_f64()
                    .with_context(|| format!("{}: line without numeric `{k}`", path.display()))
            };
            Ok((field("round")?, field("test_accuracy")?))
        })
        .collect()
}

/// Writes `accuracy.svg` into the run folder.
pub fn plot_accuracy(run: &Path, title: &str) -> anyhow::Result<()> {
    let points = read_accuracy(run)?;
    let out = run.join("accuracy.svg");
    let last_round = points.last().map_or(1.0, |p| p.0).max(1.0);
    let root = SVGBackend::new(&out, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..last_round, 0.0..1.0)?;
    chart
        .configure_mesh()
        .x_desc("round")
        .y_desc("test accuracy")
        .draw()?;
    chart.draw_series(LineSeries::new(points, &BLUE))?;
    root.present()
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}
