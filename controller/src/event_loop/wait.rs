//! The one interface the loop sleeps through, whichever backend it runs
//! on: a wait loop arms a watcher's wait, sleeps until a wake or the next
//! deadline, and marks what it found (watchers ready, timers due). The
//! loop itself never asks which backend it has; each backend is a module
//! of its own (`uring`, `waitv`, `bell`).

use std::path::Path;

use crate::wake::WakeClass;

use super::timer::Timers;
use super::watch::Watcher;
use super::{Backend, EventLoopRunError};

/// The parts of a loop a wait loop works on.
pub(super) struct Sleep<'a> {
    pub(super) watchers: &'a mut [Watcher],
    pub(super) timers: &'a mut Timers,
    /// Whose words the loop's waits arm ([`crate::wake`]).
    pub(super) class: WakeClass,
    pub(super) proc_root: &'a Path,
    /// Test instrumentation: called just before a wait is handed to the
    /// kernel.
    pub(super) before_arm: &'a mut Option<Box<dyn FnMut()>>,
    /// When the last sleep ended (`CLOCK_MONOTONIC` ns; see `healed` in
    /// the loop's dispatch).
    pub(super) slept_until_ns: &'a mut u64,
}

/// How a backend sleeps.
pub(super) trait Wait {
    fn backend(&self) -> Backend;

    /// Before a run's first sleep: what the backend needs set up (its
    /// ring, its bell and the bell's listings).
    fn prepare(&mut self, s: &mut Sleep) -> Result<(), EventLoopRunError>;

    /// Arms the wait of watcher `i`, which has no data known, no wait
    /// armed and no failure ([`arm_watcher`] checks), or marks it ready
    /// when its data is already there.
    fn arm(&mut self, s: &mut Sleep, i: usize) -> Result<(), EventLoopRunError>;

    /// One sleep, until a wake or the absolute `CLOCK_MONOTONIC`
    /// `deadline`: then marks the watchers with data ready and the timers
    /// whose deadline passed due.
    fn sleep(&mut self, s: &mut Sleep, deadline: Option<u64>) -> Result<(), EventLoopRunError>;
}

/// The wait loop of `backend`.
pub(super) fn for_backend(backend: Backend) -> Box<dyn Wait> {
    match backend {
        Backend::IoUringFutex => Box::new(super::uring::UringWait::default()),
        Backend::FutexWaitv => Box::new(super::waitv::WaitvWait::default()),
        Backend::Doorbell => Box::new(super::bell::BellWait::default()),
        Backend::Simulated => Box::new(super::sim::SimWait),
    }
}

/// Arms watcher `i`'s wait, or marks it ready when data is already there;
/// nothing for a watcher armed, ready or failed.
pub(super) fn arm_watcher(
    wait: &mut dyn Wait,
    s: &mut Sleep,
    i: usize,
) -> Result<(), EventLoopRunError> {
    let w = &s.watchers[i];
    if w.armed || w.ready || w.failed.is_some() {
        return Ok(());
    }
    wait.arm(s, i)
}
