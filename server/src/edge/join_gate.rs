//! The rate limit of Join and AssignPartition per remote address.

use std::sync::Mutex;
use std::time::Duration;

/// Rate limits of Join and AssignPartition, per remote address.
type JoinLimiter = governor::DefaultKeyedRateLimiter<std::net::IpAddr>;

/// A limiter allowing `per_second` joins per address after a burst of `burst`.
fn join_limiter(per_second: f64, burst: u32) -> JoinLimiter {
    let period = Duration::from_secs_f64(1.0 / per_second);
    let burst = std::num::NonZeroU32::new(burst.max(1)).expect("at least 1");
    let quota = governor::Quota::with_period(period)
        .unwrap_or_else(|| governor::Quota::per_second(std::num::NonZeroU32::MIN))
        .allow_burst(burst);
    governor::RateLimiter::keyed(quota)
}

/// The join limiter and the log of what it refused: thousands of clients refused together (a
/// simulation starting, or a flood) make one warning a second with their count, not a line each.
#[derive(Debug)]
pub(crate) struct JoinGate {
    limiter: JoinLimiter,
    /// Refusals since the last warning, and when that was.
    refused: Mutex<(u64, Option<std::time::Instant>)>,
}

impl JoinGate {
    /// `per_second` joins per address after a burst of `burst`.
    pub(crate) fn new(per_second: f64, burst: u32) -> Self {
        Self {
            limiter: join_limiter(per_second, burst),
            refused: Mutex::new((0, None)),
        }
    }

    /// Whether `address` may join now; if not, how long until it may, and whether a warning
    /// about the refusals since the last one is due (at most one a second).
    pub(crate) fn check(&self, address: std::net::IpAddr) -> Result<(), Refused> {
        let Err(not_until) = self.limiter.check_key(&address) else {
            return Ok(());
        };
        let wait = not_until.wait_time_from(governor::clock::Clock::now(self.limiter.clock()));
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        refused.0 += 1;
        let now = std::time::Instant::now();
        let report = match refused.1 {
            Some(last) if now.duration_since(last) < Duration::from_secs(1) => None,
            _ => {
                refused.1 = Some(now);
                Some(std::mem::take(&mut refused.0))
            }
        };
        Err(Refused { wait, report })
    }
}

/// A join the limiter refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused {
    /// How long until the address has a join again.
    pub wait: Duration,
    /// The refusals since the last warning, when a warning is due.
    pub report: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_joins_are_reported_once_a_second_with_their_count() {
        let gate = JoinGate::new(0.001, 1);
        let ip = "127.0.0.1".parse().unwrap();
        let report = |r: Result<(), Refused>| r.map_err(|refused| refused.report);
        assert_eq!(report(gate.check(ip)), Ok(()));
        assert_eq!(report(gate.check(ip)), Err(Some(1)));
        for _ in 0..5 {
            assert_eq!(report(gate.check(ip)), Err(None));
        }
        // Two seconds later the quiet refusals are reported with the new one.
        {
            let mut refused = gate.refused.lock().unwrap();
            refused.1 = refused
                .1
                .and_then(|t| t.checked_sub(Duration::from_secs(2)));
        }
        assert_eq!(report(gate.check(ip)), Err(Some(6)));
        let other = "127.0.0.2".parse().unwrap();
        assert_eq!(gate.check(other), Ok(()), "each address has its own bucket");
    }

    #[test]
    fn a_refused_join_is_told_when_the_next_token_comes() {
        // 10 joins a second after a burst of 1: the next one comes within 100 ms.
        let gate = JoinGate::new(10.0, 1);
        let ip = "127.0.0.1".parse().unwrap();
        assert_eq!(gate.check(ip), Ok(()));
        let wait = gate.check(ip).unwrap_err().wait;
        assert!(
            !wait.is_zero() && wait <= Duration::from_millis(100),
            "{wait:?}"
        );
    }
}
