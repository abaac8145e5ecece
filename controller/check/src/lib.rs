//! The timing check: does this board, with this kernel and this
//! robot.yaml, meet its latency budgets under realistic load?
//!
//! One run measures, in order:
//!
//! 1. timer latency on each isolated CPU, the way cyclictest does (a
//!    SCHED_FIFO thread per CPU sleeping to absolute `CLOCK_MONOTONIC`
//!    deadlines; latency = wake - deadline), with the loads below running;
//! 2. the scenario of the io_uring futex-wakeup cover letter: a real-time
//!    sender on one isolated CPU publishing every `check.period` on a real
//!    channel to a real-time receiver on another isolated CPU (the same one
//!    when only one is isolated); lower-priority processes on the
//!    housekeeping CPUs publishing and subscribing on the same channel every
//!    `check.low_priority.period`, started and stopped during the run;
//!    SCHED_FIFO burst threads below the real-time priority; CPU hogs and
//!    fsync'ing writers. Per message it records the sender's time in the
//!    publishing call and the delivery latency (the send time stamped in the
//!    message to the receiver's handler start).
//!
//! With several wake mechanisms (`--compare`) the scenario runs once per
//! mechanism with the same loads, and the report sets them side by side.
//! Publishers always write the message into the shared-memory channel
//! first; then the futex mechanisms wake through the channel's queue index
//! (or, for the doorbell, the bell of each subscriber listed on the channel),
//! while with eventfd and RT signal + signalfd no futex wait is armed and
//! every publisher (real-time and lower-priority alike) notifies every
//! subscriber's [`crate::notify`] waiter, whose address the subscriber
//! publishes in the control file. The receiver wakes in its waiter and
//! drains the channel, so delivery latency is measured the same way for
//! all six; the sender's timed call is the publish plus its
//! notifications, as the futex mechanisms' is the publish plus its wake.
//!
//! With [`CheckInputs::trace`] the run also traces the kernel on the
//! sender's and receiver's CPUs and analyses every delivery over its budget
//! into a verdict (see [`trace`]); without it nothing of the tracer runs.
//!
//! Every worker process is the calling executable itself, started with the
//! hidden arguments `__check-worker <role> key=value...` (see [`worker`]),
//! so one binary on the robot is enough. Workers and the engine share one
//! file in `<prefix>/dev/shm/rtdeploy/` holding the control words and the
//! fixed-size histograms the workers record into; nothing allocates while
//! measuring.
//!
//! Design rules: the engine is a library ([`run`], [`run_boot`]) so the
//! supervisor runs the same code at boot; every live-system path (`/proc`,
//! `/sys`, `/dev/cpu_dma_latency`, the shm directory) comes from the
//! caller's prefix and sysroot; without permission for SCHED_FIFO the run
//! still happens, and the report says plainly that its figures are not
//! real-time figures. The engine owns the `check:` and `boot_check:`
//! sections of robot.yaml ([`config`]): their schema and validation.

pub mod bench;
pub mod census;
pub mod config;
pub mod futex;
pub mod harness;
pub mod hist;
pub mod host;
pub mod notify;
pub mod output;
pub mod report;
pub mod rt;
mod scenario;
mod tempdir;
pub mod timer;
pub mod trace;
pub mod worker;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use config::CheckSection;
use units::cpu::CpuSet;
use units::duration::Dur;

pub use report::{
    BudgetResult, CheckReport, Measurement, MeasurementKind, TraceSummary, TraceVerdict,
    CHECK_SCHEMA_VERSION,
};
pub use scenario::evaluate_budgets;

/// How a receiver is woken: the runtime's own mechanism and those it is
/// compared with, by the check (`--compare`, `--mechanism`) and by
/// `bench wake`. Each has one name, [`Mechanism::short`], on the command
/// line and in JSON, and one [`Mechanism::label`] in the tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Mechanism {
    /// The event loop on its `io_uring-futex` backend: an io_uring
    /// `IORING_OP_FUTEX_WAIT` kept armed per channel, on the word of its
    /// wake class (the real-time pair on `rt_word`, the lower-priority
    /// processes on the queue index; see [`controller::wake`]).
    #[serde(rename = "io_uring")]
    IoUringFutex,
    /// The event loop on its `futex_waitv` backend: one `futex_waitv(2)`
    /// per sleep over the words of its wake class.
    #[serde(rename = "futex_waitv")]
    FutexWaitv,
    /// The event loop's `doorbell` backend, which real-time loops use on
    /// every kernel (and best-effort ones on kernels with neither of the
    /// above, such as JetPack 5's 5.10): the subscriber sleeps in a plain
    /// `FUTEX_WAIT` on its own word in the channel directory's bell table,
    /// which the publishers of its wake class ring (the runtime's
    /// doorbell backend, see [`controller::wake`]).
    #[serde(rename = "doorbell")]
    Doorbell,
    /// The reference the wake classes are measured against: the event
    /// loop on `io_uring-futex` with every process in one wake class, so
    /// that every subscriber, real-time or not, arms its one-shot wait on
    /// the queue index and every publisher wakes it (the runtime before
    /// wake classes, and the background letter's "one-shot io_uring
    /// wait" row).
    #[serde(rename = "io_uring_shared")]
    IoUringShared,
    /// A plain `FUTEX_WAIT` / `FUTEX_WAKE` pair on the queue index: the
    /// floor the others are measured against.
    #[serde(rename = "futex")]
    Futex,
    /// An eventfd per subscriber (created by it, fetched by every
    /// publisher with `pidfd_getfd(2)`), written by every publisher after
    /// each message; see [`crate::notify`].
    #[serde(rename = "eventfd")]
    Eventfd,
    /// A real-time signal (`SIGRTMIN + 2`) queued at each subscriber's
    /// waiting thread by every publisher after each message, read through
    /// a signalfd; see [`crate::notify`].
    #[serde(rename = "signalfd")]
    Signalfd,
    /// io_uring `IORING_OP_MSG_RING`: every publisher posts a completion
    /// into the subscriber's own ring (fetched with `pidfd_getfd(2)`)
    /// after each message, and the subscriber waits in `io_uring_enter`;
    /// see [`crate::notify`].
    #[serde(rename = "msg_ring")]
    MsgRing,
    /// A pipe written by the publisher and read by the receiver (measured
    /// by `bench wake` only; the check does not drive it).
    #[serde(rename = "pipe")]
    Pipe,
}

impl Mechanism {
    /// Every mechanism, in the order `bench wake` measures them.
    pub const ALL: [Mechanism; 9] = [
        Mechanism::Doorbell,
        Mechanism::IoUringFutex,
        Mechanism::FutexWaitv,
        Mechanism::IoUringShared,
        Mechanism::Futex,
        Mechanism::Eventfd,
        Mechanism::Signalfd,
        Mechanism::MsgRing,
        Mechanism::Pipe,
    ];

    /// The mechanisms the check drives, in the order `--compare` runs
    /// them.
    pub const CHECKED: [Mechanism; 8] = [
        Mechanism::Doorbell,
        Mechanism::IoUringFutex,
        Mechanism::FutexWaitv,
        Mechanism::IoUringShared,
        Mechanism::Futex,
        Mechanism::Eventfd,
        Mechanism::Signalfd,
        Mechanism::MsgRing,
    ];

    /// The runtime's own mechanism for a real-time subscriber: the
    /// doorbell, on every kernel (see [`controller::wake`]).
    pub fn runtime() -> Mechanism {
        Mechanism::Doorbell
    }

    /// The event loop backend the mechanism runs the receivers on, for
    /// the runtime's own and the reference.
    pub fn backend(self) -> Option<controller::event_loop::Backend> {
        use controller::event_loop::Backend;
        match self {
            Mechanism::IoUringFutex | Mechanism::IoUringShared => Some(Backend::IoUringFutex),
            Mechanism::FutexWaitv => Some(Backend::FutexWaitv),
            Mechanism::Doorbell => Some(Backend::Doorbell),
            _ => None,
        }
    }

    /// The wake classes the scenario's real-time pair and its
    /// lower-priority processes run in: apart for the runtime's
    /// backends, all best-effort (one word, one class) for the reference
    /// and the comparison mechanisms, whose publishers wake the queue
    /// index or notify every subscriber.
    pub fn classes(self) -> (controller::WakeClass, controller::WakeClass) {
        use controller::WakeClass::{BestEffort, RealTime};
        match self {
            Mechanism::IoUringFutex | Mechanism::FutexWaitv | Mechanism::Doorbell => {
                (RealTime, BestEffort)
            }
            _ => (BestEffort, BestEffort),
        }
    }

    /// What `--compare` runs: the runtime's own mechanism first (it
    /// decides the verdict), then the rest of [`Mechanism::CHECKED`].
    pub fn compared() -> Vec<Mechanism> {
        let own = Mechanism::runtime();
        std::iter::once(own)
            .chain(Mechanism::CHECKED.into_iter().filter(|&m| m != own))
            .collect()
    }

    /// The name on the command line and in JSON.
    pub fn short(self) -> &'static str {
        match self {
            Mechanism::IoUringFutex => "io_uring",
            Mechanism::FutexWaitv => "futex_waitv",
            Mechanism::Doorbell => "doorbell",
            Mechanism::IoUringShared => "io_uring_shared",
            Mechanism::Futex => "futex",
            Mechanism::Eventfd => "eventfd",
            Mechanism::Signalfd => "signalfd",
            Mechanism::MsgRing => "msg_ring",
            Mechanism::Pipe => "pipe",
        }
    }

    /// The name in the tables.
    pub fn label(self) -> &'static str {
        match self {
            Mechanism::IoUringFutex => "io_uring futex (armed)",
            Mechanism::FutexWaitv => "futex_waitv",
            Mechanism::Doorbell => "doorbell",
            Mechanism::IoUringShared => "io_uring futex, one word",
            Mechanism::Futex => "futex",
            Mechanism::Eventfd => "eventfd",
            Mechanism::Signalfd => "RT signal + signalfd",
            Mechanism::MsgRing => "io_uring MSG_RING",
            Mechanism::Pipe => "pipe",
        }
    }

    /// The mechanism `s` names ([`Mechanism::short`]).
    pub fn parse(s: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.short() == s)
    }

    /// The names [`Mechanism::parse`] takes, for a message that lists them.
    pub fn names(set: &[Mechanism]) -> String {
        set.iter().map(|m| m.short()).collect::<Vec<_>>().join(", ")
    }

    pub(crate) fn index(self) -> usize {
        Mechanism::ALL.iter().position(|&m| m == self).unwrap_or(0)
    }

    /// Whether the check can drive the mechanism on this kernel, and why
    /// not when it cannot.
    pub fn availability(self) -> Result<(), MechanismUnavailableError> {
        worker::mechanism_availability(self)
    }
}

/// Why the check cannot drive a mechanism here.
#[derive(Debug, thiserror::Error)]
pub enum MechanismUnavailableError {
    #[error("kernel {kernel} has no io_uring futex wait: {problem}")]
    NoIoUringFutex { kernel: String, problem: String },
    #[error("kernel {kernel} has no futex_waitv (needs 5.16 or later)")]
    NoFutexWaitv { kernel: String },
    #[error("kernel {kernel} cannot fetch a subscriber's eventfd")]
    NoPidfdGetfd {
        kernel: String,
        source: std::io::Error,
    },
    #[error("the check does not drive {mechanism} wakes (`deploy bench wake` measures them)")]
    NotDriven { mechanism: Mechanism },
    #[error("kernel {kernel} cannot wake a subscriber with io_uring MSG_RING (needs 5.18 or later and pidfd_getfd)")]
    NoMsgRing {
        kernel: String,
        source: std::io::Error,
    },
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.short())
    }
}

#[cfg(test)]
mod mechanism_tests {
    use super::*;

    #[test]
    fn one_name_each_on_the_command_line_and_in_json() {
        for m in Mechanism::ALL {
            assert_eq!(Mechanism::parse(m.short()), Some(m));
            assert_eq!(
                serde_json::to_value(m).unwrap(),
                serde_json::Value::from(m.short())
            );
        }
        assert_eq!(Mechanism::IoUringFutex.short(), "io_uring");
        assert_eq!(Mechanism::parse("io_uring-futex"), None);
        assert_eq!(
            Mechanism::names(&Mechanism::CHECKED),
            "doorbell, io_uring, futex_waitv, io_uring_shared, futex, eventfd, signalfd, msg_ring"
        );
        assert!(Mechanism::CHECKED
            .iter()
            .all(|m| Mechanism::ALL.contains(m)));
    }

    #[test]
    fn the_check_says_it_does_not_drive_pipe() {
        let e = Mechanism::Pipe.availability().unwrap_err();
        assert!(
            matches!(e, MechanismUnavailableError::NotDriven { .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("bench wake"), "{e}");
    }
}

/// A latency budget from outside the `check:` section: a channel's
/// `budget` or a process's `budgets.wakeup`, applied to the delivery
/// latency's maximum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedBudget {
    /// Where it comes from, e.g. `channels./demo/ping.budget`.
    pub name: String,
    pub limit: Dur,
}

/// Everything a run needs from robot.yaml, as plain values.
#[derive(Debug, Clone)]
pub struct CheckInputs {
    /// The robot's name (for the report).
    pub robot: String,
    /// The `check:` section (scenario and budgets).
    pub check: CheckSection,
    /// Total duration; overrides `check.duration` (the boot check passes
    /// `boot_check.duration`). A quarter goes to the timer phase, the rest
    /// to the scenario, per mechanism.
    pub duration: Option<Dur>,
    /// The isolated CPUs (real-time side).
    pub isolated: Vec<usize>,
    /// The housekeeping CPUs (loads and lower-priority processes).
    pub housekeeping: Vec<usize>,
    /// `power.cpu_dma_latency` in microseconds; the run holds this (or 0)
    /// on `/dev/cpu_dma_latency` throughout.
    pub cpu_dma_latency_us: Option<u32>,
    /// Channel budgets (`channels[].budget`).
    pub channel_budgets: Vec<NamedBudget>,
    /// Process wakeup budgets (`processes[].budgets.wakeup`).
    pub process_budgets: Vec<NamedBudget>,
    /// The mechanisms to run; the first one decides the verdict, the
    /// others are for comparison. Empty: the runtime's own on this kernel
    /// ([`Mechanism::runtime`]), found when the run starts.
    pub mechanisms: Vec<Mechanism>,
    /// Lines to carry into the report (e.g. a verify summary).
    pub notes: Vec<String>,
    /// Trace every delivery over its budget ([`trace`]); `None`: no
    /// tracing, no marker, no cost.
    pub trace: Option<TraceRequest>,
    /// With `trace`: run the deciding mechanism's scenario twice, untraced
    /// (it decides) then traced (measurements named `... (traced)`), and
    /// state the tracer's cost on the figures in a note.
    pub trace_compare: bool,
    /// With a logger: run the deciding mechanism's scenario twice: without
    /// it (it decides), then with it recording the check's channel
    /// (measurements named `... (logged)`), and state the logger's cost on
    /// the figures, its CPU time and its bytes per message in a note.
    /// `deploy check --log-compare` passes the supervisor's logger.
    pub log_compare: Option<Arc<dyn ChannelLogger>>,
    /// The scenario runs in this many interleaved rounds (each round runs
    /// every mechanism for `1/rounds` of its time, in an order rotated
    /// round by round; see [`harness`]); 1: each mechanism once.
    pub rounds: u32,
    /// With rounds: the mechanism the others' ratios are taken against,
    /// run a second time in every round as the A/A noise floor.
    pub aa_reference: Option<Mechanism>,
    /// Run the census ([`census`]) through the run, with its positive
    /// control (a PI futex) before the mechanisms.
    pub census: bool,
    /// Best-effort threads hammering the channel's best-effort word with
    /// `FUTEX_WAKE` in every mechanism's phase (0: none).
    pub hammer: u32,
}

/// Where and how many traced misses a run keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRequest {
    /// Saved misses go here (created when missing).
    pub dir: PathBuf,
    /// At most this many saved misses stay in `dir` (the oldest go), and
    /// the report lists this many last verdicts.
    pub keep: usize,
}

impl CheckInputs {
    /// Inputs for `check` with its defaults: the runtime's own mechanism.
    pub fn new(
        robot: impl Into<String>,
        check: CheckSection,
        isolated: Vec<usize>,
        housekeeping: Vec<usize>,
    ) -> Self {
        CheckInputs {
            robot: robot.into(),
            check,
            duration: None,
            isolated,
            housekeeping,
            cpu_dma_latency_us: None,
            channel_budgets: vec![],
            process_budgets: vec![],
            mechanisms: vec![],
            notes: vec![],
            trace: None,
            trace_compare: false,
            log_compare: None,
            rounds: 1,
            aa_reference: None,
            census: false,
            hammer: 0,
        }
    }

    /// The total duration of the run.
    pub fn total_duration(&self) -> Duration {
        self.duration.unwrap_or(self.check.duration).0
    }
}

/// A logger the check runs beside its scenario
/// ([`CheckInputs::log_compare`]) to state what logging costs delivery:
/// the supervisor's, which its caller passes in (the engine does not
/// depend on the logger; the arrow points from the logger's user to both).
pub trait ChannelLogger: fmt::Debug + Send + Sync {
    /// Starts recording `run.channel` from its next message, as the
    /// supervisor would, writing its files under `run.dir`.
    fn start(&self, run: &LoggerRun<'_>) -> io::Result<Box<dyn RunningLogger>>;
}

/// What a [`ChannelLogger`] records, where, and on which CPUs.
#[derive(Debug, Clone, Copy)]
pub struct LoggerRun<'a> {
    /// The logger's files go here (the check measures their size).
    pub dir: &'a Path,
    /// Where the channel lives.
    pub shm_dir: &'a Path,
    /// The check's channel.
    pub channel: &'a str,
    /// The housekeeping CPUs, for the logger's threads.
    pub cpus: &'a CpuSet,
}

/// A logger started by [`ChannelLogger::start`].
pub trait RunningLogger {
    /// Stops it and says what it did.
    fn stop(self: Box<Self>) -> LoggerFigures;
}

/// What a logger did and cost over the logged phase.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoggerFigures {
    /// Messages it wrote.
    pub logged: u64,
    /// Messages it missed (gaps).
    pub lost: u64,
    /// CPU time its threads used.
    pub cpu_ns: u64,
    /// Its state at the stop (`recording`, or `stopped: WHY`).
    pub state: String,
}

/// Where a run reads and writes the live system.
#[derive(Debug, Clone)]
pub struct CheckEnv {
    /// On-robot paths (the shm directory, `/var/lib/rtdeploy`) are under
    /// this (`/` on a robot).
    pub prefix: PathBuf,
    /// `/proc`, `/sys` and `/dev/cpu_dma_latency` are read under this.
    pub sysroot: PathBuf,
    /// The executable to start workers from (the `deploy` binary).
    pub exe: PathBuf,
}

/// Live progress of a run, for a progress bar.
pub trait Progress {
    /// `phase` names what runs now; `fraction` is of the whole run (0..=1);
    /// `worst_ns` is the running worst case of the phase's main figure
    /// (timer latency, then delivery latency).
    fn update(&self, phase: &str, fraction: f64, worst_ns: u64);
}

/// A [`Progress`] that shows nothing.
pub struct NoProgress;

impl Progress for NoProgress {
    fn update(&self, _: &str, _: f64, _: u64) {}
}

/// Why a run could not happen (exit 2), as opposed to a failed budget.
#[derive(Debug, thiserror::Error)]
pub enum CheckRunError {
    #[error("no isolated CPU to measure on (robot.yaml `cpus.isolated` is empty)")]
    NoIsolatedCpus,
    #[error("no housekeeping CPU for the loads (robot.yaml `cpus.housekeeping` is empty)")]
    NoHousekeepingCpus,
    #[error("cpu {cpu} is not on this machine ({online} CPUs online)")]
    NoSuchCpu { cpu: usize, online: usize },
    #[error("mechanism {mechanism} cannot run here")]
    Mechanism {
        mechanism: Mechanism,
        #[source]
        reason: MechanismUnavailableError,
    },
    #[error("cannot set up {path}")]
    Setup {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create the check channel")]
    Channel(#[source] controller::channel::ChannelCreateError),
    #[error("cannot publish on the check channel")]
    Attach(#[source] controller::channel::ChannelAttachError),
    #[error("cannot start worker `{role}` from {exe}")]
    Spawn {
        role: String,
        exe: PathBuf,
        source: std::io::Error,
    },
    #[error("worker `{role}` failed ({status}): {stderr}")]
    Worker {
        role: String,
        status: String,
        stderr: String,
    },
    #[error("{count} isolated CPUs; the timer phase measures at most {max}")]
    TooManyIsolated { count: usize, max: usize },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Runs the check: timer phase, then the scenario once per mechanism.
pub fn run(
    inputs: &CheckInputs,
    env: &CheckEnv,
    progress: &dyn Progress,
) -> Result<CheckReport, CheckRunError> {
    scenario::run(inputs, env, progress, "check")
}

/// The supervisor's boot check: the same run, shortened to `inputs.duration`
/// (the caller passes `boot_check.duration`), with the runtime's mechanism
/// only and no progress display; the report (JSON, the documented schema)
/// is written to `report_path` (the on-robot layout's
/// `var/lib/rtdeploy/boot-check.json`; directories created, written to a
/// temporary file, fsync'd and renamed) and returned.
pub fn run_boot(
    inputs: &CheckInputs,
    prefix: &Path,
    sysroot: &Path,
    exe: &Path,
    report_path: &Path,
) -> Result<CheckReport, CheckRunError> {
    let mut inputs = inputs.clone();
    inputs.mechanisms.truncate(1);
    if inputs.mechanisms.is_empty() {
        inputs.mechanisms.push(Mechanism::runtime());
    }
    let env = CheckEnv {
        prefix: prefix.to_path_buf(),
        sysroot: sysroot.to_path_buf(),
        exe: exe.to_path_buf(),
    };
    let report = scenario::run(&inputs, &env, &NoProgress, "boot")?;
    write_report(&report, report_path)?;
    Ok(report)
}

/// Writes a report as JSON to `path` atomically (temp file, fsync, rename).
pub fn write_report(report: &CheckReport, path: &Path) -> Result<(), CheckRunError> {
    use std::io::Write;
    let werr = |source| CheckRunError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(werr)?;
    }
    let mut text =
        serde_json::to_string_pretty(report).map_err(|e| werr(std::io::Error::other(e)))?;
    text.push('\n');
    let tmp = path.with_extension(format!("json.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(werr)
}

/// `CLOCK_MONOTONIC` now, in nanoseconds (the runtime's [`Monotonic`]
/// clock, as the workers' histograms and stamps count it).
///
/// [`Monotonic`]: controller::Monotonic
#[inline]
pub(crate) fn monotonic_ns() -> u64 {
    controller::Monotonic::now().as_nanos()
}
