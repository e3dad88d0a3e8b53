//! Simulated device speeds: a fleet whose clients differ in how long a round of training takes
//! them, for comparing synchronous and asynchronous aggregation on the same fleet.
//!
//! A simulation device, not a privacy mechanism: each client's pace is drawn from a generator
//! seeded by the fleet's seed and the client's index, so that `fl sim` and separate
//! `fl-client --simulate` processes given the same seed build the same fleet.

use rand::{Rng, SeedableRng, rngs::StdRng};
use rand_distr::{Distribution, LogNormal};
use std::time::Duration;

/// How the speeds of a simulated fleet are distributed.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(try_from = "String", into = "String")]
pub enum Speeds {
    /// Every client trains as fast as the machine lets it.
    #[default]
    Uniform,
    /// After each training a client waits a delay of its own, drawn once per client from a
    /// log-normal distribution: ln(delay) ~ N(ln median, sigma^2).
    LogNormal {
        /// The delays' median, in seconds (> 0).
        median_secs: f64,
        /// The spread of ln(delay) (>= 0; 0: every client waits `median_secs`).
        sigma: f64,
    },
    /// A fraction of the clients, drawn once per client, takes `factor` times as long as its
    /// training does: after training for t seconds it waits (factor - 1) t more.
    Slow {
        /// The share of slow clients, in [0, 1].
        fraction: f64,
        /// How many times slower they are (>= 1).
        factor: f64,
    },
}

/// One client's pace: what it waits after training before it answers.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Pace {
    /// No wait.
    #[default]
    Natural,
    /// A fixed delay after every training.
    Delay(Duration),
    /// Training takes this many times as long as it does here (>= 1).
    Slower(f64),
}

impl Pace {
    /// What a client of this pace waits after a training that took `trained`.
    pub fn extra(self, trained: Duration) -> Duration {
        match self {
            Pace::Natural => Duration::ZERO,
            Pace::Delay(d) => d,
            Pace::Slower(factor) => trained.mul_f64(factor - 1.0),
        }
    }
}

impl Speeds {
    /// The pace of client `index` of the fleet seeded by `seed`: the same in every process.
    pub fn pace(self, seed: u64, index: u64) -> Pace {
        // Seeded per client (SplitMix-style mixing keeps neighbouring indices apart).
        let mixed = seed ^ index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut rng = StdRng::seed_from_u64(mixed);
        match self {
            Speeds::Uniform => Pace::Natural,
            Speeds::LogNormal { median_secs, sigma } => {
                // ln(delay) ~ N(ln median, sigma^2): the log-normal's parameters.
                let dist = LogNormal::new(median_secs.ln(), sigma).expect("checked when parsed");
                Pace::Delay(Duration::from_secs_f64(dist.sample(&mut rng)))
            }
            Speeds::Slow { fraction, factor } => {
                if rng.random::<f64>() < fraction {
                    Pace::Slower(factor)
                } else {
                    Pace::Natural
                }
            }
        }
    }
}

/// The two numbers of `A:B`.
fn two_numbers(rest: &str) -> Option<(f64, f64)> {
    let (a, b) = rest.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

impl std::str::FromStr for Speeds {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let expected =
            "expected `uniform`, `lognormal:MEDIAN_SECS:SIGMA` or `slow:FRACTION:FACTOR`";
        let (name, rest) = s.split_once(':').unwrap_or((s, ""));
        let numbers = two_numbers(rest);
        match (name, numbers) {
            ("uniform", _) if rest.is_empty() => Ok(Speeds::Uniform),
            ("lognormal", Some((median_secs, sigma))) => {
                if !(median_secs > 0.0 && median_secs.is_finite()) {
                    return Err(format!("speeds `{s}`: the median must be seconds > 0"));
                }
                if !(sigma >= 0.0 && sigma.is_finite()) {
                    return Err(format!("speeds `{s}`: sigma must be >= 0"));
                }
                Ok(Speeds::LogNormal { median_secs, sigma })
            }
            ("slow", Some((fraction, factor))) => {
                if !(0.0..=1.0).contains(&fraction) {
                    return Err(format!("speeds `{s}`: the fraction must be in [0, 1]"));
                }
                if !(factor >= 1.0 && factor.is_finite()) {
                    return Err(format!("speeds `{s}`: the factor must be >= 1"));
                }
                Ok(Speeds::Slow { fraction, factor })
            }
            _ => Err(format!("speeds `{s}`: {expected}")),
        }
    }
}

impl TryFrom<String> for Speeds {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Speeds> for String {
    fn from(s: Speeds) -> String {
        match s {
            Speeds::Uniform => "uniform".into(),
            Speeds::LogNormal { median_secs, sigma } => format!("lognormal:{median_secs}:{sigma}"),
            Speeds::Slow { fraction, factor } => format!("slow:{fraction}:{factor}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print_back() {
        for spec in ["uniform", "lognormal:0.5:1", "slow:0.2:10"] {
            let speeds: Speeds = spec.parse().unwrap();
            assert_eq!(String::from(speeds), spec);
        }
        for bad in [
            "fast",
            "uniform:1",
            "lognormal:0:1",
            "lognormal:1:-1",
            "lognormal:1",
            "slow:1.5:10",
            "slow:0.2:0.5",
            "slow:0.2:inf",
        ] {
            assert!(bad.parse::<Speeds>().is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn a_clients_pace_is_the_same_in_every_process() {
        let speeds: Speeds = "lognormal:0.5:1".parse().unwrap();
        for index in [0, 1, 999] {
            assert_eq!(speeds.pace(7, index), speeds.pace(7, index));
        }
        assert_ne!(speeds.pace(7, 0), speeds.pace(7, 1));
        assert_ne!(speeds.pace(7, 0), speeds.pace(8, 0));
    }

    #[test]
    fn the_slow_fraction_is_drawn_per_client() {
        let (n, p) = (10_000u64, 0.2);
        let speeds = Speeds::Slow {
            fraction: p,
            factor: 10.0,
        };
        let slow = (0..n)
            .filter(|&i| speeds.pace(0, i) == Pace::Slower(10.0))
            .count() as f64;
        // Binomial(n, p): four standard deviations either side.
        let sd = (n as f64 * p * (1.0 - p)).sqrt();
        assert!((slow - n as f64 * p).abs() < 4.0 * sd, "{slow} slow of {n}");
    }

    #[test]
    fn lognormal_delays_have_their_median() {
        let (n, median, sigma) = (4001u64, 0.5f64, 1.0f64);
        let speeds = Speeds::LogNormal {
            median_secs: median,
            sigma,
        };
        let mut logs: Vec<f64> = (0..n)
            .map(|i| match speeds.pace(3, i) {
                Pace::Delay(d) => d.as_secs_f64().ln(),
                other => panic!("{other:?}"),
            })
            .collect();
        logs.sort_by(f64::total_cmp);
        // The sample median of n normals has standard deviation about 1.2533 sigma / sqrt(n).
        let sd = 1.2533 * sigma / (n as f64).sqrt();
        let sample = logs[logs.len() / 2];
        assert!(
            (sample - median.ln()).abs() < 4.0 * sd,
            "median log {sample}"
        );
        let every = Speeds::LogNormal {
            median_secs: median,
            sigma: 0.0,
        };
        assert_eq!(every.pace(1, 2), Pace::Delay(Duration::from_secs_f64(0.5)));
    }

    #[test]
    fn a_slower_client_waits_in_proportion_to_its_training() {
        let trained = Duration::from_millis(200);
        assert_eq!(
            Pace::Slower(10.0).extra(trained),
            Duration::from_millis(1800)
        );
        assert_eq!(Pace::Natural.extra(trained), Duration::ZERO);
        let d = Duration::from_millis(30);
        assert_eq!(Pace::Delay(d).extra(trained), d);
    }
}
