//! The C allocator: one arena for the whole process.
//!
//! glibc's malloc gives a thread that finds the arenas busy an arena of its own, up to eight per
//! core. Every received model and every upload is a buffer of the model's size that one thread
//! allocates and another frees (an async worker assembles it, a training thread or the server's
//! coordinator uses it): freed into an arena that the next allocating thread may not use, its
//! pages were not reused, and fresh ones were faulted in and zeroed. In `fl sim` of the Geyer K =
//! 1000 MLP (2.1 MB buffers, 8 rounds, 2 cores), one arena took the page faults from 690,000 -
//! 766,000 to 276,000 - 383,000, system CPU from 7.9 - 9.6 s to 5.5 - 5.7 s and peak RSS from
//! 2.4 - 2.8 GB to 0.9 GB (docs/performance.md, session 25). One arena per core faulted more and
//! kept 1.1 GB.
//!
//! One arena serialises the threads' allocations that miss their per-thread cache (glibc's
//! tcache keeps small chunks, up to 1 KiB, per thread without the arena's lock); on 2 cores the
//! user CPU did not change. It has not been measured on a many-core server.
//!
//! Why `mallopt` rather than another allocator: jemalloc (tikv-jemallocator 0.6.1) in the same
//! run faulted 1,313,326 pages (it gives freed pages back after its decay time), for no gain.

/// Limits glibc's malloc to one arena. Call it first in `main`, before any thread is started
/// (arenas already made stay). Returns whether the limit was set: elsewhere than on Linux with
/// glibc it does nothing.
pub fn single_arena() -> bool {
    set_arena_max(1)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_arena_max(arenas: i32) -> bool {
    // SAFETY: mallopt only sets a parameter of the allocator, and M_ARENA_MAX takes any positive
    // count (glibc's malloc/malloc.c, do_set_arena_max).
    unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_arena_max(_arenas: i32) -> bool {
    false
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_takes_the_limit() {
        assert!(super::single_arena());
    }
}
