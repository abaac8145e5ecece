//! When an exited process starts again (pure: no clock, no I/O).
//!
//! Exponential backoff: the first restart waits `initial_backoff`, each
//! further one `factor` times longer, up to `max_backoff`. A run that lasted
//! longer than `crash_loop_window` counts as healthy and resets the delay.
//! `crash_loop_restarts` restarts within `crash_loop_window` is a crash
//! loop: the process goes to `failed` and is not started again until asked.

use std::collections::VecDeque;
use std::time::Duration;

use crate::config::{Restart, RestartPolicy};

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    /// `exit(code)`.
    Code(i32),
    /// Killed by a signal.
    Signal(i32),
}

impl ExitKind {
    pub fn success(self) -> bool {
        self == ExitKind::Code(0)
    }

    /// `exit 3`, `killed by SIGSEGV`.
    pub fn describe(self) -> String {
        match self {
            ExitKind::Code(c) => format!("exit {c}"),
            ExitKind::Signal(s) => format!("killed by {}", signal_name(s)),
        }
    }
}

/// The name of a signal number (`SIGKILL`), or `signal N`.
pub fn signal_name(sig: i32) -> String {
    let names = [
        (1, "SIGHUP"),
        (2, "SIGINT"),
        (3, "SIGQUIT"),
        (4, "SIGILL"),
        (5, "SIGTRAP"),
        (6, "SIGABRT"),
        (7, "SIGBUS"),
        (8, "SIGFPE"),
        (9, "SIGKILL"),
        (10, "SIGUSR1"),
        (11, "SIGSEGV"),
        (12, "SIGUSR2"),
        (13, "SIGPIPE"),
        (14, "SIGALRM"),
        (15, "SIGTERM"),
        (24, "SIGXCPU"),
        (25, "SIGXFSZ"),
    ];
    names
        .iter()
        .find(|(n, _)| *n == sig)
        .map(|(_, s)| s.to_string())
        .unwrap_or_else(|| format!("signal {sig}"))
}

/// What to do after an exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Start again after this delay.
    Restart(Duration),
    /// Leave it exited (the policy says so).
    Stay,
    /// Crash loop: stop trying.
    Fail(String),
}

/// The restart history of one process.
#[derive(Debug, Clone, Default)]
pub struct Tracker {
    /// Offsets (from any fixed origin) of recent restarts.
    recent: VecDeque<Duration>,
    /// Restarts since the last healthy run; sets the next delay.
    streak: u32,
}

impl Tracker {
    /// Decides after an exit at `now` of a run that lasted `ran`.
    pub fn on_exit(
        &mut self,
        r: &Restart,
        exit: ExitKind,
        ran: Duration,
        now: Duration,
    ) -> Decision {
        let wanted = match r.policy {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => !exit.success(),
            RestartPolicy::Never => false,
        };
        if !wanted {
            return Decision::Stay;
        }
        let window = r.crash_loop_window.0;
        if ran >= window {
            self.streak = 0;
        }
        while self
            .recent
            .front()
            .is_some_and(|&t| now.saturating_sub(t) > window)
        {
            self.recent.pop_front();
        }
        if self.recent.len() as u32 >= r.crash_loop_restarts {
            return Decision::Fail(format!(
                "crash loop: {} restarts within {}, last {}",
                self.recent.len(),
                r.crash_loop_window,
                exit.describe()
            ));
        }
        let delay = backoff(r, self.streak);
        self.streak = self.streak.saturating_add(1);
        self.recent.push_back(now);
        Decision::Restart(delay)
    }

    /// Forgets the history (after a manual start).
    pub fn reset(&mut self) {
        *self = Tracker::default();
    }
}

/// The delay before restart number `n` (0-based) of a streak.
pub fn backoff(r: &Restart, n: u32) -> Duration {
    let initial = r.initial_backoff.0.as_secs_f64();
    let max = r.max_backoff.0.as_secs_f64();
    let d = initial * r.factor.max(1.0).powi(n.min(64) as i32);
    Duration::from_secs_f64(d.min(max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use units::duration::Dur;

    fn restart(policy: RestartPolicy) -> Restart {
        Restart {
            policy,
            initial_backoff: Dur::from_millis(100),
            max_backoff: Dur::from_millis(500),
            factor: 2.0,
            crash_loop_restarts: 5,
            crash_loop_window: Dur::from_secs(10),
        }
    }

    #[test]
    fn delays_grow_then_cap_then_crash_loop() {
        let r = restart(RestartPolicy::Always);
        let mut t = Tracker::default();
        let mut now = Duration::ZERO;
        let mut delays = Vec::new();
        loop {
            match t.on_exit(&r, ExitKind::Code(1), Duration::from_millis(10), now) {
                Decision::Restart(d) => {
                    delays.push(d.as_millis());
                    now += d;
                }
                Decision::Fail(why) => {
                    assert!(
                        why.starts_with("crash loop: 5 restarts within 10s, last exit 1"),
                        "{why}"
                    );
                    break;
                }
                Decision::Stay => panic!("always restarts"),
            }
        }
        assert_eq!(delays, vec![100, 200, 400, 500, 500]);
    }

    #[test]
    fn a_long_healthy_run_resets_the_streak() {
        let r = restart(RestartPolicy::Always);
        let mut t = Tracker::default();
        assert_eq!(
            t.on_exit(&r, ExitKind::Code(1), Duration::ZERO, Duration::ZERO),
            Decision::Restart(Duration::from_millis(100))
        );
        assert_eq!(
            t.on_exit(
                &r,
                ExitKind::Code(1),
                Duration::ZERO,
                Duration::from_secs(1)
            ),
            Decision::Restart(Duration::from_millis(200))
        );
        let later = Duration::from_secs(100);
        assert_eq!(
            t.on_exit(&r, ExitKind::Signal(11), Duration::from_secs(60), later),
            Decision::Restart(Duration::from_millis(100))
        );
    }

    #[test]
    fn policies() {
        let mut t = Tracker::default();
        let r = restart(RestartPolicy::OnFailure);
        assert_eq!(
            t.on_exit(&r, ExitKind::Code(0), Duration::ZERO, Duration::ZERO),
            Decision::Stay
        );
        assert!(matches!(
            t.on_exit(&r, ExitKind::Signal(9), Duration::ZERO, Duration::ZERO),
            Decision::Restart(_)
        ));
        let r = restart(RestartPolicy::Never);
        assert_eq!(
            t.on_exit(&r, ExitKind::Code(1), Duration::ZERO, Duration::ZERO),
            Decision::Stay
        );
    }

    #[test]
    fn exit_descriptions() {
        assert_eq!(ExitKind::Signal(9).describe(), "killed by SIGKILL");
        assert_eq!(ExitKind::Code(3).describe(), "exit 3");
        assert_eq!(signal_name(64), "signal 64");
    }
}
