//! The C allocator: one arena for the whole process, and freed memory kept for reuse.
//!
//! glibc's malloc gives a thread that finds the arenas busy an arena of its own, up to eight per
//! core. Every received model and every upload is a buffer of the model's size that one thread
//! allocates and another frees (an async worker assembles it, a training thread or the server's
//! coordinator uses it): freed into an arena that the next allocating thread may not use, its
//! pages were not reused, and fresh ones were faulted in and zeroed. In `fl sim` of the Geyer K =
//! 1000 MLP (2.1 MB buffers, 8 rounds, 2 cores), one arena took the page faults from 690,000 -
//! 766,000 to 276,000 - 383,000, system CPU from 7.9 - 9.6 s to 5.5 - 5.7 s and peak RSS from
//! 2.4 - 2.8 GB to 0.9 GB (2-core AMD EPYC, 2026-11-26). One arena per core faulted more and kept
//! 1.1 GB, and jemalloc faulted more still (docs/src/results/speed.md, "What did not help").
//!
//! One arena serialises the threads' allocations that miss their per-thread cache (glibc's
//! tcache keeps small chunks, up to 1 KiB, per thread without the arena's lock); on 2 cores the
//! user CPU did not change. It has not been measured on a many-core server.
//!
//! glibc also gives the top of its heap back to the OS whenever more than 128 KiB of it is free
//! (`M_TRIM_THRESHOLD`), and serves a request above its `M_MMAP_THRESHOLD` from a mapping of its
//! own. In `fl sim` the ~220 clients sampled into a round each hold a received model until a
//! training slot takes them (some 460 MB for the Geyer K = 1000 MLP), so the heap grew and was
//! trimmed again every round, and every round faulted in (and the kernel zeroed) those pages
//! anew: 68,500 - 68,900 page faults over rounds 4-8, most of them in the assembly of received
//! tensors. With the heap's top kept up to [`TRIM_THRESHOLD`] and buffers up to
//! [`MMAP_THRESHOLD`] taken from the heap, 9,400 - 21,300 (2-core Intel Xeon, 2026-11-28).
//! The memory kept is never more than the process's own high-water mark; the server hands it
//! back after a join flood (`malloc_trim`, fl_server's `release_freed_memory`).
//!
//! Why `mallopt` rather than another allocator: jemalloc (tikv-jemallocator 0.6.1) in the same
//! run faulted 1,313,326 pages (it gives freed pages back after its decay time), for no gain.

/// Free memory at the top of the heap that glibc keeps rather than giving back (512 MiB).
pub const TRIM_THRESHOLD: i32 = 512 << 20;
/// Requests up to this size come from the heap (32 MiB, the largest glibc takes on 64 bits):
/// every model-sized buffer of the models this project trains.
pub const MMAP_THRESHOLD: i32 = 32 << 20;

/// Limits glibc's malloc to one arena and keeps freed memory for reuse ([`TRIM_THRESHOLD`],
/// [`MMAP_THRESHOLD`]). Call it first in `main`, before any thread is started (arenas already
/// made stay). Returns whether every setting was taken: elsewhere than on Linux with glibc it
/// does nothing.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn tune() -> bool {
    use libc::{M_ARENA_MAX, M_MMAP_THRESHOLD, M_TRIM_THRESHOLD};
    let settings = [
        (M_ARENA_MAX, 1),
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
    ];
    settings.into_iter().fold(true, |all, (parameter, value)| {
        // SAFETY: mallopt only sets a parameter of the allocator; these take any positive value
        // (glibc's malloc/malloc.c: do_set_arena_max, do_set_mmap_threshold up to
        // HEAP_MAX_SIZE / 2, do_set_trim_threshold).
        all & (unsafe { libc::mallopt(parameter, value) } == 1)
    })
}

/// Does nothing: the settings are glibc's.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() -> bool {
    false
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_takes_every_setting() {
        assert!(super::tune());
    }
}
