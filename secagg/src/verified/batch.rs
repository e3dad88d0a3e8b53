//! A verified round between the two aggregators, without I/O: the leader prepares every upload
//! and sends the helper one [`Batch`]; the helper ([`Helper::answer`]) opens, prepares and
//! decides each, and answers with its prep shares, its decisions and its share of the accepted
//! uploads' sum with its noise; the leader ([`LeaderRound::finish`]) decides each upload itself
//! and refuses a reply that disagrees with it, so a helper that deviates makes the round abort.
//!
//! The helper answers each round (H(task)) once and never a batch of fewer accepted uploads than
//! its own floor, so that the leader cannot ask it twice about overlapping sets, nor about one
//! client alone; its noise is at least its own floor whatever the leader asks.

use super::circuit::F;
use super::prepare::{Exclusion, InputShare, Pending, PrepShare, Role, decide, prepare};
use super::report::Report;
use super::seal::{HelperKey, Sealed};
use super::shape::{Binder, Shape};
use crate::keys::RoundTag;
use crate::task::TaskDigest;
use fl_privacy::{MAX_VARIANCE, sample_discrete_gaussian};
use prio::field::FieldElement;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use std::collections::{BTreeSet, HashSet};

/// What the leader asks the helper about one round.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// The round and H(task).
    pub tag: RoundTag,
    /// d and S.
    pub shape: Shape,
    /// The round's verify key, which the clients never see.
    pub verify_key: [u8; 32],
    /// z: the noise multiplier the leader's ledger charges.
    pub noise_multiplier: f64,
    /// The uploads the leader could prepare.
    pub uploads: Vec<BatchUpload>,
}

/// One upload as the helper gets it.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchUpload {
    /// The client's id.
    pub client: u64,
    /// Its share, sealed to the helper.
    pub sealed: Sealed,
    /// The leader's prep share.
    pub leader: PrepShare,
}

/// The helper's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// Its prep share of each upload (`None`: excluded before preparing).
    pub prep: Vec<Option<PrepShare>>,
    /// Whether it accepts each upload.
    pub accepted: Vec<bool>,
    /// Its share of the accepted uploads' sum, plus its noise.
    pub aggregate: Vec<F>,
}

/// Why the helper refuses a whole batch.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BatchRefusal {
    /// It answered this round already.
    #[error("round {0} (this task) was answered already: each round is answered once")]
    Answered(u64),
    /// A client appears twice.
    #[error("client {0} appears twice in the batch")]
    Duplicate(u64),
    /// Too few uploads are valid to release a sum.
    #[error("{accepted} valid uploads, fewer than the helper's floor of {floor}")]
    TooFew {
        /// Valid uploads.
        accepted: usize,
        /// The helper's floor.
        floor: usize,
    },
    /// The batch's parameters are unusable.
    #[error("unusable batch: {0}")]
    Invalid(String),
}

/// The helper: its key, its floors, and the rounds it has answered.
#[derive(Debug)]
pub struct Helper {
    key: HelperKey,
    /// The fewest valid uploads it releases a sum of.
    min_clients: usize,
    /// The least noise multiplier it adds, whatever the leader asks.
    min_noise_multiplier: f64,
    answered: HashSet<TaskDigest>,
}

impl Helper {
    /// A helper with `key`, releasing sums of at least `min_clients` valid uploads with noise
    /// of multiplier at least `min_noise_multiplier`.
    pub fn new(key: HelperKey, min_clients: usize, min_noise_multiplier: f64) -> Self {
        Self {
            key,
            min_clients,
            min_noise_multiplier,
            answered: HashSet::new(),
        }
    }

    /// Opens, prepares and decides every upload of `batch`; see the module documentation.
    pub fn answer(&mut self, batch: &Batch) -> Result<Reply, BatchRefusal> {
        let z = batch.noise_multiplier;
        if !(z.is_finite() && z >= 0.0) {
            return Err(BatchRefusal::Invalid(format!("noise multiplier {z}")));
        }
        let mut clients = BTreeSet::new();
        if let Some(twice) = (batch.uploads.iter()).find(|u| !clients.insert(u.client)) {
            return Err(BatchRefusal::Duplicate(twice.client));
        }
        if !self.answered.insert(batch.tag.digest) {
            return Err(BatchRefusal::Answered(batch.tag.round));
        }
        let shape = &batch.shape;
        let groups = in_parallel(batch.uploads.iter().collect(), |uploads| {
            let mut sum = vec![F::zero(); shape.dim];
            let answers: Vec<(Option<PrepShare>, bool)> = (uploads.into_iter())
                .map(|upload| self.check(batch, upload, &mut sum))
                .collect();
            (answers, sum)
        });
        let (mut prep, mut accepted) = (Vec::new(), Vec::new());
        let mut sum = vec![F::zero(); shape.dim];
        for (answers, part) in groups {
            sum.iter_mut().zip(part).for_each(|(s, v)| *s += v);
            for (p, a) in answers {
                prep.push(p);
                accepted.push(a);
            }
        }
        let count = accepted.iter().filter(|&&a| a).count();
        if count < self.min_clients {
            let floor = self.min_clients;
            return Err(BatchRefusal::TooFew {
                accepted: count,
                floor,
            });
        }
        add_noise(&mut sum, shape, z.max(self.min_noise_multiplier));
        Ok(Reply {
            prep,
            accepted,
            aggregate: sum,
        })
    }
}

impl Helper {
    /// One upload of `batch`: the helper's prep share (`None` when its share does not open or
    /// is malformed) and whether it is valid, its share of X then added to `sum`.
    fn check(
        &self,
        batch: &Batch,
        upload: &BatchUpload,
        sum: &mut [F],
    ) -> (Option<PrepShare>, bool) {
        let shape = &batch.shape;
        let binder = Binder::new(&batch.tag, upload.client);
        let share = InputShare::open(shape, &binder, &self.key, &upload.sealed);
        let prepared =
            share.and_then(|s| prepare(shape, Role::Helper, &binder, &batch.verify_key, s));
        let Ok((mine, pending)) = prepared else {
            return (None, false);
        };
        let decided = decide(shape, &mine, &upload.leader, pending);
        if let Ok(x) = &decided {
            sum.iter_mut().zip(x).for_each(|(s, &v)| *s += v);
        }
        (Some(mine), decided.is_ok())
    }
}

/// `work` on `items` split in one consecutive group per core, each on a thread of its own; the
/// groups' results in order. Each upload's checks take tenths of a second at d = 535,818.
fn in_parallel<T: Send, R: Send>(items: Vec<T>, work: impl Fn(Vec<T>) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_group = items.len().div_ceil(threads).max(1);
    let mut groups = Vec::new();
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        groups.push(items.by_ref().take(per_group).collect::<Vec<T>>());
    }
    let work = &work;
    std::thread::scope(|scope| {
        let running: Vec<_> = (groups.into_iter())
            .map(|group| scope.spawn(move || work(group)))
            .collect();
        (running.into_iter())
            .map(|t| t.join().expect("a verification thread panicked"))
            .collect()
    })
}

/// Adds discrete Gaussian noise of standard deviation z S 2^f (z times the fixed-point bound)
/// to each value, from the OS-seeded CSPRNG; none for z = 0. N_Z(0, sigma^2) on an integer vector
/// of L2 sensitivity Delta gives the Gaussian's (Delta^2 / 2 sigma^2)-concentrated DP (Canonne,
/// Kamath, Steinke 2020, Theorem 14), so the ledger charges it as the Gaussian of multiplier z.
fn add_noise(values: &mut [F], shape: &Shape, z: f64) {
    if z == 0.0 {
        return;
    }
    let sigma = z * shape.clip * f64::from(shape.frac_bits).exp2();
    let variance = ((sigma * sigma).ceil() as u64).min(MAX_VARIANCE);
    let mut rng = StdRng::from_os_rng();
    for v in values {
        let noise = sample_discrete_gaussian(variance, &mut rng);
        let magnitude = F::from(noise.unsigned_abs());
        *v += if noise < 0 { -magnitude } else { magnitude };
    }
}

/// An upload as the leader prepared it: its prep share and what it keeps, or why it is excluded.
type Prepared = Result<(PrepShare, Pending), Exclusion>;

/// The leader's side of a verified round: its prep shares, until the helper's reply.
#[derive(Debug)]
pub struct LeaderRound {
    pub(super) shape: Shape,
    /// Each upload's client and what the leader made of it.
    pub(super) uploads: Vec<(u64, Prepared)>,
}

/// The round's outcome at the leader: the accepted uploads' sum (both shares and the helper's
/// noise, decoded) and every exclusion with its client.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    /// The decoded sum.
    pub sum: Vec<f64>,
    /// Uploads summed.
    pub accepted: usize,
    /// Uploads excluded, with why.
    pub excluded: Vec<(u64, Exclusion)>,
}

/// Why the leader aborts the round: the helper's reply cannot be from an honest helper.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HelperFault {
    /// The reply's lists or aggregate have the wrong length.
    #[error("the helper's reply has the wrong shape: {0}")]
    Shape(String),
    /// The helper accepts an upload the leader's check refuses, or the other way round.
    #[error("the helper decided client {0}'s upload otherwise than the leader's check")]
    Disagrees(u64),
}

impl LeaderRound {
    /// Prepares every upload of round `tag` under a fresh verify key; returns the round and the
    /// batch for the helper (the uploads the leader could prepare).
    pub fn start(
        tag: RoundTag,
        shape: Shape,
        uploads: Vec<(u64, Report)>,
        z: f64,
    ) -> (Self, Batch) {
        let mut verify_key = [0u8; 32];
        rand::rng().fill_bytes(&mut verify_key);
        let mut batch = Batch {
            tag,
            shape,
            verify_key,
            noise_multiplier: z,
            uploads: Vec::new(),
        };
        let groups = in_parallel(uploads, |group| {
            (group.into_iter())
                .map(|(client, report)| {
                    let binder = Binder::new(&tag, client);
                    let share = InputShare::from(report.leader);
                    let result = prepare(&shape, Role::Leader, &binder, &verify_key, share);
                    (client, result, report.helper)
                })
                .collect::<Vec<_>>()
        });
        let mut prepared = Vec::new();
        for (client, result, sealed) in groups.into_iter().flatten() {
            if let Ok((mine, _)) = &result {
                let leader = mine.clone();
                batch.uploads.push(BatchUpload {
                    client,
                    sealed,
                    leader,
                });
            }
            prepared.push((client, result));
        }
        let round = Self {
            shape,
            uploads: prepared,
        };
        (round, batch)
    }

    /// Decides every upload with the helper's prep shares, checks that the helper decided the
    /// same, and adds the two shares of the sum.
    pub fn finish(self, reply: Reply) -> Result<Verified, HelperFault> {
        let sent = self.uploads.iter().filter(|(_, r)| r.is_ok()).count();
        let (dim, shape) = (self.shape.dim, self.shape);
        if reply.prep.len() != sent || reply.accepted.len() != sent || reply.aggregate.len() != dim
        {
            return Err(HelperFault::Shape(format!(
                "{} prep shares, {} decisions and {} sums for {sent} uploads of {dim}",
                reply.prep.len(),
                reply.accepted.len(),
                reply.aggregate.len()
            )));
        }
        let mut answers = reply.prep.into_iter().zip(reply.accepted);
        let mut verified = Verified {
            sum: Vec::new(),
            accepted: 0,
            excluded: Vec::new(),
        };
        let mut total = reply.aggregate;
        for (client, prepared) in self.uploads {
            let (mine, pending) = match prepared {
                Ok(p) => p,
                Err(why) => {
                    verified.excluded.push((client, why));
                    continue;
                }
            };
            let (theirs, helper_accepts) = answers.next().expect("lengths checked above");
            let decided = match &theirs {
                Some(theirs) => decide(&shape, &mine, theirs, pending),
                None => Err(Exclusion::Sealed),
            };
            if decided.is_ok() != helper_accepts {
                return Err(HelperFault::Disagrees(client));
            }
            match decided {
                Ok(x) => {
                    total.iter_mut().zip(&x).for_each(|(s, &v)| *s += v);
                    verified.accepted += 1;
                }
                Err(why) => verified.excluded.push((client, why)),
            }
        }
        verified.sum = total.iter().map(|&v| shape.decode(v)).collect();
        Ok(verified)
    }
}
