//! Ctrl-C while the server waits for its clients: those already connected are told at once to
//! come back to the resumed server, so their connections close and the server exits without
//! waiting out its drain period.

use crate::procs;

use procs::{Reaper, bin, signal, start_client, wait};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn a_server_stopped_while_it_waits_for_clients_tells_those_connected_and_exits_at_once() {
    let out = std::env::temp_dir().join(format!("fl-interrupt-waiting-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let (data, out_arg) = (procs::mnist(), out.display().to_string());
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--clients",
        "3",
        "--clients-per-round",
        "2",
        "--model",
        "logistic",
        "--data",
        &data,
        "--out",
        &out_arg,
    ];
    let mut server = Reaper(
        Command::new(bin("fl-server"))
            .args(args)
            .env("RUST_LOG", "fl_server=debug")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut first = String::new();
    let mut stdout = BufReader::new(server.0.stdout.take().unwrap());
    stdout.read_line(&mut first).unwrap();
    let addr = first
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();
    // One client of the three joins; the server keeps waiting for the others.
    let mut client = start_client("waiting-client", &addr, &["--partition", "iid:3:0"]);
    let mut log = BufReader::new(server.0.stderr.take().unwrap()).lines();
    let mut said = Vec::new();
    for line in log.by_ref() {
        let line = line.unwrap();
        let joined = line.contains("session open");
        said.push(line);
        if joined {
            break;
        }
    }
    signal(&server, libc::SIGINT);
    assert_eq!(wait(&mut server, Duration::from_secs(30)).code(), Some(130));
    said.extend(log.map_while(Result::ok));
    let said = said.join("\n");
    assert!(said.contains("session closed"), "{said}");
    assert!(!said.contains("connections still open"), "{said}");
    // The client waits for the server to come back, as it was told.
    assert!(client.0.try_wait().unwrap().is_none(), "the client exited");
    std::fs::remove_dir_all(&out).unwrap();
}
