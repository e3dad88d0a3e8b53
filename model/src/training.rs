//! Local training (mini-batch SGD, McMahan et al. 2017's ClientUpdate) and evaluation.

use super::{ModelSpec, Workspace, loss_and_grad_in, loss_and_step_in};
use fl_common::cores::CoreBudget;
use fl_datasets::{Dataset, shift_images};
use ndarray::ArrayView2;
use rand::Rng;
use rand::seq::SliceRandom;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What the server asks a client to do locally in a round.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LocalConfig {
    /// E: passes over the local data.
    pub epochs: u32,
    /// B: examples per mini-batch.
    pub batch_size: u32,
    /// eta: SGD step size.
    pub learning_rate: f32,
    /// s: plain SGD translates each image of a batch by up to s pixels on each axis
    /// ([`shift_images`]); 0, the default, trains on the examples as they are. The per-example
    /// clipped rule of Laplace output perturbation does not augment.
    #[serde(default)]
    pub random_shift: u32,
}

impl LocalConfig {
    /// The rule the server checks at start-up and every client checks on each task: E >= 1,
    /// B >= 1, eta a positive number.
    pub fn check(&self) -> Result<(), String> {
        if self.epochs == 0 {
            return Err("epochs must be at least 1".into());
        }
        if self.batch_size == 0 {
            return Err("batch_size must be at least 1".into());
        }
        if !(self.learning_rate > 0.0 && self.learning_rate.is_finite()) {
            return Err("learning_rate must be a positive number".into());
        }
        Ok(())
    }
}

/// Test-set quality of a model.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Evaluation {
    /// Fraction of examples classified correctly.
    pub accuracy: f64,
    /// Mean cross-entropy.
    pub loss: f64,
}

/// How many examples ahead of its copy a batch asks for an example's features
/// ([`Dataset::prefetch_row`]): the loads of the next rows overlap the copy of this one, and what
/// they bring stays in the first-level cache until it is copied (the one distance measured).
const PREFETCH_ROWS_AHEAD: usize = 2;

/// A mini-batch copied out of a dataset, its buffers reused from batch to batch.
#[derive(Debug, Default)]
struct Batch {
    /// Features, row-major (examples x features).
    x: Vec<f32>,
    y: Vec<u32>,
    features: usize,
}

impl Batch {
    /// Copies the examples `idx` of `data` in.
    fn gather(&mut self, data: &Dataset, idx: &[usize]) {
        self.features = data.num_features();
        self.x.clear();
        self.y.clear();
        for (j, &i) in idx.iter().enumerate() {
            if let Some(&ahead) = idx.get(j + PREFETCH_ROWS_AHEAD) {
                data.prefetch_row(ahead);
            }
            data.extend_with_row(i, &mut self.x);
            self.y.push(data.labels()[i]);
        }
    }

    /// The features as a matrix.
    fn x(&self) -> ArrayView2<'_, f32> {
        ArrayView2::from_shape((self.y.len(), self.features), &self.x[..])
            .expect("one row per label")
    }

    /// Loss and gradient of the batch (see [`loss_and_grad_in`]).
    fn loss_and_grad(
        &self,
        spec: &ModelSpec,
        params: &[f32],
        grad: &mut [f32],
        workspace: &mut Workspace,
    ) -> f32 {
        loss_and_grad_in(spec, params, self.x(), &self.y, grad, workspace)
    }
}

/// How local SGD forms a batch's gradient.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GradientRule {
    /// The batch-mean gradient.
    Mean,
    /// Exactly `steps` steps, each on up to B distinct examples drawn at random, of the sum of
    /// per-example gradients clipped to L1 norm C (u / max(1, ||u||_1 / C)) divided by the
    /// public B, never by the batch's own size: one example moves a step by at most
    /// 2 C eta / B, and the steps are as many whatever the client's number of examples
    /// (Laplace output perturbation, calibrated from public numbers only).
    ClippedL1 {
        /// C.
        clip: f64,
        /// S.
        steps: u64,
    },
}

/// Runs local SGD on the examples `indices` of `data`, starting from `params` (updated in
/// place). Under the mean rule, E epochs: each shuffles, then for each batch b,
/// w <- w - eta g(w; b); returns the mean batch loss of the last epoch. Under the clipped rule,
/// its S steps ([`GradientRule::ClippedL1`]); returns their mean loss per example.
pub fn train_local(
    spec: &ModelSpec,
    params: &mut [f32],
    data: &Dataset,
    indices: &[usize],
    config: &LocalConfig,
    rule: GradientRule,
    rng: &mut impl Rng,
) -> f32 {
    if let GradientRule::ClippedL1 { clip, steps } = rule {
        return clipped_steps(spec, params, (data, indices), config, (clip, steps), rng);
    }
    let mut order = indices.to_vec();
    let (mut batch_buf, mut workspace) = (Batch::default(), Workspace::default());
    let mut scratch = Vec::new();
    let batch = config.batch_size.max(1) as usize;
    let mut last_epoch_loss = f32::NAN;
    for _ in 0..config.epochs {
        order.shuffle(rng);
        let mut total = 0.0f64;
        let mut batches = 0usize;
        for idx in order.chunks(batch) {
            batch_buf.gather(data, idx);
            if config.random_shift > 0 {
                let (x, shape) = (&mut batch_buf.x, data.example_shape());
                shift_images(x, shape, config.random_shift, rng, &mut scratch);
            }
            let (x, y) = (batch_buf.x(), &batch_buf.y);
            let eta = config.learning_rate;
            total += f64::from(loss_and_step_in(spec, params, eta, x, y, &mut workspace));
            batches += 1;
        }
        last_epoch_loss = (total / batches.max(1) as f64) as f32;
    }
    last_epoch_loss
}

/// S steps of w <- w - (eta / B) sum_{i in b} clip_1(grad f_i(w)), each b up to B distinct
/// examples drawn at random (all of them when there are fewer than B); returns the mean loss per
/// example over the steps.
fn clipped_steps(
    spec: &ModelSpec,
    params: &mut [f32],
    (data, indices): (&Dataset, &[usize]),
    config: &LocalConfig,
    (clip, steps): (f64, u64),
    rng: &mut impl Rng,
) -> f32 {
    let batch = config.batch_size.max(1) as usize;
    let mut order = indices.to_vec();
    let mut grad = vec![0.0f32; params.len()];
    // The public B divides, whatever the batch's own size (Laplace output perturbation's
    // sensitivity, `privacy::sgd_l1_sensitivity`).
    let step = config.learning_rate / batch as f32;
    let (mut loss, mut seen) = (0.0f64, 0usize);
    for _ in 0..steps {
        let (drawn, _) = order.partial_shuffle(rng, batch);
        grad.iter_mut().for_each(|g| *g = 0.0);
        loss += clipped_sum_into(spec, params, data, drawn, clip, &mut grad);
        seen += drawn.len();
        for (p, g) in params.iter_mut().zip(&grad) {
            *p -= step * g;
        }
    }
    (loss / seen.max(1) as f64) as f32
}

/// Adds sum_{i in indices} clip_1(grad f_i(params)) to `sum`; returns the summed loss.
fn clipped_sum_into(
    spec: &ModelSpec,
    params: &[f32],
    data: &Dataset,
    indices: &[usize],
    clip: f64,
    sum: &mut [f32],
) -> f64 {
    let mut grad = vec![0.0f32; params.len()];
    let (mut one, mut workspace) = (Batch::default(), Workspace::default());
    let mut loss = 0.0;
    for &i in indices {
        one.gather(data, &[i]);
        loss += f64::from(one.loss_and_grad(spec, params, &mut grad, &mut workspace));
        crate::norms::clip_l1(&mut grad, clip);
        for (s, g) in sum.iter_mut().zip(&grad) {
            *s += g;
        }
    }
    loss
}

/// sum_{i in indices} clip_1(grad f_i(params)): each example's cross-entropy gradient, clipped
/// to L1 norm `clip` (u / max(1, ||u||_1 / C)), summed; and the summed loss. The per-example clip
/// bounds what one example can change, which the Laplace output perturbation of IADMM relies on.
pub fn clipped_gradient_sum(
    spec: &ModelSpec,
    params: &[f32],
    data: &Dataset,
    indices: &[usize],
    clip: f64,
) -> (Vec<f32>, f64) {
    let mut sum = vec![0.0f32; params.len()];
    let loss = clipped_sum_into(spec, params, data, indices, clip, &mut sum);
    (sum, loss)
}

/// Examples per forward pass of [`evaluate`] at most.
const EVAL_BATCH: usize = 1000;

/// Values one forward pass of [`evaluate`] may keep (2^24 f32, 64 MiB): a convolutional
/// network's patch matrices are many times its input.
const EVAL_VALUES: usize = 1 << 24;

/// Examples per forward pass of [`evaluate`].
fn eval_batch(spec: &ModelSpec) -> usize {
    (EVAL_VALUES / spec.layers().values_per_example()).clamp(1, EVAL_BATCH)
}

/// Accuracy and mean cross-entropy of `params` on all of `data`, its batches spread over the
/// process's cores ([`CoreBudget::process`]: shared with the clients' training in `fl sim`).
pub fn evaluate(spec: &ModelSpec, params: &[f32], data: &Dataset) -> Evaluation {
    evaluate_within(spec, params, data, CoreBudget::process())
}

/// [`evaluate`] on the cores of `budget`: as many workers as it has cores, each holding one for
/// each batch it takes. The result does not depend on the number of cores or on which worker
/// took which batch: per-batch sums are added in batch order.
fn evaluate_within(
    spec: &ModelSpec,
    params: &[f32],
    data: &Dataset,
    budget: &CoreBudget,
) -> Evaluation {
    let batch = eval_batch(spec);
    let batches = data.len().div_ceil(batch);
    let next = AtomicUsize::new(0);
    let mut sums: Vec<(usize, (usize, f64))> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..budget.cores().min(batches))
            .map(|_| {
                scope.spawn(|| {
                    let mut workspace = Workspace::default();
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= batches {
                            return mine;
                        }
                        let range = i * batch..((i + 1) * batch).min(data.len());
                        let _core = budget.hold();
                        mine.push((i, evaluate_batch(spec, params, data, range, &mut workspace)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("evaluation does not panic"))
            .collect()
    });
    sums.sort_unstable_by_key(|&(i, _)| i);
    let (correct, loss) = sums
        .into_iter()
        .fold((0, 0.0), |(c, l), (_, (bc, bl))| (c + bc, l + bl));
    let n = data.len().max(1) as f64;
    Evaluation {
        accuracy: correct as f64 / n,
        loss: loss / n,
    }
}

/// Correct predictions and summed cross-entropy on the examples `range` of `data`.
fn evaluate_batch(
    spec: &ModelSpec,
    params: &[f32],
    data: &Dataset,
    range: std::ops::Range<usize>,
    workspace: &mut Workspace,
) -> (usize, f64) {
    let x = data.rows(range.clone());
    let logits = super::logits_in(spec, params, x.view(), workspace);
    let mut correct = 0usize;
    let mut loss = 0.0f64;
    for (row, &label) in logits.rows().into_iter().zip(&data.labels()[range]) {
        let (argmax, max) = row
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (j, &v)| {
                if v > best.1 { (j, v) } else { best }
            });
        correct += usize::from(argmax == label as usize);
        let log_sum: f64 = row
            .iter()
            .map(|&v| f64::from(v - max).exp())
            .sum::<f64>()
            .ln();
        loss += log_sum - f64::from(row[label as usize] - max);
    }
    (correct, loss)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// With a loose clip the clipped sum is n times the batch-mean gradient; with a tight clip no
    /// example contributes more than C in L1, so the sum's L1 norm is at most n C.
    #[test]
    fn clipped_gradient_sum_clips_each_example() {
        let n = 12;
        let labels: Vec<u32> = (0..n).map(|i| (i % 3) as u32).collect();
        let features = Array2::from_shape_fn((n, 4), |(i, j)| ((i * 5 + j * 3) % 7) as f32 - 3.0);
        let data = Dataset::new(features, labels, 3).unwrap();
        let spec = ModelSpec::mlp(4, &[5], 3).unwrap();
        let params = spec.init(&mut ChaCha8Rng::seed_from_u64(1));
        let all: Vec<usize> = (0..n).collect();
        let (loose, _) = clipped_gradient_sum(&spec, &params, &data, &all, 1e9);
        let mut batch = Batch::default();
        batch.gather(&data, &all);
        let mut mean = vec![0.0f32; params.len()];
        batch.loss_and_grad(&spec, &params, &mut mean, &mut Workspace::default());
        for (s, m) in loose.iter().zip(&mean) {
            assert!((s - n as f32 * m).abs() < 1e-4, "{s} vs {}", n as f32 * m);
        }
        let (tight, _) = clipped_gradient_sum(&spec, &params, &data, &all, 0.01);
        assert!(crate::norms::l1_norm(&tight) <= n as f64 * 0.01 + 1e-9);
    }

    /// Two Gaussian blobs: a few epochs of SGD must separate them.
    #[test]
    fn sgd_learns_separable_blobs() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let n = 400;
        let labels: Vec<u32> = (0..n).map(|i| (i % 2) as u32).collect();
        let features = Array2::from_shape_fn((n, 2), |(i, j)| {
            let centre = if labels[i] == 1 { 1.5 } else { -1.5 };
            centre * if j == 0 { 1.0 } else { -1.0 } + rng.random_range(-1.0f32..1.0)
        });
        let data = Dataset::new(features, labels, 2).unwrap();
        let spec = ModelSpec::mlp(2, &[8], 2).unwrap();
        let mut params = spec.init(&mut rng);
        let before = evaluate(&spec, &params, &data);
        let config = LocalConfig {
            epochs: 5,
            batch_size: 10,
            learning_rate: 0.1,
            random_shift: 0,
        };
        let all: Vec<usize> = (0..n).collect();
        let loss = train_local(
            &spec,
            &mut params,
            &data,
            &all,
            &config,
            GradientRule::Mean,
            &mut rng,
        );
        let after = evaluate(&spec, &params, &data);
        assert!(after.accuracy > 0.97, "{before:?} -> {after:?}");
        assert!(after.loss < before.loss);
        assert!((f64::from(loss) - after.loss).abs() < 0.2);
    }

    /// `n` random examples of `inputs` features and `classes` labels from `seed`, an MLP with
    /// one hidden layer of `hidden` units and its initial parameters.
    fn random_problem(
        seed: u64,
        n: usize,
        (inputs, hidden, classes): (usize, usize, u32),
    ) -> (Dataset, ModelSpec, Vec<f32>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let labels: Vec<u32> = (0..n).map(|_| rng.random_range(0..classes)).collect();
        let features = Array2::from_shape_fn((n, inputs), |_| rng.random_range(-1.0f32..1.0));
        let classes = classes as usize;
        let data = Dataset::new(features, labels, classes).unwrap();
        let spec = ModelSpec::mlp(inputs, &[hidden], classes).unwrap();
        let params = spec.init(&mut rng);
        (data, spec, params)
    }

    /// The batched, multi-threaded evaluation against the straightforward one: all examples in
    /// one forward pass, accuracy and mean cross-entropy by their definitions.
    #[test]
    fn evaluation_over_threads_equals_the_plain_definition() {
        let n = 2 * EVAL_BATCH + 377;
        let (data, spec, params) = random_problem(8, n, (6, 9, 4));
        let mut workspace = Workspace::default();
        let logits =
            super::super::logits_in(&spec, &params, data.rows(0..n).view(), &mut workspace);
        let (mut correct, mut loss) = (0usize, 0.0f64);
        for (row, &y) in logits.rows().into_iter().zip(data.labels()) {
            let p: Vec<f64> = row.iter().map(|&v| f64::from(v).exp()).collect();
            let best = (0..4).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap();
            correct += usize::from(best == y as usize);
            loss -= (p[y as usize] / p.iter().sum::<f64>()).ln();
        }
        let got = evaluate(&spec, &params, &data);
        assert_eq!(got.accuracy, correct as f64 / n as f64);
        assert!((got.loss - loss / n as f64).abs() < 1e-6, "{got:?}");
    }

    /// An evaluation takes its cores from the budget: with the only core held elsewhere it
    /// waits, then finishes once the core is free, with the figures of any number of cores.
    #[test]
    fn evaluation_waits_for_the_budgets_cores() {
        let (data, spec, params) = random_problem(9, 3 * EVAL_BATCH + 11, (5, 7, 3));
        let one = CoreBudget::new(1);
        let held = one.hold();
        std::thread::scope(|s| {
            let evaluation = s.spawn(|| evaluate_within(&spec, &params, &data, &one));
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while one.waiting() == 0 {
                assert!(!evaluation.is_finished(), "evaluated without a core");
                assert!(
                    std::time::Instant::now() < deadline,
                    "never asked for a core"
                );
                std::thread::yield_now();
            }
            drop(held);
            let on_one = evaluation.join().unwrap();
            let on_three = evaluate_within(&spec, &params, &data, &CoreBudget::new(3));
            assert_eq!(on_one, on_three);
        });
    }
}
