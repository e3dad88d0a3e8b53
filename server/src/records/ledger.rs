//! The privacy ledger: one line per round in `ledger.jsonl`, written and synced before the
//! round's noised aggregate can leave the server, so the privacy spent is never under-counted.
//! The ledger holds events, not a running epsilon: [`replay`] recomputes the budget from the file.
//!
//! The lines form a hash chain: each carries `prev`, the SHA-256 of the line before it (of
//! [`GENESIS`] for the first), and each checkpoint records the [`Head`] of the ledger as it was
//! written. Reading the ledger ([`read`], every resume, `fl privacy ledger --verify`) detects a
//! line edited, removed or moved, and, against the checkpoint's head, lines cut from the end.
//! The chain has no key: an operator who rewrites the whole chain (and the checkpoint) is not
//! detected. It guards against damage and careless edits, not against the curator itself.

use crate::config::ClipMode;
use crate::config::plan::LedgerTerms;
use fl_privacy::{Accountant, AccountantKind, Budget, LedgerEvent, PrivacyEvent};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::Write;
use std::path::Path;

/// One round as the ledger records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LedgerEntry {
    /// The round.
    pub round: u64,
    /// The mechanism (`mechanism`, absent from the lines of earlier ledgers, which are read by
    /// their fields) and its parameters (sampling rate, noise multiplier and sampling scheme
    /// for central noise; clients, variance, sensitivity and dimension for distributed noise;
    /// the stream step and participation rule of DP-FTRL).
    #[serde(flatten, deserialize_with = "fl_privacy::read_event")]
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
    /// SHA-256 of the line before (`sha256:HEX`; [`GENESIS`] for the first line).
    #[serde(default)]
    pub prev: String,
}

/// The `prev` of a ledger's first line.
pub const GENESIS: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// Where a ledger's chain stood: its number of lines and the digest of the last one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    /// Lines written.
    pub lines: u64,
    /// SHA-256 of the last line ([`GENESIS`] when there is none).
    pub digest: String,
}

impl Default for Head {
    fn default() -> Self {
        Self {
            lines: 0,
            digest: GENESIS.into(),
        }
    }
}

/// SHA-256 of one line of the ledger (without its newline), as `prev` names it.
fn line_digest(line: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(line)))
}

/// The complete lines of a ledger's text, checked as a chain, with the head after each; a last
/// line without its newline (cut by a crash: its write never returned) is left out.
fn chain(path: &Path, text: &str) -> std::io::Result<Vec<(LedgerEntry, usize, Head)>> {
    let broken = |n: usize, why: &str| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} line {n}: {why}", path.display()),
        )
    };
    let (mut head, mut at, mut out) = (Head::default(), 0, Vec::new());
    for (i, line) in text.split_inclusive('\n').enumerate() {
        if !line.ends_with('\n') {
            break;
        }
        let body = line.trim_end_matches('\n');
        let entry: LedgerEntry =
            serde_json::from_str(body).map_err(|e| broken(i + 1, &e.to_string()))?;
        if entry.prev != head.digest {
            return Err(broken(
                i + 1,
                "does not follow the line before it (a line was edited, removed or moved)",
            ));
        }
        at += line.len();
        head = Head {
            lines: head.lines + 1,
            digest: line_digest(body.as_bytes()),
        };
        out.push((entry, at, head.clone()));
    }
    Ok(out)
}

/// Checks that a ledger whose lines end at `last` (the head after its last complete line) still
/// holds what `anchor` (a checkpoint's head) saw.
fn check_anchor(
    path: &Path,
    lines: &[(LedgerEntry, usize, Head)],
    anchor: &Head,
) -> std::io::Result<()> {
    let seen = match anchor.lines {
        0 => Some(GENESIS.to_string()),
        n => lines.get(n as usize - 1).map(|(_, _, h)| h.digest.clone()),
    };
    if seen.as_deref() == Some(anchor.digest.as_str()) {
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!(
            "{}: the checkpoint saw {} lines ending in {}; the file holds {} lines that do not \
             (lines were cut from the end or the chain was rewritten)",
            path.display(),
            anchor.lines,
            anchor.digest,
            lines.len()
        ),
    ))
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
    /// The chain's head.
    head: Head,
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
            head: Head::default(),
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
    pub fn reopen(
        dir: &Path,
        terms: LedgerTerms,
        checkpointed: u64,
        anchor: Option<&Head>,
    ) -> std::io::Result<Self> {
        let path = dir.join("ledger.jsonl");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines = chain(&path, &text)?;
        if let Some(anchor) = anchor {
            check_anchor(&path, &lines, anchor)?;
        }
        let mut accountant = terms.accountant.accountant();
        let (mut keep, mut head) = (0, Head::default());
        let (mut after, mut recent) = (Vec::new(), VecDeque::new());
        for (entry, end, at) in lines {
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
            (keep, head) = (end, at);
            push_recent(&mut recent, entry.clone());
            if entry.round > checkpointed {
                after.push(entry);
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
            head,
        })
    }

    /// Where the chain stands: what a checkpoint records.
    pub fn head(&self) -> &Head {
        &self.head
    }

    /// Whether `round` was already spent with `event` before a crash, its result unreleased:
    /// the round then runs again under that entry (once; any other round is spent as usual),
    /// when the event says such a round may ([`PrivacyEvent::reruns_after_crash`]); otherwise
    /// it is charged again.
    pub fn take_unreleased(&mut self, round: u64, event: &PrivacyEvent) -> bool {
        match self.unreleased.take() {
            Some(e) if e.round == round && e.event == *event && event.reruns_after_crash() => true,
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
            prev: self.head.digest.clone(),
        };
        let mut line = serde_json::to_vec(&entry).map_err(std::io::Error::other)?;
        let digest = line_digest(&line);
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.file.sync_data()?;
        self.head = Head {
            lines: self.head.lines + 1,
            digest,
        };
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

/// The entries of a ledger file, in order, its chain checked (and a line cut by a crash left
/// out).
pub fn read(path: &Path) -> std::io::Result<Vec<LedgerEntry>> {
    Ok(verify(path, None)?.0)
}

/// The entries of a ledger file and its head, its chain checked, and against `anchor` (a
/// checkpoint's head) when given: what `fl privacy ledger --verify` reports.
pub fn verify(path: &Path, anchor: Option<&Head>) -> std::io::Result<(Vec<LedgerEntry>, Head)> {
    let text = std::fs::read_to_string(path)?;
    let lines = chain(path, &text)?;
    if let Some(anchor) = anchor {
        check_anchor(path, &lines, anchor)?;
    }
    let head = lines
        .last()
        .map_or_else(Head::default, |(_, _, h)| h.clone());
    Ok((lines.into_iter().map(|(e, ..)| e).collect(), head))
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
    use fl_privacy::{GaussianRound, Sampling};

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
            prev: String::new(),
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
        let mut reopened = Ledger::reopen(&dir, terms(AccountantKind::Rdp), 2, None).unwrap();
        assert_eq!(reopened.spent(), spent);
        let event = entry(3, 1.0).event;
        assert!(!reopened.take_unreleased(2, &event));
        let mut again = Ledger::reopen(&dir, terms(AccountantKind::Rdp), 2, None).unwrap();
        assert!(!again.take_unreleased(3, &entry(3, 2.0).event));
        let mut again = Ledger::reopen(&dir, terms(AccountantKind::Rdp), 2, None).unwrap();
        assert!(again.take_unreleased(3, &event));
        assert!(!again.take_unreleased(3, &event), "only once");
        again.spend(4, &entry(4, 1.0).event).unwrap();
        // Distributed noise: the server may have seen the sum, so the round is spent again.
        let ddg = LedgerEntry {
            round: 5,
            event: PrivacyEvent::from(fl_privacy::DdgRound {
                clients: 3,
                client_variance: 100,
                l2_sensitivity: 2.0,
                dim: 10,
                neighbours: Default::default(),
            }),
            ..entry(5, 1.0)
        };
        again.spend(ddg.round, &ddg.event).unwrap();
        let mut after_ddg = Ledger::reopen(&dir, terms(AccountantKind::Rdp), 4, None).unwrap();
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
        let e = Ledger::reopen(&dir, terms(AccountantKind::Pld), 1, None)
            .err()
            .expect("an RDP ledger reopened under PLD");
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        let message = e.to_string();
        assert!(
            message.contains("round 1 was accounted by rdp"),
            "{message}"
        );
        assert!(message.contains("accountant is pld"), "{message}");
        Ledger::reopen(&dir, terms(AccountantKind::Rdp), 1, None).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The chain catches an edited line, two lines swapped and lines cut from the end (against
    /// the head a checkpoint recorded); the untouched file verifies.
    #[test]
    fn an_edited_reordered_or_truncated_ledger_is_refused() {
        let dir = std::env::temp_dir().join(format!("fl-ledger-chain-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ledger.jsonl");
        let mut ledger = Ledger::create(&dir, terms(AccountantKind::Rdp)).unwrap();
        for round in 1..=4 {
            ledger.spend(round, &entry(round, 1.0).event).unwrap();
        }
        let head = ledger.head().clone();
        drop(ledger);
        let good = std::fs::read_to_string(&path).unwrap();
        assert_eq!(verify(&path, Some(&head)).unwrap().1, head);
        let refused = |text: &str, anchor: Option<&Head>| {
            std::fs::write(&path, text).unwrap();
            let e = verify(&path, anchor).unwrap_err().to_string();
            let r = Ledger::reopen(&dir, terms(AccountantKind::Rdp), 4, anchor);
            assert!(r.is_err(), "reopened: {text}");
            e
        };
        // A smaller noise multiplier in round 2's line (less privacy spent).
        let edited = good.replacen("\"noise_multiplier\":1.0", "\"noise_multiplier\":9.0", 2);
        let edited = edited.replacen("\"noise_multiplier\":9.0", "\"noise_multiplier\":1.0", 1);
        // Caught where the next line names the old one's digest.
        assert!(refused(&edited, None).contains("line 3"));
        // The last line has no successor: the checkpoint's head catches its edit.
        let last = good
            .rsplitn(2, "\"noise_multiplier\":1.0")
            .collect::<Vec<_>>();
        let edited_last = format!("{}\"noise_multiplier\":9.0{}", last[1], last[0]);
        assert!(refused(&edited_last, Some(&head)).contains("cut from the end or the chain"));
        let lines: Vec<&str> = good.split_inclusive('\n').collect();
        let swapped = [lines[0], lines[2], lines[1], lines[3]].concat();
        assert!(refused(&swapped, None).contains("line 2"));
        let removed = [lines[0], lines[2], lines[3]].concat();
        assert!(refused(&removed, None).contains("line 2"));
        let cut = lines[..2].concat();
        assert!(refused(&cut, Some(&head)).contains("cut from the end"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
