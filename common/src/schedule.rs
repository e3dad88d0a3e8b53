//! Per-round schedules of a number (clients per round m_t, noise multiplier sigma_t): constant,
//! piecewise constant from given rounds on, or linear from the first round to the last. Geyer et
//! al. found that raising m_t later in training helps.

use serde::{Deserialize, Serialize};

/// A value per round t = 1..=T. In TOML: `10`, `{ steps = [[1, 10], [50, 30]] }` (10 from round
/// 1, 30 from round 50), or `{ linear = [10, 30] }` (10 at round 1 rising linearly to 30 at T).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged, deny_unknown_fields)]
pub enum Schedule {
    /// The same value every round.
    Constant(f64),
    /// `(first_round, value)` pairs: each value holds from its round until the next pair's.
    Steps {
        /// The pairs, first round 1, rounds strictly increasing.
        steps: Vec<(u64, f64)>,
    },
    /// From `linear.0` at round 1 to `linear.1` at round T.
    Linear {
        /// (start, end).
        linear: (f64, f64),
    },
}

impl Schedule {
    /// The value at round `t` of `total` rounds (t from 1).
    pub fn at(&self, t: u64, total: u64) -> f64 {
        match self {
            Schedule::Constant(v) => *v,
            Schedule::Steps { steps } => steps
                .iter()
                .take_while(|(from, _)| *from <= t)
                .last()
                .map_or(steps[0].1, |&(_, v)| v),
            Schedule::Linear { linear: (a, b) } => {
                if total <= 1 {
                    *a
                } else {
                    a + (b - a) * (t.saturating_sub(1)) as f64 / (total - 1) as f64
                }
            }
        }
    }

    /// Every value the schedule takes (for range checks).
    pub fn values(&self) -> Vec<f64> {
        match self {
            Schedule::Constant(v) => vec![*v],
            Schedule::Steps { steps } => steps.iter().map(|s| s.1).collect(),
            Schedule::Linear { linear: (a, b) } => vec![*a, *b],
        }
    }

    /// Checks the shape (steps start at round 1 and increase) and that every value satisfies
    /// `ok`; `name` goes into the message.
    pub fn check(&self, name: &str, ok: impl Fn(f64) -> bool, what: &str) -> Result<(), String> {
        if let Schedule::Steps { steps } = self {
            if steps.first().map(|s| s.0) != Some(1) {
                return Err(format!("{name}: steps must start at round 1"));
            }
            if steps.windows(2).any(|w| w[1].0 <= w[0].0) {
                return Err(format!("{name}: step rounds must increase strictly"));
            }
        }
        match self.values().into_iter().find(|&v| !ok(v)) {
            Some(bad) => Err(format!("{name}: value {bad} must be {what}")),
            None => Ok(()),
        }
    }
}

impl From<f64> for Schedule {
    fn from(v: f64) -> Self {
        Schedule::Constant(v)
    }
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Schedule::Constant(v) => write!(f, "{v}"),
            Schedule::Steps { steps } => {
                let parts: Vec<String> =
                    steps.iter().map(|(r, v)| format!("{v} from {r}")).collect();
                write!(f, "{}", parts.join(", "))
            }
            Schedule::Linear { linear: (a, b) } => write!(f, "{a} to {b} linearly"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_evaluate_per_round() {
        let steps = Schedule::Steps {
            steps: vec![(1, 10.0), (5, 20.0)],
        };
        assert_eq!(steps.at(4, 10), 10.0);
        assert_eq!(steps.at(5, 10), 20.0);
        let lin = Schedule::Linear { linear: (1.0, 2.0) };
        assert_eq!(lin.at(1, 11), 1.0);
        assert_eq!(lin.at(6, 11), 1.5);
        assert_eq!(lin.at(11, 11), 2.0);
        assert_eq!(Schedule::Constant(3.0).at(7, 9), 3.0);
    }

    #[test]
    fn inconsistent_schedules_are_refused() {
        let positive = |v: f64| v > 0.0;
        let late = Schedule::Steps {
            steps: vec![(2, 1.0)],
        };
        assert!(
            late.check("s", positive, "positive")
                .unwrap_err()
                .contains("round 1")
        );
        let back = Schedule::Steps {
            steps: vec![(1, 1.0), (5, 1.0), (5, 2.0)],
        };
        assert!(
            back.check("s", positive, "positive")
                .unwrap_err()
                .contains("strictly")
        );
        let neg = Schedule::Linear {
            linear: (1.0, -1.0),
        };
        assert!(
            neg.check("s", positive, "positive")
                .unwrap_err()
                .contains("-1")
        );
    }

    #[test]
    fn parses_from_toml() {
        #[derive(Deserialize)]
        struct T {
            a: Schedule,
            b: Schedule,
            c: Schedule,
        }
        let t: T =
            toml::from_str("a = 3\nb = { steps = [[1, 2], [10, 4]] }\nc = { linear = [1, 2] }")
                .unwrap();
        assert_eq!(t.a, Schedule::Constant(3.0));
        assert_eq!(t.b.at(10, 20), 4.0);
        assert_eq!(t.c.at(20, 20), 2.0);
    }
}
