use fl_common::data::*;
use fl_common::model::*;
use rand::SeedableRng;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let epochs: u32 = args[1].parse().unwrap();
    let b: u32 = args[2].parse().unwrap();
    let lr: f32 = args[3].parse().unwrap();
    let rounds: usize = args[4].parse().unwrap();
    let dir = std::path::Path::new("data/mnist");
    let t = std::time::Instant::now();
    let train = load_mnist(dir, Split::Train).unwrap();
    let test = load_mnist(dir, Split::Test).unwrap();
    println!("load {:?}", t.elapsed());
    let p = Partition { scheme: PartitionScheme::Shards, clients: 100, seed: 0 };
    let parts = p.assign(train.labels()).unwrap();
    let spec = ModelSpec::mlp(784, &[600, 100], 10).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut w = spec.init(&mut rng);
    let cfg = LocalConfig { epochs, batch_size: b, learning_rate: lr };
    let t = std::time::Instant::now();
    for r in 0..rounds {
        let mut agg = WeightedMean::new(w.len());
        for c in rand::seq::index::sample(&mut rng, 100, 10).into_iter() {
            let mut local = w.clone();
            train_local(&spec, &mut local, &train, &parts[c], &cfg, &mut rng);
            let u: Vec<f32> = local.iter().zip(&w).map(|(a, b)| a - b).collect();
            agg.add(&u, parts[c].len() as u64).unwrap();
        }
        apply_update(&mut w, &agg.mean().unwrap());
        let e = evaluate(&spec, &w, &test);
        println!("round {} acc {:.4} loss {:.4} t {:.1}", r + 1, e.accuracy, e.loss, t.elapsed().as_secs_f64());
    }
}
