//! Monotonic time: `CLOCK_MONOTONIC` as a type, so a message's send time,
//! a timer's deadline and "now" are not confused with other nanosecond
//! counts (durations, wall-clock times), the one absolute sleep every
//! periodic thread of the runtime and of the check uses, and the clock a
//! loop and its publishers read: `CLOCK_MONOTONIC`, or a virtual clock in
//! simulation ([`Clock`]).
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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

/// Sleeps until `deadline` on `CLOCK_MONOTONIC`: an absolute
/// [`clock_nanosleep(2)`](https://man7.org/linux/man-pages/man2/clock_nanosleep.2.html)
/// (`TIMER_ABSTIME`), so a periodic thread does not drift by the time it
/// took to get here. A signal handler that interrupts the sleep (`EINTR`)
/// does not end it: the same deadline is slept to again. A deadline in the
/// past returns at once.
///
/// One syscall, no allocation, async-signal-safe: a forked child may call
/// it before it `exec`s or `_exit`s.
#[inline]
pub fn sleep_until(deadline: Monotonic) {
    let ts = crate::sys::timespec_of(deadline.0);
    loop {
        // SAFETY: `ts` is a valid timespec for the call; with TIMER_ABSTIME
        // no remainder is written, so the null pointer is allowed.
        let r = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        // clock_nanosleep returns the error number (not -1 and errno).
        if r != libc::EINTR {
            return;
        }
    }
}

/// A clock that only moves when told to: the time of a simulation
/// ([`crate::sim`]), shared by its loops and their publishers. It counts
/// in the same nanoseconds as `CLOCK_MONOTONIC`, so messages, deadlines
/// and reports read the same as in a real run; it never goes back.
#[derive(Debug, Clone)]
pub struct VirtualClock(Arc<AtomicU64>);

impl VirtualClock {
    /// A clock reading `start`.
    pub fn new(start: Monotonic) -> VirtualClock {
        VirtualClock(Arc::new(AtomicU64::new(start.0)))
    }

    /// The virtual time now.
    #[inline]
    pub fn now(&self) -> Monotonic {
        Monotonic(self.0.load(Ordering::Relaxed))
    }

    /// Moves the clock on to `t`; an earlier `t` leaves it where it is
    /// (virtual time never goes back). Returns the time now.
    pub fn advance_to(&self, t: Monotonic) -> Monotonic {
        Monotonic(self.0.fetch_max(t.0, Ordering::Relaxed).max(t.0))
    }
}

/// Where a loop and its publishers take the time: `CLOCK_MONOTONIC`, or
/// a simulation's [`VirtualClock`].
///
/// An enum, chosen at run time (a controller binary is the same for a
/// real run and a simulated one; the environment says which): reading it
/// is one test of the variant before the `clock_gettime` of the vDSO that
/// a real loop made anyway, with no indirect call, so a real loop's
/// costs do not change. A generic parameter would make every controller
/// generic for a choice made once at start; a trait object would make
/// every reading an indirect call.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    #[default]
    Monotonic,
    Virtual(VirtualClock),
}

impl Clock {
    /// The time now, in nanoseconds.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        match self {
            Clock::Monotonic => crate::sys::monotonic_ns(),
            Clock::Virtual(v) => v.now().0,
        }
    }

    /// The time now.
    #[inline]
    pub fn now(&self) -> Monotonic {
        Monotonic(self.now_ns())
    }

    /// The virtual clock, in a simulation.
    pub fn virtual_clock(&self) -> Option<&VirtualClock> {
        match self {
            Clock::Monotonic => None,
            Clock::Virtual(v) => Some(v),
        }
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

    #[test]
    fn a_virtual_clock_moves_only_forward_and_only_when_told() {
        let v = VirtualClock::new(Monotonic::from_nanos(1_000));
        let c = Clock::Virtual(v.clone());
        assert_eq!(c.now_ns(), 1_000);
        assert_eq!(v.advance_to(Monotonic::from_nanos(5_000)).as_nanos(), 5_000);
        assert_eq!(c.now_ns(), 5_000);
        assert_eq!(v.advance_to(Monotonic::from_nanos(2_000)).as_nanos(), 5_000);
        assert_eq!(c.now_ns(), 5_000, "never back");
        assert!(Clock::Monotonic.now_ns() > 0);
    }

    #[test]
    fn sleep_until_does_not_return_before_its_deadline() {
        let deadline = Monotonic::now() + Duration::from_millis(2);
        sleep_until(deadline);
        assert!(Monotonic::now() >= deadline);
        // A deadline in the past returns at once (not asserted in time:
        // it returns at all).
        sleep_until(Monotonic::from_nanos(1));
    }

    #[test]
    fn sleep_until_sleeps_on_through_a_signal() {
        use std::sync::atomic::{AtomicBool, Ordering};
        static HANDLED: AtomicBool = AtomicBool::new(false);
        extern "C" fn on_signal(_: libc::c_int) {
            HANDLED.store(true, Ordering::SeqCst);
        }
        // SAFETY: installs an async-signal-safe handler (one atomic store)
        // for SIGRTMAX - 1, which nothing else in this test binary uses;
        // no SA_RESTART, so the sleep sees EINTR.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGRTMAX() - 1, &sa, std::ptr::null_mut());
        }
        let deadline = Monotonic::now() + Duration::from_millis(50);
        // SAFETY: pthread_self is always valid for the calling thread.
        let me = unsafe { libc::pthread_self() } as usize;
        let poker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            // SAFETY: `me` is the sleeping test thread, alive until this
            // thread is joined.
            unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGRTMAX() - 1) };
        });
        sleep_until(deadline);
        poker.join().unwrap();
        assert!(HANDLED.load(Ordering::SeqCst), "the signal was handled");
        assert!(Monotonic::now() >= deadline, "the sleep went on after it");
    }
}
