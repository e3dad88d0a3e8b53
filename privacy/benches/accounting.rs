//! The accountants on a long heterogeneous run: 100,000 rounds of the Poisson-subsampled Gaussian
//! mechanism in 100 phases of 1,000 rounds, q rising from 0.001 to 0.01 and the noise multiplier
//! z falling from 1.5 to 0.8 (a ramped m_t with a decaying z): epsilon at delta = 1e-5.
//!
//! - `rdp_round_by_round`: the ledger's path, one `compose(event, 1)` per round, then epsilon.
//! - `{rdp,pld}_by_phase`: one `compose(event, 1000)` per phase, then epsilon.
//!
//! `cargo bench -p fl-privacy --bench accounting`; report medians with the machine's core count.

use criterion::{Criterion, criterion_group, criterion_main};
use fl_privacy::{Accountant, GaussianRound, PldAccountant, PrivacyEvent, RdpAccountant, Sampling};
use std::hint::black_box;

/// Phases of the run.
const PHASES: usize = 100;
/// Rounds per phase.
const ROUNDS_PER_PHASE: u64 = 1_000;
/// delta of the reported epsilon.
const DELTA: f64 = 1e-5;

/// The event of phase `p`.
fn phase(p: usize) -> PrivacyEvent {
    let s = p as f64 / (PHASES - 1) as f64;
    let q = 0.001 + s * 0.009;
    let z = 1.5 - s * 0.7;
    PrivacyEvent::from(GaussianRound::new(q, z, Sampling::Poisson).expect("valid round"))
}

fn by_phase(accountant: &mut dyn Accountant) -> f64 {
    for p in 0..PHASES {
        accountant.compose(&phase(p), ROUNDS_PER_PHASE);
    }
    accountant.epsilon(DELTA)
}

fn accounting(c: &mut Criterion) {
    let mut group = c.benchmark_group("accountant_100k_rounds");
    group.sample_size(10);
    group.bench_function("rdp_round_by_round", |b| {
        b.iter(|| {
            let mut rdp = RdpAccountant::default();
            for p in 0..PHASES {
                let event = phase(p);
                for _ in 0..ROUNDS_PER_PHASE {
                    rdp.compose(&event, 1);
                }
            }
            black_box(rdp.epsilon(DELTA))
        })
    });
    group.bench_function("rdp_by_phase", |b| {
        b.iter(|| black_box(by_phase(&mut RdpAccountant::default())))
    });
    group.bench_function("pld_by_phase", |b| {
        b.iter(|| black_box(by_phase(&mut PldAccountant::default())))
    });
    group.finish();
    let rdp = by_phase(&mut RdpAccountant::default());
    let pld = by_phase(&mut PldAccountant::default());
    println!("epsilon at delta 1e-5 after 100,000 rounds: RDP {rdp:.3}, PLD {pld:.3}");
}

criterion_group!(benches, accounting);
criterion_main!(benches);
