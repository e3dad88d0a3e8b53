//! One check for every group's partial aggregate (the aggregator tier), as `intake.rs` is for a
//! client's upload: the coordinator does not trust an aggregator to count or to clip, so a
//! group's sum is refused unless it could have come from the group's sampled clients under the
//! round's rule. The checks, each on what the coordinator knows itself:
//!
//! - the sum has the model's length and finite values;
//! - its clip label is the round's S (none where the round clips nothing);
//! - at least one and at most the group's sampled clients contributed;
//! - its weight is the contributors' count where each result weighs 1, and at least that where
//!   results weigh their example counts;
//! - its L2 norm is at most what `contributors` results could reach: contributors x S for a sum
//!   of clipped updates; for a secure group's decoded sum, contributors x (S + sqrt(d)/gamma)
//!   (clipping, then stochastic rounding, [`fl_secagg::Quantizer::decoded_sensitivity`]) plus a
//!   tail bound on the contributors' discrete Gaussian noise.

use crate::round::events::GroupReport;
use fl_model::CheckedUpdate;
use fl_secagg::Calibration;

/// Relative slack on a norm bound for f32 sums and decoding: far above their rounding, far
/// below any scaling that would matter.
const FLOAT_SLACK: f64 = 1e-4;

/// t of the noise's tail bound: an honest group's sum is refused with probability at most
/// e^-t = 2e-22.
const NOISE_TAIL: f64 = 50.0;

/// What the coordinator expects of one group's sum in a round.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expected<'a> {
    /// d.
    pub dim: usize,
    /// The group's clients sampled into the round.
    pub sampled: usize,
    /// How the group had to sum.
    pub rule: SumRule<'a>,
}

/// How a group had to sum its clients' results.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SumRule<'a> {
    /// Clipped to S (or not, `None`), each weighing 1 or (`weighted`) its example count.
    Plain {
        /// S.
        clip: Option<f64>,
        /// Results weigh their example counts.
        weighted: bool,
    },
    /// Secure aggregation under the round's code and noise.
    Secure(&'a Calibration),
}

/// Why a group's sum is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum GroupRefusal {
    /// Not the model's length, or a value not finite.
    #[error("the sum is not {dim} finite values")]
    Malformed {
        /// d.
        dim: usize,
    },
    /// Clipped to another bound than the round's.
    #[error("the sum is labelled clipped to {got:?}, the round's S is {expected:?}")]
    Clip {
        /// The label.
        got: Option<f64>,
        /// The round's.
        expected: Option<f64>,
    },
    /// No contributor, or more than the group's sampled clients.
    #[error("{contributors} contributors claimed, the group had {sampled} sampled clients")]
    Contributors {
        /// Claimed.
        contributors: u64,
        /// Sampled.
        sampled: usize,
    },
    /// A weight no results of the group could sum to.
    #[error("weight {weight} for {contributors} contributors")]
    Weight {
        /// Claimed.
        weight: f64,
        /// Contributors.
        contributors: u64,
    },
    /// A norm no `contributors` results could reach.
    #[error("L2 norm {norm:.4e}, above the {bound:.4e} its contributors could reach")]
    Oversized {
        /// ||sum||.
        norm: f64,
        /// The bound.
        bound: f64,
    },
}

/// Checks `report`'s sum against what the coordinator `expected`; the sum, checked finite.
pub(crate) fn check_group(
    report: GroupReport,
    expected: Expected,
) -> Result<Option<CheckedUpdate>, GroupRefusal> {
    let Some(sum) = report.sum else {
        return Ok(None);
    };
    let Expected { dim, sampled, rule } = expected;
    let malformed = || GroupRefusal::Malformed { dim };
    if sum.len() != dim {
        return Err(malformed());
    }
    let sum = CheckedUpdate::new(sum).map_err(|_| malformed())?;
    let contributors = report.contributors;
    if contributors == 0 || contributors > sampled as u64 {
        return Err(GroupRefusal::Contributors {
            contributors,
            sampled,
        });
    }
    let (clip, weighted) = match rule {
        SumRule::Plain { clip, weighted } => (clip, weighted),
        SumRule::Secure(c) => (Some(c.quantizer.clip), false),
    };
    if report.clip_bound != clip {
        return Err(GroupRefusal::Clip {
            got: report.clip_bound,
            expected: clip,
        });
    }
    let n = contributors as f64;
    let weight_fits = match weighted {
        true => report.weight >= n && report.weight.is_finite(),
        false => report.weight == n,
    };
    if !weight_fits {
        return Err(GroupRefusal::Weight {
            weight: report.weight,
            contributors,
        });
    }
    if let Some(bound) = norm_bound(rule, n, dim) {
        let norm = sum.norm();
        if norm > bound * (1.0 + FLOAT_SLACK) {
            return Err(GroupRefusal::Oversized { norm, bound });
        }
    }
    Ok(Some(sum))
}

/// The largest L2 norm a sum of `n` results can have under `rule` (`None`: unbounded).
fn norm_bound(rule: SumRule, n: f64, dim: usize) -> Option<f64> {
    match rule {
        SumRule::Plain { clip, .. } => clip.map(|s| n * s),
        SumRule::Secure(c) => {
            let q = c.quantizer;
            let signal = n * q.decoded_sensitivity(dim);
            // The n noises sum to a vector of independent coordinates, each sub-Gaussian of
            // variance proxy n sigma_i^2 (a discrete Gaussian's is its sigma^2; Canonne, Kamath,
            // Steinke 2020, Prop. 19): ||x||^2 <= s^2 (d + 2 sqrt(d t) + 2 t) but with
            // probability e^-t (Hsu, Kakade, Zhang 2012, Thm 1).
            let s2 = n * c.ddg.map_or(0, |d| d.client_variance) as f64;
            let d = dim as f64;
            let tail = (s2 * (d + 2.0 * (d * NOISE_TAIL).sqrt() + 2.0 * NOISE_TAIL)).sqrt();
            Some(signal + tail / q.scale)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(sum: Vec<f32>, contributors: u64, weight: f64, clip: Option<f64>) -> GroupReport {
        GroupReport {
            round: 1,
            sum: Some(sum),
            contributors,
            weight,
            clip_bound: clip,
            dropped: 0,
            refused: 0,
            bytes_up: 0,
            bytes_down: 0,
            losses: (0.0, 0),
            dropouts_recovered: 0,
        }
    }

    const CLIPPED: SumRule = SumRule::Plain {
        clip: Some(1.0),
        weighted: false,
    };

    fn expected(rule: SumRule) -> Expected {
        Expected {
            dim: 4,
            sampled: 3,
            rule,
        }
    }

    /// Three clipped updates of norm 1 sum to a norm of at most 3: a sum of norm 3 is taken, one
    /// of norm 3.01 (or any norm with a count above the sampled, or no contributor) refused, and
    /// an unweighted sum's weight must be its count.
    #[test]
    fn a_groups_sum_is_held_to_what_its_sampled_clients_could_send() {
        let ok = report(vec![3.0, 0.0, 0.0, 0.0], 3, 3.0, Some(1.0));
        assert!(check_group(ok, expected(CLIPPED)).unwrap().is_some());
        let big = report(vec![3.01, 0.0, 0.0, 0.0], 3, 3.0, Some(1.0));
        let refused = check_group(big, expected(CLIPPED)).unwrap_err();
        assert!(
            matches!(refused, GroupRefusal::Oversized { .. }),
            "{refused}"
        );
        let inflated = report(vec![0.1; 4], 10, 10.0, Some(1.0));
        let refused = check_group(inflated, expected(CLIPPED)).unwrap_err();
        assert!(
            matches!(
                refused,
                GroupRefusal::Contributors {
                    contributors: 10,
                    sampled: 3
                }
            ),
            "{refused}"
        );
        let none = report(vec![0.0; 4], 0, 0.0, Some(1.0));
        assert!(check_group(none, expected(CLIPPED)).is_err());
        let heavy = report(vec![0.1; 4], 2, 7.0, Some(1.0));
        let refused = check_group(heavy, expected(CLIPPED)).unwrap_err();
        assert!(matches!(refused, GroupRefusal::Weight { .. }), "{refused}");
        let weighted = SumRule::Plain {
            clip: None,
            weighted: true,
        };
        let examples = report(vec![1e6; 4], 2, 700.0, None);
        assert!(check_group(examples, expected(weighted)).is_ok());
        let light = report(vec![1.0; 4], 2, 1.5, None);
        assert!(check_group(light, expected(weighted)).is_err());
        let relabelled = report(vec![0.1; 4], 2, 2.0, Some(100.0));
        let refused = check_group(relabelled, expected(CLIPPED)).unwrap_err();
        assert!(matches!(refused, GroupRefusal::Clip { .. }), "{refused}");
        let short = report(vec![0.1; 3], 2, 2.0, Some(1.0));
        assert!(check_group(short, expected(CLIPPED)).is_err());
    }

    /// A secure group's bound: n (S + sqrt(d)/gamma) plus the noise's tail. With S = 1,
    /// gamma = 1000, d = 4 and sigma_i = 100 levels (0.1 in update units) for 3 clients, the bound
    /// is 3 (1 + 0.002) + sqrt(3 10^4 (4 + 2 sqrt(200) + 100)) / 1000 = 3.006 + 1.992; a sum of
    /// norm 4.9 is taken, one of norm 5.2 refused.
    #[test]
    fn a_secure_groups_bound_counts_rounding_and_noise() {
        let quantizer = fl_secagg::Quantizer {
            ring: fl_secagg::Ring::new(32).unwrap(),
            clip: 1.0,
            scale: 1000.0,
        };
        let calibration = Calibration {
            quantizer,
            min_survivors: 3,
            calibrated_for: 3,
            ddg: Some(fl_privacy::DdgRound {
                clients: 3,
                client_variance: 10_000,
                l2_sensitivity: 1.0,
                neighbours: Default::default(),
                dim: 4,
            }),
        };
        let rule = SumRule::Secure(&calibration);
        let bound = norm_bound(rule, 3.0, 4).unwrap();
        assert!((bound - 4.998).abs() < 1e-3, "{bound}");
        let ok = report(vec![4.9, 0.0, 0.0, 0.0], 3, 3.0, Some(1.0));
        assert!(check_group(ok, expected(rule)).is_ok());
        let big = report(vec![5.2, 0.0, 0.0, 0.0], 3, 3.0, Some(1.0));
        assert!(check_group(big, expected(rule)).is_err());
    }
}
