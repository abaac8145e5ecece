//! The check's worker processes. The engine starts the calling executable
//! with `__check-worker <role> key=value...`; the executable hands those
//! arguments to [`main`]. Roles:
//!
//! - `rt-send`: the real-time sender (SCHED_FIFO, pinned, memory locked),
//!   publishing every period and timing each publishing call;
//! - `rt-recv`: the real-time receiver, woken by the mechanism under test,
//!   timing each message from its send time to the handler start;
//! - `low`: a lower-priority process on the housekeeping CPUs, publishing
//!   every low-priority period and subscribing on the same channel;
//! - `burst`: a SCHED_FIFO thread below the real-time priority running
//!   busy bursts of random length;
//! - `hog`: a CPU hog at normal priority;
//! - `io`: a writer doing fsync'd writes in a directory;
//! - `hammer`: best-effort threads calling `FUTEX_WAKE` on the channel's
//!   best-effort word (the queue index) in a tight loop, the census's
//!   hammer on the word the one-word reference shares;
//! - `pi-hold` and `rt-pi`: the census's positive control, a best-effort
//!   process holding a priority-inheritance futex (`FUTEX_LOCK_PI`) that
//!   a real-time one then locks, which the kernel answers with a boost.
//!
//! Each names itself `rtd-<role>` (the census tells the robot's tasks and
//! their class by it: `rtd-rt-*` are the real-time ones).
//!
//! Workers stop when the engine raises their stop word in the shared
//! control file, and die with it (`PR_SET_PDEATHSIG`).
//!
//! One module per concern: `shared` (the control file), `deliver` (the
//! real-time pair and the lower-priority peers), `load` (the timer phase
//! and the loads), `pi` (the census's positive control); this one parses
//! the arguments and dispatches.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::hist::Histogram;
use crate::monotonic_ns;
use crate::notify::{AddressCell, Peers, Waiter};
use crate::{rt, Mechanism, MechanismUnavailableError};
use controller::channel::{Channel, ChannelAttachError, ChannelOpenError, Message};
use controller::event_loop::{
    self, Backend, EventLoop, EventLoopCreateError, EventLoopRunError, LoopOptions,
};
use controller::shm::{Mapping, ShmAtomic};
use controller::time::{sleep_until, Monotonic};
use units::cpu::{CpuSet, MAX_CPU};
use units::error::Chain;
use units::sched::{AffinitySetError, SchedSetError};

mod deliver;
mod load;
mod pi;
mod shared;

use deliver::*;
use load::*;
use pi::*;
pub use shared::*;

/// Why a worker role could not run (printed on its stderr, which the
/// engine puts in its report).
#[derive(Debug, thiserror::Error)]
pub enum WorkerRunError {
    #[error("argument `{arg}` is not key=value")]
    NotKeyValue { arg: String },
    #[error("missing argument {key}=")]
    Missing { key: &'static str },
    #[error("{key}={value} is not a number")]
    NotANumber { key: &'static str, value: String },
    #[error("{key}: `{value}` is not a CPU number")]
    NotACpu { key: &'static str, value: String },
    #[error("mech={value} is not a mechanism (expected one of {expected})")]
    NotAMechanism { value: String, expected: String },
    #[error("unknown role `{role}`")]
    UnknownRole { role: String },
    #[error("{key}={value} is out of range (at most {max})")]
    OutOfRange {
        key: &'static str,
        value: usize,
        max: usize,
    },
    #[error("mechanism {mechanism} cannot run here")]
    Unavailable {
        mechanism: Mechanism,
        #[source]
        reason: MechanismUnavailableError,
    },
    #[error("cannot open the check's shared file {path}")]
    Shared {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot join the cgroup of cpus {cpus}")]
    Cgroup {
        cpus: CpuSet,
        source: std::io::Error,
    },
    #[error("cannot pin to cpus {cpus} ({cgroup})")]
    Pin {
        cpus: CpuSet,
        cgroup: String,
        source: AffinitySetError,
    },
    #[error("cannot run SCHED_FIFO at priority {priority}")]
    Fifo {
        priority: u32,
        source: SchedSetError,
    },
    #[error("cannot open the check channel")]
    Channel(#[source] ChannelOpenError),
    #[error("cannot attach to the check channel")]
    Attach(#[source] ChannelAttachError),
    #[error("cannot start the {mechanism} receive loop")]
    Loop {
        mechanism: Mechanism,
        source: EventLoopCreateError,
    },
    #[error("cannot watch the check channel")]
    Watch(#[source] controller::event_loop::LoopChannelError),
    #[error("the {mechanism} receive loop failed")]
    LoopRun {
        mechanism: Mechanism,
        source: EventLoopRunError,
    },
    #[error("cannot create the {mechanism} waiter")]
    Waiter {
        mechanism: Mechanism,
        source: std::io::Error,
    },
    #[error("{mechanism} wait failed")]
    Wait {
        mechanism: Mechanism,
        source: std::io::Error,
    },
    #[error(
        "the {mechanism} receive loop returned before the run ended (its wait was not re-armed)"
    )]
    StoppedEarly { mechanism: Mechanism },
    #[error("cannot start the publisher thread")]
    Thread(#[source] std::io::Error),
    #[error("cannot {what} {path}")]
    File {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Whether the check can drive `m` on this kernel and in this build, and
/// why not.
pub fn mechanism_availability(m: Mechanism) -> Result<(), MechanismUnavailableError> {
    match m {
        // A plain futex wait and wake: every kernel the runtime supports.
        Mechanism::Futex | Mechanism::Doorbell => Ok(()),
        Mechanism::FutexWaitv => {
            let p = event_loop::probe();
            if p.futex_waitv {
                Ok(())
            } else {
                Err(MechanismUnavailableError::NoFutexWaitv { kernel: p.kernel })
            }
        }
        Mechanism::IoUringFutex | Mechanism::IoUringShared => {
            let p = event_loop::probe();
            if p.io_uring_futex {
                Ok(())
            } else {
                Err(MechanismUnavailableError::NoIoUringFutex {
                    kernel: p.kernel,
                    problem: p.io_uring_problem.unwrap_or_else(|| "not supported".into()),
                })
            }
        }
        Mechanism::Eventfd => crate::notify::probe_pidfd_getfd().map_err(|source| {
            MechanismUnavailableError::NoPidfdGetfd {
                kernel: controller::kernel::release(),
                source,
            }
        }),
        Mechanism::Signalfd => Ok(()),
        Mechanism::MsgRing => {
            crate::notify::probe_msg_ring().map_err(|source| MechanismUnavailableError::NoMsgRing {
                kernel: controller::kernel::release(),
                source,
            })
        }
        Mechanism::Pipe => Err(MechanismUnavailableError::NotDriven { mechanism: m }),
    }
}

/// The signal the signalfd mechanism queues: SIGRTMIN + 2.
pub(crate) fn check_signal() -> i32 {
    libc::SIGRTMIN() + 2
}

/// Records a failed notification in the control words.
fn count_notify_failures(ctl: &Control, peers: &Peers, before: u64) {
    let n = peers.failed() - before;
    if n > 0 {
        ctl.notify_failed.fetch_add(n, Ordering::Relaxed); // a statistic
        if let Some(e) = peers.last_error() {
            ctl.notify_errno.store(e as u64, Ordering::Relaxed); // a statistic
        }
    }
}

/// Parsed `key=value` arguments.
struct Args {
    map: HashMap<String, String>,
}

impl Args {
    fn parse(args: &[String]) -> Result<Args, WorkerRunError> {
        let mut map = HashMap::new();
        for a in args {
            let (k, v) = a
                .split_once('=')
                .ok_or_else(|| WorkerRunError::NotKeyValue { arg: a.clone() })?;
            map.insert(k.to_string(), v.to_string());
        }
        Ok(Args { map })
    }
    fn str(&self, k: &'static str) -> Result<&str, WorkerRunError> {
        self.map
            .get(k)
            .map(|s| s.as_str())
            .ok_or(WorkerRunError::Missing { key: k })
    }
    fn u64(&self, k: &'static str) -> Result<u64, WorkerRunError> {
        let v = self.str(k)?;
        v.parse().map_err(|_| WorkerRunError::NotANumber {
            key: k,
            value: v.into(),
        })
    }
    fn path(&self, k: &'static str) -> Result<PathBuf, WorkerRunError> {
        self.str(k).map(PathBuf::from)
    }
    /// An optional path argument.
    fn opt_path(&self, k: &'static str) -> Option<PathBuf> {
        self.map.get(k).map(PathBuf::from)
    }
    fn cpus(&self, k: &'static str) -> Result<CpuSet, WorkerRunError> {
        self.str(k)?
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|c| {
                c.parse()
                    .ok()
                    .filter(|&n: &u32| n <= MAX_CPU)
                    .ok_or_else(|| WorkerRunError::NotACpu {
                        key: k,
                        value: c.into(),
                    })
            })
            .collect()
    }
    fn mech(&self) -> Result<Mechanism, WorkerRunError> {
        let v = self.str("mech")?;
        Mechanism::parse(v).ok_or_else(|| WorkerRunError::NotAMechanism {
            value: v.into(),
            expected: Mechanism::names(&Mechanism::ALL),
        })
    }
    /// `key` as an index below `max`.
    fn index(&self, k: &'static str, max: usize) -> Result<usize, WorkerRunError> {
        let v = self.u64(k)?.min(usize::MAX as u64) as usize;
        if v >= max {
            return Err(WorkerRunError::OutOfRange {
                key: k,
                value: v,
                max: max - 1,
            });
        }
        Ok(v)
    }
    /// Opens the shared file named by `shared=`.
    fn shared(&self) -> Result<Shared, WorkerRunError> {
        let path = self.path("shared")?;
        Shared::open(&path).map_err(|source| WorkerRunError::Shared { path, source })
    }
}

/// Runs a worker role; returns the process exit code. `args[0]` is the
/// role, the rest `key=value`.
pub fn main(args: &[String]) -> i32 {
    rt::die_with_parent();
    // An engine that died before the request above took hold sends no
    // signal: the worker would run on as an orphan (a SCHED_FIFO sender
    // publishing forever). It is gone when the parent is not the one
    // that started us.
    if let Some(engine) = std::env::var(units::env::CHECK_ENGINE)
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    {
        if std::os::unix::process::parent_id() != engine {
            eprintln!("check worker: the engine (pid {engine}) is gone");
            return 2;
        }
    }
    let Some((role, rest)) = args.split_first() else {
        eprintln!("check worker: no role given");
        return 2;
    };
    name_thread(&format!("rtd-{role}"));
    let result = Args::parse(rest).and_then(|a| match role.as_str() {
        "rt-send" => rt_send(&a),
        "rt-recv" => rt_recv(&a),
        "low" => low(&a),
        "burst" => burst(&a),
        "timer" => timer(&a),
        "hog" => hog(&a),
        "io" => io_writer(&a),
        "hammer" => hammer(&a),
        "pi-hold" => pi_hold(&a),
        "rt-pi" => rt_pi(&a),
        r => Err(WorkerRunError::UnknownRole { role: r.into() }),
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("check worker {role}: {}", Chain(&e));
            let _ = std::io::stderr().flush();
            2
        }
    }
}

/// Common real-time setup: pin, memory lock, SCHED_FIFO (counted in the
/// control words when refused).
fn rt_setup(ctl: &Control, a: &Args, priority: Option<u32>) -> Result<(), WorkerRunError> {
    let cpus = a.cpus("cpu")?;
    // Join the rtdeploy cgroup that holds these CPUs first: an isolated
    // partition takes them away from the cgroup this process starts in.
    let joined = controller::rt::join_cgroup_holding(&a.path("sys")?, &cpus).map_err(|source| {
        WorkerRunError::Cgroup {
            cpus: cpus.clone(),
            source,
        }
    })?;
    units::sched::set_affinity(0, &cpus).map_err(|source| WorkerRunError::Pin {
        cpus: cpus.clone(),
        cgroup: joined.map_or_else(
            || "no rtdeploy cgroup holds them".to_string(),
            |p| format!("in {}", p.display()),
        ),
        source,
    })?;
    if priority.is_some() && !rt::lock_memory() {
        ctl.mlock_failed.fetch_add(1, Ordering::Relaxed); // a statistic
    }
    if let Some(p) = priority {
        if !rt::set_fifo(p).map_err(|source| WorkerRunError::Fifo {
            priority: p,
            source,
        })? {
            ctl.fifo_refused.fetch_add(1, Ordering::Relaxed); // a statistic
        }
    }
    Ok(())
}

fn open_channel(a: &Args) -> Result<Channel, WorkerRunError> {
    let dir = a.path("shm")?;
    let name = a.str("channel")?;
    Channel::open(&dir, name).map_err(WorkerRunError::Channel)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Result<Args, WorkerRunError> {
        Args::parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn bad_arguments_are_typed_errors_naming_the_value() {
        let e = args(&["period"]).err().unwrap();
        assert_eq!(e.to_string(), "argument `period` is not key=value");
        let a = args(&["period_ns=ten", "cpu=1,x", "mech=pipes", "slot=40"]).unwrap();
        assert_eq!(
            a.u64("period_ns").unwrap_err().to_string(),
            "period_ns=ten is not a number"
        );
        assert_eq!(
            a.u64("priority").unwrap_err().to_string(),
            "missing argument priority="
        );
        assert_eq!(
            a.cpus("cpu").unwrap_err().to_string(),
            "cpu: `x` is not a CPU number"
        );
        let m = a.mech().unwrap_err().to_string();
        assert!(
            m.starts_with("mech=pipes is not a mechanism (expected one of doorbell, io_uring, "),
            "{m}"
        );
        assert_eq!(
            a.index("slot", MAX_LOW).unwrap_err().to_string(),
            format!("slot=40 is out of range (at most {})", MAX_LOW - 1)
        );
    }

    #[test]
    fn a_missing_shared_file_names_it_and_says_why_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p1.ctl");
        let a = args(&[&format!("shared={}", path.display())]).unwrap();
        let e = a.shared().err().unwrap();
        assert_eq!(
            e.to_string(),
            format!("cannot open the check's shared file {}", path.display())
        );
        let chain = Chain(&e).to_string();
        assert!(
            chain.ends_with("No such file or directory (os error 2)"),
            "{chain}"
        );
        assert_eq!(chain.matches("os error").count(), 1, "{chain}");
    }
}
