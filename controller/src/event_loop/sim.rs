//! The simulated loop's side of a simulation ([`crate::sim`]): a loop on
//! a virtual clock never sleeps. Its simulation asks it when its next
//! event is due ([`EventLoop::sim_next_event`]) and gives it turns at
//! that virtual time ([`EventLoop::sim_turn`]); in a turn the loop looks
//! at every watched channel itself, so no wake is ever armed or made: its
//! subscribers count no waiter, and publishers of a simulation skip the
//! wake as they do for any channel nobody sleeps on.
//!
//! Everything else is the real loop's code: dispatch in event-time order,
//! timers and phased loops, typed senders and fetchers, `Ctx`, timing
//! reports, all on the loop's [`crate::time::Clock`].

use super::wait::{Sleep, Wait};
use super::{Backend, EventLoop, EventLoopRunError};

/// The wait "loop" of a simulated loop.
#[derive(Default)]
pub(super) struct SimWait;

impl Wait for SimWait {
    fn backend(&self) -> Backend {
        Backend::Simulated
    }

    fn prepare(&mut self, _: &mut Sleep) -> Result<(), EventLoopRunError> {
        Ok(())
    }

    /// Nothing to arm: a watcher with data is ready, one without waits
    /// for the next turn's look (it is never counted as a waiter).
    fn arm(&mut self, s: &mut Sleep, i: usize) -> Result<(), EventLoopRunError> {
        let w = &mut s.watchers[i];
        if w.sub.has_new() {
            w.ready = true;
            w.woken = true;
        }
        Ok(())
    }

    fn sleep(&mut self, _: &mut Sleep, _: Option<u64>) -> Result<(), EventLoopRunError> {
        // EventLoop::run refuses a simulated loop before it would sleep.
        Err(EventLoopRunError::Simulated)
    }
}

/// How a simulated loop's turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEnd {
    /// It handled what was due and waits for its next event.
    Waiting,
    /// A handler called [`super::Ctx::exit`].
    Exited,
    /// Nothing is left to wait for (no watcher, no timer armed).
    Done,
}

impl EventLoop {
    /// When this simulated loop next has something to do, on its clock: now
    /// when it has not started yet, a watched channel holds a message it
    /// has not handled or a timer is due; else its earliest timer
    /// deadline; `None` when nothing is armed. Applies the timer handles'
    /// commands first, as a turn would.
    pub(crate) fn sim_next_event(&mut self) -> Option<u64> {
        let now = self.clock.now_ns();
        if !self.started {
            return Some(now);
        }
        self.timers.apply_commands();
        let message = self
            .watchers
            .iter()
            .any(|w| w.failed.is_none() && (w.ready || w.staged.is_some() || w.sub.has_new()));
        if message || self.timers.list.iter().any(|t| t.due) {
            return Some(now);
        }
        self.timers.next_deadline().map(|d| d.max(now))
    }

    /// One turn of a simulated loop at its clock's time: the first one
    /// starts it (its waits, timers and [`EventLoop::on_run`] hooks), then
    /// each marks the timers whose deadline has come due and the watched
    /// channels with messages ready, and handles everything ready in
    /// event-time order, as the real loop does after a sleep.
    pub(crate) fn sim_turn(&mut self) -> Result<TurnEnd, EventLoopRunError> {
        if self.backend() != Backend::Simulated {
            return Err(EventLoopRunError::NotSimulated);
        }
        if !self.started {
            self.exit = false;
            self.start()?;
        }
        let now = self.clock.now_ns();
        self.timers.apply_commands();
        self.timers.expire(now);
        for w in &mut self.watchers {
            if w.failed.is_none() && !w.ready && w.staged.is_none() && w.sub.has_new() {
                w.ready = true;
                w.woken = true;
            }
        }
        self.slept_until_ns = now;
        self.dispatch()?;
        if self.exit {
            return Ok(TurnEnd::Exited);
        }
        let waiting = self.watchers.iter().any(|w| w.failed.is_none())
            || self.timers.any_armed_but_wake_check();
        if waiting {
            return Ok(TurnEnd::Waiting);
        }
        if let Some(w) = self.watchers.iter().find(|w| w.failed.is_some()) {
            return Err(EventLoopRunError::ChannelFailed {
                channel: w.name.clone(),
                fault: w.failed.expect("found by failed"),
            });
        }
        Ok(TurnEnd::Done)
    }
}
