//! Monotonic time: `CLOCK_MONOTONIC` as a type, so a message's send time,
//! a timer's deadline and "now" are not confused with other nanosecond
//! counts (durations, wall-clock times).

use std::time::Duration;

/// An instant on `CLOCK_MONOTONIC` (nanoseconds since boot), as stamped in
/// messages and used for deadlines. Comparable across processes of one
/// boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Monotonic(u64);

impl Monotonic {
    /// The time now.
    pub fn now() -> Monotonic {
        Monotonic(crate::sys::monotonic_ns())
    }

    pub const fn from_nanos(ns: u64) -> Monotonic {
        Monotonic(ns)
    }

    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The time from `earlier` to `self`, zero when `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Monotonic) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// `self + d`, saturating at the end of time.
    pub fn saturating_add(self, d: Duration) -> Monotonic {
        Monotonic(
            self.0
                .saturating_add(d.as_nanos().min(u64::MAX as u128) as u64),
        )
    }
}

impl std::ops::Add<Duration> for Monotonic {
    type Output = Monotonic;
    fn add(self, d: Duration) -> Monotonic {
        self.saturating_add(d)
    }
}

impl std::ops::Sub for Monotonic {
    type Output = Duration;
    /// The time from `earlier` to `self` (zero when `earlier` is later).
    fn sub(self, earlier: Monotonic) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl std::fmt::Display for Monotonic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}.{:09}",
            self.0 / 1_000_000_000,
            self.0 % 1_000_000_000
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_and_prints_seconds() {
        let t = Monotonic::from_nanos(1_500_000_000);
        assert_eq!(
            t + Duration::from_millis(500),
            Monotonic::from_nanos(2_000_000_000)
        );
        assert_eq!(
            t - Monotonic::from_nanos(500_000_000),
            Duration::from_secs(1)
        );
        assert_eq!(Monotonic::from_nanos(1) - t, Duration::ZERO);
        assert_eq!(
            Monotonic::from_nanos(u64::MAX) + Duration::from_secs(1),
            Monotonic::from_nanos(u64::MAX)
        );
        assert_eq!(t.to_string(), "1.500000000");
        assert!(Monotonic::now() > Monotonic::from_nanos(0));
    }
}
