//! Timer latency, the way cyclictest measures it: one measuring process per
//! isolated CPU (the check's `timer` worker), SCHED_FIFO where permitted,
//! sleeping to absolute `CLOCK_MONOTONIC` deadlines one period apart; the
//! latency of each wake is the time read on waking minus the deadline.

use crate::hist::Histogram;
use crate::monotonic_ns;
use controller::time::{sleep_until, Monotonic};

/// What one timer worker found about its own setup.
#[derive(Debug, Clone, Copy, Default)]
pub struct TimerThreadSetup {
    pub cpu: usize,
    pub pinned: bool,
    pub fifo: bool,
}

/// Sleeps to absolute `CLOCK_MONOTONIC` deadlines `period_ns` apart and
/// records each wake's lateness into `h`, until `stop()` says so (checked
/// after every wake). `woke(n, deadline, now)` sees each wake, numbered
/// from 0, after it is recorded (the tracer's miss check).
pub fn measure(
    h: &Histogram,
    period_ns: u64,
    stop: impl Fn() -> bool,
    mut woke: impl FnMut(u64, u64, u64),
) {
    let period_ns = period_ns.max(1);
    let mut next = monotonic_ns() + period_ns;
    let mut n = 0u64;
    while !stop() {
        sleep_until(Monotonic::from_nanos(next));
        let now = monotonic_ns();
        h.record(now.saturating_sub(next));
        woke(n, next, now);
        n += 1;
        next += period_ns;
        if now > next {
            // Overran whole periods: skip them, as cyclictest does, rather
            // than bunching.
            let behind = (now - next) / period_ns + 1;
            next += behind * period_ns;
        }
    }
}
