//! The trial verdict: whether a release that was just switched to is
//! healthy, judged from the supervisor's own view of its processes, and
//! what to do about it ([`releases::commit`] or [`releases::rollback`]).
//!
//! How the supervisor uses it: when `state.json` says trial (an install
//! just switched `current`; it looks once a second, or is told over the
//! control socket), it restarts every process from `current`, makes a
//! [`TrialHealth`] with `update.health_window`, and once a second feeds it
//! each process's [`ProcessHealth`] (`running`: the child is alive;
//! `ready`: `health::Health::ready() && !unhealthy(now)`; `over_budget`:
//! `Health::over_budget`; `restarts`: its restart count); on
//! [`HealthVerdict::Commit`] it commits, on [`HealthVerdict::Rollback`] it
//! rolls back and restarts the processes again (from the old release).
//! [`watch_trial`] is that loop, for callers that can block a thread on it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use releases::{commit, rollback, ReleaseError, Rollback};

/// One process as the supervisor sees it, as plain data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessHealth {
    pub name: String,
    /// Alive now.
    pub running: bool,
    /// Reported ready (its first timing report, or the readiness signal).
    pub ready: bool,
    /// Timing reports over budget so far (a running count, as
    /// `health::Health::over_budget` keeps it); any increase during the
    /// trial fails it.
    pub over_budget: u64,
    /// Restarts since the supervisor started it (a crash shows up here even
    /// if the process is running again by the time we look).
    pub restarts: u32,
}

/// What to do with a trial now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthVerdict {
    /// Keep watching.
    Wait,
    /// Healthy for the whole window: [`commit`].
    Commit,
    /// [`rollback`], for this reason.
    Rollback(String),
}

/// The health decision for one trial. Healthy means every process running,
/// ready and within budget; a crash, a restart or a budget overrun rolls
/// back at once; the processes must all be ready within one window of the
/// trial's start, and then stay healthy for a whole window.
#[derive(Debug, Clone)]
pub struct TrialHealth {
    window: Duration,
    healthy_since: Option<Duration>,
    /// Restarts and over-budget counts at the first observation.
    baseline: Option<BTreeMap<String, (u32, u64)>>,
}

impl TrialHealth {
    pub fn new(window: Duration) -> TrialHealth {
        TrialHealth {
            window,
            healthy_since: None,
            baseline: None,
        }
    }

    /// How much of the window is still to go, `elapsed` after the trial
    /// began; `None` until every process was seen healthy.
    pub fn window_left(&self, elapsed: Duration) -> Option<Duration> {
        self.healthy_since
            .map(|since| self.window.saturating_sub(elapsed.saturating_sub(since)))
    }

    /// Takes one observation, `elapsed` after the trial began.
    pub fn observe(&mut self, elapsed: Duration, procs: &[ProcessHealth]) -> HealthVerdict {
        let baseline = self.baseline.get_or_insert_with(|| {
            procs
                .iter()
                .map(|p| (p.name.clone(), (p.restarts, p.over_budget)))
                .collect()
        });
        for p in procs {
            if !p.running {
                return HealthVerdict::Rollback(format!("process {} is not running", p.name));
            }
            let (restarts, over) = baseline.get(&p.name).copied().unwrap_or((0, 0));
            if p.restarts > restarts {
                return HealthVerdict::Rollback(format!(
                    "process {} restarted {} time(s) during the trial",
                    p.name, p.restarts
                ));
            }
            if p.over_budget > over {
                return HealthVerdict::Rollback(format!(
                    "process {} went over its timing budget ({} report(s) during the trial)",
                    p.name,
                    p.over_budget - over
                ));
            }
        }
        if let Some(p) = procs.iter().find(|p| !p.ready) {
            self.healthy_since = None;
            if elapsed >= self.window {
                return HealthVerdict::Rollback(format!(
                    "process {} not ready {:?} into the trial",
                    p.name, self.window
                ));
            }
            return HealthVerdict::Wait;
        }
        let since = *self.healthy_since.get_or_insert(elapsed);
        if elapsed.saturating_sub(since) >= self.window {
            HealthVerdict::Commit
        } else {
            HealthVerdict::Wait
        }
    }
}

/// How a watched trial ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrialOutcome {
    Committed(String),
    RolledBack { rollback: Rollback, reason: String },
}

/// Watches the trial in `state.json` until it commits or rolls back:
/// every `interval` it asks `probe` for the processes' health and applies
/// [`TrialHealth`]'s verdict with [`commit`] or [`rollback`].
pub fn watch_trial(
    prefix: &Path,
    window: Duration,
    keep: u32,
    interval: Duration,
    mut probe: impl FnMut() -> Vec<ProcessHealth>,
) -> Result<TrialOutcome, ReleaseError> {
    let mut health = TrialHealth::new(window);
    let start = Instant::now();
    loop {
        match health.observe(start.elapsed(), &probe()) {
            HealthVerdict::Wait => std::thread::sleep(interval),
            HealthVerdict::Commit => return commit(prefix, keep).map(TrialOutcome::Committed),
            HealthVerdict::Rollback(reason) => {
                return rollback(prefix)
                    .map(|rollback| TrialOutcome::RolledBack { rollback, reason })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(name: &str, running: bool, ready: bool, over_budget: u64, restarts: u32) -> ProcessHealth {
        ProcessHealth {
            name: name.into(),
            running,
            ready,
            over_budget,
            restarts,
        }
    }
    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn health_commits_after_a_full_healthy_window() {
        let mut h = TrialHealth::new(S(10));
        assert_eq!(
            h.observe(S(0), &[p("a", true, false, 0, 0)]),
            HealthVerdict::Wait
        );
        assert_eq!(
            h.observe(S(3), &[p("a", true, true, 0, 0)]),
            HealthVerdict::Wait
        );
        assert_eq!(
            h.observe(S(12), &[p("a", true, true, 0, 0)]),
            HealthVerdict::Wait
        );
        assert_eq!(
            h.observe(S(13), &[p("a", true, true, 0, 0)]),
            HealthVerdict::Commit
        );
    }

    #[test]
    fn health_rolls_back_on_crash_restart_budget_or_never_ready() {
        let mut h = TrialHealth::new(S(10));
        assert!(
            matches!(h.observe(S(1), &[p("a", false, false, 0, 0)]), HealthVerdict::Rollback(r) if r.contains("a is not running"))
        );
        let mut h = TrialHealth::new(S(10));
        assert_eq!(
            h.observe(S(0), &[p("a", true, true, 0, 2)]),
            HealthVerdict::Wait
        );
        assert!(
            matches!(h.observe(S(1), &[p("a", true, true, 0, 3)]), HealthVerdict::Rollback(r) if r.contains("restarted"))
        );
        let mut h = TrialHealth::new(S(10));
        assert_eq!(
            h.observe(S(0), &[p("a", true, true, 4, 0)]),
            HealthVerdict::Wait
        );
        assert!(
            matches!(h.observe(S(1), &[p("a", true, true, 5, 0)]), HealthVerdict::Rollback(r) if r.contains("budget"))
        );
        let mut h = TrialHealth::new(S(10));
        assert_eq!(
            h.observe(S(9), &[p("a", true, true, 0, 0), p("b", true, false, 0, 0)]),
            HealthVerdict::Wait
        );
        assert!(
            matches!(h.observe(S(10), &[p("a", true, true, 0, 0), p("b", true, false, 0, 0)]), HealthVerdict::Rollback(r) if r.contains("b not ready"))
        );
    }

    #[test]
    fn health_streak_restarts_when_a_process_stops_being_ready() {
        let mut h = TrialHealth::new(S(10));
        assert_eq!(
            h.observe(S(0), &[p("a", true, true, 0, 0)]),
            HealthVerdict::Wait
        );
        assert_eq!(
            h.observe(S(5), &[p("a", true, false, 0, 0)]),
            HealthVerdict::Wait
        );
        assert_eq!(
            h.observe(S(6), &[p("a", true, true, 0, 0)]),
            HealthVerdict::Wait
        );
        assert_eq!(
            h.observe(S(15), &[p("a", true, true, 0, 0)]),
            HealthVerdict::Wait
        );
        assert_eq!(
            h.observe(S(16), &[p("a", true, true, 0, 0)]),
            HealthVerdict::Commit
        );
    }
}
