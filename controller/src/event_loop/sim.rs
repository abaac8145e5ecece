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

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};

use units::sim_link::{FromLoop, ToLoop, FRAME, VERSION};

use super::wait::{Sleep, Wait};
use super::{Backend, EventLoop, EventLoopCreateError, EventLoopRunError};
use crate::time::Monotonic;

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

/// How a simulated loop's turn ended (the coordinator's wire says the
/// same).
pub use units::sim_link::TurnEnd;

/// Whether this process's simulation link has been taken by a loop.
static LINK_TAKEN: AtomicBool = AtomicBool::new(false);

/// Takes the link to the coordinator named in the environment: once per
/// process (a second loop would answer turns the coordinator gives the
/// first).
pub(super) fn take_link(fd: i32) -> Result<OwnedFd, EventLoopCreateError> {
    let err = |reason: String| EventLoopCreateError::SimLink { fd, reason };
    if LINK_TAKEN.swap(true, Ordering::AcqRel) {
        return Err(err(
            "another event loop of this process has it: deploy sim runs one loop per process"
                .into(),
        ));
    }
    crate::sys::adopt_seqpacket(fd).map_err(|e| {
        // Not taken: nothing was adopted.
        LINK_TAKEN.store(false, Ordering::Release);
        err(e.to_string())
    })
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

    /// Messages this loop has published since it started: its senders'
    /// and its timing reports.
    fn published_total(&self) -> u64 {
        let sent: u64 = self.senders.iter().map(|s| s.counts().published).sum();
        sent.saturating_add(self.reports_published())
    }

    /// Runs this simulated loop under `deploy sim`: says hello, then takes
    /// each turn the coordinator gives at the virtual time it names, and
    /// answers how the turn ended, when the loop next has something to do
    /// and what it has published. Returns when the coordinator stops the
    /// run or the loop has ended. A coordinator that goes away or sends a
    /// frame that is not one ends the run with an error naming it; the
    /// loop never waits for anything but the coordinator's next frame.
    pub(super) fn follow(&mut self, link: OwnedFd) -> Result<(), EventLoopRunError> {
        let lost = |what: String| EventLoopRunError::SimLink(what);
        let send = |frame: [u8; FRAME]| match crate::sys::packet_send(&link, &frame) {
            Ok(FRAME) => Ok(()),
            Ok(n) => Err(lost(format!("a frame went out as {n} bytes"))),
            Err(e) => Err(lost(format!("cannot send: {e}"))),
        };
        send(FromLoop::Hello { version: VERSION }.encode())?;
        let mut buf = [0u8; 2 * FRAME];
        loop {
            let n = crate::sys::packet_recv(&link, &mut buf)
                .map_err(|e| lost(format!("cannot receive: {e}")))?;
            if n == 0 {
                return Err(lost("the coordinator closed it".into()));
            }
            let now_ns = match ToLoop::decode(&buf[..n]) {
                Ok(ToLoop::Stop) => return Ok(()),
                Ok(ToLoop::Turn { now_ns }) => now_ns,
                Err(e) => return Err(lost(format!("a frame that is not one: {e}"))),
            };
            let clock = self
                .clock
                .virtual_clock()
                .ok_or(EventLoopRunError::NotSimulated)?;
            if now_ns < clock.now().as_nanos() {
                return Err(lost(format!(
                    "a turn at {} after one at {}: the virtual time went back",
                    Monotonic::from_nanos(now_ns),
                    clock.now()
                )));
            }
            clock.advance_to(Monotonic::from_nanos(now_ns));
            let cpu = crate::sys::thread_cpu_ns();
            let end = self.sim_turn()?;
            let cpu_ns = crate::sys::thread_cpu_ns().saturating_sub(cpu);
            let next_ns = match end {
                TurnEnd::Waiting => self.sim_next_event(),
                TurnEnd::Exited | TurnEnd::Done => None,
            };
            send(
                FromLoop::Turned {
                    end,
                    next_ns,
                    published: self.published_total(),
                    cpu_ns,
                }
                .encode(),
            )?;
            if end != TurnEnd::Waiting {
                return Ok(());
            }
        }
    }
}
