//! The real-time runtime of rtdeploy controllers.
//!
//! A controller process is written against this crate: shared-memory
//! publish/subscribe channels, an event loop that keeps one io_uring futex
//! wait armed per watched channel (or, on kernels without io_uring futex
//! waits, one `futex_waitv` or one [`doorbell`] futex per sleep), timers
//! and phased loops on absolute `CLOCK_MONOTONIC` deadlines, real-time
//! process setup, timing reports, what a kernel version offers the
//! runtime ([`kernel`]), and the `channels:` section of robot.yaml
//! ([`config`]).
//!
//! Design rules:
//! - the publish and handle paths never allocate, never panic and never take
//!   a lock a lower-priority task could hold;
//! - every path to the live system (`/dev/shm`, `/proc`) is a parameter;
//! - `unsafe` lives only in the modules that map shared memory or issue
//!   syscalls, each block with its `SAFETY:` argument;
//! - an error says what failed and keeps the underlying error as its
//!   `source()` without repeating it ([`units::error::Chain`] prints the chain);
//! - no check engine, benchmark, serde_json or comparison wake mechanism
//!   here (they live in the `check` crate, with the `check:` and
//!   `boot_check:` sections): a controller links this (and `units`) alone;
//! - what other crates share with the runtime is `units`', not ours:
//!   durations, CPU sets, kernel versions, the scheduling calls, the wake
//!   class and the process environment ([`units::env::ProcessEnv`], which
//!   [`event_loop::LoopOptions::from_env`] reads). The runtime re-exports
//!   only the types its own signatures take ([`WakeClass`],
//!   [`rt::Policy`]), and no crate of ours borrows a type from it that is
//!   not the runtime's;
//! - test instrumentation (publish fault steps, abandoned publishers, the
//!   test kernel profiles) exists only with the `fault-injection` feature.

pub mod channel;
pub mod config;
pub mod doorbell;
pub mod event_loop;
pub mod kernel;
pub mod miss_trace;
pub mod rt;
pub mod seccomp;
pub mod shm;
pub mod sys;
pub mod time;
pub mod timing_report;
pub mod wake;

pub use channel::{Channel, ChannelGeometry, Message, Publisher, SlotView, Subscriber};
pub use shm::ShmSafe;
pub use time::Monotonic;
pub use wake::WakeClass;
