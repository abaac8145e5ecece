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

/// Settings of the wake benchmark.
#[derive(Debug, Clone)]
pub struct WakeOptions {
    /// Samples per mechanism (after a short warm-up).
    pub samples: u32,
    /// The sender's period.
    pub period: Duration,
    pub mechanisms: Vec<Mechanism>,
    /// Mechanisms are measured in this many interleaved rounds, so slow
    /// drifts of the machine hit all of them alike.
    pub rounds: u32,
    /// CPUs for sender and receiver; `None` picks the last two allowed.
    pub sender_cpu: Option<usize>,
    pub receiver_cpu: Option<usize>,
    /// SCHED_FIFO priority for both; `None` keeps the current policy.
    pub priority: Option<u32>,
    /// Normally `/dev/cpu_dma_latency`.
    pub dma_latency: PathBuf,
    /// A directory for the benchmark's channel file (e.g. a temp dir under
    /// `<prefix>/dev/shm/rtdeploy`).
    pub shm_dir: PathBuf,
    /// Normally `/proc`.
    pub proc_root: PathBuf,
}

impl WakeOptions {
    pub fn new(shm_dir: &Path) -> WakeOptions {
        WakeOptions {
            samples: 10_000,
            period: Duration::from_micros(200),
            mechanisms: Mechanism::ALL.to_vec(),
            rounds: 5,
            sender_cpu: None,
            receiver_cpu: None,
            priority: Some(80),
            dma_latency: PathBuf::from("/dev/cpu_dma_latency"),
            shm_dir: shm_dir.into(),
            proc_root: PathBuf::from("/proc"),
        }
    }
}

/// What was in force during a run.
#[derive(Debug, Clone, Serialize)]
pub struct BenchSettings {
    pub kernel: String,
    /// e.g. `SCHED_FIFO 80`, or why not.
    pub scheduling: String,
    pub sender_cpu: Option<usize>,
    pub receiver_cpu: Option<usize>,
    /// e.g. `held at 0us`, or why not.
    pub cpu_dma_latency: String,
    pub period_ns: u64,
    pub samples_per_mechanism: u32,
    pub rounds: u32,
}

/// Latency figures of one mechanism, nanoseconds.
#[derive(Debug, Clone, Serialize)]
pub struct LatencySummary {
    pub mechanism: String,
    pub count: u64,
    pub min_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    pub over_100us: u64,
    pub over_1ms: u64,
    /// Wakes that found more than one send (the receiver was late by
    /// more than a period); each still counts once, from the newest stamp.
    pub coalesced: u64,
    /// Why the mechanism was not measured, if it was not.
    pub skipped: Option<String>,
}

impl LatencySummary {
    fn from_samples(mechanism: &str, mut v: Vec<u64>, coalesced: u64) -> LatencySummary {
        v.sort_unstable();
        let q = |p: f64| -> u64 {
            if v.is_empty() {
                return 0;
            }
            let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
            v[i]
        };
        LatencySummary {
            mechanism: mechanism.into(),
            count: v.len() as u64,
            min_ns: v.first().copied().unwrap_or(0),
            p50_ns: q(0.5),
            p99_ns: q(0.99),
            p999_ns: q(0.999),
            max_ns: v.last().copied().unwrap_or(0),
            over_100us: v.iter().filter(|&&x| x > 100_000).count() as u64,
            over_1ms: v.iter().filter(|&&x| x > 1_000_000).count() as u64,
            coalesced,
            skipped: None,
        }
    }
    fn skipped(mechanism: &str, why: String) -> LatencySummary {
        let mut s = LatencySummary::from_samples(mechanism, Vec::new(), 0);
        s.skipped = Some(why);
        s
    }
}

/// The wake benchmark's result.
#[derive(Debug, Clone, Serialize)]
pub struct WakeReport {
    pub settings: BenchSettings,
    pub results: Vec<LatencySummary>,
    /// Each mechanism's p50 over the one-word reference's (io_uring_shared),
    /// per round, with the reference's A/A floor (see [`crate::harness`]);
    /// empty when the reference did not run.
    pub ratios: Vec<crate::harness::Ratio>,
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

impl WakeReport {
    /// A text table (microseconds).
    pub fn table(&self) -> String {
        let s = &self.settings;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "wake latency, one way between processes: kernel {}, {}, sender CPU {}, receiver CPU {}, cpu_dma_latency {}, period {}us, {} samples per mechanism in {} interleaved rounds",
            s.kernel,
            s.scheduling,
            s.sender_cpu.map_or("any".into(), |c| c.to_string()),
            s.receiver_cpu.map_or("any".into(), |c| c.to_string()),
            s.cpu_dma_latency,
            s.period_ns / 1000,
            s.samples_per_mechanism,
            s.rounds
        );
        let _ = writeln!(
            out,
            "(io_uring futex (armed), futex_waitv and doorbell are this runtime's event loop on its io_uring-futex, futex_waitv and doorbell backends; futex is a bare FUTEX_WAIT/FUTEX_WAKE pair, the floor; microseconds)"
        );
        let _ = writeln!(
            out,
            "{:<22} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8} {:>9}",
            "mechanism",
            "count",
            "min",
            "p50",
            "p99",
            "p99.9",
            "max",
            ">100us",
            ">1ms",
            "coalesced"
        );
        for r in &self.results {
            let label = Mechanism::parse(&r.mechanism).map_or(r.mechanism.as_str(), |m| m.label());
            if let Some(why) = &r.skipped {
                let _ = writeln!(out, "{label:<22} skipped: {why}");
                continue;
            }
            let _ = writeln!(
                out,
                "{:<22} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8} {:>9}",
                label,
                r.count,
                us(r.min_ns),
                us(r.p50_ns),
                us(r.p99_ns),
                us(r.p999_ns),
                us(r.max_ns),
                r.over_100us,
                r.over_1ms,
                r.coalesced
            );
        }
        for r in &self.ratios {
            let _ = writeln!(out, "{}", r.line());
        }
        out
    }
}

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

/// Shared between sender and receiver: an anonymous shared mapping.
#[repr(C)]
struct Shared {
    /// The futex word of the raw futex mechanism (low 32 bits).
    word: AtomicU64,
    /// Sends so far; send `k` (from 1) stamped `stamps[k % STAMPS]`.
    seq: AtomicU64,
    /// Set by the receiver when it has all its samples.
    done: AtomicU64,
    _pad: AtomicU64,
    stamps: [AtomicU64; STAMPS],
}

const STAMPS: usize = 1024;
const SHARED_BYTES: usize = 16384;
const _: () = assert!(std::mem::size_of::<Shared>() <= SHARED_BYTES);

impl Shared {
    /// Sender: stamps send `k` and publishes it.
    fn stamp(&self, k: u64) {
        self.stamps[k as usize % STAMPS].store(monotonic_ns(), Ordering::Relaxed);
        // Release: the stamp is visible to a receiver that sees seq >= k.
        self.seq.store(k, Ordering::Release);
    }
}

/// Receiver side: every send is one sample, from its own stamp to the
/// wake that delivered it; sends found by a wake that also found a later
/// one count as coalesced (the receiver was late by over a period).
struct Samples {
    lat: Vec<u64>,
    seen: u64,
    coalesced: u64,
}

impl Samples {
    fn take_upto(&mut self, shared: &Shared, now: u64, upto: u64) {
        while self.seen < upto {
            self.seen += 1;
            let t = shared.stamps[self.seen as usize % STAMPS].load(Ordering::Relaxed);
            if self.seen < upto {
                self.coalesced += 1;
            }
            self.lat.push(now.saturating_sub(t));
        }
    }
}

struct SharedMap(*mut Shared);

impl SharedMap {
    fn new() -> Result<SharedMap, BenchRunError> {
        // SAFETY: a fresh anonymous shared mapping; checked for failure.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SHARED_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(sys_err("mmap"));
        }
        Ok(SharedMap(p as *mut Shared))
    }
    fn get(&self) -> &Shared {
        // SAFETY: the mapping is SHARED_BYTES zeroed bytes (a valid Shared:
        // all atomics), page aligned, alive as long as `self`.
        unsafe { &*self.0 }
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: unmaps what `new` mapped.
        unsafe { libc::munmap(self.0 as *mut libc::c_void, SHARED_BYTES) };
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

fn pick_cpus(opts: &WakeOptions) -> (Option<usize>, Option<usize>) {
    let cpus: Vec<usize> = rt::sched_state()
        .map(|s| s.cpus.iter().map(|c| c as usize).collect())
        .unwrap_or_default();
    let n = cpus.len();
    let s = opts
        .sender_cpu
        .or(if n >= 2 { Some(cpus[n - 2]) } else { None });
    let r = opts.receiver_cpu.or(cpus.last().copied());
    (s, r)
}

/// Measures one-way wake latency for each mechanism in `opts`.
pub fn wake(opts: &WakeOptions) -> Result<WakeReport, BenchRunError> {
    let (sender_cpu, receiver_cpu) = pick_cpus(opts);
    let _restore = SchedRestore(rt::sched_state().ok());
    let scheduling = match opts.priority {
        Some(p) => match set_fifo(p) {
            Ok(()) => format!("SCHED_FIFO {p}"),
            Err(e) => format!("SCHED_OTHER (SCHED_FIFO refused: {})", Chain(&e)),
        },
        None => "inherited policy".into(),
    };
    let fifo = scheduling.starts_with("SCHED_FIFO");
    if let Some(c) = receiver_cpu {
        let _ = pin_to(c);
    }
    let (_dma, dma_text) = hold_dma_latency(&opts.dma_latency);
    let p = probe();
    let settings = BenchSettings {
        kernel: p.kernel.clone(),
        scheduling,
        sender_cpu,
        receiver_cpu,
        cpu_dma_latency: dma_text,
        period_ns: opts.period.as_nanos() as u64,
        samples_per_mechanism: opts.samples,
        rounds: opts.rounds.max(1),
    };
    let child_sched = SenderSched {
        cpus: sender_cpu.and_then(|c| CpuSet::from_indices([c]).ok()),
        fifo: if fifo { opts.priority } else { None },
    };
    let rounds = opts.rounds.max(1);
    let per_round = opts.samples.div_ceil(rounds);
    // The arms: every mechanism, and the one-word reference a second time
    // (the A/A floor) when it is measured.
    let mut arms: Vec<Mechanism> = opts.mechanisms.clone();
    let reference = arms.iter().position(|&m| m == Mechanism::IoUringShared);
    if let Some(r) = reference {
        arms.push(arms[r]);
    }
    let mut all: Vec<(Vec<u64>, u64, Option<String>)> =
        arms.iter().map(|_| (Vec::new(), 0, None)).collect();
    let mut p50s: Vec<crate::harness::Arm> = arms
        .iter()
        .enumerate()
        .map(|(k, m)| crate::harness::Arm {
            name: if k >= opts.mechanisms.len() {
                format!("{} (A/A)", m.short())
            } else {
                m.short().to_string()
            },
            rounds: vec![None; rounds as usize],
        })
        .collect();
    for round in 0..rounds as usize {
        for k in crate::harness::order(arms.len(), round) {
            let m = arms[k];
            if all[k].2.is_some() {
                continue;
            }
            let skip = match m {
                Mechanism::IoUringFutex | Mechanism::IoUringShared if !p.io_uring_futex => {
                    p.io_uring_problem.clone()
                }
                Mechanism::FutexWaitv if !p.futex_waitv => {
                    Some("kernel lacks futex_waitv (5.16+)".into())
                }
                Mechanism::MsgRing => crate::notify::probe_msg_ring()
                    .err()
                    .map(|e| format!("no io_uring MSG_RING wake here (5.18+): {e}")),
                _ => None,
            };
            if let Some(why) = skip {
                all[k].2 = Some(why);
                continue;
            }
            let (v, coalesced) = run_one(m, per_round, opts, &child_sched)?;
            p50s[k].rounds[round] = (!v.is_empty())
                .then(|| LatencySummary::from_samples("", v.clone(), 0).p50_ns as f64);
            all[k].0.extend(v);
            all[k].1 += coalesced;
        }
    }
    let mut ratios = vec![];
    if let Some(r) = reference {
        let aa = p50s.last();
        for (k, arm) in p50s.iter().enumerate().take(opts.mechanisms.len()) {
            if k != r {
                ratios.extend(crate::harness::Ratio::of("wake p50", arm, &p50s[r], aa));
            }
        }
    }
    let results = arms
        .iter()
        .zip(all)
        .zip(&p50s)
        .map(|((_, (v, c, skip)), arm)| match skip {
            Some(why) => LatencySummary::skipped(&arm.name, why),
            None => LatencySummary::from_samples(&arm.name, v, c),
        })
        .collect();
    Ok(WakeReport {
        settings,
        results,
        ratios,
    })
}

struct SenderSched {
    /// Built before the fork: the child allocates nothing.
    cpus: Option<CpuSet>,
    fifo: Option<u32>,
}

const WARMUP: u32 = 20;

/// Forks the sender: `send(i)` is called every period until the receiver
/// says done (or a generous cap passes). Only async-signal-safe work
/// happens in the child.
fn fork_sender(
    shared: &Shared,
    opts: &WakeOptions,
    placement: &SenderSched,
    expected: u32,
    mut send: impl FnMut(u64),
) -> Result<libc::pid_t, BenchRunError> {
    let period = opts.period.as_nanos() as u64;
    // SAFETY: fork has no memory-safety preconditions; the child below
    // only uses syscalls, atomics on shared memory and `send` (which
    // only does the same), then _exit without running destructors.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(sys_err("fork"));
    }
    if pid > 0 {
        return Ok(pid);
    }
    // Child: units::sched makes its calls on its own stack and
    // allocates nothing.
    if let Some(cpus) = &placement.cpus {
        let _ = sched::set_affinity(0, cpus);
    }
    if let Some(p) = placement.fifo {
        let _ = set_fifo(p);
    }
    let cap = (expected as u64 + WARMUP as u64) * 4 + 5_000_000_000 / period.max(1);
    let mut next = monotonic_ns() + 2_000_000; // let the receiver go to sleep
    let mut i = 0u64;
    while shared.done.load(Ordering::Acquire) == 0 && i < cap {
        sleep_until(Monotonic::from_nanos(next));
        next += period;
        send(i);
        i += 1;
    }
    // SAFETY: ends the child without unwinding or running destructors of
    // state duplicated from the parent.
    unsafe { libc::_exit(0) }
}

fn reap(pid: libc::pid_t, m: Mechanism) -> Result<(), BenchRunError> {
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is valid.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else {
        Err(BenchRunError::Child {
            mechanism: m.short(),
            status,
        })
    }
}

fn run_one(
    m: Mechanism,
    n: u32,
    opts: &WakeOptions,
    sched: &SenderSched,
) -> Result<(Vec<u64>, u64), BenchRunError> {
    let map = SharedMap::new()?;
    let shared = map.get();
    let total = n + WARMUP;
    let mut smp = Samples {
        lat: Vec::with_capacity(total as usize + 64),
        seen: 0,
        coalesced: 0,
    };
    match m {
        Mechanism::IoUringFutex
        | Mechanism::FutexWaitv
        | Mechanism::Doorbell
        | Mechanism::IoUringShared => {
            let dir = bench_dir(&opts.shm_dir)?;
            let geom = ChannelGeometry::new(64, 1024, 2);
            let ch = channel_for(dir.path(), "/bench/wake", &geom, &opts.proc_root)?;
            // The real-time pair's class for the runtime's backends (its
            // own word or bell), one class for the one-word reference.
            let (class, _) = m.classes();
            let mut publisher = publisher_for(&ch, dir.path(), &opts.proc_root, class)?;
            let mut lp = EventLoop::new(LoopOptions {
                backend: m.backend(),
                proc_root: opts.proc_root.clone(),
                class,
                ..LoopOptions::default()
            })
            .map_err(BenchRunError::LoopCreate)?;
            // Every message counts, each from its own send time (a late
            // wake that finds several is charged for all of them).
            let samples = Rc::new(RefCell::new(Vec::with_capacity(total as usize)));
            let s2 = samples.clone();
            let mut got = 0u32;
            lp.watch_raw(&ch, move |ctx, msg| {
                s2.borrow_mut().push(ctx.latency().as_nanos() as u64);
                if msg.lost_before > 0 {
                    got += msg.lost_before as u32;
                }
                got += 1;
                if got >= total {
                    ctx.exit();
                }
            })
            .map_err(BenchRunError::LoopWatch)?;
            let pid = fork_sender(shared, opts, sched, n, |i| {
                let _ = publisher.publish(&i.to_ne_bytes());
            })?;
            let r = lp.run().map_err(BenchRunError::LoopRun);
            shared.done.store(1, Ordering::Release);
            reap(pid, m)?;
            r?;
            drop(lp);
            let v = samples.borrow();
            return Ok((
                v.iter()
                    .take(total as usize)
                    .skip(WARMUP as usize)
                    .copied()
                    .collect(),
                0,
            ));
        }
        Mechanism::Futex => {
            let pid = fork_sender(shared, opts, sched, n, |i| {
                shared.stamp(i + 1);
                shared.word.fetch_add(1, Ordering::SeqCst);
                let _ = futex::wake_all(&shared.word);
            })?;
            let mut seen_word = 0u64;
            while smp.lat.len() < total as usize {
                loop {
                    let w = shared.word.load(Ordering::SeqCst);
                    if w != seen_word {
                        seen_word = w;
                        break;
                    }
                    let _ = futex::wait(&shared.word, w as u32, Some(1_000_000_000));
                }
                let now = monotonic_ns();
                smp.take_upto(shared, now, shared.seq.load(Ordering::Acquire));
            }
            shared.done.store(1, Ordering::Release);
            reap(pid, m)?;
        }
        Mechanism::Eventfd | Mechanism::MsgRing => {
            let (waiter, what) = if m == Mechanism::Eventfd {
                (Waiter::eventfd(), "eventfd")
            } else {
                (Waiter::msg_ring(), "io_uring MSG_RING")
            };
            let waiter = waiter.map_err(|e| sys_err_from(what, e))?;
            let notifier = Notifier::connect(&waiter.address())
                .map_err(|e| sys_err_from("notifier connect", e))?;
            let pid = fork_sender(shared, opts, sched, n, |i| {
                shared.stamp(i + 1);
                let _ = notifier.notify();
            })?;
            while smp.lat.len() < total as usize {
                // The counter (eventfd) or the completions (MSG_RING):
                // the number of sends since the last wait.
                let r = waiter.wait();
                let now = monotonic_ns();
                let Ok(k) = r else { break };
                let upto = smp.seen + k;
                smp.take_upto(shared, now, upto);
            }
            shared.done.store(1, Ordering::Release);
            reap(pid, m)?;
        }
        Mechanism::Pipe => {
            let mut fds = [0i32; 2];
            // SAFETY: `fds` has room for two fds.
            if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                return Err(sys_err("pipe2"));
            }
            // SAFETY: fresh fds we own.
            let (rfd, wfd) =
                unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
            let w = wfd.as_raw_fd();
            let pid = fork_sender(shared, opts, sched, n, |i| {
                shared.stamp(i + 1);
                let k = i + 1;
                // SAFETY: writes 8 bytes from a valid u64 to our pipe.
                unsafe { libc::write(w, &k as *const u64 as *const libc::c_void, 8) };
            })?;
            drop(wfd);
            while smp.lat.len() < total as usize {
                let mut k = 0u64;
                // SAFETY: reads 8 bytes into a valid u64.
                let r = unsafe {
                    libc::read(rfd.as_raw_fd(), &mut k as *mut u64 as *mut libc::c_void, 8)
                };
                let now = monotonic_ns();
                if r != 8 {
                    break;
                }
                // Later sends already in the pipe are read (and timed) on
                // the next reads: charge them as found by this wake.
                let upto = k.max(smp.seen + 1);
                smp.take_upto(shared, now, upto);
            }
            shared.done.store(1, Ordering::Release);
            // Closing the read end ends a sender blocked on a full pipe.
            drop(rfd);
            reap(pid, m)?;
        }
        Mechanism::Signalfd => {
            // Blocked in this thread only; the sender queues the signal at
            // this thread, so no other thread ever gets it.
            let waiter =
                Waiter::signal(libc::SIGRTMIN() + 1).map_err(|e| sys_err_from("signalfd", e))?;
            let notifier = Notifier::connect(&waiter.address())
                .map_err(|e| sys_err_from("signalfd connect", e))?;
            let pid = fork_sender(shared, opts, sched, n, |i| {
                shared.stamp(i + 1);
                let _ = notifier.notify();
            })?;
            while smp.lat.len() < total as usize {
                // RT signals queue one per send, in order.
                let r = waiter.wait();
                let now = monotonic_ns();
                let Ok(k) = r else { break };
                let upto = smp.seen + k;
                smp.take_upto(shared, now, upto);
            }
            shared.done.store(1, Ordering::Release);
            reap(pid, m)?;
            // Dropping the waiter discards signals still queued and
            // restores the mask.
            drop(waiter);
        }
    }
    let coalesced = smp.coalesced;
    let mut lat = smp.lat;
    lat.truncate(total as usize);
    let lat = lat.split_off((WARMUP as usize).min(lat.len()));
    Ok((lat, coalesced))
}

/// A fresh directory under `base` for a benchmark's channel files,
/// removed with them when the benchmark ends.
fn bench_dir(base: &Path) -> Result<TempDir, BenchRunError> {
    TempDir::unique(base, "bench").map_err(|source| BenchRunError::Dir {
        dir: base.into(),
        source,
    })
}

/// Publish cost figures.
#[derive(Debug, Clone, Serialize)]
pub struct PublishReport {
    pub payload_bytes: usize,
    /// Without any subscriber waiting.
    pub no_waiter: PublishCost,
    /// With a subscriber process keeping an io_uring futex wait armed.
    pub with_waiter: Option<PublishCost>,
    /// Why `with_waiter` was not measured.
    pub with_waiter_skipped: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PublishCost {
    pub publishes: u64,
    /// Mean over all publishes, wall-clock.
    pub mean_ns: f64,
    /// Mean over the publishing thread's CPU time (a shared machine takes
    /// the CPU away now and then; this is the cost when it does not).
    pub mean_cpu_ns: Option<f64>,
    /// Percentiles of per-publish times (clock read around each call,
    /// which adds ~20-40 ns of its own).
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    /// Futex wake syscalls the publisher made, in all.
    pub wake_syscalls: u64,
    pub wake_syscalls_per_publish: f64,
}

impl PublishReport {
    pub fn table(&self) -> String {
        let mut out = format!("publish cost, {}-byte messages\n", self.payload_bytes);
        let _ = writeln!(
            out,
            "{:<22} {:>10} {:>10} {:>12} {:>8} {:>8} {:>10} {:>14}",
            "case",
            "publishes",
            "mean ns",
            "mean CPU ns",
            "p50 ns",
            "p99 ns",
            "max ns",
            "wakes/publish"
        );
        let mut row = |name: &str, c: &PublishCost| {
            let _ = writeln!(
                out,
                "{:<22} {:>10} {:>10.1} {:>12} {:>8} {:>8} {:>10} {:>14.3}",
                name,
                c.publishes,
                c.mean_ns,
                c.mean_cpu_ns.map_or("-".into(), |v| format!("{v:.1}")),
                c.p50_ns,
                c.p99_ns,
                c.max_ns,
                c.wake_syscalls_per_publish
            );
        };
        row("no waiter", &self.no_waiter);
        match &self.with_waiter {
            Some(c) => row("waiting subscriber", c),
            None => {
                let why = self
                    .with_waiter_skipped
                    .as_deref()
                    .unwrap_or("not measured");
                let _ = writeln!(out, "waiting subscriber     skipped: {why}");
            }
        }
        out
    }
}

fn channel_for(
    dir: &Path,
    name: &str,
    geom: &ChannelGeometry,
    proc_root: &Path,
) -> Result<Channel, BenchRunError> {
    Channel::create(dir, name, geom, None, proc_root)
        .map(|(c, _)| c)
        .map_err(|source| BenchRunError::ChannelCreate {
            dir: dir.into(),
            source,
        })
}

fn publisher_for(
    ch: &Channel,
    dir: &Path,
    proc_root: &Path,
    class: controller::WakeClass,
) -> Result<controller::channel::Publisher, BenchRunError> {
    ch.publisher_as(class, proc_root)
        .map_err(|source| BenchRunError::ChannelAttach {
            dir: dir.into(),
            source,
        })
}

/// Publishes per arm of [`publish_costs`], in this many batches.
const COST_PUBLISHES: u64 = 100_000;
const COST_BATCHES: usize = 50;

/// The cost of one 8-byte publish with no waiter, in nanoseconds (the
/// median of 50 batches' means), for
/// a real-time publisher (the wake classes' path), a best-effort one (the
/// path as before them) and a best-effort one again (the A/A floor), each
/// on a channel of its own under `<prefix>/dev/shm/rtdeploy`, measured in
/// turn, in an order rotated by `round` (see [`crate::harness`]). `None`
/// for an arm that could not run.
pub fn publish_costs(
    prefix: &Path,
    proc_root: &Path,
    round: usize,
) -> Vec<(&'static str, Option<f64>)> {
    use controller::WakeClass::{BestEffort, RealTime};
    let arms = [
        ("real-time", RealTime),
        ("best-effort", BestEffort),
        ("best-effort (A/A)", BestEffort),
    ];
    let mut out: Vec<(&'static str, Option<f64>)> = arms.iter().map(|a| (a.0, None)).collect();
    let base = crate::scenario::shm_dir(prefix);
    for i in crate::harness::order(arms.len(), round) {
        let (_, class) = arms[i];
        out[i].1 = (|| {
            let dir = bench_dir(&base).ok()?;
            let geom = ChannelGeometry::new(8, 4096, 1);
            let ch = channel_for(dir.path(), "/bench/cost", &geom, proc_root).ok()?;
            let mut p = publisher_for(&ch, dir.path(), proc_root, class).ok()?;
            let payload = 7u64.to_ne_bytes();
            for _ in 0..10_000 {
                let _ = p.publish(&payload);
            }
            // The median of short batches: a batch the machine preempted
            // is an outlier, not part of the figure.
            let mut batches = Vec::with_capacity(COST_BATCHES);
            for _ in 0..COST_BATCHES {
                let t0 = monotonic_ns();
                for _ in 0..COST_PUBLISHES / COST_BATCHES as u64 {
                    let _ = std::hint::black_box(p.publish(std::hint::black_box(&payload)));
                }
                batches.push(
                    (monotonic_ns() - t0) as f64 / (COST_PUBLISHES / COST_BATCHES as u64) as f64,
                );
            }
            crate::harness::Spread::of(&batches).map(|s| s.median)
        })();
    }
    out
}

/// Measures the cost of publishing `payload_bytes` messages: `count`
/// back-to-back without a waiter, and `waited` one per 200us to a forked
/// subscriber process that keeps an io_uring futex wait armed.
pub fn publish(
    shm_dir: &Path,
    proc_root: &Path,
    payload_bytes: usize,
    count: u64,
    waited: u64,
) -> Result<PublishReport, BenchRunError> {
    let dir = bench_dir(shm_dir)?;
    let geom = ChannelGeometry::new(payload_bytes as u64, 4096, 2);
    let ch = channel_for(dir.path(), "/bench/publish", &geom, proc_root)?;
    let mut p = publisher_for(
        &ch,
        dir.path(),
        proc_root,
        controller::WakeClass::BestEffort,
    )?;
    let payload = vec![0x5au8; payload_bytes];
    // Warm up.
    for _ in 0..10_000 {
        let _ = p.publish(&payload);
    }
    // Mean over a tight loop (no clock reads inside).
    let wakes0 = p.wake_syscalls();
    let t0 = monotonic_ns();
    let c0 = thread_cpu_ns();
    for _ in 0..count {
        let _ = std::hint::black_box(p.publish(std::hint::black_box(&payload)));
    }
    let mean = (monotonic_ns() - t0) as f64 / count.max(1) as f64;
    let mean_cpu = (thread_cpu_ns() - c0) as f64 / count.max(1) as f64;
    let wakes = p.wake_syscalls() - wakes0;
    // Per-call distribution on a shorter run.
    let per = count.min(200_000) as usize;
    let mut v = Vec::with_capacity(per);
    for _ in 0..per {
        let a = monotonic_ns();
        let _ = std::hint::black_box(p.publish(&payload));
        v.push(monotonic_ns() - a);
    }
    v.sort_unstable();
    let pct = |v: &[u64], q: f64| {
        v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    let no_waiter = PublishCost {
        publishes: count,
        mean_ns: mean,
        mean_cpu_ns: Some(mean_cpu),
        p50_ns: pct(&v, 0.5),
        p99_ns: pct(&v, 0.99),
        max_ns: v.last().copied().unwrap_or(0),
        wake_syscalls: wakes,
        wake_syscalls_per_publish: wakes as f64 / count.max(1) as f64,
    };
    let pr = probe();
    let (with_waiter, with_waiter_skipped) = if waited == 0 {
        (None, Some("not asked for (0 publishes)".to_string()))
    } else if !pr.io_uring_futex {
        (None, pr.io_uring_problem)
    } else {
        (
            Some(publish_with_waiter(
                &ch, &mut p, &payload, waited, proc_root,
            )?),
            None,
        )
    };
    Ok(PublishReport {
        payload_bytes,
        no_waiter,
        with_waiter,
        with_waiter_skipped,
    })
}

fn publish_with_waiter(
    ch: &Channel,
    p: &mut controller::channel::Publisher,
    payload: &[u8],
    n: u64,
    proc_root: &Path,
) -> Result<PublishCost, BenchRunError> {
    // The subscriber: a forked child running this runtime's loop. It is
    // built in the child (after fork) because the loop's ring is per
    // process; the child exits when it has seen `n` messages.
    let ch2 = ch.clone();
    let proc_root = proc_root.to_path_buf();
    // SAFETY: see fork_sender; the child here does allocate (it builds an
    // event loop): acceptable because the benchmark parent is single
    // threaded at this point (the CLI runs it on its main thread) —
    // documented on `publish`.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(sys_err("fork"));
    }
    if pid == 0 {
        let code = (|| {
            let mut lp = EventLoop::new(LoopOptions {
                backend: Some(Backend::IoUringFutex),
                proc_root,
                ..LoopOptions::default()
            })
            .ok()?;
            let mut got = 0u64;
            lp.watch_raw(&ch2, move |ctx, _| {
                got += 1;
                if got >= n {
                    ctx.exit();
                }
            })
            .ok()?;
            lp.run().ok()
        })()
        .map_or(1, |_| 0);
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) }
    }
    // Wait until the child's loop runs and its wait is armed.
    let t_end = monotonic_ns() + 5_000_000_000;
    while ch.waiters(controller::WakeClass::BestEffort) == 0 && monotonic_ns() < t_end {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut v = Vec::with_capacity(n as usize);
    let wakes0 = p.wake_syscalls();
    let mut next = monotonic_ns();
    for _ in 0..n {
        next += 200_000;
        sleep_until(Monotonic::from_nanos(next));
        let a = monotonic_ns();
        let _ = p.publish(payload);
        v.push(monotonic_ns() - a);
    }
    let wakes = p.wake_syscalls() - wakes0;
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let mean = v.iter().sum::<u64>() as f64 / n.max(1) as f64;
    v.sort_unstable();
    let pct = |q: f64| {
        v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    Ok(PublishCost {
        publishes: n,
        mean_ns: mean,
        mean_cpu_ns: None,
        p50_ns: pct(0.5),
        p99_ns: pct(0.99),
        max_ns: v.last().copied().unwrap_or(0),
        wake_syscalls: wakes,
        wake_syscalls_per_publish: wakes as f64 / n.max(1) as f64,
    })
}

/// Settings of [`copy_and_loan`].
#[derive(Debug, Clone)]
pub struct CopyLoanOptions {
    /// Rounds over every case of every size, interleaved so that slow
    /// drifts of the machine hit all of them alike.
    pub rounds: u32,
    /// Timed samples of each case per round.
    pub samples: u32,
}

impl Default for CopyLoanOptions {
    fn default() -> Self {
        CopyLoanOptions {
            rounds: 20,
            samples: 100,
        }
    }
}

/// The message sizes [`copy_and_loan`] measures: a small message and a
/// large one (the size a camera frame or a point cloud slice takes).
pub const COPY_LOAN_SIZES: [usize; 2] = [SMALL, LARGE];
const SMALL: usize = 64;
const LARGE: usize = 1 << 20;

/// One case's time per message, nanoseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CaseTime {
    pub median_ns: f64,
    pub p90_ns: f64,
}

/// The figures of one message size (nanoseconds per message).
#[derive(Debug, Clone, Serialize)]
pub struct SizeFigures {
    pub bytes: usize,
    /// Messages per timed sample: small messages are timed in batches so
    /// the clock reads do not weigh on them.
    pub per_sample: u32,
    /// Samples behind each figure.
    pub samples: u64,
    /// `copy_from_slice` of `bytes` into a prefaulted buffer: the
    /// reference a receive is held against.
    pub memcpy: CaseTime,
    /// The writer's own write: filling `bytes` of a plain prefaulted
    /// buffer. Whatever a send costs beyond it is the channel's.
    pub write: CaseTime,
    /// By copy: the writer fills its own buffer, then
    /// `Publisher::publish_value` copies it into the channel.
    pub copy_send: CaseTime,
    /// A subscriber taking the copied message: `Subscriber::next_message`
    /// (which copies it out of the shared slot) and a look at it in place
    /// (`Message::get`).
    pub copy_receive: CaseTime,
    /// By loan: `Publisher::loan`, the writer fills the slot in place,
    /// `Loan::send`.
    pub loan_send: CaseTime,
    /// The same receive, of the loaned message.
    pub loan_receive: CaseTime,
    /// Median send minus median write: what the channel adds.
    pub copy_send_beyond_write_ns: f64,
    pub loan_send_beyond_write_ns: f64,
    pub copy_send_per_write: f64,
    pub loan_send_per_write: f64,
    pub copy_receive_per_memcpy: f64,
    pub loan_receive_per_memcpy: f64,
    /// Loans that were staged instead of written in place (a reader of
    /// this process was copying the slot): 0 here, nothing else reads.
    pub loans_staged: u64,
    /// Messages received lost, short, or with other contents than sent: 0
    /// unless the channel misbehaved.
    pub bad_reads: u64,
}

/// The copy and loan comparison of `bench publish`.
#[derive(Debug, Clone, Serialize)]
pub struct CopyLoanReport {
    pub rounds: u32,
    pub samples_per_round: u32,
    /// The CPU the measuring thread was pinned to, if it could be.
    pub cpu: Option<usize>,
    pub sizes: Vec<SizeFigures>,
    /// For the 1 MiB message: a loaned send costs no copy beyond the
    /// writer's own write (it exceeds the plain write by less than half a
    /// 1 MiB memcpy).
    pub loan_send_without_copy: bool,
    /// For the 1 MiB message: both receives take at most 1.2 times the
    /// 1 MiB memcpy.
    pub receive_within_1_2x_memcpy: bool,
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

impl CopyLoanReport {
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "publishing by copy and by loan, send and receive apart, against memcpy measured in the same run: medians (p90) in ns per message, {} samples of each case over {} interleaved rounds{}",
            self.samples_per_round as u64 * self.rounds as u64,
            self.rounds,
            self.cpu.map_or(String::new(), |c| format!(", on CPU {c}"))
        );
        for s in &self.sizes {
            let _ = writeln!(
                out,
                "\n{} message ({} per timed sample):",
                size_text(s.bytes),
                match s.per_sample {
                    1 => "one message".to_string(),
                    n => format!("{n} messages"),
                }
            );
            let row = |out: &mut String, name: &str, t: &CaseTime, note: String| {
                let _ = writeln!(
                    out,
                    "  {:<56} {:>12} {:>12}  {}",
                    name,
                    format!("{:.1}", t.median_ns),
                    format!("({:.1})", t.p90_ns),
                    note
                );
            };
            let b = size_text(s.bytes);
            row(
                &mut out,
                &format!("memcpy {b} (copy_from_slice, prefaulted)"),
                &s.memcpy,
                "reference".into(),
            );
            row(
                &mut out,
                &format!("write {b} into a plain buffer (the writer's own)"),
                &s.write,
                "reference".into(),
            );
            row(
                &mut out,
                "copy: send (write own buffer + publish_value)",
                &s.copy_send,
                format!(
                    "{:.2}x the write, {:+.1} ns beyond it",
                    s.copy_send_per_write, s.copy_send_beyond_write_ns
                ),
            );
            row(
                &mut out,
                "copy: receive (next_message copies out, get)",
                &s.copy_receive,
                format!("{:.2}x memcpy", s.copy_receive_per_memcpy),
            );
            row(
                &mut out,
                "loan: send (loan, write in place, send)",
                &s.loan_send,
                format!(
                    "{:.2}x the write, {:+.1} ns beyond it",
                    s.loan_send_per_write, s.loan_send_beyond_write_ns
                ),
            );
            row(
                &mut out,
                "loan: receive (next_message copies out, get)",
                &s.loan_receive,
                format!("{:.2}x memcpy", s.loan_receive_per_memcpy),
            );
            if s.loans_staged > 0 || s.bad_reads > 0 {
                let _ = writeln!(
                    out,
                    "  {} loans staged instead of written in place, {} bad reads",
                    s.loans_staged, s.bad_reads
                );
            }
        }
        if let Some(l) = self.sizes.iter().find(|s| s.bytes == LARGE) {
            let _ = writeln!(
                out,
                "\n1 MiB loaned send: {:.1} ns, {:+.1} ns beyond writing 1 MiB into a plain buffer (a copy would add about {:.1} ns): {}",
                l.loan_send.median_ns,
                l.loan_send_beyond_write_ns,
                l.memcpy.median_ns,
                if self.loan_send_without_copy {
                    "no copy beyond the writer's own write"
                } else {
                    "MORE than the writer's own write (target missed)"
                }
            );
            let _ = writeln!(
                out,
                "1 MiB receive: {:.2}x (copied) and {:.2}x (loaned) a 1 MiB memcpy: {}",
                l.copy_receive_per_memcpy,
                l.loan_receive_per_memcpy,
                if self.receive_within_1_2x_memcpy {
                    "within the 1.2x target"
                } else {
                    "OVER the 1.2x target"
                }
            );
        }
        out
    }
}

fn size_text(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} B")
    }
}

/// Median and 90th percentile of `v` (totals per sample) per message.
fn case_time(v: &mut [u64], per_sample: u32) -> CaseTime {
    v.sort_unstable();
    let at = |q: f64| -> f64 {
        if v.is_empty() {
            return 0.0;
        }
        let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        v[i] as f64 / per_sample.max(1) as f64
    };
    CaseTime {
        median_ns: at(0.5),
        p90_ns: at(0.9),
    }
}

/// A zeroed `[u8; N]` on the heap (not built on the stack), every page
/// touched.
fn prefaulted<const N: usize>() -> Box<[u8; N]> {
    let mut b: Box<[u8; N]> = vec![0u8; N]
        .into_boxed_slice()
        .try_into()
        .unwrap_or_else(|_| unreachable!("a Vec of N bytes"));
    b.fill(1);
    b
}

/// The cases of one size, in the order each sample runs them.
const MEMCPY: usize = 0;
const WRITE: usize = 1;
const COPY_SEND: usize = 2;
const COPY_RECEIVE: usize = 3;
const LOAN_SEND: usize = 4;
const LOAN_RECEIVE: usize = 5;

/// The state of one message size across rounds.
struct SizeBench<const N: usize> {
    publisher: controller::channel::Publisher,
    subscriber: controller::channel::Subscriber,
    src: Box<[u8; N]>,
    dst: Box<[u8; N]>,
    plain: Box<[u8; N]>,
    own: Box<[u8; N]>,
    per_sample: u32,
    fill: u8,
    times: [Vec<u64>; 6],
    loans_staged: u64,
    bad_reads: u64,
}

impl<const N: usize> SizeBench<N> {
    fn new(dir: &Path, proc_root: &Path) -> Result<Self, BenchRunError> {
        // Small messages are timed 64 KiB at a time; the ring holds one
        // sample's messages, so the subscriber loses none.
        let per_sample = (65536 / N).max(1) as u32;
        let geom = ChannelGeometry::new(N as u64, per_sample as u64, 1).with_subscribers(1);
        let ch = channel_for(dir, &format!("/bench/copy-loan-{N}"), &geom, proc_root)?;
        let mut publisher = publisher_for(&ch, dir, proc_root, controller::WakeClass::BestEffort)?;
        publisher.reserve_loans::<[u8; N]>();
        let subscriber =
            ch.subscriber(proc_root)
                .map_err(|source| BenchRunError::ChannelAttach {
                    dir: dir.into(),
                    source,
                })?;
        Ok(SizeBench {
            publisher,
            subscriber,
            src: prefaulted(),
            dst: prefaulted(),
            plain: prefaulted(),
            own: prefaulted(),
            per_sample,
            fill: 0,
            times: Default::default(),
            loans_staged: 0,
            bad_reads: 0,
        })
    }

    /// One sample of every case; `record` false for the warm-up.
    fn sample(&mut self, record: bool) -> Result<(), BenchRunError> {
        let per = self.per_sample;
        let mut t = [0u64; 6];
        let mut mark = monotonic_ns();
        let mut lap = |case: usize| {
            let now = monotonic_ns();
            t[case] = now - mark;
            mark = now;
        };
        for _ in 0..per {
            self.dst.copy_from_slice(&self.src[..]);
            std::hint::black_box(&mut self.dst);
        }
        lap(MEMCPY);
        for _ in 0..per {
            self.fill = self.fill.wrapping_add(1);
            self.plain.fill(self.fill);
            std::hint::black_box(&mut self.plain);
        }
        lap(WRITE);
        let first = self.fill.wrapping_add(1);
        for _ in 0..per {
            self.fill = self.fill.wrapping_add(1);
            self.own.fill(self.fill);
            self.publisher
                .publish_value(&*self.own)
                .map_err(|source| BenchRunError::Publish {
                    what: "a copied publish",
                    bytes: N,
                    source,
                })?;
        }
        lap(COPY_SEND);
        // Each receive checks its message against what was sent.
        for k in 0..per {
            self.receive_one(first.wrapping_add(k as u8));
        }
        lap(COPY_RECEIVE);
        let first = self.fill.wrapping_add(1);
        for _ in 0..per {
            self.fill = self.fill.wrapping_add(1);
            let mut loan =
                self.publisher
                    .loan::<[u8; N]>()
                    .map_err(|source| BenchRunError::Publish {
                        what: "a loan",
                        bytes: N,
                        source,
                    })?;
            if !loan.in_place() {
                self.loans_staged += 1;
            }
            loan.fill(self.fill);
            loan.send().map_err(|source| BenchRunError::Publish {
                what: "a loaned send",
                bytes: N,
                source,
            })?;
        }
        lap(LOAN_SEND);
        for k in 0..per {
            self.receive_one(first.wrapping_add(k as u8));
        }
        lap(LOAN_RECEIVE);
        if record {
            for (v, x) in self.times.iter_mut().zip(t) {
                v.push(x);
            }
        }
        Ok(())
    }

    /// Reads the next message, expected to be `N` bytes of `fill`.
    #[inline(always)]
    fn receive_one(&mut self, fill: u8) {
        match self.subscriber.next_message() {
            Ok(Some(m)) => {
                let ok = m.lost_before == 0
                    && m.get::<[u8; N]>()
                        .is_some_and(|v| v[0] == fill && v[N - 1] == fill);
                if !ok {
                    self.bad_reads += 1;
                }
                std::hint::black_box(m.data);
            }
            _ => self.bad_reads += 1,
        }
    }

    fn figures(mut self) -> SizeFigures {
        let per = self.per_sample;
        let samples = self.times[0].len() as u64;
        let [memcpy, write, copy_send, copy_receive, loan_send, loan_receive] =
            self.times.each_mut().map(|v| case_time(v, per));
        SizeFigures {
            bytes: N,
            per_sample: per,
            samples,
            memcpy,
            write,
            copy_send,
            copy_receive,
            loan_send,
            loan_receive,
            copy_send_beyond_write_ns: copy_send.median_ns - write.median_ns,
            loan_send_beyond_write_ns: loan_send.median_ns - write.median_ns,
            copy_send_per_write: ratio(copy_send.median_ns, write.median_ns),
            loan_send_per_write: ratio(loan_send.median_ns, write.median_ns),
            copy_receive_per_memcpy: ratio(copy_receive.median_ns, memcpy.median_ns),
            loan_receive_per_memcpy: ratio(loan_receive.median_ns, memcpy.median_ns),
            loans_staged: self.loans_staged,
            bad_reads: self.bad_reads,
        }
    }
}

/// Publishes a 64 B and a 1 MiB message by copy (`publish_value`) and by
/// loan (written in place, then sent) on channels with slots of that
/// size, times send and receive apart, and times, in the same run and
/// interleaved with them, a `memcpy` and a plain write of the same size:
/// what a send costs beyond the writer's own write, and what a receive
/// costs against a memcpy. One thread, pinned to one CPU where allowed,
/// sends and then receives each sample's messages (the subscriber is in
/// the same process: the figures are the copies, not a cross-CPU
/// transfer).
pub fn copy_and_loan(
    shm_dir: &Path,
    proc_root: &Path,
    opts: &CopyLoanOptions,
) -> Result<CopyLoanReport, BenchRunError> {
    let dir = bench_dir(shm_dir)?;
    let _restore = SchedRestore(rt::sched_state().ok());
    let cpu = rt::sched_state()
        .ok()
        .and_then(|s| s.cpus.max())
        .map(|c| c as usize)
        .filter(|&c| pin_to(c));
    let mut small = SizeBench::<SMALL>::new(dir.path(), proc_root)?;
    let mut large = SizeBench::<LARGE>::new(dir.path(), proc_root)?;
    // Warm-up: page tables, caches and branch predictors, not recorded.
    for _ in 0..opts.samples.clamp(1, 10) {
        small.sample(false)?;
        large.sample(false)?;
    }
    let rounds = opts.rounds.max(1);
    let samples = opts.samples.max(1);
    for _ in 0..rounds {
        for _ in 0..samples {
            small.sample(true)?;
        }
        for _ in 0..samples {
            large.sample(true)?;
        }
    }
    let sizes = vec![small.figures(), large.figures()];
    let l = &sizes[1];
    let loan_send_without_copy = l.loan_send_beyond_write_ns < 0.5 * l.memcpy.median_ns;
    let receive_within_1_2x_memcpy =
        l.copy_receive_per_memcpy <= 1.2 && l.loan_receive_per_memcpy <= 1.2;
    Ok(CopyLoanReport {
        rounds,
        samples_per_round: samples,
        cpu,
        sizes,
        loan_send_without_copy,
        receive_within_1_2x_memcpy,
    })
}

/// Everything `bench publish` reports: the cost of one publish (without
/// and with a waiting subscriber), then publishing by copy and by loan.
#[derive(Debug, Clone, Serialize)]
pub struct PublishBenchReport {
    #[serde(flatten)]
    pub cost: PublishReport,
    pub copy_and_loan: CopyLoanReport,
}

impl PublishBenchReport {
    pub fn table(&self) -> String {
        format!(
            "{}
{}",
            self.cost.table(),
            self.copy_and_loan.table()
        )
    }
}

/// Throughput figures.
#[derive(Debug, Clone, Serialize)]
pub struct ThroughputReport {
    pub payload_bytes: usize,
    pub publishers: u32,
    pub duration_ns: u64,
    pub messages: u64,
    /// Over wall-clock time.
    pub messages_per_second: f64,
    /// CPU time the publisher threads got (on a shared machine less than
    /// wall-clock time).
    pub cpu_ns: u64,
    /// Over the publishers' CPU time: the rate an undisturbed CPU reaches.
    pub messages_per_cpu_second: f64,
    /// The publishers' policy, e.g. `SCHED_FIFO 50`.
    pub scheduling: String,
}

impl ThroughputReport {
    pub fn table(&self) -> String {
        format!(
            "throughput: {} publisher(s) ({}), {}-byte messages, no waiters: {} messages in {:.3}s = {:.2} M msgs/s ({:.2} M per CPU-second, CPU time {:.3}s)\n",
            self.publishers,
            self.scheduling,
            self.payload_bytes,
            self.messages,
            self.duration_ns as f64 / 1e9,
            self.messages_per_second / 1e6,
            self.messages_per_cpu_second / 1e6,
            self.cpu_ns as f64 / 1e9
        )
    }
}

/// Publishes `payload_bytes` messages as fast as `publishers` threads can
/// for `duration`, without waiters; with `fifo_priority` the publisher
/// threads run SCHED_FIFO at that priority (as a real-time publisher
/// would; the kernel's RT throttling still leaves other tasks 5%).
pub fn throughput(
    shm_dir: &Path,
    proc_root: &Path,
    payload_bytes: usize,
    publishers: u32,
    duration: Duration,
    fifo_priority: Option<u32>,
) -> Result<ThroughputReport, BenchRunError> {
    let dir = bench_dir(shm_dir)?;
    let geom = ChannelGeometry::new(payload_bytes as u64, 4096, publishers.max(1));
    let ch = channel_for(dir.path(), "/bench/throughput", &geom, proc_root)?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut handles = Vec::new();
    let start = monotonic_ns();
    for _ in 0..publishers.max(1) {
        let mut p = publisher_for(
            &ch,
            dir.path(),
            proc_root,
            controller::WakeClass::BestEffort,
        )?;
        let stop = stop.clone();
        let payload = vec![0xa5u8; payload_bytes];
        handles.push(std::thread::spawn(move || {
            let fifo = fifo_priority.map(|p| set_fifo(p).is_ok());
            let mut n = 0u64;
            let cpu0 = thread_cpu_ns();
            // Relaxed: a stop flag; a few extra publishes are harmless.
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..1024 {
                    let _ = std::hint::black_box(p.publish(&payload));
                }
                n += 1024;
            }
            (n, thread_cpu_ns() - cpu0, fifo)
        }));
    }
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    let mut fifo = None;
    let (messages, cpu_ns) = handles
        .into_iter()
        .map(|h| h.join().unwrap_or((0, 0, None)))
        .fold((0, 0), |a, b| {
            fifo = fifo.or(b.2);
            (a.0 + b.0, a.1 + b.1)
        });
    let scheduling = match (fifo_priority, fifo) {
        (Some(p), Some(true)) => format!("SCHED_FIFO {p}"),
        (Some(_), _) => "SCHED_OTHER (SCHED_FIFO refused)".to_string(),
        (None, _) => "inherited policy".to_string(),
    };
    let elapsed = monotonic_ns() - start;
    Ok(ThroughputReport {
        payload_bytes,
        publishers: publishers.max(1),
        duration_ns: elapsed,
        messages,
        messages_per_second: messages as f64 * 1e9 / elapsed as f64,
        cpu_ns,
        messages_per_cpu_second: messages as f64 * 1e9 / cpu_ns.max(1) as f64,
        scheduling,
    })
}
