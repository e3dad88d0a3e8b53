//! Logging for a client process: what `fl-client` and the Python package set up, and what a
//! program built on the library calls first to see its client's progress.

/// Logs on stderr, filtered by `RUST_LOG`, or by `default_filter` (`"info"`: the client's
/// connection, rounds and end) when it is unset. Colours only on a terminal, so logs collected by
/// docker or a file stay plain text. A second call changes nothing.
pub fn init_logging(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_filter.into());
    // Err only when a logger is set already (an earlier call): that one stays.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
