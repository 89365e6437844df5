//! [`FakeClock`]: a deterministic [`Clock`] for tests.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use keel_contracts::Clock;

/// A clock that starts at 2026-01-01T00:00:00Z and moves only when read or told to.
///
/// Each [`Clock::now`] returns the current instant and then steps 1 ms, so consecutive
/// events get distinct, increasing timestamps; [`FakeClock::advance`] jumps further.
/// Shared by reference (it is `Sync`); clones are not provided on purpose, so two parts of
/// a test cannot drift apart by holding different clocks.
#[derive(Debug)]
pub struct FakeClock {
    start: DateTime<Utc>,
    /// Nanoseconds elapsed since `start`.
    elapsed_nanos: AtomicI64,
}

/// How far each reading moves the clock.
const STEP_NANOS: i64 = 1_000_000;

impl FakeClock {
    /// A clock at 2026-01-01T00:00:00Z.
    pub fn new() -> FakeClock {
        FakeClock::starting_at(
            Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).single().unwrap_or_default(),
        )
    }

    /// A clock at `start`.
    pub fn starting_at(start: DateTime<Utc>) -> FakeClock {
        FakeClock { start, elapsed_nanos: AtomicI64::new(0) }
    }

    /// Moves the clock forward by `by` without reading it.
    pub fn advance(&self, by: Duration) {
        let nanos = i64::try_from(by.as_nanos()).unwrap_or(i64::MAX);
        self.elapsed_nanos.fetch_add(nanos, Ordering::SeqCst);
    }

    /// The current instant, without stepping.
    pub fn peek(&self) -> DateTime<Utc> {
        self.at(self.elapsed_nanos.load(Ordering::SeqCst))
    }

    fn at(&self, elapsed_nanos: i64) -> DateTime<Utc> {
        self.start + TimeDelta::nanoseconds(elapsed_nanos)
    }
}

impl Default for FakeClock {
    fn default() -> Self {
        FakeClock::new()
    }
}

impl Clock for FakeClock {
    fn now(&self) -> DateTime<Utc> {
        self.at(self.elapsed_nanos.fetch_add(STEP_NANOS, Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_new_year_2026_and_steps_one_millisecond_per_reading() {
        let clock = FakeClock::new();
        assert_eq!(clock.now().to_rfc3339(), "2026-01-01T00:00:00+00:00");
        assert_eq!(clock.now().to_rfc3339(), "2026-01-01T00:00:00.001+00:00");
        clock.advance(Duration::from_secs(60));
        assert_eq!(clock.peek().to_rfc3339(), "2026-01-01T00:01:00.002+00:00");
        assert_eq!(clock.now(), clock.peek() - TimeDelta::milliseconds(1));
    }
}
