//! What a handler knows about the event it handles.

use std::time::Duration;

use crate::time::Monotonic;

/// What a handler knows about the event it handles.
///
/// One accessor per fact, typed: instants are [`Monotonic`] and lengths
/// are [`Duration`], as everywhere in the runtime's API, so that a send
/// time is not taken for a latency, a period or a wall-clock time. Both
/// hold the same nanosecond count the loop measured, so the typed value
/// costs nothing: a handler that feeds a histogram takes
/// [`Monotonic::as_nanos`] or [`Duration::as_nanos`] of it.
pub struct Ctx<'a> {
    pub(super) now: Monotonic,
    pub(super) event: Monotonic,
    pub(super) missed: u64,
    pub(super) lost: u64,
    pub(super) exit: &'a mut bool,
}

impl Ctx<'_> {
    /// `CLOCK_MONOTONIC` when the handler started.
    pub fn now(&self) -> Monotonic {
        self.now
    }
    /// The event's time: the message's send time or the timer's deadline.
    pub fn event_time(&self) -> Monotonic {
        self.event
    }
    /// Wakeup latency: event time to handler start.
    pub fn latency(&self) -> Duration {
        self.now.saturating_duration_since(self.event)
    }
    /// For a timer or phased loop: the periods skipped since its previous
    /// run because the loop was late (their deadlines passed unhandled);
    /// 0 for messages.
    pub fn missed_cycles(&self) -> u64 {
        self.missed
    }
    /// For a message: how many messages of its channel were overwritten
    /// before this loop read them, just before this one; 0 for timers.
    pub fn lost_before(&self) -> u64 {
        self.lost
    }
    /// Makes [`super::EventLoop::run`] return after this handler.
    pub fn exit(&mut self) {
        *self.exit = true;
    }
}
