//! Asynchronous buffered aggregation's bookkeeping, without I/O (FedBuff: Nguyen et al.,
//! "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022, Alg. 1): which
//! model version each client was sent, who is training, and whether an upload may enter the
//! buffer and with what weight.
//!
//! Versions are named by the round number of the task that carried them: the model after t
//! server steps goes out in round t + 1's task, so an upload for round r that arrives while
//! round R is being buffered has staleness s = R - r.

use crate::identity::ids::ClientId;
use crate::round::rejection::Rejection;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The weight of an update of staleness s: 1 / sqrt(1 + s) (FedBuff, Sec. 5, the polynomial
/// staleness scaling with exponent 1/2; Papaya, Huba et al. 2022, uses the same). At most 1, so
/// a weighted sum of updates clipped to S still moves by at most S per client.
pub(crate) fn staleness_weight(staleness: u64) -> f64 {
    1.0 / (1.0 + staleness as f64).sqrt()
}

/// What becomes of an upload.
#[derive(Debug)]
pub(crate) enum Admission {
    /// It enters the buffer with weight [`staleness_weight`] of its staleness.
    Buffer {
        /// s.
        staleness: u64,
    },
    /// It is older than the maximum staleness: refused, and its client may train again.
    TooStale {
        /// s.
        staleness: u64,
    },
    /// An honest leftover (a second copy, or work sent before the server restarted): ignored.
    Ignored(&'static str),
    /// A message no honest client sends: its stream ends.
    Refused(Rejection),
}

/// Who was sent which version and who is training; see the module documentation.
#[derive(Debug)]
pub(crate) struct Dispatches {
    /// The first round this process sends.
    first_round: u64,
    /// Whether this process resumed an interrupted run: its predecessor sent rounds up to
    /// `first_round`, which this process has no record of.
    resumed: bool,
    /// The most steps an update may lag.
    max_staleness: u64,
    /// Per client, the rounds it was sent that may still be answered, and whether they were.
    sent: BTreeMap<ClientId, BTreeMap<u64, bool>>,
    /// The clients training now, since when.
    training: BTreeMap<ClientId, Instant>,
}

impl Dispatches {
    /// Nothing sent yet; this process starts at round `first_round`, resuming an interrupted run
    /// or not.
    pub(crate) fn new(first_round: u64, resumed: bool, max_staleness: u64) -> Self {
        Self {
            first_round,
            resumed,
            max_staleness,
            sent: BTreeMap::new(),
            training: BTreeMap::new(),
        }
    }

    /// How many clients are training.
    pub(crate) fn training(&self) -> usize {
        self.training.len()
    }

    /// Whether `client` may be sent round `round`'s model now: it is not training, and it was
    /// not sent this version already.
    pub(crate) fn is_free(&self, client: ClientId, round: u64) -> bool {
        !self.training.contains_key(&client)
            && !(self.sent.get(&client)).is_some_and(|rounds| rounds.contains_key(&round))
    }

    /// `client` was sent round `round`'s model at `now`.
    pub(crate) fn sent(&mut self, client: ClientId, round: u64, now: Instant) {
        self.sent.entry(client).or_default().insert(round, false);
        self.training.insert(client, now);
    }

    /// `client` stopped training without an upload (its stream ended, or it said it failed):
    /// its place goes to another. A late upload of what it was sent still counts.
    pub(crate) fn stopped(&mut self, client: ClientId) -> bool {
        self.training.remove(&client).is_some()
    }

    /// `client` said it could not do round `round`: its place is freed if that is what it was
    /// training.
    pub(crate) fn failed(&mut self, client: ClientId, round: u64) -> bool {
        self.latest(client) == Some(round) && self.stopped(client)
    }

    /// Frees the places of clients training for longer than `limit`; returns them.
    pub(crate) fn expire(&mut self, now: Instant, limit: Duration) -> Vec<ClientId> {
        let late: Vec<ClientId> = (self.training.iter())
            .filter(|(_, since)| now.duration_since(**since) > limit)
            .map(|(c, _)| *c)
            .collect();
        for client in &late {
            self.training.remove(client);
        }
        late
    }

    /// When the earliest place expires under `limit`, if anyone is training.
    pub(crate) fn next_expiry(&self, limit: Duration) -> Option<Instant> {
        self.training.values().min().map(|since| *since + limit)
    }

    /// Forgets the versions no upload may be for any more once round `current` is buffered.
    pub(crate) fn advance(&mut self, current: u64) {
        let oldest = current.saturating_sub(self.max_staleness);
        self.sent.retain(|_, rounds| {
            rounds.retain(|round, _| *round >= oldest);
            !rounds.is_empty()
        });
    }

    /// Decides on `client`'s upload for round `claimed` while round `current` is buffered, and
    /// records it as answered when it enters the buffer or is too stale.
    pub(crate) fn admit(&mut self, client: ClientId, claimed: u64, current: u64) -> Admission {
        let known = self.sent.get_mut(&client).and_then(|r| r.get_mut(&claimed));
        let answered = match known {
            Some(answered) => answered,
            // Older than any version still remembered: too stale, whoever sent it.
            None if claimed + self.max_staleness < current => {
                return Admission::TooStale {
                    staleness: current - claimed,
                };
            }
            // Sent by the process before a restart (up to the version it was buffering when it
            // stopped): lost with its buffer.
            None if self.resumed && (1..=self.first_round).contains(&claimed) => {
                return Admission::Ignored("trained on a model sent before the server restarted");
            }
            None if claimed > current => {
                return Admission::Refused(Rejection::WrongRound {
                    what: "update",
                    claimed,
                    current,
                });
            }
            None => {
                return Admission::Refused(Rejection::NotSent {
                    client,
                    round: claimed,
                });
            }
        };
        if std::mem::replace(answered, true) {
            return Admission::Ignored("a second upload of the same version");
        }
        if self.training.contains_key(&client) && self.latest(client) == Some(claimed) {
            self.training.remove(&client);
        }
        let staleness = current - claimed;
        if staleness > self.max_staleness {
            Admission::TooStale { staleness }
        } else {
            Admission::Buffer { staleness }
        }
    }

    /// The last round `client` was sent.
    fn latest(&self, client: ClientId) -> Option<u64> {
        self.sent.get(&client)?.keys().next_back().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// a(s) = 1/sqrt(1 + s) by hand: 1, 1/sqrt(3) = 0.57735, 1/sqrt(4) = 0.5, 1/sqrt(9) = 1/3.
    #[test]
    fn the_staleness_weight_is_one_over_the_root_of_one_plus_s() {
        for (s, by_hand) in [(0, 1.0), (2, 0.577_350_27), (3, 0.5), (8, 0.333_333_33)] {
            assert!((staleness_weight(s) - by_hand).abs() < 1e-8, "s = {s}");
        }
    }

    /// Client 7 is sent rounds 3 and 5, with at most 2 steps of lag: round 5's upload enters at
    /// round 6 (s = 1), round 3's is past the maximum at round 6 (s = 3), a second copy is
    /// ignored, and a round it was never sent (4, or a future 9) ends its stream.
    #[test]
    fn an_update_past_the_maximum_staleness_or_never_sent_is_refused() {
        let now = Instant::now();
        let mut d = Dispatches::new(1, false, 2);
        d.sent(7, 3, now);
        d.sent(7, 5, now);
        assert_eq!(d.training(), 1);
        assert!(matches!(
            d.admit(7, 5, 6),
            Admission::Buffer { staleness: 1 }
        ));
        assert_eq!(d.training(), 0, "its answer frees its place");
        assert!(matches!(d.admit(7, 5, 6), Admission::Ignored(_)));
        assert!(matches!(
            d.admit(7, 3, 6),
            Admission::TooStale { staleness: 3 }
        ));
        assert!(matches!(
            d.admit(7, 4, 6),
            Admission::Refused(Rejection::NotSent {
                client: 7,
                round: 4
            })
        ));
        assert!(matches!(
            d.admit(7, 9, 6),
            Admission::Refused(Rejection::WrongRound { claimed: 9, .. })
        ));
        assert!(matches!(d.admit(8, 6, 6), Admission::Refused(_)));
    }

    /// After a restart at round 10, uploads of rounds 9 and 10 that this process did not send
    /// (the old process did) are ignored, not held against their clients; versions older than
    /// the window are forgotten.
    #[test]
    fn work_sent_before_a_restart_is_ignored_and_old_versions_forgotten() {
        let mut d = Dispatches::new(10, true, 3);
        assert!(matches!(d.admit(1, 9, 10), Admission::Ignored(_)));
        assert!(matches!(d.admit(2, 10, 10), Admission::Ignored(_)));
        d.sent(1, 10, Instant::now());
        assert!(!d.is_free(1, 10), "training");
        d.stopped(1);
        assert!(!d.is_free(1, 10), "already sent this version");
        assert!(d.is_free(1, 11));
        d.advance(14);
        assert!(matches!(
            d.admit(1, 10, 14),
            Admission::TooStale { staleness: 4 }
        ));
    }

    /// A client training past the limit loses its place; one that fails its current round too.
    #[test]
    fn places_of_late_and_failed_clients_are_freed() {
        let start = Instant::now();
        let mut d = Dispatches::new(1, false, 5);
        d.sent(1, 1, start);
        d.sent(2, 1, start + Duration::from_secs(5));
        assert_eq!(
            d.next_expiry(Duration::from_secs(10)),
            Some(start + Duration::from_secs(10))
        );
        assert_eq!(
            d.expire(start + Duration::from_secs(11), Duration::from_secs(10)),
            vec![1]
        );
        assert!(!d.failed(2, 7), "not what it trains");
        assert!(d.failed(2, 1));
        assert_eq!(d.training(), 0);
    }
}
