//! Simulation only: an in-process record of the clients' plain quantised inputs, so that `fl sim`
//! can check the unmasked sum against the true one. It never crosses the network and a deployed
//! server has none.

use super::ring::Ring;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// The plain inputs x_u of each (round, client), as the simulated clients report them.
#[derive(Debug, Default)]
pub struct PlainInputs {
    inputs: Mutex<BTreeMap<(u64, u64), Vec<u64>>>,
}

impl PlainInputs {
    /// Records client `client`'s quantised input of `round`.
    pub fn record(&self, round: u64, client: u64, x: Vec<u64>) {
        self.lock().insert((round, client), x);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(u64, u64), Vec<u64>>> {
        self.inputs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// sum_{u in clients} x_u of `round` in `ring`, or `None` if one is missing; forgets every
    /// input of this round and earlier.
    pub fn sum(&self, round: u64, ring: Ring, clients: &[u64], dim: usize) -> Option<Vec<u64>> {
        let mut inputs = self.lock();
        let mut sum = vec![0u64; dim];
        let mut complete = true;
        for &c in clients {
            match inputs.get(&(round, c)) {
                Some(x) if x.len() == dim => ring.add_assign(&mut sum, x),
                _ => complete = false,
            }
        }
        inputs.retain(|&(r, _), _| r > round);
        complete.then_some(sum)
    }
}
