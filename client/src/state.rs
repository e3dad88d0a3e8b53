//! What a client remembers across its own restarts, so that a server cannot make it start over:
//! the local privacy it has spent (its releases composed, [`LocalLedger`]) against its total
//! cap, and the secure-round attempts it took part in, each (federation, run, round) once.
//!
//! Kept in memory for every client, and in a small JSON file when the client has one
//! (`fl-client --state-dir`; one file per federation and client name). The file is written
//! whole and durably ([`fl_common::durable`]: a synced temporary file, renamed, the folder
//! synced) before the upload or key advertisement it records leaves the client: a crash or a
//! power loss loses at most an attempt that never started, never a spend that was sent.
//!
//! Under a policy every release composes at the policy's `max_delta`, fixed, so that no
//! release's own delta can lower the total of the others; and the policy's serial is
//! remembered, so that an older policy is refused once a newer one was seen.

use fl_authority::policy::FederationPolicy;
use fl_privacy::{DdgRound, LocalLedger, Release};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Why the client state refuses: a file that cannot be used (starting over would forget what
/// was spent), a spent budget, or a secure attempt taken part in already.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The file cannot be read.
    #[error("reading the client state {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a client state.
    #[error("the client state {}: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: serde_json::Error,
    },
    /// The file is of another federation.
    #[error("the client state {} is of federation {found:?}, not {expected:?}", path.display())]
    OtherFederation {
        /// The file.
        path: PathBuf,
        /// Its federation.
        found: String,
        /// This client's.
        expected: String,
    },
    /// The file cannot be written.
    #[error("writing the client state {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// One more release would take the client past its cap.
    #[error(
        "this client's privacy budget is spent: one more release at epsilon {epsilon:.4} \
         would bring its total to {total:.4}, above its cap of {cap}"
    )]
    BudgetSpent {
        /// The release's epsilon.
        epsilon: f64,
        /// The total it would bring.
        total: f64,
        /// The client's cap.
        cap: f64,
    },
    /// Another client (of this process or another) holds the file.
    #[error(
        "the client state {} is in use by another client: give each client its own name \
         (--name, or Client(name=...)) or its own --state-dir",
        path.display()
    )]
    InUse {
        /// The file.
        path: PathBuf,
    },
    /// The policy is older than one this client has held.
    #[error(
        "federation {federation:?} policy serial {serial} is older than serial {seen}, which \
         this client has held: give it the current policy"
    )]
    OlderPolicy {
        /// The federation.
        federation: String,
        /// The policy's serial.
        serial: u64,
        /// The highest serial seen.
        seen: u64,
    },
    /// The client took part in this round, or a later one, of the run.
    #[error(
        "this client already took part in round {last} of run {run:016x}: a secure round is \
         taken part in once, and rounds only go forward"
    )]
    AlreadyTookPart {
        /// The last round it took part in.
        last: u64,
        /// The run.
        run: u64,
    },
}

/// The state file of the client `name` in the folder `dir`: `FEDERATION--NAME.json`, the
/// federation being `policy`'s id (`local` without one), every character other than an ASCII
/// letter, digit, `-` or `.` written `_`.
pub fn state_file(dir: &Path, policy: Option<&FederationPolicy>, name: &str) -> PathBuf {
    let federation = policy.map_or("local", |p| p.federation.as_str());
    let safe = |s: &str| -> String {
        (s.chars())
            .map(
                |c| match c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    true => c,
                    false => '_',
                },
            )
            .collect()
    };
    dir.join(format!("{}--{}.json", safe(federation), safe(name)))
}

/// What one release costs a client: a local mechanism's release, or a secure round at this
/// client's own noise (what the server may learn of its input from the unmasked sum).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Charge {
    /// A local mechanism's release.
    Local(Release),
    /// A secure round: this client's discrete Gaussian noise alone (`clients` = 1).
    Secure(DdgRound),
}

/// The file's contents.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Remembered {
    /// The federation the file is for (its policy's id; empty without a policy).
    federation: String,
    /// The highest policy serial this client has held for the federation (0: none).
    #[serde(default)]
    policy_serial: u64,
    /// The releases made.
    spent: LocalLedger,
    /// The largest delta of those releases (the composition's delta without a policy).
    delta: f64,
    /// For each run id of a server process, the last secure round taken part in.
    attempts: BTreeMap<u64, u64>,
}

/// How a client writes its file: [`fl_common::durable::write_atomic`], or in tests one that
/// fails at a chosen step.
type Writer = Box<dyn Fn(&Path, &[u8]) -> std::io::Result<()> + Send + Sync>;

/// See the module documentation.
pub(crate) struct ClientState {
    file: Option<PathBuf>,
    remembered: Remembered,
    /// The largest composed epsilon this client releases up to, if capped.
    cap: Option<f64>,
    /// The delta every release composes at (the policy's `max_delta`), if fixed.
    compose_at: Option<f64>,
    write: Writer,
    /// The lock on the file's `.lock` companion, held while the client runs, so that two
    /// clients can never share (and undercount) one record.
    _lock: Option<std::fs::File>,
}

impl std::fmt::Debug for ClientState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (f.debug_struct("ClientState"))
            .field("file", &self.file)
            .field("remembered", &self.remembered)
            .field("cap", &self.cap)
            .field("compose_at", &self.compose_at)
            .finish_non_exhaustive()
    }
}

impl ClientState {
    /// The state of a client under `policy` (if any), capped at the smaller of `own_cap` and
    /// the policy's `max_total_epsilon`, read from `file` when it exists (a missing file is a
    /// client's first start; an unreadable one, one of another federation, or one that has
    /// held a newer policy is an error: starting over would forget what was spent). A newer
    /// policy's serial is remembered before this returns.
    pub(crate) fn open(
        file: Option<PathBuf>,
        policy: Option<&FederationPolicy>,
        own_cap: Option<f64>,
    ) -> Result<Self, StateError> {
        let federation = policy.map_or("", |p| p.federation.as_str());
        let lock = file.as_deref().map(lock).transpose()?;
        let remembered = match &file {
            Some(path) if path.exists() => read(path, federation)?,
            Some(_) | None => Remembered {
                federation: federation.into(),
                ..Remembered::default()
            },
        };
        let cap = [own_cap, policy.map(|p| p.max_total_epsilon)];
        let mut state = Self {
            file,
            remembered,
            cap: cap.into_iter().flatten().reduce(f64::min),
            compose_at: policy.map(|p| p.max_delta),
            write: Box::new(fl_common::durable::write_atomic),
            _lock: lock,
        };
        if let Some(p) = policy {
            state.hold_policy(p)?;
        }
        Ok(state)
    }

    /// A state kept in memory only, with no cap.
    pub(crate) fn in_memory() -> Self {
        Self {
            file: None,
            remembered: Remembered::default(),
            cap: None,
            compose_at: None,
            write: Box::new(|_, _| Ok(())),
            _lock: None,
        }
    }

    /// Refuses `policy` when this client has held a newer one of its federation; remembers
    /// its serial when it is newer.
    fn hold_policy(&mut self, policy: &FederationPolicy) -> Result<(), StateError> {
        let seen = self.remembered.policy_serial;
        if policy.serial < seen {
            return Err(StateError::OlderPolicy {
                federation: policy.federation.clone(),
                serial: policy.serial,
                seen,
            });
        }
        if policy.serial > seen {
            self.remembered.policy_serial = policy.serial;
            self.save()?;
        }
        Ok(())
    }

    /// Writes the file, if the client has one, durably.
    fn save(&self) -> Result<(), StateError> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let text = serde_json::to_string_pretty(&self.remembered).expect("the state serialises");
        let fail = |source| StateError::Write {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(fail)?;
        }
        (self.write)(path, text.as_bytes()).map_err(fail)
    }

    /// Takes part in the secure round (`run`, `round`) of this client's federation, charged
    /// `charge` (if the round's noise is charged): refused when this client already took part
    /// in this round or a later one of the same run (an attempt is signed once; an aborted one
    /// is re-run as a new round number), or when the charge would pass the cap. Remembered, the
    /// charge with it, before it returns.
    pub(crate) fn take_part(
        &mut self,
        run: u64,
        round: u64,
        charge: Option<&Charge>,
    ) -> Result<(), StateError> {
        let last = self.remembered.attempts.get(&run).copied();
        if let Some(last) = last.filter(|&last| round <= last) {
            return Err(StateError::AlreadyTookPart { last, run });
        }
        if let Some(charge) = charge {
            self.spend(charge)?;
        }
        self.remembered.attempts.insert(run, round);
        self.save()
    }

    /// The ledger with `charge` added, and the delta the releases then compose at.
    fn with(&self, charge: &Charge) -> (LocalLedger, f64) {
        let mut spent = self.remembered.spent.clone();
        let delta = match charge {
            Charge::Local(release) => {
                spent.record(release);
                self.remembered.delta.max(release.delta)
            }
            Charge::Secure(round) => {
                spent.record_secure(round);
                self.remembered.delta
            }
        };
        (spent, delta)
    }

    /// The delta the releases compose at: the policy's, or without one the largest released.
    fn composed_at(&self, largest: f64) -> f64 {
        self.compose_at.unwrap_or(largest)
    }

    /// What `charge` alone costs, at the composition's delta.
    pub(crate) fn cost(&self, charge: &Charge) -> f64 {
        match charge {
            Charge::Local(release) => release.epsilon,
            Charge::Secure(round) => {
                let mut alone = LocalLedger::default();
                alone.record_secure(round);
                alone.epsilon(self.composed_at(self.remembered.delta))
            }
        }
    }

    /// Refuses `charge` when it would take this client past its cap.
    pub(crate) fn check(&self, charge: &Charge) -> Result<(), StateError> {
        let (spent, delta) = self.with(charge);
        let total = spent.epsilon(self.composed_at(delta));
        match self.cap {
            Some(cap) if total > cap => Err(StateError::BudgetSpent {
                epsilon: self.cost(charge),
                total,
                cap,
            }),
            Some(_) | None => Ok(()),
        }
    }

    /// Adds `charge` (checked against the cap first) in memory.
    fn spend(&mut self, charge: &Charge) -> Result<(), StateError> {
        self.check(charge)?;
        let (spent, delta) = self.with(charge);
        self.remembered.spent = spent;
        self.remembered.delta = delta;
        Ok(())
    }

    /// Records a local release (checked against the cap first), remembered before it returns.
    pub(crate) fn record(&mut self, release: &Release) -> Result<(), StateError> {
        self.spend(&Charge::Local(*release))?;
        self.save()
    }

    /// Releases made.
    pub(crate) fn releases(&self) -> u64 {
        self.remembered.spent.releases()
    }

    /// Their composed epsilon (0 with none).
    pub(crate) fn epsilon(&self) -> f64 {
        let delta = self.composed_at(self.remembered.delta);
        self.remembered.spent.epsilon(delta)
    }
}

/// Locks the state file `path` for this client (its folder made if missing): refused while
/// another client holds it. The lock ends with the process.
fn lock(path: &Path) -> Result<std::fs::File, StateError> {
    let fail = |source| StateError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    let file = (std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true))
    .open(path.with_extension("json.lock"))
    .map_err(fail)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(StateError::InUse {
            path: path.to_path_buf(),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(fail(e)),
    }
}

/// The remembered state in `path`, which must be of `federation`.
fn read(path: &Path, federation: &str) -> Result<Remembered, StateError> {
    let text = std::fs::read_to_string(path).map_err(|source| StateError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let read: Remembered = serde_json::from_str(&text).map_err(|source| StateError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    if read.federation != federation {
        return Err(StateError::OtherFederation {
            path: path.to_path_buf(),
            found: read.federation,
            expected: federation.into(),
        });
    }
    Ok(read)
}

#[cfg(test)]
mod tests;
