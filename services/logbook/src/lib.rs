//! Record and replay: the supervisor's logger writes the recorded channels,
//! the processes' timing reports and the supervisor's events to MCAP files
//! ([`recorder`]); [`read`] reads them back (also files cut short by a power
//! cut, and files other MCAP writers made), exports a window or a subset
//! ([`read::export`]), and [`replay`] publishes recorded messages onto
//! channels at their recorded spacing.
//!
//! The section of robot.yaml it owns is `log:` ([`section`]); message types
//! declared there become `ros2msg` schemas with `cdr` messages
//! ([`schema`]).

pub mod diff;
pub mod file;
pub mod read;
pub mod recorder;
pub mod replay;
pub mod schema;
pub mod section;
pub mod sim;

pub use recorder::{EventSink, LogStatus, Recorder, RecorderConfig};
pub use section::LogSection;
