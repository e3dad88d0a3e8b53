//! One log line per round for a process of many clients (`fl-client --simulate N`): each client
//! tells the [`RoundLog`] the rounds it trained, and the process says a round once a later one
//! starts or its clients are done, naming the clients that trained in it.

use std::sync::{Arc, Mutex};

/// The round this process's clients are training in, and who trained in it so far. Cloned into
/// each client of the process (see `ClientOptions::round_log`).
#[derive(Clone, Debug, Default)]
pub struct RoundLog(Arc<Mutex<Pending>>);

/// The round not yet said.
#[derive(Debug, Default)]
struct Pending {
    round: u64,
    names: Vec<String>,
    /// The slowest client's training time.
    seconds: f64,
    losses: Vec<f64>,
}

impl RoundLog {
    /// A log with no round yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Client `name` trained for `round` in `seconds`, to a local `loss`. A report of a later
    /// round says the pending one first; a late report of an earlier one joins the pending line.
    pub(crate) fn trained(&self, round: u64, name: &str, seconds: f64, loss: Option<f64>) {
        let mut pending = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if round > pending.round {
            say(&pending);
            *pending = Pending {
                round,
                ..Pending::default()
            };
        }
        pending.names.push(name.to_owned());
        pending.seconds = pending.seconds.max(seconds);
        pending.losses.extend(loss);
    }

    /// Says the pending round, if any: the process's clients are done.
    pub fn finish(&self) {
        let mut pending = self.0.lock().unwrap_or_else(|e| e.into_inner());
        say(&pending);
        pending.names.clear();
    }
}

/// The line of a round: how many clients trained, which, the slowest time, the mean loss.
fn say(pending: &Pending) {
    if pending.names.is_empty() {
        return;
    }
    let losses = &pending.losses;
    let loss = (!losses.is_empty())
        .then(|| format!("{:.4}", losses.iter().sum::<f64>() / losses.len() as f64));
    // Said for the process, outside the span of the client whose report closed the round.
    tracing::info!(
        parent: None,
        round = pending.round,
        clients = pending.names.len(),
        names = %compact(&pending.names),
        seconds = format!("{:.2}", pending.seconds),
        mean_loss = loss,
        "trained for the round"
    );
}

/// `names` in short: numbered names of one prefix as ranges (`client-3..5,9`), others as they
/// are, in order.
fn compact(names: &[String]) -> String {
    let mut split: Vec<(&str, Option<u64>)> = (names.iter())
        .map(|n| match n.rsplit_once('-') {
            Some((prefix, number)) => match number.parse() {
                Ok(i) => (&n[..prefix.len() + 1], Some(i)),
                Err(_) => (n.as_str(), None),
            },
            None => (n.as_str(), None),
        })
        .collect();
    split.sort();
    split.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < split.len() {
        let (prefix, number) = split[i];
        let Some(first) = number else {
            out.push(prefix.to_owned());
            i += 1;
            continue;
        };
        // The numbers of this prefix, as runs of consecutive ones.
        let mut runs = Vec::new();
        let mut start = first;
        let mut last = first;
        i += 1;
        while i < split.len() && split[i].0 == prefix {
            let next = split[i].1.unwrap_or(last);
            if next != last + 1 {
                runs.push(range(start, last));
                start = next;
            }
            last = next;
            i += 1;
        }
        runs.push(range(start, last));
        out.push(format!("{prefix}{}", runs.join(",")));
    }
    out.join(" ")
}

/// `a..b`, or `a` alone.
fn range(a: u64, b: u64) -> String {
    if a == b {
        a.to_string()
    } else {
        format!("{a}..{b}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn numbered_names_are_said_as_ranges() {
        let said = compact(&names(&[
            "client-5",
            "client-3",
            "client-4",
            "client-9",
            "site-a",
            "client-10",
        ]));
        assert_eq!(said, "client-3..5,9..10 site-a");
        assert_eq!(compact(&names(&["h-1"])), "h-1");
        assert_eq!(compact(&names(&["lab", "h-2", "h-0"])), "h-0,2 lab");
    }

    #[test]
    fn a_round_is_said_once_a_later_one_starts() {
        let log = RoundLog::new();
        log.trained(1, "c-0", 0.5, Some(1.0));
        log.trained(1, "c-1", 0.7, Some(3.0));
        {
            let pending = log.0.lock().unwrap();
            assert_eq!((pending.round, pending.names.len()), (1, 2));
            assert_eq!(pending.seconds, 0.7);
        }
        log.trained(2, "c-1", 0.1, None);
        let pending = log.0.lock().unwrap();
        assert_eq!((pending.round, pending.names.clone()), (2, names(&["c-1"])));
        assert!(pending.losses.is_empty());
    }
}
