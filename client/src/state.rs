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
mod tests {
    use super::*;
    use fl_authority::policy::{MinDegree, PolicyMode};
    use fl_common::durable::{WriteStep, write_atomic_with};
    use fl_privacy::{GaussianLdp, LocalKind, LocalMechanism};

    fn policy(serial: u64) -> FederationPolicy {
        FederationPolicy {
            federation: "hospitals".into(),
            serial,
            modes: PolicyMode::all().into_iter().collect(),
            min_clients: 4,
            min_degree: MinDegree::Complete,
            min_threshold: 0.7,
            min_noise_multiplier: 0.0,
            max_release_epsilon: 4.0,
            max_total_epsilon: 5.0,
            max_delta: 1e-5,
            max_model_magnitude: 100.0,
        }
    }

    #[test]
    fn state_files_are_named_by_federation_and_client_in_safe_characters() {
        let dir = Path::new("state");
        let policy = FederationPolicy {
            federation: "hospitals/2026".into(),
            ..policy(1)
        };
        assert_eq!(
            state_file(dir, Some(&policy), "site 1"),
            dir.join("hospitals_2026--site_1.json")
        );
        assert_eq!(
            state_file(dir, None, "a.b-c"),
            dir.join("local--a.b-c.json")
        );
    }

    fn file(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("fl-state-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir.join("hospitals--site-1.json")
    }

    /// The cap holds across a restart: what was spent is read back, and a release past the
    /// cap is refused.
    #[test]
    fn spend_and_attempts_survive_a_restart() {
        let path = file("restart");
        let release = Release {
            kind: LocalKind::Laplace,
            epsilon: 2.0,
            delta: 0.0,
            noise: 1.0 / 2.0,
            sensitivity: 1.0,
        };
        let mut state = ClientState::open(Some(path.clone()), Some(&policy(1)), None).unwrap();
        state.record(&release).unwrap();
        state.record(&release).unwrap();
        state.take_part(7, 3, None).unwrap();
        drop(state);
        let mut again = ClientState::open(Some(path.clone()), Some(&policy(1)), None).unwrap();
        assert_eq!(again.releases(), 2);
        assert_eq!(again.epsilon(), 4.0);
        let refused = again.record(&release).unwrap_err();
        assert!(
            matches!(
                refused,
                StateError::BudgetSpent {
                    total: 6.0,
                    cap: 5.0,
                    ..
                }
            ),
            "{refused}"
        );
        let twice = again.take_part(7, 3, None).unwrap_err();
        assert!(
            matches!(twice, StateError::AlreadyTookPart { last: 3, run: 7 }),
            "{twice}"
        );
        assert!(again.take_part(7, 2, None).is_err());
        again.take_part(7, 4, None).unwrap();
        again.take_part(8, 1, None).unwrap();
        let elsewhere = FederationPolicy {
            federation: "elsewhere".into(),
            ..policy(1)
        };
        drop(again);
        let other = ClientState::open(Some(path.clone()), Some(&elsewhere), None).unwrap_err();
        assert!(
            matches!(&other, StateError::OtherFederation { found, .. } if found == "hospitals"),
            "{other}"
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    /// Once a client has held serial 3 of its federation's policy, serial 2 is refused (also
    /// after a restart), and serial 3 and 4 are taken.
    #[test]
    fn an_older_policy_is_refused_after_a_newer_one() {
        let path = file("serial");
        drop(ClientState::open(Some(path.clone()), Some(&policy(3)), None).unwrap());
        let older = ClientState::open(Some(path.clone()), Some(&policy(2)), None).unwrap_err();
        assert!(
            matches!(
                older,
                StateError::OlderPolicy {
                    serial: 2,
                    seen: 3,
                    ..
                }
            ),
            "{older}"
        );
        assert!(older.to_string().contains("older than serial 3"), "{older}");
        ClientState::open(Some(path.clone()), Some(&policy(3)), None).unwrap();
        ClientState::open(Some(path.clone()), Some(&policy(4)), None).unwrap();
        assert!(ClientState::open(Some(path.clone()), Some(&policy(3)), None).is_err());
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    /// Two clients cannot share one state file: the second is refused while the first holds
    /// it, and takes it once the first has ended.
    #[test]
    fn a_state_file_is_held_by_one_client() {
        let path = file("lock");
        let first = ClientState::open(Some(path.clone()), Some(&policy(1)), None).unwrap();
        let second = ClientState::open(Some(path.clone()), Some(&policy(1)), None).unwrap_err();
        assert!(matches!(second, StateError::InUse { .. }), "{second}");
        drop(first);
        ClientState::open(Some(path.clone()), Some(&policy(1)), None).unwrap();
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    /// Under a policy the releases compose at its max_delta, whatever delta one release was
    /// made at: a release at delta 0.5 does not lower the total of the others (without a
    /// policy the composition's delta is the largest released, and it does).
    #[test]
    fn releases_compose_at_the_policys_delta() {
        let small = LocalMechanism::Gaussian(GaussianLdp {
            epsilon: 1.0,
            delta: 1e-5,
            clip_bound: 1.0,
        })
        .accounted_release()
        .unwrap();
        let large = LocalMechanism::Gaussian(GaussianLdp {
            epsilon: 1.0,
            delta: 0.5,
            clip_bound: 1.0,
        })
        .accounted_release()
        .unwrap();
        let total = |policy: Option<&FederationPolicy>| {
            let mut state = ClientState::open(None, policy, Some(1e9)).unwrap();
            for _ in 0..40 {
                state.record(&small).unwrap();
            }
            let before = state.epsilon();
            state.record(&large).unwrap();
            (before, state.epsilon())
        };
        let generous = FederationPolicy {
            max_total_epsilon: 1e9,
            ..policy(1)
        };
        let (before, after) = total(Some(&generous));
        assert!(after > before, "{before} then {after}");
        let (before, after) = total(None);
        assert!(after < before, "{before} then {after}");
    }

    /// A fault at each step of the state's write: the spend is refused (so the release does
    /// not leave), and the state read back after it never holds less than what was sent.
    #[test]
    fn a_fault_at_any_step_of_the_write_never_undercounts() {
        let release = Release {
            kind: LocalKind::Laplace,
            epsilon: 1.0,
            delta: 0.0,
            noise: 1.0 / 1.0,
            sensitivity: 1.0,
        };
        for step in WriteStep::ALL {
            let path = file(&format!("fault-{step:?}"));
            let mut state = ClientState::open(Some(path.clone()), Some(&policy(1)), None).unwrap();
            state.record(&release).unwrap();
            let sent = state.releases();
            state.write = Box::new(move |path, bytes| {
                write_atomic_with(path, bytes, |s| match s == step {
                    true => Err(std::io::Error::other("injected")),
                    false => Ok(()),
                })
            });
            let refused = state.record(&release).unwrap_err();
            assert!(matches!(refused, StateError::Write { .. }), "{refused}");
            drop(state);
            let again = ClientState::open(Some(path.clone()), Some(&policy(1)), None).unwrap();
            assert!(again.releases() >= sent, "{step:?}: {}", again.releases());
            assert!(again.epsilon() >= 1.0, "{step:?}");
            let _ = std::fs::remove_dir_all(path.parent().unwrap());
        }
    }
}
