//! What a client remembers across its own restarts, so that a server cannot make it start over:
//! the local privacy it has spent (its releases composed, [`LocalLedger`]) against its total
//! cap, and the secure-round attempts it took part in, each (federation, run, round) once.
//!
//! Kept in memory for every client, and in a small JSON file when the client has one
//! (`fl-client --state-dir`; one file per federation and client name). The file is written
//! whole (to a temporary name, then renamed) before the upload or key advertisement it
//! records leaves the client: a crash loses at most an attempt that never started, never a
//! spend that was sent.

use fl_authority::policy::FederationPolicy;
use fl_privacy::{LocalLedger, Release};
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
        "this client's local privacy budget is spent: one more release at epsilon {epsilon} \
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

/// The file's contents.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Remembered {
    /// The federation the file is for (its policy's id; empty without a policy).
    federation: String,
    /// The releases made.
    spent: LocalLedger,
    /// The largest delta of those releases, at which they compose.
    delta: f64,
    /// For each run id of a server process, the last secure round taken part in.
    attempts: BTreeMap<u64, u64>,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct ClientState {
    file: Option<PathBuf>,
    remembered: Remembered,
    /// The largest composed epsilon this client releases up to, if capped.
    cap: Option<f64>,
}

impl ClientState {
    /// The state of a client of `federation` capped at `cap`, read from `file` when it exists
    /// (a missing file is a client's first start; an unreadable one, or one of another
    /// federation, is an error: starting over would forget what was spent).
    pub(crate) fn open(
        file: Option<PathBuf>,
        federation: &str,
        cap: Option<f64>,
    ) -> Result<Self, StateError> {
        let fresh = Remembered {
            federation: federation.into(),
            ..Remembered::default()
        };
        let remembered = match &file {
            Some(path) if path.exists() => {
                let text = std::fs::read_to_string(path).map_err(|source| StateError::Read {
                    path: path.clone(),
                    source,
                })?;
                let read: Remembered =
                    serde_json::from_str(&text).map_err(|source| StateError::Parse {
                        path: path.clone(),
                        source,
                    })?;
                if read.federation != federation {
                    return Err(StateError::OtherFederation {
                        path: path.clone(),
                        found: read.federation,
                        expected: federation.into(),
                    });
                }
                read
            }
            _ => fresh,
        };
        Ok(Self {
            file,
            remembered,
            cap,
        })
    }

    /// A state kept in memory only, with no cap.
    pub(crate) fn in_memory() -> Self {
        Self {
            file: None,
            remembered: Remembered::default(),
            cap: None,
        }
    }

    /// Writes the file, if the client has one.
    fn save(&self) -> Result<(), StateError> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let text = serde_json::to_string_pretty(&self.remembered).expect("the state serialises");
        let tmp = path.with_extension("json.tmp");
        let fail = |source| StateError::Write {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(fail)?;
        }
        std::fs::write(&tmp, text).map_err(fail)?;
        std::fs::rename(&tmp, path).map_err(fail)
    }

    /// Takes part in the secure round (`run`, `round`) of this client's federation: refused
    /// when this client already took part in this round or a later one of the same run (an
    /// attempt is signed once; an aborted one is re-run as a new round number). Remembered
    /// before it returns.
    pub(crate) fn take_part(&mut self, run: u64, round: u64) -> Result<(), StateError> {
        let last = self.remembered.attempts.get(&run).copied();
        if let Some(last) = last.filter(|&last| round <= last) {
            return Err(StateError::AlreadyTookPart { last, run });
        }
        self.remembered.attempts.insert(run, round);
        self.save()
    }

    /// What the releases made so far compose to, with `release` added, at their largest delta.
    fn with(&self, release: &Release) -> (LocalLedger, f64, f64) {
        let mut spent = self.remembered.spent.clone();
        spent.record(release);
        let delta = self.remembered.delta.max(release.delta);
        let epsilon = spent.epsilon(delta);
        (spent, delta, epsilon)
    }

    /// Refuses `release` when it would take this client past its cap.
    pub(crate) fn check(&self, release: &Release) -> Result<(), StateError> {
        let (_, _, total) = self.with(release);
        match self.cap {
            Some(cap) if total > cap => Err(StateError::BudgetSpent {
                epsilon: release.epsilon,
                total,
                cap,
            }),
            _ => Ok(()),
        }
    }

    /// Records `release` (checked against the cap first), remembered before it returns.
    pub(crate) fn record(&mut self, release: &Release) -> Result<(), StateError> {
        self.check(release)?;
        let (spent, delta, _) = self.with(release);
        self.remembered.spent = spent;
        self.remembered.delta = delta;
        self.save()
    }

    /// Releases made.
    pub(crate) fn releases(&self) -> u64 {
        self.remembered.spent.releases()
    }

    /// Their composed epsilon (0 with none).
    pub(crate) fn epsilon(&self) -> f64 {
        self.remembered.spent.epsilon(self.remembered.delta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_files_are_named_by_federation_and_client_in_safe_characters() {
        let dir = Path::new("state");
        let policy = FederationPolicy {
            federation: "hospitals/2026".into(),
            min_clients: 4,
            min_degree: fl_authority::policy::MinDegree::Complete,
            min_threshold: 0.7,
            min_noise_multiplier: 0.0,
            max_release_epsilon: 4.0,
            max_total_epsilon: 10.0,
            max_model_magnitude: 100.0,
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
        let release = Release::laplace(2.0, 1.0);
        let mut state = ClientState::open(Some(path.clone()), "hospitals", Some(5.0)).unwrap();
        state.record(&release).unwrap();
        state.record(&release).unwrap();
        state.take_part(7, 3).unwrap();
        let mut again = ClientState::open(Some(path.clone()), "hospitals", Some(5.0)).unwrap();
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
        let twice = again.take_part(7, 3).unwrap_err();
        assert!(
            matches!(twice, StateError::AlreadyTookPart { last: 3, run: 7 }),
            "{twice}"
        );
        assert!(again.take_part(7, 2).is_err());
        again.take_part(7, 4).unwrap();
        again.take_part(8, 1).unwrap();
        let other = ClientState::open(Some(path.clone()), "elsewhere", None).unwrap_err();
        assert!(
            matches!(&other, StateError::OtherFederation { found, .. } if found == "hospitals"),
            "{other}"
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}
