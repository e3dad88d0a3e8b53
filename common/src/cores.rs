//! One budget of the machine's cores for everything CPU-heavy a process does: a client's local
//! training and the server's test evaluation take a core from the same [`CoreBudget`], so that
//! `fl sim` (server and clients in one process), evaluating a round while the next one trains,
//! runs as many compute threads as there are cores and no more.
//!
//! A hold is a leaf: code that holds a core never waits for another (training holds one for its
//! steps alone; an evaluation's workers hold one per batch, never the thread that waits for
//! them), so holders cannot wait on each other.
//!
//! Why by hand: the standard library has no counting semaphore, and tokio's would make this
//! crate depend on tokio; a mutex and a condition variable are the whole of it.

use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};

/// A number of cores, held by blocking until one is free.
#[derive(Debug)]
pub struct CoreBudget {
    cores: usize,
    state: Mutex<Holders>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct Holders {
    holding: usize,
    waiting: usize,
}

/// A held core, given back when dropped.
#[derive(Debug)]
pub struct CoreHold<'a>(&'a CoreBudget);

impl CoreBudget {
    /// A budget of `cores` (at least one).
    pub fn new(cores: usize) -> Self {
        Self {
            cores: cores.max(1),
            state: Mutex::default(),
            freed: Condvar::new(),
        }
    }

    /// The process's budget: the cores the operating system gives it.
    pub fn process() -> &'static Self {
        static PROCESS: OnceLock<CoreBudget> = OnceLock::new();
        PROCESS
            .get_or_init(|| Self::new(std::thread::available_parallelism().map_or(1, usize::from)))
    }

    /// How many cores the budget has.
    pub fn cores(&self) -> usize {
        self.cores
    }

    /// Blocks until a core is free and holds it. Must not be called while holding one.
    pub fn hold(&self) -> CoreHold<'_> {
        let mut state = self.lock();
        state.waiting += 1;
        while state.holding == self.cores {
            state = self
                .freed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.waiting -= 1;
        state.holding += 1;
        CoreHold(self)
    }

    /// Threads blocked in [`CoreBudget::hold`] now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting
    }

    fn lock(&self) -> MutexGuard<'_, Holders> {
        // The counts stay consistent under a panic elsewhere: each is changed in one statement.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for CoreHold<'_> {
    fn drop(&mut self) {
        self.0.lock().holding -= 1;
        self.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// However many threads ask, no more than `cores` hold at once, and all get their turn.
    #[test]
    fn holders_never_exceed_the_cores() {
        let budget = CoreBudget::new(2);
        let (now, peak, done) = (
            AtomicUsize::new(0),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        );
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..50 {
                        let _core = budget.hold();
                        let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(n, Ordering::SeqCst);
                        std::thread::yield_now();
                        now.fetch_sub(1, Ordering::SeqCst);
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(done.load(Ordering::SeqCst), 400);
        assert!(peak.load(Ordering::SeqCst) <= 2);
    }
}
