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

/// Most lower-priority process slots.
pub const MAX_LOW: usize = 32;
/// Receiver address cells: the real-time receiver and two per low slot.
pub(crate) const CELLS: usize = 1 + 2 * MAX_LOW;
/// The cell of the real-time receiver.
pub(crate) const RT_CELL: usize = 0;
/// Histograms per mechanism: send, delivery, low-priority delivery.
pub(crate) const PER_MECH: usize = 3;
pub(crate) const H_SEND: usize = 0;
pub(crate) const H_DELIVERY: usize = 1;
pub(crate) const H_LOW_DELIVERY: usize = 2;
pub(crate) const CONTROL_BYTES: usize = 4096;
/// `RTDCHECK` read as a little-endian u64.
pub(crate) const CONTROL_MAGIC: u64 = u64::from_le_bytes(*b"RTDCHECK");
/// Message tags: which side sent it.
pub(crate) const TAG_RT: u64 = 0x5254;
pub(crate) const TAG_LOW: u64 = 0x4c4f;
/// A message the engine publishes after raising a stop word, so that a
/// receiver asleep in its loop looks at the words.
pub(crate) const TAG_STOP: u64 = 0x5354;

/// The control words at the start of the shared file. Every field is an
/// independent word; see each access for its ordering.
#[repr(C)]
pub(crate) struct Control {
    pub magic: AtomicU64,
    /// Non-zero: every worker stops.
    pub stop_all: AtomicU64,
    /// Non-zero: the real-time pair stops.
    pub rt_stop: AtomicU64,
    /// The receiver is subscribed and about to wait.
    pub receiver_ready: AtomicU64,
    /// Workers that asked for SCHED_FIFO and were refused.
    pub fifo_refused: AtomicU64,
    /// Workers that could not lock their memory.
    pub mlock_failed: AtomicU64,
    /// Low-priority processes started (all generations).
    pub low_started: AtomicU64,
    /// eventfd / signal notifications (and connections) that failed.
    pub notify_failed: AtomicU64,
    /// The errno of the last such failure.
    pub notify_errno: AtomicU64,
    /// Non-zero: the timer workers stop.
    pub timer_stop: AtomicU64,
    /// Bit `slot`: that timer worker pinned itself to its CPU.
    pub timer_pinned: AtomicU64,
    /// Bit `slot`: that timer worker got SCHED_FIFO.
    pub timer_fifo: AtomicU64,
    /// Non-zero: the real-time receiver stops at the next stop message.
    /// Raised only after the sender has exited, so the receiver that
    /// handles the stop message has passed every real-time message.
    pub rt_recv_stop: AtomicU64,
    /// The real-time receiver reached the end of the run (it handled the
    /// stop message after `rt_recv_stop`).
    pub rt_recv_done: AtomicU64,
    /// The generation the hammer runs for (it stops when it changes).
    pub hammer_gen: AtomicU64,
    /// The positive control's priority-inheritance futex word (low 32
    /// bits: the holder's tid, `FUTEX_WAITERS` when one waits).
    pub pi_word: AtomicU64,
    /// The positive control's waiter: lock and unlock cycles done (the
    /// phase lasts until enough were, however slowly the workers start).
    pub pi_cycles: AtomicU64,
    /// Per low-priority slot: the generation that may run; a process whose
    /// generation differs stops.
    pub low_gen: [AtomicU64; MAX_LOW],
    /// Where the eventfd / signalfd receivers wait: cell 0 the real-time
    /// receiver, cells `1 + 2 * slot + (0|1)` the low-priority processes
    /// (two per slot: a slot's new process starts before its old one
    /// stops). Every publisher notifies every filled cell.
    pub cells: [AddressCell; CELLS],
    /// Tracing (`crate::trace`): 1 while the instance records and a miss
    /// may stop it; the engine raises it, the receiver that stops the
    /// instance lowers it (one miss, one snapshot).
    pub trace_armed: AtomicU64,
    /// 1: the receiver stopped the instance on a miss described by the
    /// three words below; the engine takes the snapshot, lowers this and
    /// raises `trace_armed` again.
    pub trace_miss: AtomicU64,
    pub trace_miss_seq: AtomicU64,
    pub trace_miss_send_ns: AtomicU64,
    pub trace_miss_handler_ns: AtomicU64,
    /// Real-time messages over the miss threshold (traced or not).
    pub trace_over: AtomicU64,
    /// Who stopped the instance: 0 the real-time receiver, `slot + 1` the
    /// timer worker of that slot (then `trace_miss_seq` numbers its wake,
    /// `send_ns` is the deadline and `handler_ns` the wake).
    pub trace_miss_timer: AtomicU64,
    /// The pid of that timer worker.
    pub trace_miss_pid: AtomicU64,
    /// Timer wakes over the timer miss threshold (traced or not).
    pub trace_timer_over: AtomicU64,
    /// The real-time receiver's messages that its loop's wake check found
    /// (no wake came for them), stored when its loop ends.
    pub rt_healed: AtomicU64,
}
// SAFETY: repr(C), only AtomicU64 fields and arrays: no padding, no
// pointers, no Drop, valid for every bit pattern.
unsafe impl ShmAtomic for Control {}
const _: () = assert!(std::mem::size_of::<Control>() <= CONTROL_BYTES);

/// Timer-latency histograms: one per isolated CPU, at most this many.
pub(crate) const MAX_TIMERS: usize = 64;

/// Real-time messages whose delivery is accounted one by one (by their
/// sequence number): 2^21, 35 minutes at 1 kHz.
pub(crate) const ACCOUNTED_SEQS: u64 = 1 << 21;
const MARK_WORDS: usize = (ACCOUNTED_SEQS / 64) as usize;
/// The two bitmaps of the accounting.
pub(crate) const MARK_SENT: usize = 0;
pub(crate) const MARK_SEEN: usize = 1;

fn histograms_bytes() -> usize {
    (Mechanism::ALL.len() * PER_MECH + MAX_TIMERS) * std::mem::size_of::<Histogram>()
}

/// Bytes of the shared file: control words, histograms, then the sent and
/// seen bitmaps of the real-time messages.
pub(crate) fn shared_bytes() -> usize {
    CONTROL_BYTES + histograms_bytes() + 2 * MARK_WORDS * 8
}

/// The shared file, mapped.
pub(crate) struct Shared {
    map: Mapping,
}

impl Shared {
    pub fn create(path: &Path) -> std::io::Result<Shared> {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)?;
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        f.set_len(shared_bytes() as u64)?;
        // SAFETY: the file is the engine's own; it and its workers touch
        // it only through `at` (atomics: Control, Histogram, the marks).
        let map = unsafe { Mapping::map(&f, shared_bytes())? };
        let s = Shared { map };
        // Release: a worker that reads the magic (Acquire) sees a fully
        // sized, zeroed file.
        s.control().magic.store(CONTROL_MAGIC, Ordering::Release);
        Ok(s)
    }

    pub fn open(path: &Path) -> std::io::Result<Shared> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let len = f.metadata()?.len() as usize;
        if len != shared_bytes() {
            return Err(std::io::Error::other(format!(
                "{len} bytes, expected {} (a worker of another version?)",
                shared_bytes()
            )));
        }
        // SAFETY: as in `create`.
        let map = unsafe { Mapping::map(&f, len)? };
        let s = Shared { map };
        // Acquire: pairs with the Release store in `create`.
        if s.control().magic.load(Ordering::Acquire) != CONTROL_MAGIC {
            return Err(std::io::Error::other("not a check control file"));
        }
        Ok(s)
    }

    pub fn control(&self) -> &Control {
        self.map.at(0)
    }

    pub fn hist(&self, mech: Mechanism, which: usize) -> &Histogram {
        let i = mech.index() * PER_MECH + which;
        self.map
            .at(CONTROL_BYTES + i * std::mem::size_of::<Histogram>())
    }

    fn mark_word(&self, which: usize, word: usize) -> &AtomicU64 {
        self.map
            .at(CONTROL_BYTES + histograms_bytes() + (which * MARK_WORDS + word) * 8)
    }

    /// Marks real-time message `seq` in bitmap `which` (sent by the
    /// sender, seen by the receiver); beyond [`ACCOUNTED_SEQS`] nothing.
    pub fn mark(&self, which: usize, seq: u64) {
        if seq < ACCOUNTED_SEQS {
            // Relaxed: read by the engine after it reaped the workers.
            self.mark_word(which, (seq / 64) as usize)
                .fetch_or(1 << (seq % 64), Ordering::Relaxed);
        }
    }

    /// The sequence numbers marked in `sent` but not in `seen`, in order,
    /// and how many were marked sent.
    pub fn unseen(&self) -> (Vec<u64>, u64) {
        let mut out = vec![];
        let mut sent_n = 0;
        for w in 0..MARK_WORDS {
            let sent = self.mark_word(MARK_SENT, w).load(Ordering::Relaxed);
            if sent == 0 {
                continue;
            }
            sent_n += sent.count_ones() as u64;
            let mut missing = sent & !self.mark_word(MARK_SEEN, w).load(Ordering::Relaxed);
            while missing != 0 {
                let b = missing.trailing_zeros() as u64;
                out.push(w as u64 * 64 + b);
                missing &= missing - 1;
            }
        }
        (out, sent_n)
    }

    /// Clears both bitmaps (between mechanisms, with no worker running).
    pub fn clear_marks(&self) {
        for which in [MARK_SENT, MARK_SEEN] {
            for w in 0..MARK_WORDS {
                self.mark_word(which, w).store(0, Ordering::Relaxed);
            }
        }
    }

    /// The timer-latency histogram of timer worker `slot` (< MAX_TIMERS).
    pub fn timer_hist(&self, slot: usize) -> &Histogram {
        assert!(slot < MAX_TIMERS, "timer slot {slot} out of range");
        let i = Mechanism::ALL.len() * PER_MECH + slot;
        self.map
            .at(CONTROL_BYTES + i * std::mem::size_of::<Histogram>())
    }
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

/// Stop polling interval for waits (bounded so a stop request is seen).
const WAIT_SLICE_NS: u64 = 20_000_000;

fn rt_send(a: &Args) -> Result<(), WorkerRunError> {
    let shared = a.shared()?;
    let ctl = shared.control();
    let mech = a.mech()?;
    rt_setup(ctl, a, Some(a.u64("priority")? as u32))?;
    let ch = open_channel(a)?;
    let mut publisher = ch
        .publisher_as(mech.classes().0, &a.path("proc")?)
        .map_err(WorkerRunError::Attach)?;
    let period = a.u64("period_ns")?.max(1);
    let send_h = shared.hist(mech, H_SEND);
    let mut peers = notified(mech).then(|| Peers::new(CELLS));
    let marker = a.opt_path("trace").and_then(|d| TraceMarker::open(&d));
    // Acquire: pairs with the receiver's Release store; its subscription
    // is in place before the first message.
    while ctl.receiver_ready.load(Ordering::Acquire) == 0 {
        if ctl.rt_stop.load(Ordering::Relaxed) != 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut seq = 0u64;
    let mut next = monotonic_ns() + period;
    // Relaxed: a stop request; the engine reaps this process before it
    // reads the histograms.
    while ctl.rt_stop.load(Ordering::Relaxed) == 0 {
        sleep_until(Monotonic::from_nanos(next));
        // New or gone receivers are (dis)connected outside the timed call.
        if let Some(p) = peers.as_mut() {
            p.refresh(&ctl.cells);
        }
        let failed_before = peers.as_ref().map_or(0, |p| p.failed());
        let payload = [TAG_RT, seq];
        // Outside the timed call; Relaxed: a hint (a marker more or less).
        if let Some(m) = &marker {
            if ctl.trace_armed.load(Ordering::Relaxed) != 0 {
                m.mark("send", seq, monotonic_ns());
            }
        }
        let t0 = monotonic_ns();
        let r = publisher.publish_value(&payload);
        // The message is in the channel; now wake every receiver.
        if let Some(p) = peers.as_mut() {
            p.notify_all();
        }
        let t1 = monotonic_ns();
        if let Some(p) = peers.as_ref() {
            count_notify_failures(ctl, p, failed_before);
        }
        match r {
            Ok(_) => {
                send_h.record(t1 - t0);
                shared.mark(MARK_SENT, seq);
            }
            Err(_) => send_h.error(),
        }
        seq += 1;
        next += period;
        let now = monotonic_ns();
        if now > next {
            next += ((now - next) / period + 1) * period;
        }
    }
    Ok(())
}

/// Records one received message: lost messages before it count as
/// errors; its delivery latency is recorded when its tag is `only` (or
/// always when `None`).
/// A real-time receiver also marks each real-time message in `seen`.
#[inline]
fn record_message(h: &Histogram, latency_ns: u64, m: &Message, only: Option<u64>, seen: Seen) {
    for _ in 0..m.lost_before {
        h.error();
    }
    let (tag, seq) = tag_seq(m);
    if only.is_none_or(|t| t == tag) {
        h.record(latency_ns);
    }
    if let (Some(shared), TAG_RT) = (seen, tag) {
        shared.mark(MARK_SEEN, seq);
        if let Some(t) = RECV_TRACE.get() {
            t.handled(seq, m.send_time_ns, latency_ns);
        }
    }
}

/// Where a real-time receiver marks what it saw.
type Seen = Option<&'static Shared>;

/// The instance's `tracing_on`, open for writing: a worker that sees a
/// miss turns the instance off through it.
fn open_tracing_on(instance: &Path) -> Result<std::fs::File, WorkerRunError> {
    let path = instance.join("tracing_on");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|source| WorkerRunError::File {
            what: "open",
            path,
            source,
        })
}

/// The instance's `trace_marker`, open for writing (see [`crate::trace`]).
struct TraceMarker(std::fs::File);

impl TraceMarker {
    /// Opens `<instance>/trace_marker`; `None` when there is none (the
    /// run goes on without markers).
    fn open(instance: &Path) -> Option<TraceMarker> {
        std::fs::OpenOptions::new()
            .write(true)
            .open(instance.join("trace_marker"))
            .ok()
            .map(TraceMarker)
    }

    /// Writes `rtdeploy <what> seq=<seq> t=<t_ns>` with no allocation.
    fn mark(&self, what: &str, seq: u64, t_ns: u64) {
        controller::miss_trace::write_marker(
            &self.0,
            format_args!("rtdeploy {what} seq={seq} t={t_ns}"),
        );
    }
}

/// The real-time receiver's side of tracing: the handler marker, and on a
/// message over `miss_ns` the instance stopped at once.
struct RecvTrace {
    marker: Option<TraceMarker>,
    on: std::fs::File,
    miss_ns: u64,
    ctl: &'static Control,
}

/// Set once in the real-time receiver when the run traces; never in
/// other roles (so the handler path pays one load when not tracing).
static RECV_TRACE: std::sync::OnceLock<RecvTrace> = std::sync::OnceLock::new();

impl RecvTrace {
    fn handled(&self, seq: u64, send_ns: u64, latency_ns: u64) {
        let ctl = self.ctl;
        let over = latency_ns > self.miss_ns;
        if over {
            ctl.trace_over.fetch_add(1, Ordering::Relaxed); // a statistic
        }
        // Relaxed: a hint; the compare-exchange below decides.
        if ctl.trace_armed.load(Ordering::Relaxed) == 0 {
            return;
        }
        let handler_ns = send_ns.saturating_add(latency_ns);
        if let Some(m) = &self.marker {
            m.mark("handler", seq, handler_ns);
        }
        if over {
            stop_on_miss(ctl, &self.on, seq, send_ns, handler_ns, None);
        }
    }
}

/// Turns the instance off (through `on`, its `tracing_on`) for a miss,
/// when it is armed, and tells the engine which: `seq`, the event at
/// `send_ns` (a send, a deadline) handled at `handler_ns`, by the
/// real-time receiver or, with `timer`, the timer worker of that slot and
/// pid. One miss at a time: the first to disarm it wins.
fn stop_on_miss(
    ctl: &Control,
    on: &std::fs::File,
    seq: u64,
    send_ns: u64,
    handler_ns: u64,
    timer: Option<(usize, u32)>,
) {
    if ctl
        .trace_armed
        .compare_exchange(1, 0, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return;
    }
    let _ = (&*on).write_all(b"0");
    ctl.trace_miss_seq.store(seq, Ordering::Relaxed);
    ctl.trace_miss_send_ns.store(send_ns, Ordering::Relaxed);
    ctl.trace_miss_handler_ns
        .store(handler_ns, Ordering::Relaxed);
    if let Some((slot, pid)) = timer {
        ctl.trace_miss_timer
            .store(slot as u64 + 1, Ordering::Relaxed);
        ctl.trace_miss_pid.store(u64::from(pid), Ordering::Relaxed);
    }
    // Release: the engine that sees the flag (Acquire) sees the words
    // above.
    ctl.trace_miss.store(1, Ordering::Release);
}

fn tag_seq(m: &Message) -> (u64, u64) {
    m.value::<[u64; 2]>().map_or((0, 0), |v| (v[0], v[1]))
}

fn tag_of(m: &Message) -> u64 {
    tag_seq(m).0
}

/// Whether publishers wake receivers through [`crate::notify`] (not the
/// channel's futex word) with `mech`.
fn notified(mech: Mechanism) -> bool {
    matches!(
        mech,
        Mechanism::Eventfd | Mechanism::Signalfd | Mechanism::MsgRing
    )
}

/// Drains `sub`, recording each message's delivery latency.
fn drain(sub: &mut controller::channel::Subscriber, h: &Histogram, only: Option<u64>, seen: Seen) {
    loop {
        let m = match sub.next_message() {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(controller::channel::ChannelFault::Truncated) => break,
            // Counted by the subscriber; it has resynchronised to the
            // index, so reading on is bounded.
            Err(_) => continue,
        };
        let now = monotonic_ns();
        if tag_of(&m) != TAG_STOP {
            record_message(h, now.saturating_sub(m.send_time_ns), &m, only, seen);
        }
    }
}

/// Receives on `ch` woken by `mech` until `stop()` is true, recording each
/// message's delivery latency (send time -> handler start) into `h`.
/// `ready` runs once the first wait is armed.
///
/// The runtime's backends and the one-word reference run the runtime's
/// own event loop (with that backend forced, in wake class `class`); the
/// plain futex uses the channel's blocking wait; eventfd and signalfd
/// block in their [`Waiter`], whose address is published in `cell` for
/// the publishers, then drain the channel.
#[allow(clippy::too_many_arguments)]
fn receive(
    mech: Mechanism,
    class: controller::WakeClass,
    ch: &Channel,
    proc_root: &Path,
    h: &'static Histogram,
    only: Option<u64>,
    cell: &AddressCell,
    seen: Seen,
    stop: impl Fn() -> bool + 'static,
    ready: impl FnOnce() + 'static,
) -> Result<(), WorkerRunError> {
    match mech {
        Mechanism::IoUringFutex
        | Mechanism::FutexWaitv
        | Mechanism::Doorbell
        | Mechanism::IoUringShared => {
            let backend = mech.backend().unwrap_or(Backend::Doorbell);
            let mut lp = EventLoop::new(LoopOptions {
                backend: Some(backend),
                timing: None,
                proc_root: proc_root.into(),
                // As a controller under the supervisor would run it.
                wake_check: LoopOptions::from_env().wake_check,
                class,
                ..LoopOptions::default()
            })
            .map_err(|source| WorkerRunError::Loop {
                mechanism: mech,
                source,
            })?;
            // No timer on the real-time loop: the engine publishes a
            // TAG_STOP message after raising a stop word.
            lp.watch_raw(ch, move |ctx, m| {
                let tag = tag_of(m);
                if tag == TAG_STOP {
                    if stop() {
                        ctx.exit();
                    }
                    return;
                }
                record_message(h, ctx.latency().as_nanos() as u64, m, only, seen)
            })
            .map_err(WorkerRunError::Watch)?;
            let mut ready = Some(ready);
            lp.on_run(move |_| {
                if let Some(r) = ready.take() {
                    r();
                }
            });
            let r = lp.run().map_err(|source| WorkerRunError::LoopRun {
                mechanism: mech,
                source,
            });
            if let Some(shared) = seen {
                let healed: u64 = lp.report_now().entries.iter().map(|e| e.healed).sum();
                // SeqCst: read by the engine after it reaped this process.
                shared.control().rt_healed.store(healed, Ordering::SeqCst);
            }
            r
        }
        Mechanism::Futex => {
            let mut sub = ch.subscriber(proc_root).map_err(WorkerRunError::Attach)?;
            sub.skip_to_end();
            ready();
            while !stop() {
                sub.wait(Some(Duration::from_nanos(WAIT_SLICE_NS)));
                drain(&mut sub, h, only, seen);
            }
            // Everything published before the stop request.
            drain(&mut sub, h, only, seen);
            Ok(())
        }
        Mechanism::Eventfd | Mechanism::Signalfd | Mechanism::MsgRing => {
            let mut sub = ch.subscriber(proc_root).map_err(WorkerRunError::Attach)?;
            let waiter = match mech {
                Mechanism::Eventfd => Waiter::eventfd(),
                Mechanism::MsgRing => Waiter::msg_ring(),
                _ => Waiter::signal(check_signal()),
            }
            .map_err(|source| WorkerRunError::Waiter {
                mechanism: mech,
                source,
            })?;
            // No futex wait is ever armed (`begin_wait` is not called), so
            // publishers make no futex wake: the mechanism is the only wake.
            sub.skip_to_end();
            let gen = cell.publish(&waiter.address());
            ready();
            // Blocking waits without a timeout: the engine notifies every
            // filled cell after raising a stop word (and the counter or
            // the signal queue keeps a notification that arrives before
            // the wait).
            let r = loop {
                if stop() {
                    drain(&mut sub, h, only, seen);
                    break Ok(());
                }
                if let Err(source) = waiter.wait() {
                    break Err(WorkerRunError::Wait {
                        mechanism: mech,
                        source,
                    });
                }
                drain(&mut sub, h, only, seen);
            };
            cell.clear(gen);
            r
        }
        Mechanism::Pipe => Err(WorkerRunError::Unavailable {
            mechanism: mech,
            reason: MechanismUnavailableError::NotDriven { mechanism: mech },
        }),
    }
}

/// Opens the shared file for the life of the process (handlers of the
/// event loop need `'static` references into it; the process exits when
/// the role ends).
fn shared_static(a: &Args) -> Result<&'static Shared, WorkerRunError> {
    Ok(Box::leak(Box::new(a.shared()?)))
}

fn rt_recv(a: &Args) -> Result<(), WorkerRunError> {
    let shared = shared_static(a)?;
    let ctl = shared.control();
    let mech = a.mech()?;
    mechanism_availability(mech).map_err(|reason| WorkerRunError::Unavailable {
        mechanism: mech,
        reason,
    })?;
    rt_setup(ctl, a, Some(a.u64("priority")? as u32))?;
    if let Some(dir) = a.opt_path("trace") {
        let on = open_tracing_on(&dir)?;
        let _ = RECV_TRACE.set(RecvTrace {
            marker: TraceMarker::open(&dir),
            on,
            miss_ns: a.u64("miss_ns")?,
            ctl,
        });
    }
    let ch = open_channel(a)?;
    let h = shared.hist(mech, H_DELIVERY);
    receive(
        mech,
        mech.classes().0,
        &ch,
        &a.path("proc")?,
        h,
        Some(TAG_RT),
        &ctl.cells[RT_CELL],
        Some(shared),
        // SeqCst: raised by the engine after the sender exited; whoever
        // sees it has every real-time message before it in the channel.
        move || ctl.rt_recv_stop.load(Ordering::SeqCst) != 0,
        // Release: the subscription is in place before the sender's first
        // message (its Acquire load of this word).
        move || ctl.receiver_ready.store(1, Ordering::Release),
    )?;
    if ctl.rt_recv_stop.load(Ordering::SeqCst) == 0 {
        return Err(WorkerRunError::StoppedEarly { mechanism: mech });
    }
    // SeqCst: read by the engine after it reaped this process.
    ctl.rt_recv_done.store(1, Ordering::SeqCst);
    Ok(())
}

fn low(a: &Args) -> Result<(), WorkerRunError> {
    let shared = shared_static(a)?;
    let ctl = shared.control();
    let mech = a.mech()?;
    let slot = a.index("slot", MAX_LOW)?;
    let gen = a.u64("gen")?;
    rt_setup(ctl, a, None)?;
    ctl.low_started.fetch_add(1, Ordering::Relaxed); // a statistic
    let ch = open_channel(a)?;
    let proc_root = a.path("proc")?;
    let period = a.u64("period_ns")?.max(1);
    let running = move || {
        // Relaxed: stop requests; see rt_send.
        ctl.stop_all.load(Ordering::Relaxed) == 0
            && ctl.low_gen[slot].load(Ordering::Relaxed) == gen
    };
    let cell = a.index("cell", CELLS)?;
    let mut publisher = ch
        .publisher_as(mech.classes().1, &proc_root)
        .map_err(WorkerRunError::Attach)?;
    let mut peers = notified(mech).then(|| Peers::new(CELLS));
    let publisher_thread = std::thread::Builder::new()
        .name("rtd-low-pub".into())
        .spawn(move || {
            let mut seq = 0u64;
            let mut next = monotonic_ns() + period;
            while running() {
                sleep_until(Monotonic::from_nanos(next));
                if let Some(p) = peers.as_mut() {
                    p.refresh(&ctl.cells);
                    let before = p.failed();
                    let _ = publisher.publish_value(&[TAG_LOW, seq]);
                    p.notify_all();
                    count_notify_failures(ctl, p, before);
                } else {
                    let _ = publisher.publish_value(&[TAG_LOW, seq]);
                }
                seq += 1;
                next += period;
                let now = monotonic_ns();
                if now > next {
                    next += ((now - next) / period + 1) * period;
                }
            }
        })
        .map_err(WorkerRunError::Thread)?;
    let h = shared.hist(mech, H_LOW_DELIVERY);
    let r = receive(
        mech,
        mech.classes().1,
        &ch,
        &proc_root,
        h,
        None,
        &ctl.cells[cell],
        None,
        move || !running(),
        || {},
    );
    let _ = publisher_thread.join();
    r
}

/// A small xorshift generator (no allocation, no dependency).
struct Rng(u64);
impl Rng {
    fn new() -> Rng {
        Rng(monotonic_ns() ^ ((std::process::id() as u64) << 32) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Log-uniform in `[lo, hi]`, so short and long bursts both happen.
    fn log_between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        let f = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        let (l, h) = ((lo.max(1)) as f64, hi as f64);
        (l * (h / l).powf(f)) as u64
    }
}

/// Timer latency on one isolated CPU, cyclictest-style, in a process of
/// its own: it can join the cgroup of its CPU, which a thread of the
/// engine (a supervisor pinned to housekeeping CPUs) cannot.
fn timer(a: &Args) -> Result<(), WorkerRunError> {
    let shared = shared_static(a)?;
    let ctl = shared.control();
    let slot = a.index("slot", MAX_TIMERS)?;
    let cpus = a.cpus("cpu")?;
    // A CPU the cgroup or the affinity refuses is reported, not fatal:
    // the report says the figures were not taken there.
    let _ = controller::rt::join_cgroup_holding(&a.path("sys")?, &cpus);
    if units::sched::set_affinity(0, &cpus).is_ok() {
        ctl.timer_pinned.fetch_or(1 << slot, Ordering::SeqCst);
    }
    let _ = rt::lock_memory();
    if rt::set_fifo(a.u64("priority")? as u32).unwrap_or(false) {
        ctl.timer_fifo.fetch_or(1 << slot, Ordering::SeqCst);
    }
    let h = shared.timer_hist(slot);
    let trace = match a.opt_path("trace") {
        Some(dir) => Some(TimerTrace::open(&dir, a.u64("miss_ns")?, slot, ctl)?),
        None => None,
    };
    // Relaxed: stop requests; the engine reads the histogram after this
    // process exited (waitpid orders it).
    crate::timer::measure(
        h,
        a.u64("period_ns")?,
        || ctl.timer_stop.load(Ordering::Relaxed) != 0 || ctl.stop_all.load(Ordering::Relaxed) != 0,
        |n, deadline, now| {
            if let Some(t) = &trace {
                t.woke(n, deadline, now);
            }
        },
    );
    Ok(())
}

/// A timer worker's side of tracing: on a wake over `miss_ns` it marks
/// the miss and stops the instance at once, as the real-time receiver
/// does for a message; nothing is written on a wake in time.
struct TimerTrace {
    marker: Option<TraceMarker>,
    on: std::fs::File,
    miss_ns: u64,
    slot: usize,
    ctl: &'static Control,
}

impl TimerTrace {
    fn open(
        dir: &Path,
        miss_ns: u64,
        slot: usize,
        ctl: &'static Control,
    ) -> Result<TimerTrace, WorkerRunError> {
        let on = open_tracing_on(dir)?;
        Ok(TimerTrace {
            marker: TraceMarker::open(dir),
            on,
            miss_ns,
            slot,
            ctl,
        })
    }

    fn woke(&self, n: u64, deadline: u64, now: u64) {
        if now.saturating_sub(deadline) <= self.miss_ns {
            return;
        }
        let ctl = self.ctl;
        ctl.trace_timer_over.fetch_add(1, Ordering::Relaxed); // a statistic
                                                              // Relaxed: a hint; the compare-exchange in stop_on_miss decides.
        if ctl.trace_armed.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Some(m) = &self.marker {
            m.mark("timer", n, now);
        }
        let me = Some((self.slot, std::process::id()));
        stop_on_miss(ctl, &self.on, n, deadline, now, me);
    }
}

fn burst(a: &Args) -> Result<(), WorkerRunError> {
    let shared = a.shared()?;
    let ctl = shared.control();
    rt_setup(ctl, a, Some(a.u64("priority")? as u32))?;
    let (lo, hi) = (a.u64("min_ns")?, a.u64("max_ns")?);
    let mut rng = Rng::new();
    // Relaxed: a stop request, see rt_send.
    while ctl.stop_all.load(Ordering::Relaxed) == 0 {
        let busy = rng.log_between(lo, hi);
        let end = monotonic_ns() + busy;
        while monotonic_ns() < end {
            std::hint::spin_loop();
        }
        // An idle gap of the same distribution: about half the CPU.
        let gap = rng.log_between(lo, hi);
        sleep_until(Monotonic::now() + Duration::from_nanos(gap));
    }
    Ok(())
}

fn hog(a: &Args) -> Result<(), WorkerRunError> {
    let shared = a.shared()?;
    let ctl = shared.control();
    rt_setup(ctl, a, None)?;
    let mut x = 1u64;
    // Relaxed: a stop request, see rt_send.
    while ctl.stop_all.load(Ordering::Relaxed) == 0 {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    Ok(())
}

fn io_writer(a: &Args) -> Result<(), WorkerRunError> {
    let shared = a.shared()?;
    let ctl = shared.control();
    rt_setup(ctl, a, None)?;
    let dir = a.path("dir")?;
    let path = dir.join(format!("io-{}", std::process::id()));
    let file_err = |what: &'static str| {
        let path = path.clone();
        move |source| WorkerRunError::File { what, path, source }
    };
    let buf = vec![0x5au8; 64 << 10];
    let mut f = std::fs::File::create(&path).map_err(file_err("create"))?;
    let mut written = 0u64;
    // Relaxed: a stop request, see rt_send.
    while ctl.stop_all.load(Ordering::Relaxed) == 0 {
        f.write_all(&buf).map_err(file_err("write"))?;
        f.sync_data().map_err(file_err("fsync"))?;
        written += buf.len() as u64;
        if written >= 16 << 20 {
            f.set_len(0).map_err(file_err("truncate"))?;
            use std::io::Seek;
            f.rewind().map_err(file_err("rewind"))?;
            written = 0;
        }
    }
    drop(f);
    let _ = std::fs::remove_file(&path);
    Ok(())
}

/// Names the calling thread (its comm: at most 15 bytes are kept).
fn name_thread(name: &str) {
    let mut buf = [0u8; 16];
    let n = name.len().min(15);
    buf[..n].copy_from_slice(&name.as_bytes()[..n]);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16
    // bytes from the buffer, which outlives the call.
    unsafe { libc::prctl(libc::PR_SET_NAME, buf.as_ptr()) };
}

/// The census's hammer: `threads=N` threads on the housekeeping CPUs, each
/// calling `FUTEX_WAKE` on the channel's best-effort word in a tight loop
/// until the engine moves `hammer_gen` on. With the one-word reference the
/// real-time pair waits and wakes on that very word: on PREEMPT_RT its
/// bucket lock is then the letter's contended lock. The runtime's
/// real-time path never touches it.
fn hammer(a: &Args) -> Result<(), WorkerRunError> {
    let shared = shared_static(a)?;
    let ctl = shared.control();
    rt_setup(ctl, a, None)?;
    let gen = a.u64("gen")?;
    let threads = a.u64("threads")?.clamp(1, 16);
    let ch = open_channel(a)?;
    let running = move || {
        // Relaxed: stop requests; see rt_send.
        ctl.stop_all.load(Ordering::Relaxed) == 0 && ctl.hammer_gen.load(Ordering::Relaxed) == gen
    };
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let ch = ch.clone();
            std::thread::Builder::new()
                .name("rtd-hammer".into())
                .spawn(move || {
                    while running() {
                        for _ in 0..256 {
                            let _ = ch.wake_best_effort_waiters();
                        }
                    }
                })
                .map_err(WorkerRunError::Thread)
        })
        .collect::<Result<_, _>>()?;
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

fn gettid() -> u32 {
    // SAFETY: no arguments; cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// `FUTEX_LOCK_PI` / `FUTEX_UNLOCK_PI` (shared) on the low word of `w`.
fn futex_pi(w: &AtomicU64, op: i32) -> i64 {
    let word = crate::futex::low_word_ptr(w);
    // SAFETY: the kernel reads and writes the 32-bit word, which lives in
    // the shared control file this process maps for its whole life.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word,
            op,
            0,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    }
}

/// Takes the PI lock: the fast path claims a free word with our tid, else
/// the kernel queues us (and boosts the holder).
fn pi_lock(w: &AtomicU64, tid: u32) {
    // SeqCst: a lock word shared with the kernel's PI protocol.
    if w.compare_exchange(0, tid as u64, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        futex_pi(w, libc::FUTEX_LOCK_PI);
    }
}

fn pi_unlock(w: &AtomicU64, tid: u32) {
    if w.compare_exchange(tid as u64, 0, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        // FUTEX_WAITERS set: the kernel hands the lock on.
        futex_pi(w, libc::FUTEX_UNLOCK_PI);
    }
}

/// The positive control's holder (best-effort, on the housekeeping CPUs):
/// takes the PI lock, holds it for `hold_ns` busy, releases it, pauses as
/// long, until `rt_stop`.
fn pi_hold(a: &Args) -> Result<(), WorkerRunError> {
    let shared = a.shared()?;
    let ctl = shared.control();
    rt_setup(ctl, a, None)?;
    let hold = a.u64("hold_ns")?.clamp(1_000, 1_000_000_000);
    let tid = gettid();
    // Relaxed: a stop request; see rt_send.
    while ctl.rt_stop.load(Ordering::Relaxed) == 0 {
        pi_lock(&ctl.pi_word, tid);
        let end = monotonic_ns() + hold;
        while monotonic_ns() < end {
            std::hint::spin_loop();
        }
        pi_unlock(&ctl.pi_word, tid);
        sleep_until(Monotonic::now() + Duration::from_nanos(hold));
    }
    Ok(())
}

/// The positive control's waiter (SCHED_FIFO on an isolated CPU): every
/// `period_ns`, locks the PI futex the holder has most of the time (so the
/// kernel boosts the holder to this priority) and unlocks it.
fn rt_pi(a: &Args) -> Result<(), WorkerRunError> {
    let shared = a.shared()?;
    let ctl = shared.control();
    rt_setup(ctl, a, Some(a.u64("priority")? as u32))?;
    let period = a.u64("period_ns")?.clamp(1_000, 1_000_000_000);
    let tid = gettid();
    while ctl.rt_stop.load(Ordering::Relaxed) == 0 {
        sleep_until(Monotonic::now() + Duration::from_nanos(period));
        pi_lock(&ctl.pi_word, tid);
        pi_unlock(&ctl.pi_word, tid);
        // SeqCst: read by the engine, which ends the phase by it.
        ctl.pi_cycles.fetch_add(1, Ordering::SeqCst);
    }
    Ok(())
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
