//! The privacy ledger: one line per round in `ledger.jsonl`, written and synced before the
//! round's noised aggregate can leave the server, so the privacy spent is never under-counted.
//! The ledger holds events, not a running epsilon: [`replay`] recomputes the budget from the file.

use fl_common::privacy::{Accountant, AccountantKind, Budget, PrivacyEvent};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::Write;
use std::path::Path;

/// How the clip bound S is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClipMode {
    /// S = `clip_bound` every round.
    Fixed,
    /// S = median of the round's update norms (Geyer et al.); NOT private, marked as leaking.
    Median,
    /// S adapted towards `target_quantile` of the norms with a noised count (Andrew et al. 2021).
    Quantile,
}

impl std::fmt::Display for ClipMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ClipMode::Fixed => "fixed",
            ClipMode::Median => "median",
            ClipMode::Quantile => "quantile",
        })
    }
}

/// What a run's ledger records beside each round's event, and the budget it enforces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LedgerTerms {
    /// The budget.
    pub budget: Budget,
    /// The accountant that reads the ledger.
    pub accountant: AccountantKind,
    /// How S is chosen.
    pub clip_mode: ClipMode,
    /// Whether S itself leaks (the non-private median).
    pub clip_bound_leaks: bool,
    /// Whether participants are drawn from a seeded generator.
    pub sampling_seeded: bool,
}

/// One round as the ledger records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// The round.
    pub round: u64,
    /// The mechanism and its parameters (sampling rate, noise multiplier and sampling scheme
    /// for central noise; clients, variance, sensitivity and dimension for distributed noise).
    #[serde(flatten)]
    pub event: PrivacyEvent,
    /// How S was chosen.
    pub clip_mode: ClipMode,
    /// True when S itself leaks (the non-private median): the epsilon does not cover it.
    pub clip_bound_leaks: bool,
    /// True when participants were drawn from a seeded, reproducible generator: the epsilon,
    /// which assumes secret sampling, is not a guarantee.
    #[serde(default)]
    pub sampling_seeded: bool,
    /// Accountant that reads this ledger.
    pub accountant: String,
}

/// The ledger of a run: its file, the accountant over its entries, and the budget.
pub struct Ledger {
    file: std::fs::File,
    accountant: Box<dyn Accountant>,
    terms: LedgerTerms,
    /// A round spent just before a crash whose result never left the server (see
    /// [`Ledger::reopen`]).
    unreleased: Option<LedgerEntry>,
    /// The last [`RECENT`] entries, for the live page.
    recent: VecDeque<LedgerEntry>,
}

/// Entries a ledger keeps in memory for [`Ledger::recent_through`]: the live page's ten and the
/// at most two lines (a charge and its settlement) of a round spent but not yet published.
const RECENT: usize = 12;

impl Ledger {
    /// Starts `dir/ledger.jsonl` afresh under `terms`.
    pub fn create(dir: &Path, terms: LedgerTerms) -> std::io::Result<Self> {
        Ok(Self {
            file: std::fs::File::create(dir.join("ledger.jsonl"))?,
            accountant: terms.accountant.accountant(),
            terms,
            unreleased: None,
            recent: VecDeque::new(),
        })
    }

    /// Reopens the ledger of an interrupted run under `terms`, whose checkpoint holds the model
    /// after round `checkpointed`. Every complete entry is composed again: a round written
    /// before the crash stays spent. A line cut by the crash is dropped: its write had not
    /// returned, so nothing of its round had left the server. The entry of round
    /// `checkpointed + 1`, if any, was spent by a round whose result never left the server (the
    /// model reaches clients only after its checkpoint is durable): when that round runs again
    /// with the same mechanism it uses this entry instead of a second one
    /// ([`Ledger::take_unreleased`]). New rounds are appended.
    pub fn reopen(dir: &Path, terms: LedgerTerms, checkpointed: u64) -> std::io::Result<Self> {
        let path = dir.join("ledger.jsonl");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut accountant = terms.accountant.accountant();
        let mut keep = 0;
        let (mut after, mut recent) = (Vec::new(), VecDeque::new());
        for line in text.split_inclusive('\n') {
            match serde_json::from_str::<LedgerEntry>(line.trim_end()) {
                Ok(entry) if line.ends_with('\n') => {
                    // An entry another accountant wrote may not compose under this one (PLD takes
                    // Poisson-subsampled Gaussian rounds only): refuse rather than guess.
                    if entry.accountant != accountant.name() {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!(
                                "{}: round {} was accounted by {}, this run's accountant is {}",
                                path.display(),
                                entry.round,
                                entry.accountant,
                                accountant.name()
                            ),
                        ));
                    }
                    accountant.compose(&entry.event, 1);
                    keep += line.len();
                    push_recent(&mut recent, entry.clone());
                    if entry.round > checkpointed {
                        after.push(entry);
                    }
                }
                _ => break,
            }
        }
        let unreleased = match after.as_slice() {
            [entry] if entry.round == checkpointed + 1 => Some(entry.clone()),
            _ => None,
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        file.set_len(keep as u64)?;
        file.sync_all()?;
        Ok(Self {
            file,
            accountant,
            terms,
            unreleased,
            recent,
        })
    }

    /// Whether `round` was already spent with `event` before a crash, its result unreleased:
    /// the round then runs again under that entry (once; any other round is spent as usual).
    /// Only central noise qualifies, which the trusted curator adds after collecting: its draw
    /// never left the server. Under distributed noise the server, the adversary, may have seen
    /// the noised sum before the crash, so the round is charged again.
    pub fn take_unreleased(&mut self, round: u64, event: &PrivacyEvent) -> bool {
        match self.unreleased.take() {
            Some(e)
                if e.round == round
                    && e.event == *event
                    && matches!(event, PrivacyEvent::SampledGaussian(_)) =>
            {
                true
            }
            other => {
                if let Some(e) = other {
                    tracing::warn!(
                        round = e.round,
                        "the round spent before the crash runs again with another mechanism: \
                         both are counted"
                    );
                }
                false
            }
        }
    }

    /// Records round `round` as spent with `event` when composing it keeps the run within the
    /// budget; false, with nothing recorded, when it does not. The event is composed once: the
    /// accountant that passed the gate is the one kept.
    pub fn spend_within_budget(
        &mut self,
        round: u64,
        event: &PrivacyEvent,
    ) -> std::io::Result<bool> {
        let mut next = self.accountant.boxed();
        next.compose(event, 1);
        if !self.terms.budget.allows(next.as_ref()) {
            return Ok(false);
        }
        self.append(round, event)?;
        self.accountant = next;
        Ok(true)
    }

    /// Records round `round` as spent with `event`, whatever the budget: appended, synced, then
    /// composed (a settlement's correction of a round already run).
    pub fn spend(&mut self, round: u64, event: &PrivacyEvent) -> std::io::Result<()> {
        self.append(round, event)?;
        self.accountant.compose(event, 1);
        Ok(())
    }

    /// Appends and syncs the entry of round `round`'s `event` (before it is composed, so that
    /// no release follows an event the file does not hold).
    fn append(&mut self, round: u64, event: &PrivacyEvent) -> std::io::Result<()> {
        let t = &self.terms;
        let entry = LedgerEntry {
            round,
            event: *event,
            clip_mode: t.clip_mode,
            clip_bound_leaks: t.clip_bound_leaks,
            sampling_seeded: t.sampling_seeded,
            accountant: self.accountant.name().into(),
        };
        let mut line = serde_json::to_vec(&entry).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.file.sync_data()?;
        push_recent(&mut self.recent, entry);
        Ok(())
    }

    /// The last entries of rounds up to `round`, oldest first: those a page may show once
    /// `round` is published.
    pub fn recent_through(&self, round: u64) -> impl Iterator<Item = &LedgerEntry> {
        self.recent.iter().filter(move |e| e.round <= round)
    }

    /// (epsilon, delta) spent so far, stated the way the budget is: epsilon at the budget's
    /// delta, or delta at the budget's epsilon.
    pub fn spent(&self) -> (f64, f64) {
        spent(self.accountant.as_ref(), &self.terms.budget)
    }

    /// What the ledger records beside each event, and its budget.
    pub fn terms(&self) -> &LedgerTerms {
        &self.terms
    }

    /// Name of the accountant.
    pub fn accountant_name(&self) -> &'static str {
        self.accountant.name()
    }
}

/// Appends `entry` to `recent`, forgetting the oldest beyond [`RECENT`].
fn push_recent(recent: &mut VecDeque<LedgerEntry>, entry: LedgerEntry) {
    if recent.len() == RECENT {
        recent.pop_front();
    }
    recent.push_back(entry);
}

fn spent(accountant: &dyn Accountant, budget: &Budget) -> (f64, f64) {
    match *budget {
        Budget::Epsilon { delta, .. } => (accountant.epsilon(delta), delta),
        Budget::Delta { epsilon, .. } => (epsilon, accountant.delta(epsilon)),
    }
}

/// The entries of a ledger file, in order.
pub fn read(path: &Path) -> std::io::Result<Vec<LedgerEntry>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| serde_json::from_str(line).map_err(std::io::Error::other))
        .collect()
}

/// Recomputes (epsilon, delta) from a ledger file under `budget` with an accountant of `kind`,
/// and the number of rounds in it.
pub fn replay(
    path: &Path,
    budget: &Budget,
    kind: AccountantKind,
) -> std::io::Result<((f64, f64), usize)> {
    let entries = read(path)?;
    let mut accountant = kind.accountant();
    for entry in &entries {
        accountant.compose(&entry.event, 1);
    }
    // A round may have two lines (a distributed-noise round's charge and its settlement).
    let rounds: std::collections::BTreeSet<u64> = entries.iter().map(|e| e.round).collect();
    Ok((spent(accountant.as_ref(), budget), rounds.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fl_common::privacy::{GaussianRound, Sampling};

    /// The terms of the tests' ledgers: an epsilon of 100 at delta 1e-5, read by `kind`.
    fn terms(kind: AccountantKind) -> LedgerTerms {
        LedgerTerms {
            budget: Budget::Epsilon {
                epsilon: 100.0,
                delta: 1e-5,
            },
            accountant: kind,
            clip_mode: ClipMode::Fixed,
            clip_bound_leaks: false,
            sampling_seeded: false,
        }
    }

    fn entry(round: u64, z: f64) -> LedgerEntry {
        LedgerEntry {
            round,
            event: PrivacyEvent::from(GaussianRound {
                q: 0.1,
                noise_multiplier: z,
                sampling: Sampling::Poisson,
            }),
            clip_mode: ClipMode::Fixed,
            clip_bound_leaks: false,
            sampling_seeded: false,
            accountant: "rdp".into(),
        }
    }

    /// After a crash: complete entries stay spent, a cut line is dropped, and the round spent
    /// after the checkpoint runs again under its entry only with the same mechanism.
    #[test]
    fn a_reopened_ledger_keeps_what_was_spent() {
        let dir = std::env::temp_dir().join(format!("fl-ledger-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let budget = terms(AccountantKind::Rdp).budget;
        let mut ledger = Ledger::create(&dir, terms(AccountantKind::Rdp)).unwrap();
        for round in 1..=3 {
            ledger.spend(round, &entry(round, 1.0).event).unwrap();
        }
        let spent = ledger.spent();
        drop(ledger);
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("ledger.jsonl"))
            .unwrap();
        file.write_all(b"{\"round\":4,\"q\"").unwrap();
        // The checkpoint holds round 2: round 3 was spent, not released.
        let mut reopened = Ledger::reopen(&dir, terms(AccountantKind::Rdp), 2).unwrap();
        assert_eq!(reopened.spent(), spent);
        let event = entry(3, 1.0).event;
        assert!(!reopened.take_unreleased(2, &event));
        let mut again = Ledger::reopen(&dir, terms(AccountantKind::Rdp), 2).unwrap();
        assert!(!again.take_unreleased(3, &entry(3, 2.0).event));
        let mut again = Ledger::reopen(&dir, terms(AccountantKind::Rdp), 2).unwrap();
        assert!(again.take_unreleased(3, &event));
        assert!(!again.take_unreleased(3, &event), "only once");
        again.spend(4, &entry(4, 1.0).event).unwrap();
        // Distributed noise: the server may have seen the sum, so the round is spent again.
        let ddg = LedgerEntry {
            round: 5,
            event: PrivacyEvent::from(fl_common::privacy::DdgRound {
                clients: 3,
                client_variance: 100,
                l2_sensitivity: 2.0,
                dim: 10,
                neighbours: Default::default(),
            }),
            ..entry(5, 1.0)
        };
        again.spend(ddg.round, &ddg.event).unwrap();
        let mut after_ddg = Ledger::reopen(&dir, terms(AccountantKind::Rdp), 4).unwrap();
        assert!(!after_ddg.take_unreleased(5, &ddg.event));
        let ((eps, _), rounds) =
            replay(&dir.join("ledger.jsonl"), &budget, AccountantKind::Rdp).unwrap();
        assert_eq!(rounds, 5);
        assert!(eps > spent.0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The budget gate spends rounds while they fit, refuses the first that does not without
    /// writing or composing it, and keeps what it spent equal to a replay of its file.
    #[test]
    fn the_budget_gate_records_only_what_fits() {
        let dir = std::env::temp_dir().join(format!("fl-ledger-gate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut t = terms(AccountantKind::Rdp);
        t.budget = Budget::Epsilon {
            epsilon: 2.0,
            delta: 1e-5,
        };
        let budget = t.budget;
        let mut ledger = Ledger::create(&dir, t).unwrap();
        let mut round = 0;
        while ledger
            .spend_within_budget(round + 1, &entry(round + 1, 2.0).event)
            .unwrap()
        {
            round += 1;
            assert!(round < 1000, "the gate never closed");
        }
        assert!(round > 0, "the first round already exceeded the budget");
        let spent = ledger.spent();
        assert!(spent.0 <= 2.0, "{spent:?}");
        let ((eps, _), rounds) =
            replay(&dir.join("ledger.jsonl"), &budget, AccountantKind::Rdp).unwrap();
        assert_eq!(rounds as u64, round);
        assert_eq!(eps, spent.0);
        // One more round of the same event would pass 2.
        let mut next = AccountantKind::Rdp.accountant();
        next.compose(&entry(0, 2.0).event, round + 1);
        assert!(next.epsilon(1e-5) > 2.0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A ledger whose entries another accountant wrote is refused on reopening, naming both.
    #[test]
    fn a_ledger_of_another_accountant_is_not_reopened() {
        let dir = std::env::temp_dir().join(format!("fl-ledger-kind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ledger = Ledger::create(&dir, terms(AccountantKind::Rdp)).unwrap();
        ledger.spend(1, &entry(1, 1.0).event).unwrap();
        drop(ledger);
        let e = Ledger::reopen(&dir, terms(AccountantKind::Pld), 1)
            .err()
            .expect("an RDP ledger reopened under PLD");
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        let message = e.to_string();
        assert!(
            message.contains("round 1 was accounted by rdp"),
            "{message}"
        );
        assert!(message.contains("accountant is pld"), "{message}");
        Ledger::reopen(&dir, terms(AccountantKind::Rdp), 1).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
