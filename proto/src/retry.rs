//! How a server tells a refused client when to come back: a `RESOURCE_EXHAUSTED` status carries
//! the wait in its `retry-after-ms` metadata (the gRPC form of HTTP's `Retry-After`), which the
//! client's back-off honours.

use std::time::Duration;
use tonic::Status;

/// The metadata key of the wait, in whole milliseconds.
pub const RETRY_AFTER_KEY: &str = "retry-after-ms";

/// `RESOURCE_EXHAUSTED` with `message` and the wait `after` (rounded up to a millisecond).
pub fn exhausted_retry_after(message: &str, after: Duration) -> Status {
    let millis = after.as_nanos().div_ceil(1_000_000).max(1);
    let mut status = Status::resource_exhausted(format!("{message}: retry in {millis} ms"));
    status.metadata_mut().insert(
        RETRY_AFTER_KEY,
        millis
            .to_string()
            .parse()
            .expect("digits are valid metadata"),
    );
    status
}

/// The wait a status asks for, if it names one (an unreadable value names none).
pub fn retry_after(status: &Status) -> Option<Duration> {
    let value = status.metadata().get(RETRY_AFTER_KEY)?.to_str().ok()?;
    value.parse().ok().map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_survives_the_round_trip_rounded_up_to_a_millisecond() {
        let s = exhausted_retry_after("too many joins", Duration::from_micros(2_300));
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        assert_eq!(retry_after(&s), Some(Duration::from_millis(3)));
        assert!(s.message().contains("retry in 3 ms"), "{}", s.message());
        let zero = exhausted_retry_after("x", Duration::ZERO);
        assert_eq!(retry_after(&zero), Some(Duration::from_millis(1)));
    }

    #[test]
    fn a_status_without_or_with_a_garbled_wait_names_none() {
        assert_eq!(retry_after(&Status::resource_exhausted("full")), None);
        let mut s = Status::resource_exhausted("full");
        s.metadata_mut()
            .insert(RETRY_AFTER_KEY, "soon".parse().unwrap());
        assert_eq!(retry_after(&s), None);
    }
}
