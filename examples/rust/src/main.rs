//! A client with training code of its own: softmax regression on this site's share of MNIST,
//! trained by the plain mini-batch SGD written below, taking part in an `fl-server` federation
//! through `fl_client::run`. The library does the rest: joining, reconnecting, the round's
//! checks, the update u = w_k - w_t, clipping, noise and secure-aggregation masks.
//!
//! From the repository root, the server in one terminal:
//!
//! ```sh
//! cargo run --release -p fl-server -- --config examples/rust/server.toml
//! ```
//!
//! and three sites in another:
//!
//! ```sh
//! cargo build --release -p own-trainer
//! for site in 0 1 2; do target/release/own-trainer --site $site --sites 3 & done; wait
//! ```

use clap::Parser;
use fl_client::{ClientOptions, Evaluation, TrainRequest, Trained, Trainer};
use fl_datasets::{Dataset, Split, load_mnist};
use fl_model::Model;
use ndarray::{Array2, Axis, s};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use std::path::PathBuf;

/// MNIST's ten digits.
const CLASSES: usize = 10;

/// The command line.
#[derive(Parser)]
struct Args {
    /// The server's address.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    server: String,
    /// This site's number, from 0 to `--sites` - 1.
    #[arg(long)]
    site: usize,
    /// How many sites share MNIST's training images: site i holds every image whose index
    /// leaves i when divided by this.
    #[arg(long)]
    sites: usize,
    /// The folder of MNIST's files.
    #[arg(long, default_value = "data/mnist")]
    data: PathBuf,
}

/// Softmax regression, p = softmax(x W + b), on one site's examples. The server's `logistic`
/// model lays its parameters out as W's rows (one per pixel, one column per class), then b: read
/// here as one (pixels + 1) x classes matrix whose last row is b.
struct Softmax {
    data: Dataset,
}

impl Softmax {
    /// The class probabilities of the examples `rows` under `theta`, and their features.
    fn predict(&self, theta: &Array2<f32>, rows: &[usize]) -> (Array2<f32>, Array2<f32>) {
        let mut x = Vec::with_capacity(rows.len() * self.data.num_features());
        rows.iter()
            .for_each(|&i| self.data.extend_with_row(i, &mut x));
        let x = Array2::from_shape_vec((rows.len(), self.data.num_features()), x)
            .expect("each row has the data set's width");
        let pixels = self.data.num_features();
        let mut p = x.dot(&theta.slice(s![..pixels, ..])) + theta.row(pixels);
        for mut row in p.rows_mut() {
            let top = row.fold(f32::MIN, |a, &b| a.max(b));
            row.mapv_inplace(|z| (z - top).exp());
            let sum = row.sum();
            row /= sum;
        }
        (p, x)
    }

    /// theta read from the flat parameters `weights`.
    fn theta(&self, weights: &[f32]) -> Result<Array2<f32>, String> {
        let shape = (self.data.num_features() + 1, CLASSES);
        Array2::from_shape_vec(shape, weights.to_vec()).map_err(|e| e.to_string())
    }
}

impl Trainer for Softmax {
    fn check(&self, model: &Model) -> Result<(), String> {
        let expected = (self.data.num_features() + 1) * CLASSES;
        match model.num_params() == expected {
            true => Ok(()),
            false => Err(format!(
                "this site trains softmax regression: {expected} parameters"
            )),
        }
    }

    fn train(&self, request: &TrainRequest, global: &[f32]) -> Result<Trained, String> {
        let mut theta = self.theta(global)?;
        let pixels = self.data.num_features();
        let (config, mut order) = (&request.config, (0..self.data.len()).collect::<Vec<_>>());
        let mut rng = rand::rngs::StdRng::seed_from_u64(request.seed);
        let (mut loss, mut batches) = (0.0, 0);
        for _ in 0..config.epochs {
            order.shuffle(&mut rng);
            for batch in order.chunks(config.batch_size as usize) {
                let (mut p, x) = self.predict(&theta, batch);
                // The gradient of the mean cross-entropy: (p - onehot(y)) / n, through W and b.
                for (mut row, &i) in p.rows_mut().into_iter().zip(batch) {
                    let label = self.data.labels()[i] as usize;
                    loss += -row[label].max(1e-12).ln();
                    row[label] -= 1.0;
                }
                p /= batch.len() as f32;
                let step = config.learning_rate;
                theta
                    .slice_mut(s![..pixels, ..])
                    .scaled_add(-step, &x.t().dot(&p));
                let mut b = theta.row_mut(pixels);
                b.scaled_add(-step, &p.sum_axis(Axis(0)));
                batches += batch.len();
            }
        }
        Ok(Trained {
            weights: theta.into_raw_vec_and_offset().0,
            loss: Some(loss / batches.max(1) as f32),
            examples: self.data.len() as u64,
        })
    }

    fn evaluate(&self, _model: &Model, global: &[f32]) -> Result<Evaluation, String> {
        let all: Vec<usize> = (0..self.data.len()).collect();
        let (p, _) = self.predict(&self.theta(global)?, &all);
        let (mut loss, mut right) = (0.0, 0);
        for (row, &label) in p.rows().into_iter().zip(self.data.labels()) {
            let best = (0..CLASSES)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap();
            right += usize::from(best == label as usize);
            loss -= f64::from(row[label as usize].max(1e-12).ln());
        }
        let n = self.data.len().max(1);
        Ok(Evaluation {
            loss: loss / n as f64,
            accuracy: right as f64 / n as f64,
            examples: self.data.len() as u64,
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    fl_client::init_logging("info");
    let args = Args::parse();
    anyhow::ensure!(args.site < args.sites, "--site must be below --sites");
    let train = load_mnist(&args.data, Split::Train)?;
    let mine: Vec<usize> = (args.site..train.len()).step_by(args.sites).collect();
    let trainer = Softmax {
        data: train.subset(&mine),
    };
    tracing::info!(
        site = args.site,
        examples = mine.len(),
        "loaded this site's images"
    );
    let options = ClientOptions {
        name: format!("site-{}", args.site),
        ..ClientOptions::new(&args.server)
    };
    let report = fl_client::run(options, trainer).await?;
    tracing::info!(rounds = report.rounds_trained, "the server ended training");
    Ok(())
}
