//! Timers and phased loops: absolute `CLOCK_MONOTONIC` deadlines that end
//! the loop's sleep (every backend sleeps with its next deadline as the
//! wait's own timeout, never an io_uring timeout request: see
//! [`crate::wake`]), the handles that disable or reschedule them, and the
//! loop's own timers (timing reports, the wake check).

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use crate::time::Monotonic;
use crate::timing_report::EntryStats;

use super::{Ctx, EventLoop};

pub(super) type TimerFn = Box<dyn FnMut(&mut Ctx)>;

pub(super) struct Timer {
    pub(super) name: String,
    pub(super) deadline: u64,
    pub(super) period: u64,
    pub(super) handler: Option<TimerFn>,
    /// Counted in the next sleep's deadline.
    pub(super) armed: bool,
    pub(super) due: bool,
    pub(super) active: bool,
    /// Periods skipped before the next run (told to the handler).
    pub(super) missed: u64,
    control: Rc<Cell<TimerCommand>>,
    pub(super) stats: EntryStats,
    pub(super) total: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimerCommand {
    None,
    Disable,
    Schedule { deadline: u64, period: u64 },
}

/// A timer of a loop: disable it or reschedule it, from its own handler,
/// another handler or the code that set up the loop (not `Send`: the loop
/// lives on one thread). The change applies before the loop next waits.
#[derive(Clone)]
pub struct TimerHandle {
    control: Rc<Cell<TimerCommand>>,
}

impl TimerHandle {
    /// Stops the timer: no more firings until it is scheduled again.
    pub fn disable(&self) {
        self.control.set(TimerCommand::Disable);
    }

    /// Next due at `deadline`, then every `period` if given.
    pub fn schedule(&self, deadline: Monotonic, period: Option<Duration>) {
        self.control.set(TimerCommand::Schedule {
            deadline: deadline.as_nanos(),
            period: period.map_or(0, |p| p.as_nanos().clamp(1, u64::MAX as u128) as u64),
        });
    }
}

/// A loop's timers: the user's, and the loop's own.
#[derive(Default)]
pub(super) struct Timers {
    pub(super) list: Vec<Timer>,
    /// The loop's timing report timer, if it publishes reports.
    pub(super) report: Option<usize>,
    /// The loop's wake check timer, once it runs with one.
    pub(super) wake_check: Option<usize>,
}

impl Timers {
    pub(super) fn len(&self) -> usize {
        self.list.len()
    }

    pub(super) fn push(
        &mut self,
        name: String,
        deadline: u64,
        period: u64,
        handler: Option<TimerFn>,
    ) -> usize {
        self.list.push(Timer {
            name,
            deadline,
            period,
            handler,
            armed: false,
            due: false,
            active: true,
            missed: 0,
            control: Rc::new(Cell::new(TimerCommand::None)),
            stats: EntryStats::default(),
            total: 0,
        });
        self.list.len() - 1
    }

    fn handle(&self, i: usize) -> TimerHandle {
        TimerHandle {
            control: self.list[i].control.clone(),
        }
    }

    /// Whether timer `i` is the loop's own (reports, wake check), not a
    /// user's.
    pub(super) fn internal(&self, i: usize) -> bool {
        self.report == Some(i) || self.wake_check == Some(i)
    }

    /// Applies what timer handles asked for since the last look (the next
    /// sleep's deadline follows).
    pub(super) fn apply_commands(&mut self) {
        for i in 0..self.list.len() {
            let cmd = self.list[i].control.replace(TimerCommand::None);
            if cmd == TimerCommand::None {
                continue;
            }
            let t = &mut self.list[i];
            t.armed = false;
            t.due = false;
            t.missed = 0;
            match cmd {
                TimerCommand::Disable => t.active = false,
                TimerCommand::Schedule { deadline, period } => {
                    t.active = true;
                    t.deadline = deadline;
                    t.period = period;
                }
                TimerCommand::None => {}
            }
            self.arm(i);
        }
    }

    /// Counts timer `i` in the next sleep's deadline, on every backend:
    /// the deadline is the sleep's own timeout, never an io_uring timeout
    /// request, whose expiry would add task_work to the ring from
    /// `ktimers/N` (see [`crate::wake`]).
    pub(super) fn arm(&mut self, i: usize) {
        let t = &mut self.list[i];
        if !(t.armed || t.due || !t.active) {
            t.armed = true;
        }
    }

    /// The earliest deadline of the armed timers.
    pub(super) fn next_deadline(&self) -> Option<u64> {
        self.list
            .iter()
            .filter(|t| t.armed)
            .map(|t| t.deadline)
            .min()
    }

    /// Marks every armed timer whose deadline is at or before `now` as due.
    pub(super) fn expire(&mut self, now: u64) {
        for t in &mut self.list {
            if t.armed && t.deadline <= now {
                t.armed = false;
                t.due = true;
            }
        }
    }

    /// Whether a timer other than the wake check is armed (the wake check
    /// alone keeps no loop alive).
    pub(super) fn any_armed_but_wake_check(&self) -> bool {
        self.list
            .iter()
            .enumerate()
            .any(|(i, t)| t.armed && self.wake_check != Some(i))
    }
}

impl EventLoop {
    /// A timer first due at `first_deadline`, then every `period` if given.
    /// The handle disables or reschedules it.
    pub fn add_timer(
        &mut self,
        name: &str,
        first_deadline: Monotonic,
        period: Option<Duration>,
        handler: impl FnMut(&mut Ctx) + 'static,
    ) -> TimerHandle {
        let period = period.map_or(0, |p| p.as_nanos().max(1) as u64);
        let i = self.timers.push(
            name.into(),
            first_deadline.as_nanos(),
            period,
            Some(Box::new(handler)),
        );
        self.timers.handle(i)
    }

    /// A phased loop: due at every `k * period + offset` on the loop's
    /// clock (CLOCK_MONOTONIC, or its simulation's virtual time),
    /// starting with the next such instant. A late loop skips the cycles
    /// whose deadlines passed and tells the handler how many
    /// ([`Ctx::missed_cycles`]).
    pub fn add_phased_loop(
        &mut self,
        name: &str,
        period: Duration,
        offset: Duration,
        handler: impl FnMut(&mut Ctx) + 'static,
    ) -> TimerHandle {
        let p = period.as_nanos().max(1) as u64;
        let off = offset.as_nanos() as u64 % p;
        let now = self.clock.now_ns();
        let k = now.saturating_sub(off) / p + 1;
        let i = self
            .timers
            .push(name.into(), k * p + off, p, Some(Box::new(handler)));
        self.timers.handle(i)
    }
}
