//! One epoch (600 MNIST-shaped examples) of FedAvg-CNN training steps, forward, loss, backward
//! and SGD update, by fl-model's layers and by candle on CPU, at B = 10 and 50; prints the
//! median of 5 epochs of each. Run pinned to one core:
//!
//!     RAYON_NUM_THREADS=1 taskset -c 0 cargo run --release --manifest-path scripts/cnn-kernels/Cargo.toml

use candle_core::{DType, Device, Tensor};
use candle_nn::{Conv2dConfig, Module, Optimizer, SGD, VarBuilder, VarMap};
use fl_model::sequential::{Sequential, Workspace, FEDAVG_CNN, LayerSpec, Shape};
use std::time::Instant;

const EXAMPLES: usize = 600;

fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn data() -> (Vec<f32>, Vec<u32>) {
    let x = (0..EXAMPLES * 784)
        .map(|i| ((i * 7919) % 256) as f32 / 255.0)
        .collect();
    let y = (0..EXAMPLES).map(|i| (i % 10) as u32).collect();
    (x, y)
}

fn ours(batch: usize) -> f64 {
    let layers: Vec<LayerSpec> = FEDAVG_CNN.iter().map(|s| s.parse().unwrap()).collect();
    let input = Shape {
        height: 28,
        width: 28,
        channels: 1,
    };
    let cnn = Sequential::new(input, &layers).unwrap();
    let mut params: Vec<f32> = (0..cnn.num_params())
        .map(|i| ((i % 97) as f32 - 48.0) * 1e-3)
        .collect();
    let (x, y) = data();
    let x = ndarray::Array2::from_shape_vec((EXAMPLES, 784), x).unwrap();
    let mut ws = Workspace::default();
    let times = (0..6)
        .map(|_| {
            let t = Instant::now();
            for s in (0..EXAMPLES).step_by(batch) {
                let xb = x.slice(ndarray::s![s..s + batch, ..]);
                cnn.loss_and_step(&mut params, 0.01, xb, &y[s..s + batch], &mut ws);
            }
            t.elapsed().as_secs_f64()
        })
        .skip(1)
        .collect();
    median(times)
}

fn candle(batch: usize) -> candle_core::Result<f64> {
    let dev = Device::Cpu;
    let vars = VarMap::new();
    let vb = VarBuilder::from_varmap(&vars, DType::F32, &dev);
    let pad2 = Conv2dConfig {
        padding: 2,
        ..Default::default()
    };
    let c1 = candle_nn::conv2d(1, 32, 5, pad2, vb.pp("c1"))?;
    let c2 = candle_nn::conv2d(32, 64, 5, pad2, vb.pp("c2"))?;
    let d1 = candle_nn::linear(7 * 7 * 64, 512, vb.pp("d1"))?;
    let d2 = candle_nn::linear(512, 10, vb.pp("d2"))?;
    let mut sgd = SGD::new(vars.all_vars(), 0.01)?;
    let (x, y) = data();
    let x = Tensor::from_vec(x, (EXAMPLES, 1, 28, 28), &dev)?;
    let y = Tensor::from_vec(y, EXAMPLES, &dev)?;
    let mut times = Vec::new();
    for _ in 0..6 {
        let t = Instant::now();
        for s in (0..EXAMPLES).step_by(batch) {
            let xb = x.narrow(0, s, batch)?;
            let h = c1.forward(&xb)?.relu()?.max_pool2d(2)?;
            let h = c2.forward(&h)?.relu()?.max_pool2d(2)?.flatten_from(1)?;
            let logits = d2.forward(&d1.forward(&h)?.relu()?)?;
            let loss = candle_nn::loss::cross_entropy(&logits, &y.narrow(0, s, batch)?)?;
            sgd.backward_step(&loss)?;
        }
        times.push(t.elapsed().as_secs_f64());
    }
    Ok(median(times[1..].to_vec()))
}

fn main() -> candle_core::Result<()> {
    for batch in [10, 50] {
        println!(
            "B = {batch}: fl-model {:.3} s, candle {:.3} s per epoch",
            ours(batch),
            candle(batch)?
        );
    }
    Ok(())
}
