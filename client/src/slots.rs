//! A process's training slots: a fixed set of threads that take CPU-heavy client work (a round's
//! training, the secure-aggregation protocol's quantising, noising and masking) from one queue.
//!
//! A slot that finishes a job takes the next queued one itself, with no async task to wake in
//! between: with a semaphore in front of tokio's blocking pool, each hand-off went training
//! thread → session task → permit → the next session's task → blocking pool, and on two cores
//! the Geyer K = 1000 simulation left 7-8% of the CPU idle between trainings; with the queue 2%,
//! and 11% less time per client (2-core Intel Xeon, 2026-11-27).
//!
//! None of this work may run on the async workers: inline, a simulation of 1,000
//! secure-aggregation clients on two cores kept them busy for 27.5 s at a time, past the
//! keep-alive ping's 20 s, and a shared connection's 100 clients dropped at once.
//!
//! Why by hand: the work is a boxed closure and a oneshot answer; a general thread-pool crate
//! (rayon, threadpool) would bring scheduling this needs none of.

use crate::ClientError;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, mpsc};
use tokio::sync::oneshot;

/// A job for a slot: runs once, on a slot's thread.
type Job = Box<dyn FnOnce() + Send>;

/// How many clients of a process train at once: clients given clones of one `TrainingSlots`
/// share its slots, which are threads started on first use and ended when the last clone is
/// dropped.
#[derive(Clone)]
pub struct TrainingSlots(Arc<Slots>);

struct Slots {
    count: usize,
    queue: OnceLock<mpsc::Sender<Job>>,
}

impl TrainingSlots {
    /// `slots` threads (at least one).
    pub fn new(slots: usize) -> Self {
        Self(Arc::new(Slots {
            count: slots.max(1),
            queue: OnceLock::new(),
        }))
    }

    /// Runs `job` in the next free slot and returns what it returned. The job runs to its end
    /// even if the caller stops waiting (a dropped session); a panic in it is an error here and
    /// leaves the slot serving.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ClientError> {
        let (answer, answered) = oneshot::channel();
        let job: Job = Box::new(move || {
            // The caller may have stopped waiting: then nobody wants the answer.
            let _ = answer.send(catch_unwind(AssertUnwindSafe(job)));
        });
        let lost = || ClientError::Protocol("no training slot is running".into());
        self.0.queue().send(job).map_err(|_| lost())?;
        match answered.await.map_err(|_| lost())? {
            Ok(done) => Ok(done),
            Err(_) => Err(ClientError::Protocol("the training panicked".into())),
        }
    }
}

impl Slots {
    /// The queue, starting the slots' threads on first use.
    fn queue(&self) -> &mpsc::Sender<Job> {
        self.queue.get_or_init(|| {
            let (queue, jobs) = mpsc::channel::<Job>();
            let jobs = Arc::new(Mutex::new(jobs));
            for i in 0..self.count {
                let jobs = jobs.clone();
                let started = std::thread::Builder::new()
                    .name(format!("fl-training-{i}"))
                    .spawn(move || serve(&jobs));
                if let Err(e) = started {
                    tracing::warn!(error = %e, slot = i, "could not start a training slot");
                }
            }
            queue
        })
    }
}

/// A slot's life: take the next job and run it, until the queue's senders are all dropped.
fn serve(jobs: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        // The lock is given back before the job runs: the other slots take jobs meanwhile.
        let next = jobs.lock().unwrap_or_else(PoisonError::into_inner).recv();
        match next {
            Ok(job) => job(),
            Err(mpsc::RecvError) => return,
        }
    }
}

impl fmt::Debug for TrainingSlots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrainingSlots")
            .field("slots", &self.0.count)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::time::Duration;

    /// On a runtime of one async worker, a task of 10 ms ticks keeps ticking while a slot runs
    /// 400 ms of work: the work is off the worker (inline, the ticks would stop).
    #[test]
    fn slot_work_leaves_the_async_worker_free() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let ticks = Arc::new(AtomicU64::new(0));
        let counter = ticks.clone();
        let slots = TrainingSlots::new(1);
        let during = runtime.block_on(async move {
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    counter.fetch_add(1, Ordering::SeqCst);
                }
            });
            slots
                .run(move || {
                    let before = ticks.load(Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(400));
                    ticks.load(Ordering::SeqCst) - before
                })
                .await
                .unwrap()
        });
        // 40 ticks of 10 ms fit in 400 ms; a loaded machine may delay some, not nearly all.
        assert!(during >= 5, "{during} ticks during the slot's work");
    }

    /// Never more jobs at once than slots, however many are queued, and every slot in use
    /// (two jobs meet, which one slot could not run); every job runs; a panic is an error for
    /// its caller only.
    #[test]
    fn slots_bound_the_work_running_at_once() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let slots = TrainingSlots::new(2);
        let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (to_b, b_hears) = mpsc::channel();
        let (to_a, a_hears) = mpsc::channel();
        let meet = Mutex::new(vec![(to_b, a_hears), (to_a, b_hears)]);
        let meet = Arc::new(meet);
        let results: Vec<_> = runtime.block_on(async {
            let jobs: Vec<_> = (0..12)
                .map(|i| {
                    let (running, most, meet, slots) =
                        (running.clone(), most.clone(), meet.clone(), slots.clone());
                    tokio::spawn(async move {
                        slots
                            .run(move || {
                                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                                most.fetch_max(now, Ordering::SeqCst);
                                if i < 2 {
                                    let (tell, hear) = meet.lock().unwrap().pop().unwrap();
                                    tell.send(i).unwrap();
                                    hear.recv_timeout(Duration::from_secs(60)).unwrap();
                                }
                                running.fetch_sub(1, Ordering::SeqCst);
                                assert_ne!(i, 7, "job 7 fails");
                                i
                            })
                            .await
                    })
                })
                .collect();
            let mut results = Vec::new();
            for job in jobs {
                results.push(job.await.unwrap());
            }
            results
        });
        assert_eq!(most.load(Ordering::SeqCst), 2);
        for (i, result) in results.into_iter().enumerate() {
            match result {
                Ok(done) => assert_eq!(done, i),
                Err(e) => assert!(i == 7 && e.to_string().contains("panicked"), "{i}: {e}"),
            }
        }
    }
}
