//! Microbenchmarks of the runtime: one-way wake latency between two
//! processes for each wake mechanism side by side, the cost of a publish,
//! and publish throughput. `deploy bench wake|publish|throughput` prints
//! these.
//!
//! The wake benchmark forks one sender process per mechanism (the fork
//! happens before any allocation the child needs; the child only sleeps,
//! reads the clock, writes shared memory and issues the wake syscall, then
//! `_exit`s). The sender stamps `CLOCK_MONOTONIC` every period and wakes
//! the receiver, which sleeps in the mechanism under test and reads the
//! clock when it wakes. Both run with the same settings, reported with the
//! results: SCHED_FIFO where permitted, pinned CPUs, `/dev/cpu_dma_latency`
//! held at 0.
//!
//! One module per benchmark: `wake`, `publish` (with `copy_loan`) and
//! `throughput`; this one holds what they share (errors, the scheduling
//! and CPU settings, the temporary directory).
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::fmt::Write as _;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::futex;
use crate::monotonic_ns;
use crate::notify::{Notifier, Waiter};
use crate::tempdir::TempDir;
use controller::channel::{
    Channel, ChannelAttachError, ChannelCreateError, ChannelGeometry, PublishError,
};
use controller::event_loop::{
    probe, Backend, EventLoop, EventLoopCreateError, EventLoopRunError, LoopOptions,
};
use controller::rt::{self, DmaLatencyHold};
use controller::time::{sleep_until, Monotonic};
use units::cpu::CpuSet;
use units::error::Chain;
use units::sched::{self, Policy, SchedAttr};

/// The wake mechanisms [`wake`] measures: the check's, one enum with one
/// name each on the command line and in JSON.
pub use crate::Mechanism;

mod bridge;
mod copy_loan;
mod fanout;
mod publish;
mod throughput;
mod wake;

pub use copy_loan::*;
pub use fanout::*;
pub use publish::*;
pub use throughput::*;
pub use wake::*;

/// A benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchRunError {
    #[error("cannot create a benchmark directory under {dir}")]
    Dir { dir: PathBuf, source: io::Error },
    #[error("cannot create the benchmark channel in {dir}")]
    ChannelCreate {
        dir: PathBuf,
        source: ChannelCreateError,
    },
    #[error("cannot attach to the benchmark channel in {dir}")]
    ChannelAttach {
        dir: PathBuf,
        source: ChannelAttachError,
    },
    #[error("{what} failed")]
    Sys {
        what: &'static str,
        source: io::Error,
    },
    #[error("cannot create the benchmark's event loop")]
    LoopCreate(#[source] EventLoopCreateError),
    #[error("the benchmark's event loop cannot watch its channel")]
    LoopWatch(#[source] controller::event_loop::LoopChannelError),
    #[error("the benchmark's event loop failed")]
    LoopRun(#[source] EventLoopRunError),
    #[error("{what} of a {bytes}-byte message failed")]
    Publish {
        what: &'static str,
        bytes: usize,
        source: PublishError,
    },
    #[error("the sender process for {mechanism} failed (status {status})")]
    Child {
        mechanism: &'static str,
        status: i32,
    },
    /// The C++ receiver of `bench wake` (`--cpp-receiver`) could not be
    /// run, or said something else than its protocol.
    #[error("the C++ receiver {path}: {why}")]
    Receiver { path: PathBuf, why: String },
}

fn sys_err_from(what: &'static str, source: io::Error) -> BenchRunError {
    BenchRunError::Sys { what, source }
}

fn sys_err(what: &'static str) -> BenchRunError {
    BenchRunError::Sys {
        what,
        source: io::Error::last_os_error(),
    }
}

/// Holds `path` (normally `/dev/cpu_dma_latency`) at 0 for a run, and
/// says what was in force: `held at 0us`, or `not held: <why>`.
fn hold_dma_latency(path: &Path) -> (Option<DmaLatencyHold>, String) {
    match DmaLatencyHold::hold(path, 0) {
        Ok(h) => (Some(h), "held at 0us".into()),
        Err(e) => (None, format!("not held: {}", Chain(&e))),
    }
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is valid and writable.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The receiver thread's scheduling state before the benchmark, restored
/// after.
struct SchedRestore(Option<rt::SchedState>);

impl Drop for SchedRestore {
    fn drop(&mut self) {
        if let Some(s) = &self.0 {
            let policy = s.policy.unwrap_or(Policy::Other);
            let _ = sched::set_attr(0, &SchedAttr::new(policy, s.priority));
            let _ = sched::set_affinity(0, &s.cpus);
        }
    }
}

/// Pins the calling thread to CPU `cpu`; whether it worked.
fn pin_to(cpu: usize) -> bool {
    CpuSet::from_indices([cpu]).is_ok_and(|set| sched::set_affinity(0, &set).is_ok())
}

/// The calling thread under SCHED_FIFO at `priority`.
fn set_fifo(priority: u32) -> Result<(), sched::SchedSetError> {
    sched::set_attr(0, &SchedAttr::new(Policy::Fifo, priority))
}

/// A fresh directory under `base` for a benchmark's channel files,
/// removed with them when the benchmark ends.
fn bench_dir(base: &Path) -> Result<TempDir, BenchRunError> {
    TempDir::unique(base, "bench").map_err(|source| BenchRunError::Dir {
        dir: base.into(),
        source,
    })
}
