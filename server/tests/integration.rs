//! The server's integration tests, in one binary: each file of `server/tests` is a module here,
//! so the helpers (`support`, `procs`) and the dependencies are compiled and linked once.
//! `log_boundary.rs`, which installs a process-wide log subscriber, and the tidy checks are
//! binaries of their own.

mod procs;
mod support;

mod bad_input;
mod buffered;
mod buffered_kill;
mod chaos;
mod cnn;
mod configs;
mod enrollment;
mod external_model;
mod framing;
mod in_process;
mod interrupt;
mod live_page;
mod local_privacy;
mod metrics;
mod privacy;
mod processes;
mod secagg;
mod server_optimizer;
mod signed_secagg;
mod tier;
mod tier_kill;
mod tls;
mod trainer;
mod verified;
