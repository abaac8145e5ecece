//! The real-time runtime of rtdeploy controllers.
//!
//! A controller process is written against this crate: shared-memory
//! publish/subscribe channels, an event loop that keeps one io_uring futex
//! wait armed per watched channel (or, on kernels without io_uring futex
//! waits, one `futex_waitv` or one doorbell futex per sleep), timers
//! and phased loops on absolute `CLOCK_MONOTONIC` deadlines, real-time
//! process setup, timing reports, what a kernel version offers the
//! runtime ([`kernel`]), and the `channels:` section of robot.yaml
//! ([`config`]).
//!
//! # Layers
//!
//! From the memory up, each layer using only those below it:
//!
//! 1. [`shm`] (mappings that survive truncation, [`ShmSafe`] and
//!    [`shm_struct!`] for what is placed in shared memory) and the
//!    private `sys` (the syscalls the runtime issues itself);
//! 2. [`channel`]: the file layout, the file's life and recovery, the
//!    queue algorithm (publish, read) and the waking a publish ends with,
//!    each a module of its own; [`wake`] says which kernel objects each
//!    wake class may touch, the private `doorbell` is the bell table the
//!    doorbell backend sleeps on;
//! 3. [`event_loop`]: the probe and the three wait loops behind one
//!    interface, timers, watchers, senders and the loop's timing report,
//!    whose counts are the channel layer's own;
//! 4. around them: [`rt`] (real-time process setup), [`time`],
//!    [`timing_report`], [`miss_trace`], [`kernel`], [`config`].
//!
//! # What is public
//!
//! The crate root exports what a controller author uses: [`EventLoop`],
//! [`LoopOptions`], [`Ctx`], [`TypedSender`], [`TypedFetcher`] and the
//! errors of their calls, [`shm_struct!`] and [`ShmSafe`], [`Channel`]
//! with what its constructors take and give, [`Publisher`] and
//! [`Subscriber`] for tools on the byte API, [`WakeClass`], [`Monotonic`]
//! and the [`Clock`] a loop reads ([`VirtualClock`] in simulation, with
//! [`sim::Sim`] giving the loops their turns), and the timing report a
//! controller reads ([`TimingReport`]). The
//! modules above stay public for tools, the supervisor and the check
//! engine. The syscall wrappers (`sys`), the doorbell table (`doorbell`)
//! and the seccomp filter (`seccomp`) are private: what a supervisor
//! needs of the filter is [`supervise`], one narrow module; the check
//! engine's comparison mechanisms issue their own futex calls, and read
//! the clock and the kernel release through [`Monotonic::now`] and
//! [`kernel::release`].
//!
//! # Design rules
//!
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
//!   [`LoopOptions::from_env`] reads). The runtime re-exports
//!   only the types its own signatures take ([`WakeClass`],
//!   [`rt::Policy`]), and no crate of ours borrows a type from it that is
//!   not the runtime's;
//! - test instrumentation (publish fault steps, abandoned publishers, the
//!   test kernel profiles) exists only with the `fault-injection` feature.

pub mod channel;
pub mod config;
mod doorbell;
pub mod event_loop;
pub mod kernel;
pub mod miss_trace;
pub mod rt;
mod seccomp;
pub mod shm;
pub mod sim;
mod sys;
pub mod time;
pub mod timing_report;
pub mod wake;

/// What a supervisor calls that a controller does not: the seccomp filter
/// that makes a process see an older kernel (its io_uring or
/// `futex_waitv` calls answer `ENOSYS`, so the probe picks the backend it
/// would pick there), parsed from `RTDEPLOY_DENY_SYSCALLS` and installed
/// between `fork` and `exec`. A way to test behaviour, not a security
/// boundary.
pub mod supervise {
    pub use crate::seccomp::{
        parse_list as parse_deny_list, Deniable, DenyFilter, UnknownDeniable,
    };
}

pub use channel::{
    ByteLoan, Channel, ChannelAttachError, ChannelCreateError, ChannelFault, ChannelGeometry,
    ChannelOpenError, CreateOutcome, FrameLoan, Held, HoldError, Message, PublishError, Published,
    Publisher, SlotView, Subscriber,
};
pub use event_loop::{
    Backend, Ctx, EventLoop, EventLoopCreateError, EventLoopRunError, FetchError, FrameSender,
    LoopChannelError, LoopOptions, TimerHandle, TypedFetcher, TypedSender,
};
pub use shm::ShmSafe;
pub use time::{Clock, Monotonic, VirtualClock};
pub use timing_report::{EntryKind, EntryReport, TimingReport};
pub use wake::WakeClass;
