//! Helpers for tests that run the real `fl-server` and `fl-client` binaries.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The path of a workspace binary next to `fl-server`.
pub fn bin(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_fl-server")).with_file_name(name);
    assert!(
        path.exists(),
        "{} missing: build the workspace's binaries first (`cargo test --workspace` does)",
        path.display()
    );
    path
}

/// The shipped MNIST as a `--data` value.
pub fn mnist() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    format!("mnist:{}", dir.display())
}

/// Kills the child (SIGKILL) when dropped, whatever happens.
pub struct Reaper(pub Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for the child to exit, failing the test after `limit`.
pub fn wait(child: &mut Reaper, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "process did not finish within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `signal` to `child`.
pub fn signal(child: &Reaper, signal: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    let sent = unsafe { libc::kill(child.0.id() as libc::pid_t, signal) };
    assert_eq!(sent, 0);
}

/// Where a process's stderr goes: `FL_TEST_LOGS=DIR` keeps each in DIR/NAME.log.
fn log(name: &str) -> Stdio {
    match std::env::var_os("FL_TEST_LOGS") {
        Some(dir) => {
            let path = Path::new(&dir).join(format!("{name}.log"));
            Stdio::from(std::fs::File::create(path).unwrap())
        }
        None => Stdio::null(),
    }
}

/// Starts `fl-server` with `args` and returns it with the address it printed; `name` names its
/// log (see `FL_TEST_LOGS`).
pub fn start_server(name: &str, args: &[&str]) -> (Reaper, String) {
    let mut server = Reaper(
        Command::new(bin("fl-server"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(log(name))
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(server.0.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    (server, addr)
}

/// A free loopback address for a server that must come back on the same address after it is
/// killed. Its port is below the kernel's ephemeral range, so that in between neither another
/// test's port-0 bind nor a retrying client's outgoing connection (which, on an ephemeral port,
/// can connect to itself) can take it; each call in this process starts from a different port.
pub fn reusable_address() -> String {
    use std::sync::atomic::{AtomicU16, Ordering};
    static CALLS: AtomicU16 = AtomicU16::new(0);
    let low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let span = low.saturating_sub(10_000).max(1);
    let first =
        (std::process::id() as u16 % span).wrapping_add(CALLS.fetch_add(97, Ordering::Relaxed));
    (0..span)
        .map(|i| 10_000 + (first.wrapping_add(i) % span))
        .find(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
        .map(|port| format!("127.0.0.1:{port}"))
        .expect("a free port below the ephemeral range")
}

/// Starts `fl-client` against `addr` with `args` after the server and data flags; `name` names
/// its log.
pub fn start_client(name: &str, addr: &str, args: &[&str]) -> Reaper {
    Reaper(
        Command::new(bin("fl-client"))
            .args(["--server", &format!("http://{addr}"), "--data", &mnist()])
            .args(args)
            .stdout(Stdio::null())
            .stderr(log(name))
            .spawn()
            .unwrap(),
    )
}

/// Writes an enrollment file at `path` naming `client-0` .. `client-{count - 1}`, each with the
/// token `token-{i}` (as its digest); returns the list.
pub fn enroll_numbered(path: &Path, count: usize) -> fl_server::credentials::EnrollmentList {
    use fl_server::credentials::{Digest, EnrollmentList};
    let mut list = EnrollmentList::default();
    for i in 0..count {
        let token = Digest::of(format!("token-{i}").as_bytes());
        list.enroll(&format!("client-{i}"), Some(token), None)
            .unwrap();
    }
    std::fs::write(path, list.to_toml()).unwrap();
    list
}
