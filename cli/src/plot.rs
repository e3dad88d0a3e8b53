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

/// A metrics line's accuracy: the server's test accuracy, or where the server has no test set
/// (an external model) the federated evaluation's.
fn accuracy(line: &serde_json::Value) -> Option<f64> {
    (line["test_accuracy"].as_f64()).or(line["federated_eval"]["accuracy"].as_f64())
}

/// `(x, accuracy)` of a run along `x`, over the rounds that have an accuracy.
fn accuracy_along(run: &Path, x: XAxis) -> anyhow::Result<Vec<(f64, f64)>> {
    let mut sent = 0.0;
    let mut points = Vec::new();
    for v in read_rows(run)? {
        let field = |k: &str| {
            v[k].as_f64()
                .with_context(|| format!("{}: line without `{k}`", run.display()))
        };
        sent += field("bytes_up")? + field("bytes_down")?;
        let at = match x {
            XAxis::Round => field("round")?,
            XAxis::Megabytes => sent / 1e6,
            XAxis::Epsilon => v["epsilon"].as_f64().with_context(|| {
                format!(
                    "{} is not a private run (its metrics have no epsilon): --x epsilon compares \
                     private runs only; use --x round or --x megabytes",
                    run.display()
                )
            })?,
        };
        points.extend(accuracy(&v).map(|a| (at, a)));
    }
    Ok(points)
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

/// What a chart shows beside its series.
struct Chart<'a> {
    title: &'a str,
    x_desc: &'a str,
    y_desc: &'a str,
    y_range: std::ops::Range<f64>,
    /// The x axis counts rounds: its ticks are whole numbers.
    rounds: bool,
    /// A horizontal line and its label (a privacy budget).
    guide: Option<(String, f64)>,
}

impl<'a> Chart<'a> {
    /// A chart of `y_desc` against rounds, between 0 and 1.
    fn per_round(title: &'a str, y_desc: &'a str) -> Self {
        Self {
            title,
            x_desc: "round",
            y_desc,
            y_range: 0.0..1.0,
            rounds: true,
            guide: None,
        }
    }
}

/// Draws labelled line series into `out` (a legend when there is more than one series or a
/// guide line).
fn line_chart(
    out: &Path,
    chart: Chart,
    series: Vec<(String, Vec<(f64, f64)>)>,
) -> anyhow::Result<()> {
    let x_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let root = SVGBackend::new(out, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut drawing = ChartBuilder::on(&root)
        .caption(chart.title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(65)
        .build_cartesian_2d(0.0..x_max, chart.y_range)?;
    // Rounds: at most one tick per round, printed as whole numbers (plotters picks steps of
    // 1, 2, 5, 10... when it has no more labels than rounds).
    let ticks = match chart.rounds {
        true => (x_max as usize + 1).min(11),
        false => 10,
    };
    let whole = |x: &f64| format!("{x:.0}");
    let mut mesh = drawing.configure_mesh();
    mesh.x_desc(chart.x_desc)
        .y_desc(chart.y_desc)
        .x_labels(ticks);
    if chart.rounds {
        mesh.x_label_formatter(&whole);
    }
    mesh.draw()?;
    let labelled = series.len() > 1 || chart.guide.is_some();
    for (i, (label, points)) in series.into_iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let drawn = drawing.draw_series(LineSeries::new(points, &colour))?;
        if labelled {
            drawn
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
        }
    }
    if let Some((label, y)) = chart.guide {
        let line = DashedLineSeries::new(vec![(0.0, y), (x_max, y)], 8, 6, RED.stroke_width(2));
        drawing
            .draw_series(line)?
            .label(label)
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    }
    if labelled {
        drawing
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
        .map(|(label, run)| {
            let points = accuracy_along(run, x)?;
            // An empty line on the chart would look like a run that was drawn.
            anyhow::ensure!(
                !points.is_empty(),
                "{}: no round with a test accuracy yet, nothing to draw for {label}",
                run.display()
            );
            Ok((label.clone(), points))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let x_desc = match x {
        XAxis::Round => "round",
        XAxis::Megabytes => "MB exchanged (up + down)",
        XAxis::Epsilon => "epsilon spent",
    };
    let chart = Chart {
        x_desc,
        rounds: x == XAxis::Round,
        ..Chart::per_round(title, "test accuracy")
    };
    line_chart(out, chart, series)
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
    let chart = Chart {
        x_desc: "epsilon (budget)",
        rounds: false,
        ..Chart::per_round(title, "final test accuracy")
    };
    line_chart(out, chart, series)
}

/// The budget of a private run, from its `summary.json`'s configuration: ("epsilon", eps) or
/// ("delta", delta); `None` without a summary or a ledger.
fn budget(run: &Path) -> Option<(String, f64)> {
    let text = std::fs::read_to_string(run.join("summary.json")).ok()?;
    let summary: serde_json::Value = serde_json::from_str(&text).ok()?;
    summary["accountant"].as_str()?;
    let privacy = &summary["config"]["privacy"];
    let kind = privacy["budget"].as_str()?.to_owned();
    let value = privacy[kind.as_str()].as_f64()?;
    Some((kind, value))
}

/// Writes `accuracy.svg`, and `privacy.svg` when the run is private, with its budget as a
/// dashed line; returns the files written.
pub fn plot_run(run: &Path, title: &str) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let one = |points| vec![(String::new(), points)];
    let accuracy = run.join("accuracy.svg");
    line_chart(
        &accuracy,
        Chart::per_round(title, "test accuracy"),
        one(accuracy_along(run, XAxis::Round)?),
    )?;
    let epsilon = read_series(run, "epsilon")?;
    let delta = read_series(run, "delta")?;
    if epsilon.is_empty() {
        return Ok(vec![accuracy]);
    }
    let budget = budget(run);
    // One of the two is the budget's fixed value; plot the one that grows.
    let varies = |s: &[(f64, f64)]| s.windows(2).any(|w| w[0].1 != w[1].1);
    let (points, y_desc, guide) = if varies(&epsilon) || !varies(&delta) {
        let guide = budget.filter(|(kind, _)| kind == "epsilon");
        (epsilon, "epsilon spent", guide.map(|(_, eps)| eps))
    } else {
        let log = |d: f64| d.max(1e-300).log10();
        let points = delta.into_iter().map(|(r, d)| (r, log(d))).collect();
        let guide = budget.filter(|(kind, _)| kind == "delta");
        (
            points,
            "log10 delta (at fixed epsilon)",
            guide.map(|(_, d)| log(d)),
        )
    };
    let ys = (points.iter().map(|p| p.1)).chain(guide);
    let (lo, hi) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), y| {
        (lo.min(y), hi.max(y))
    });
    let y_range = match y_desc {
        "epsilon spent" => 0.0..hi * 1.1 + 1e-9,
        _ => lo.floor()..hi.ceil() + 0.5,
    };
    let chart = Chart {
        y_range,
        guide: guide.map(|y| ("budget".to_owned(), y)),
        ..Chart::per_round(title, y_desc)
    };
    let privacy = run.join("privacy.svg");
    line_chart(&privacy, chart, vec![(y_desc.to_owned(), points)])?;
    Ok(vec![accuracy, privacy])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of an external model (no test set) is drawn from its federated evaluation.
    #[test]
    fn an_external_model_run_plots_its_federated_accuracy() {
        let dir = std::env::temp_dir().join(format!("fl-plot-external-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let line = |round: u32, acc: &str| {
            format!(
                "{{\"round\":{round},\"bytes_up\":1,\"bytes_down\":1,\"test_accuracy\":null,\
                 \"federated_eval\":{acc}}}\n"
            )
        };
        let metrics = line(1, "null") + &line(2, r#"{"accuracy":0.8}"#);
        std::fs::write(dir.join("metrics.jsonl"), metrics).unwrap();
        assert_eq!(accuracy_along(&dir, XAxis::Round).unwrap(), [(2.0, 0.8)]);
        // A run with no accuracy yet is refused by name, not drawn as nothing.
        let empty = dir.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        std::fs::write(empty.join("metrics.jsonl"), line(1, "null")).unwrap();
        let runs = [("e".to_owned(), empty.clone())];
        let refused = compare_runs(&runs, XAxis::Round, "t", &dir.join("c.svg")).unwrap_err();
        assert!(
            refused.to_string().contains("nothing to draw for e"),
            "{refused}"
        );
        plot_run(&dir, "external").unwrap();
        assert!(dir.join("accuracy.svg").is_file());
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
