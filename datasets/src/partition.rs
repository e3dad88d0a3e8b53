//! Splitting one dataset across K simulated clients: IID, label shards (McMahan et al. 2017; Geyer
//! et al. 2017), and Dirichlet(alpha) label skew (Hsu et al. 2019).
//!
//! Partitions are a simulation device, not a privacy mechanism: they are drawn from a seeded
//! generator so that separate client processes given the same seed agree on who holds what.

use super::DataError;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng, rngs::StdRng};
use rand_distr::{Distribution, Gamma};

/// The paper's client size: with more clients than the data allows at this size, data repeats.
const MIN_SHARD_CLIENT_SIZE: usize = 600;

/// How examples are dealt to clients.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(try_from = "String", into = "String")]
pub enum PartitionScheme {
    /// Shuffle, then cut into K near-equal parts.
    Iid,
    /// Sort by label, cut 2K shards, deal 2 shards to each client. Each client holds
    /// max(N/K, 600) examples (at most N); when 2K shards need more than N examples, the sorted
    /// data is reused cyclically, as the Geyer et al. experiments do for K = 1000 and 10000.
    Shards,
    /// For each class, split its examples across clients in proportions drawn from
    /// Dirichlet(alpha, ..., alpha): small alpha gives strong label skew.
    Dirichlet {
        /// Concentration, > 0.
        alpha: f64,
    },
}

impl std::str::FromStr for PartitionScheme {
    type Err = DataError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            None if s == "iid" => Ok(PartitionScheme::Iid),
            None if s == "shards" => Ok(PartitionScheme::Shards),
            Some(("dirichlet", a)) => match a.parse::<f64>() {
                Ok(alpha) if alpha > 0.0 && alpha.is_finite() => {
                    Ok(PartitionScheme::Dirichlet { alpha })
                }
                _ => Err(DataError::Spec(format!(
                    "dirichlet alpha `{a}` must be a positive number"
                ))),
            },
            _ => Err(DataError::Spec(format!(
                "partition scheme `{s}`: expected `iid`, `shards` or `dirichlet:ALPHA`"
            ))),
        }
    }
}

impl TryFrom<String> for PartitionScheme {
    type Error = DataError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<PartitionScheme> for String {
    fn from(p: PartitionScheme) -> String {
        match p {
            PartitionScheme::Iid => "iid".into(),
            PartitionScheme::Shards => "shards".into(),
            PartitionScheme::Dirichlet { alpha } => format!("dirichlet:{alpha}"),
        }
    }
}

/// A scheme applied to K clients with a seed: every process that builds the same `Partition`
/// over the same labels gets the same split.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Partition {
    /// How examples are dealt.
    pub scheme: PartitionScheme,
    /// K: the number of clients.
    pub clients: usize,
    /// Seed of the dealing.
    pub seed: u64,
}

impl Partition {
    /// Parses the client command line's `SCHEME:K:INDEX` (e.g. `shards:100:7`,
    /// `dirichlet:0.5:100:7`) into the partition and this client's index.
    pub fn parse_with_index(spec: &str, seed: u64) -> Result<(Self, usize), DataError> {
        let bad = || {
            DataError::Spec(format!(
                "partition `{spec}`: expected SCHEME:K:INDEX, e.g. shards:100:0"
            ))
        };
        let (rest, index) = spec.rsplit_once(':').ok_or_else(bad)?;
        let (scheme, k) = rest.rsplit_once(':').ok_or_else(bad)?;
        let index: usize = index.parse().map_err(|_| bad())?;
        let clients: usize = k.parse().map_err(|_| bad())?;
        if clients == 0 || index >= clients {
            return Err(DataError::Spec(format!(
                "partition `{spec}`: index must be below K and K at least 1"
            )));
        }
        Ok((
            Partition {
                scheme: scheme.parse()?,
                clients,
                seed,
            },
            index,
        ))
    }

    /// Deals example indices to the K clients. `labels` are the dataset's labels.
    pub fn assign(&self, labels: &[u32]) -> Result<Vec<Vec<usize>>, DataError> {
        let n = labels.len();
        let k = self.clients;
        if k == 0 || n == 0 {
            return Err(DataError::Spec(
                "cannot partition: no clients or no examples".into(),
            ));
        }
        let mut rng = StdRng::seed_from_u64(self.seed);
        Ok(match self.scheme {
            PartitionScheme::Iid => {
                if n < k {
                    return Err(DataError::Spec(format!(
                        "iid partition of {n} examples over {k} clients leaves clients empty"
                    )));
                }
                let mut order: Vec<usize> = (0..n).collect();
                order.shuffle(&mut rng);
                (0..k)
                    .map(|c| order[c * n / k..(c + 1) * n / k].to_vec())
                    .collect()
            }
            PartitionScheme::Shards => shards(labels, k, &mut rng),
            PartitionScheme::Dirichlet { alpha } => dirichlet(labels, k, alpha, &mut rng)?,
        })
    }

    /// The example indices of client `index` alone.
    pub fn client(&self, labels: &[u32], index: usize) -> Result<Vec<usize>, DataError> {
        let mut all = self.assign(labels)?;
        if index >= all.len() {
            return Err(DataError::Spec(format!(
                "client index {index} outside 0..{}",
                all.len()
            )));
        }
        Ok(all.swap_remove(index))
    }
}

/// Label shards: sort by label, cut 2K shards of s = max(N/K, 600).min(N) / 2 consecutive
/// examples (cyclically), give each client two shards at random.
fn shards(labels: &[u32], k: usize, rng: &mut StdRng) -> Vec<Vec<usize>> {
    let n = labels.len();
    let per_client = (n / k).max(MIN_SHARD_CLIENT_SIZE).min(n).max(2);
    let shard = per_client / 2;
    let mut sorted: Vec<usize> = (0..n).collect();
    sorted.sort_by_key(|&i| labels[i]);
    let mut order: Vec<usize> = (0..2 * k).collect();
    order.shuffle(rng);
    order
        .chunks(2)
        .map(|pair| {
            pair.iter()
                .flat_map(|&j| (0..shard).map(move |i| (j * shard + i) % n))
                .map(|pos| sorted[pos])
                .collect()
        })
        .collect()
}

/// Dirichlet label skew: for each class, proportions p ~ Dir(alpha 1_K) drawn as normalised
/// Gamma(alpha, 1) variates, and the class's shuffled examples cut at the cumulative proportions.
fn dirichlet(
    labels: &[u32],
    k: usize,
    alpha: f64,
    rng: &mut StdRng,
) -> Result<Vec<Vec<usize>>, DataError> {
    let gamma = Gamma::new(alpha, 1.0)
        .map_err(|e| DataError::Spec(format!("dirichlet alpha {alpha}: {e}")))?;
    let classes = labels.iter().copied().max().unwrap_or(0) as usize + 1;
    let mut out = vec![Vec::new(); k];
    for class in 0..classes {
        let mut members: Vec<usize> = (0..labels.len())
            .filter(|&i| labels[i] as usize == class)
            .collect();
        members.shuffle(rng);
        let mut weights: Vec<f64> = (0..k).map(|_| gamma.sample(rng)).collect();
        let total: f64 = weights.iter().sum();
        if total <= 0.0 || !total.is_finite() {
            // All draws underflowed (tiny alpha): the whole class goes to one client.
            weights = vec![0.0; k];
            weights[rng.random_range(0..k)] = 1.0;
        }
        let total: f64 = weights.iter().sum();
        let mut cumulative = 0.0;
        let mut start = 0;
        for (client, w) in weights.iter().enumerate() {
            cumulative += w / total;
            let end = if client + 1 == k {
                members.len()
            } else {
                ((cumulative * members.len() as f64).round() as usize).min(members.len())
            };
            out[client].extend_from_slice(&members[start..end.max(start)]);
            start = end.max(start);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(n: usize) -> Vec<u32> {
        (0..n).map(|i| (i * 7 % 10) as u32).collect()
    }

    #[test]
    fn iid_is_a_disjoint_cover() {
        let l = labels(1003);
        let p = Partition {
            scheme: PartitionScheme::Iid,
            clients: 10,
            seed: 1,
        };
        let parts = p.assign(&l).unwrap();
        let mut all: Vec<usize> = parts.concat();
        all.sort();
        assert_eq!(all, (0..1003).collect::<Vec<_>>());
        assert!(parts.iter().all(|c| c.len() == 100 || c.len() == 101));
    }

    #[test]
    fn shards_give_two_labels_per_client_and_cover_the_data() {
        let l = labels(60_000);
        let p = Partition {
            scheme: PartitionScheme::Shards,
            clients: 100,
            seed: 3,
        };
        let parts = p.assign(&l).unwrap();
        let mut all: Vec<usize> = parts.concat();
        all.sort();
        assert_eq!(all, (0..60_000).collect::<Vec<_>>());
        for c in &parts {
            assert_eq!(c.len(), 600);
            let mut seen: Vec<u32> = c.iter().map(|&i| l[i]).collect();
            seen.sort();
            seen.dedup();
            // Shards of 300 inside classes of 6000 examples: at most one label per shard.
            assert!(seen.len() <= 2, "{seen:?}");
        }
    }

    #[test]
    fn shards_repeat_data_when_clients_outnumber_it() {
        let l = labels(60_000);
        let p = Partition {
            scheme: PartitionScheme::Shards,
            clients: 1000,
            seed: 3,
        };
        let parts = p.assign(&l).unwrap();
        assert_eq!(parts.len(), 1000);
        assert!(parts.iter().all(|c| c.len() == 600));
        let mut uses = vec![0; 60_000];
        parts.iter().flatten().for_each(|&i| uses[i] += 1);
        assert!(uses.iter().all(|&u| u == 10));
    }

    #[test]
    fn dirichlet_covers_the_data_and_skews_labels() {
        let l = labels(10_000);
        let p = Partition {
            scheme: PartitionScheme::Dirichlet { alpha: 0.1 },
            clients: 20,
            seed: 9,
        };
        let parts = p.assign(&l).unwrap();
        let mut all: Vec<usize> = parts.concat();
        all.sort();
        assert_eq!(all, (0..10_000).collect::<Vec<_>>());
        // With alpha = 0.1 most of a client's data comes from few classes.
        let skewed = parts
            .iter()
            .filter(|c| !c.is_empty())
            .filter(|c| {
                let mut counts = [0usize; 10];
                c.iter().for_each(|&i| counts[l[i] as usize] += 1);
                *counts.iter().max().unwrap() * 2 > c.len()
            })
            .count();
        assert!(skewed >= 10, "only {skewed} clients skewed");
    }

    #[test]
    fn same_seed_same_split_and_spec_parsing() {
        let l = labels(5000);
        let (p, i) = Partition::parse_with_index("dirichlet:0.5:10:3", 7).unwrap();
        assert_eq!(i, 3);
        assert_eq!(p.scheme, PartitionScheme::Dirichlet { alpha: 0.5 });
        assert_eq!(p.client(&l, 3).unwrap(), p.assign(&l).unwrap()[3]);
        assert_eq!(p.assign(&l).unwrap(), p.assign(&l).unwrap());
        assert!(Partition::parse_with_index("shards:10:10", 0).is_err());
        assert!(Partition::parse_with_index("shards:0:0", 0).is_err());
        assert!(Partition::parse_with_index("bogus:10:1", 0).is_err());
        assert!(Partition::parse_with_index("dirichlet:-1:10:1", 0).is_err());
        assert!(Partition::parse_with_index("shards", 0).is_err());
    }
}
