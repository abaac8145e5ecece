//! Why was it late: a kernel trace around every budget miss, analysed
//! into a sentence.
//!
//! While the check runs with tracing, an ftrace instance of our own
//! ([`tracefs::Tracer`]) records the scheduler, interrupt, hrtimer and
//! io_uring events of the sender's and receiver's CPUs in overwrite mode,
//! and the two real-time workers write markers to its `trace_marker`
//! (`rtdeploy send seq=N t=NS` before each publish, `rtdeploy handler
//! seq=N t=NS` at each handler start; the wake itself is the kernel's
//! `sched_wakeup` of the receiver; without tracing they hold no marker
//! file and write nothing). A message over its budget makes the receiver turn the
//! instance off at once (as cyclictest's `-b` does); the engine then
//! copies the CPUs' buffers ([`snapshot::Snapshot`]), analyses the window
//! from the send to the handler ([`analyse::analyse`]: what ran on the
//! receiver's CPU with priorities and times, woken late or ran late, PI
//! boosts, a one-line verdict), saves the raw text and a trace-event JSON
//! ([`chrome`]) and turns the instance on again.
//!
//! Layers: [`model`] parses the kernel's text and [`analyse`] decides
//! (pure, tested on recorded text); [`tracefs`] is the only I/O on the
//! live system; [`snapshot`] reads and writes saved traces. Every byte
//! read from tracefs or a saved file is treated as hostile: bounded
//! reads, lines that do not parse are counted and skipped.

pub mod analyse;
pub mod chrome;
pub mod model;
pub(crate) mod run;
pub mod snapshot;
pub mod tracefs;
pub mod watch;

pub use analyse::{analyse, Analysis, MissContext};
pub use snapshot::{load, Snapshot, TraceLoadError};
pub use tracefs::{TraceSetupError, Tracer};
