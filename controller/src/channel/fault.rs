//! The publish path's one test hook: a publish that stops dead after one
//! of its steps ([`PublishStep`]), as a publisher killed there would, for
//! the crash-recovery tests (`Publisher::publish_stopping_after`).
//!
//! Every step of `Publisher::publish` that such a test may stop after
//! calls [`stop_after!`] with the publish's [`Stop`]. With the
//! `fault-injection` feature it returns from the publish when the stop is
//! at that step; without it [`Stop`] is empty and the macro expands to
//! nothing, so a release build's publish path has no trace of it.

#[cfg(feature = "fault-injection")]
use super::publish::PublishStep;

/// Where a publish stops: never, outside the tests.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stop(#[cfg(feature = "fault-injection")] Option<PublishStep>);

impl Stop {
    /// Every publish but a test's: run to the end.
    pub(super) const NEVER: Stop = Stop(
        #[cfg(feature = "fault-injection")]
        None,
    );

    /// Stops after `step`.
    #[cfg(feature = "fault-injection")]
    pub(super) fn after(step: PublishStep) -> Stop {
        Stop(Some(step))
    }

    /// Whether the publish stops after `step`.
    #[cfg(feature = "fault-injection")]
    #[inline(always)]
    pub(super) fn is(self, step: PublishStep) -> bool {
        self.0 == Some(step)
    }
}

/// `stop_after!(stop, Step, index, send_time_ns)`: returns
/// `Ok(Published { index, send_time_ns, woke: false })` from the publish
/// when `stop` is at `PublishStep::Step`.
#[cfg(feature = "fault-injection")]
macro_rules! stop_after {
    ($stop:expr, $step:ident, $index:expr, $time:expr) => {
        if $stop.is($crate::channel::PublishStep::$step) {
            return Ok($crate::channel::Published {
                index: $index,
                send_time_ns: $time,
                woke: false,
            });
        }
    };
}

/// Without the `fault-injection` feature: nothing ([`Stop`] is empty).
#[cfg(not(feature = "fault-injection"))]
macro_rules! stop_after {
    ($stop:expr, $step:ident, $index:expr, $time:expr) => {
        let _: $crate::channel::fault::Stop = $stop;
    };
}

pub(super) use stop_after;
