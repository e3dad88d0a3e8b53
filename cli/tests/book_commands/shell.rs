//! Runs a page's commands as a reader would, in a folder of its own laid out like the
//! repository: one `bash` per command, the page's `export`s before each, commands the page runs
//! side by side left running until a `wait` or the page's end, each command's output (stdout
//! and stderr, in order) compared with what the page shows.
//!
//! Ports: a server the page starts on `127.0.0.1:PORT` listens on a free port instead, read from
//! its `listening on` line; later commands get that port where the page writes PORT, and what
//! they print is compared with PORT put back.

use super::output;
use super::page::{Step, without_comment};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long one command may run (a debug build; the longest is a private run of 9 rounds of
/// 100 clients, about 30 s on 2 cores).
const DEADLINE: Duration = Duration::from_secs(300);

/// How the test runs a command: the page's text with `edits` (shorter runs, a placeholder
/// filled in), side by side with the next ones if `background`, stopped once a line contains
/// `until` (what the page shows up to that line is still compared).
#[derive(Clone, Copy, Debug)]
pub struct Run {
    pub edits: &'static [(&'static str, &'static str)],
    pub background: bool,
    pub until: Option<&'static str>,
}

/// The page's folder and what its commands so far have set up.
pub struct Shell {
    dir: PathBuf,
    /// The variables the page's `export`s set, as they came out (a random token once).
    exports: Vec<(String, String)>,
    /// (the page's address, the one its server listens on).
    ports: Vec<(String, String)>,
    running: Vec<Running>,
}

/// A command started and not yet checked.
struct Running {
    step: Step,
    run: Run,
    child: Child,
    printed: Arc<Mutex<Vec<String>>>,
    /// Set once its output is read to the end.
    read: Arc<std::sync::atomic::AtomicBool>,
    started: Instant,
}

impl Drop for Running {
    fn drop(&mut self) {
        kill_group(&self.child);
        let _ = self.child.wait();
    }
}

impl Shell {
    /// A fresh folder `dir` holding what the repository at `repo` gives a reader (configs, data,
    /// examples, scripts, the certificate script) and the binaries of this build at
    /// `target/release`, as a release build would leave them.
    pub fn new(repo: &Path, dir: PathBuf, binaries: &Path) -> Self {
        let _ = std::fs::remove_dir_all(&dir);
        let release = dir.join("target/release");
        std::fs::create_dir_all(&release).unwrap();
        std::fs::create_dir_all(dir.join("deploy")).unwrap();
        let link = |from: PathBuf, to: PathBuf| std::os::unix::fs::symlink(from, to).unwrap();
        for shared in ["configs", "data", "examples", "scripts", "python"] {
            link(repo.join(shared), dir.join(shared));
        }
        link(
            repo.join("deploy/make-certs.sh"),
            dir.join("deploy/make-certs.sh"),
        );
        for binary in ["fl", "fl-server", "fl-client", "own-trainer"] {
            let built = binaries.join(binary);
            assert!(
                built.is_file(),
                "no {} (cargo build --workspace)",
                built.display()
            );
            link(built, release.join(binary));
        }
        Self {
            dir,
            exports: Vec::new(),
            ports: Vec::new(),
            running: Vec::new(),
        }
    }

    /// Runs `step` as `run` says; an error says how it differs from its page.
    pub fn run(&mut self, step: &Step, run: Run) -> Result<(), String> {
        let mut script = step.script.clone();
        for (from, to) in run.edits {
            assert!(
                script.contains(from),
                "line {}: no `{from}` to edit",
                step.line
            );
            script = script.replacen(from, to, 1);
        }
        let code = without_comment(&script).to_owned();
        if code == "wait" {
            return self.wait_all();
        }
        let listens = listen_address(&code);
        if let Some(page) = &listens {
            script = script.replacen(&format!("--listen {page}"), "--listen 127.0.0.1:0", 1);
        }
        for (page, ours) in &self.ports {
            script = script.replace(page.as_str(), ours);
        }
        if code.starts_with("export ") {
            return self.export(step, &script);
        }
        // A command the page ends with `&` runs in the test's own background (its `bash` would
        // end at once), so that its exit and output are checked.
        if step.background {
            let at = script.rfind('&').unwrap();
            script.replace_range(at..=at, "");
        }
        let running = self.start(step, run, &script);
        if let Some(page) = listens {
            let ours = self.listening(&running)?;
            self.ports.retain(|(p, _)| *p != page);
            self.ports.push((page, ours));
        }
        if run.background || step.background {
            self.running.push(running);
            Ok(())
        } else {
            self.finish(running)
        }
    }

    /// Waits for every command running side by side, and checks each.
    pub fn wait_all(&mut self) -> Result<(), String> {
        let running = std::mem::take(&mut self.running);
        let mut errors = Vec::new();
        for each in running {
            errors.extend(self.finish(each).err());
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("\n\n"))
        }
    }

    /// Runs the `export` of `step` once and keeps the values it set for the page's later
    /// commands.
    fn export(&mut self, step: &Step, script: &str) -> Result<(), String> {
        let names: Vec<&str> = (script.split_whitespace())
            .filter_map(|w| w.split_once('=').map(|(name, _)| name))
            .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
            .collect();
        let print = names
            .iter()
            .map(|n| format!("printf '%s\\0' \"${n}\""))
            .collect::<Vec<_>>();
        let ran = self
            .bash(&format!("{script}\n{}", print.join("\n")))
            .output()
            .unwrap();
        if !ran.status.success() {
            return Err(format!("line {}: `{script}`: {ran:?}", step.line));
        }
        let values = String::from_utf8(ran.stdout).unwrap();
        for (name, value) in names.iter().zip(values.split('\0')) {
            self.exports.retain(|(n, _)| n != name);
            self.exports.push((name.to_string(), value.to_owned()));
        }
        Ok(())
    }

    /// `bash -c script` in the page's folder, with the binaries first on `PATH`, the page's
    /// exports, and none of the test's own `FL_*` variables or `RUST_LOG`.
    fn bash(&self, script: &str) -> Command {
        let path = format!(
            "{}:{}",
            self.dir.join("target/release").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = Command::new("bash");
        command
            .arg("-c")
            .arg(script)
            .current_dir(&self.dir)
            .env("PATH", path)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null());
        for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("FL_")) {
            command.env_remove(key);
        }
        command.envs(self.exports.iter().map(|(k, v)| (k, v)));
        command
    }

    /// Starts `script` in the page's folder, its output collected line by line.
    fn start(&self, step: &Step, run: Run, script: &str) -> Running {
        let mut command = self.bash(&format!("exec 2>&1\n{script}"));
        command.stdout(Stdio::piped());
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command.spawn().expect("bash runs");
        let stdout = child.stdout.take().unwrap();
        let printed = Arc::new(Mutex::new(Vec::new()));
        let read = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (into, ended) = (printed.clone(), read.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                into.lock().unwrap().push(line);
            }
            ended.store(true, std::sync::atomic::Ordering::Release);
        });
        Running {
            step: step.clone(),
            run,
            child,
            printed,
            read,
            started: Instant::now(),
        }
    }

    /// The address `running` says it listens on.
    fn listening(&self, running: &Running) -> Result<String, String> {
        loop {
            let printed = running.printed.lock().unwrap().clone();
            let said = printed.iter().find_map(|l| l.strip_prefix("listening on "));
            if let Some(address) = said {
                return Ok(address.trim().to_owned());
            }
            if running.started.elapsed() > DEADLINE {
                return Err(format!(
                    "line {}: never said where it listens",
                    running.step.line
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until `running` ends (or prints its `until` line), then compares its exit and
    /// output with the page.
    fn finish(&self, mut running: Running) -> Result<(), String> {
        let step = running.step.clone();
        let cut = running.run.until;
        let status = loop {
            if let Some(status) = running.child.try_wait().unwrap() {
                // What it printed last may still be in the pipe: read to its end (which a process
                // it left running may hold open; that one is stopped with the rest).
                let ended = Instant::now();
                while !running.read.load(std::sync::atomic::Ordering::Acquire)
                    && ended.elapsed() < Duration::from_secs(10)
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                break Some(status);
            }
            let printed = running.printed.lock().unwrap().clone();
            if cut.is_some_and(|c| printed.iter().any(|l| l.contains(c))) {
                break None;
            }
            if running.started.elapsed() > DEADLINE {
                return Err(format!(
                    "line {}: still running after {DEADLINE:?}",
                    step.line
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut printed = running.printed.lock().unwrap().clone();
        drop(running);
        for line in &mut printed {
            for (page, ours) in &self.ports {
                *line = line.replace(ours.as_str(), page);
            }
        }
        let said = |why: String| format!("line {}: `{}`: {why}", step.line, step.script);
        // A page shows a failing command by its `error:` line.
        let fails = step.expected.iter().any(|l| l.starts_with("error:"));
        if let Some(status) = status
            && status.success() == fails
        {
            return Err(said(format!(
                "{status}; it printed:\n{}",
                printed.join("\n")
            )));
        }
        if step.expected.is_empty() {
            return Ok(());
        }
        output::check(&step.expected, &printed, &step.varies, cut).map_err(said)
    }
}

/// The `127.0.0.1:PORT` a command's `--listen` names.
fn listen_address(code: &str) -> Option<String> {
    let after = code.split("--listen ").nth(1)?;
    let address = after.split_whitespace().next()?;
    address
        .starts_with("127.0.0.1:")
        .then(|| address.to_owned())
}

/// Ends the process group `child` leads (bash and what it started).
fn kill_group(child: &Child) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .stderr(Stdio::null())
        .status();
}
