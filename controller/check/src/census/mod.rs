//! The census: which task touches which kernel object of a wake, and
//! which real-time thread waited on a lock held by a lower-priority task.
//!
//! For the whole run, an ftrace instance of its own records, on every CPU:
//! the futex-family syscalls and `io_uring_enter` of the robot's tasks
//! (their entry and exit: the brackets of every wake, arm and wait), lock
//! contention (`lock:contention_begin`/`_end`, Linux 5.19+), priority
//! inheritance boosts (`sched:sched_pi_setprio`), and, where the kernel
//! has kprobes, the bucket of every futex operation (`futex_hash`, its key
//! on entry and the bucket it returns), io_uring's arms included, for every
//! task. A reader thread streams the instance's `trace_pipe` and folds each
//! line into an [`Aggregator`] (pure, tested on recorded text); nothing
//! grows with the run's length but the bounded tables below.
//!
//! Tasks are told apart by their comm, which the check's workers set:
//! `rtd-rt-*` are the real-time threads, every other `rtd-*` a
//! best-effort task of the robot (the low-priority processes, the hammer,
//! a PI holder), anything else is not the robot's.
//!
//! What is counted: a wait of a real-time thread, inside one of its
//! futex-family or `io_uring_enter` calls, on a lock whose holder had a
//! lower priority: the kernel boosting that holder (`sched_pi_setprio`
//! from the waiter's context, old priority below the new). On PREEMPT_RT
//! every futex hash bucket lock is such a lock. Other lock waits of
//! real-time threads (no boost, or outside a wake or wait: pipe writes,
//! `trace_marker`, `mmap_lock`) are listed, not counted.
//!
//! What is listed per word: each futex word a robot task named in a
//! syscall, resolved to its file and offset through the task's
//! `/proc/<pid>/maps` (the words of a `futex_waitv` read from its vector in
//! `/proc/<pid>/mem`), with the real-time and best-effort tasks that
//! touched it. With the probe: the buckets real-time and best-effort tasks
//! share, for the same word (a shared word) or for different words (a
//! collision of the global hash), and the rate of collisions with words of
//! tasks that are not the robot's.
//!
//! `aggregate` counts, `resolve` maps addresses to words, `instance` runs
//! the tracer; this module holds the report's types.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::trace::model::{parse_line, Event, EventKind};
use crate::trace::tracefs::{self, TraceSetupError};

mod aggregate;
mod instance;
mod resolve;

pub use aggregate::*;
pub use instance::*;
pub use resolve::*;

/// The comm prefix of the robot's tasks in the check, and of its
/// real-time threads.
pub const ROBOT_PREFIX: &str = "rtd-";
pub const RT_PREFIX: &str = "rtd-rt-";
/// The kprobe events' group and names.
const PROBE_GROUP: &str = "rtdeploy";
/// Most words, buckets, tasks and listed waits kept per phase (a bound
/// on memory whatever the run does); beyond them, counted only.
const MAX_WORDS: usize = 256;
const MAX_BUCKETS: usize = 4096;
const MAX_COUNTED: usize = 32;
const MAX_LISTED: usize = 64;
const MAX_TASKS: usize = 4096;
/// Lines longer than this are not events (see `trace::model`).
const MAX_LINE: usize = crate::trace::model::MAX_LINE;
/// The bucket keys kept per bucket.
const MAX_KEYS: usize = 16;

/// Whose task an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskClass {
    RealTime,
    BestEffort,
    /// Not a task of the robot.
    Other,
}

impl TaskClass {
    pub fn of(comm: &str) -> TaskClass {
        if comm.starts_with(RT_PREFIX) {
            TaskClass::RealTime
        } else if comm.starts_with(ROBOT_PREFIX) {
            TaskClass::BestEffort
        } else {
            TaskClass::Other
        }
    }
}

/// Resolves user addresses of a task to the file and offset they map.
pub trait Resolver {
    /// `(file, offset in it)` of `addr` in task `tid`'s address space.
    fn resolve(&mut self, tid: i32, addr: u64) -> Option<(String, u64)>;
    /// The `uaddr` and whether it is private (`FUTEX2_PRIVATE`) of each
    /// of the `nr` entries of the `futex_waitv` vector at `ptr` in task
    /// `tid` (read while the task lives).
    fn waitv(&mut self, tid: i32, ptr: u64, nr: u64) -> Vec<(u64, bool)>;
    /// The process task `tid` belongs to (`tid` when unknown).
    fn process(&mut self, tid: i32) -> i32;
}

/// `FUTEX_PRIVATE_FLAG` (in a `futex` op) and `FUTEX2_PRIVATE` (in the
/// futex2 flags): a word only the threads of one process share, keyed by
/// their address space, not by a file.
const PRIVATE: u64 = 128;

/// A wait of a real-time thread on a lock whose holder had a lower
/// priority.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CountedWait {
    pub ts_ns: u64,
    pub waiter: String,
    pub waiter_pid: i32,
    /// The call it waited in (`futex`, `futex_waitv`, `io_uring_enter`).
    pub call: String,
    pub holder: String,
    pub holder_pid: i32,
    /// Kernel priorities (lower is higher): the holder's before the boost,
    /// and the one it was boosted to.
    pub holder_prio: i32,
    pub boosted_to: i32,
    /// The lock, when a contention event named it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock: Option<String>,
}

/// Other lock waits of real-time threads, by where and what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListedWait {
    /// The call it waited in, or `outside a wake or wait`.
    pub context: String,
    /// The lock kind (`SPIN`, `RT`, `MUTEX`, ...).
    pub flags: String,
    pub count: u64,
    pub total_ns: u64,
    pub longest_ns: u64,
}

/// A futex word the robot's tasks named in their syscalls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WordUse {
    pub file: String,
    pub offset: u64,
    /// The comms of the tasks of each class that touched it.
    pub real_time: BTreeSet<String>,
    pub best_effort: BTreeSet<String>,
    pub calls: u64,
}

/// The futex hash buckets, from the kprobe on `futex_hash`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BucketCensus {
    /// Futex operations seen (keys hashed), by class.
    pub ops_real_time: u64,
    pub ops_best_effort: u64,
    pub ops_other: u64,
    /// Buckets real-time threads used.
    pub real_time_buckets: u64,
    /// Of those, shared with a best-effort task of the robot for the same
    /// word, and for another word (a collision).
    pub shared_same_word: u64,
    pub shared_other_word: u64,
    /// Operations of tasks that are not the robot's on a bucket real-time
    /// threads used, on another word: collisions with unrelated words.
    pub unrelated_collisions: u64,
    /// Those per second of the phase.
    pub unrelated_collisions_per_s: f64,
}

/// What one phase of the run showed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CensusPhase {
    pub label: String,
    pub duration_ns: u64,
    pub counted_waits: u64,
    /// The first counted waits.
    pub counted: Vec<CountedWait>,
    pub listed_waits: Vec<ListedWait>,
    /// Futex-family syscalls of the robot's tasks, by class.
    pub futex_calls_real_time: u64,
    pub futex_calls_best_effort: u64,
    /// `mmap`, `munmap` and `mremap` calls of the real-time threads in the
    /// phase (a running real-time loop should make none: each takes the
    /// process's `mmap_lock`, and an unmap interrupts every CPU it runs
    /// on), and of the best-effort tasks.
    pub maps_real_time: u64,
    pub maps_best_effort: u64,
    pub words: Vec<WordUse>,
    /// Words touched by a real-time and a best-effort task both.
    pub shared_words: u64,
    /// Addresses no mapping resolved (the task was gone), and by whom.
    pub unresolved: u64,
    pub unresolved_by: BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buckets: Option<BucketCensus>,
}

/// The census of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CensusReport {
    pub enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Events the kernel has for it, and those it lacks.
    pub events: Vec<String>,
    pub missing: Vec<String>,
    /// `futex_hash` probed (key and bucket of every futex operation), or
    /// why not.
    pub bucket_probe: String,
    /// Events the kernel dropped (full buffers) and lines that did not parse.
    pub events_lost: u64,
    pub lines_skipped: u64,
    pub phases: Vec<CensusPhase>,
}

impl CensusReport {
    /// The census as lines of the text report.
    pub fn to_text(&self) -> String {
        use std::fmt::Write as _;
        let mut o = String::new();
        if !self.enabled {
            let _ = writeln!(
                o,
                "census: off: {}",
                self.reason.as_deref().unwrap_or("not asked for")
            );
            return o;
        }
        let _ = writeln!(
            o,
            "\ncensus ({} events lost, {} lines skipped; buckets: {})",
            self.events_lost, self.lines_skipped, self.bucket_probe
        );
        for p in &self.phases {
            let _ = writeln!(
                o,
                "  {:<28} {} counted waits of real-time threads on lower-priority holders; futex calls {} real-time, {} best-effort; maps and unmaps {} real-time, {} best-effort; {} words, {} touched by both classes{}",
                p.label,
                p.counted_waits,
                p.futex_calls_real_time,
                p.futex_calls_best_effort,
                p.maps_real_time,
                p.maps_best_effort,
                p.words.len(),
                p.shared_words,
                if p.unresolved > 0 {
                    format!(", {} addresses unresolved", p.unresolved)
                } else {
                    String::new()
                }
            );
            if let Some(c) = p.counted.first() {
                let _ = writeln!(
                    o,
                    "  {:<28}   first: {} ({}) in {} waited for {} ({}) at prio {} boosted to {}",
                    "",
                    c.waiter,
                    c.waiter_pid,
                    c.call,
                    c.holder,
                    c.holder_pid,
                    c.holder_prio,
                    c.boosted_to
                );
            }
            for w in p
                .words
                .iter()
                .filter(|w| !w.real_time.is_empty() && !w.best_effort.is_empty())
            {
                let _ = writeln!(
                    o,
                    "  {:<28}   shared word {}+{}: real-time {:?}, best-effort {:?}",
                    "", w.file, w.offset, w.real_time, w.best_effort
                );
            }
            for l in &p.listed_waits {
                let _ = writeln!(
                    o,
                    "  {:<28}   listed: {} {} lock waits in {}, longest {}",
                    "",
                    l.count,
                    l.flags,
                    l.context,
                    crate::report::fmt_ns(l.longest_ns)
                );
            }
            if let Some(b) = &p.buckets {
                let _ = writeln!(
                    o,
                    "  {:<28}   buckets: {} used by real-time threads, shared with best-effort for the same word {}, for another word {}; {} operations of other tasks collided ({:.1}/s)",
                    "",
                    b.real_time_buckets,
                    b.shared_same_word,
                    b.shared_other_word,
                    b.unrelated_collisions,
                    b.unrelated_collisions_per_s
                );
            }
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Addresses `0x1000 + n` are offset `n` of file `/shm/ch`, for every
    /// task; waitv vectors hold `0x1100` and `0x1200`.
    struct Fake;
    impl Resolver for Fake {
        fn resolve(&mut self, _tid: i32, addr: u64) -> Option<(String, u64)> {
            (0x1000..0x2000)
                .contains(&addr)
                .then(|| ("/shm/ch".to_string(), addr - 0x1000))
        }
        fn waitv(&mut self, _tid: i32, _ptr: u64, nr: u64) -> Vec<(u64, bool)> {
            [(0x1100, false), (0x1200, false)]
                .into_iter()
                .take(nr as usize)
                .collect()
        }
        fn process(&mut self, tid: i32) -> i32 {
            tid / 10
        }
    }

    fn run(text: &str) -> Vec<CensusPhase> {
        let mut a = Aggregator::new(Fake);
        a.begin_phase("one", 0);
        for l in text.lines() {
            if let Some(e) = parse_line(l) {
                a.feed(&e);
            }
        }
        a.end_phase(u64::MAX - 1);
        a.finish()
    }

    #[test]
    fn a_boost_of_a_lower_priority_holder_in_a_wake_is_counted_others_are_listed() {
        let text = "\
 rtd-rt-send-900  [002] .....  10.000001: sys_futex(uaddr: 0x1100, op: 0x1, val: 0x7fffffff, utime: 0, uaddr2: 0, val3: 0)
 rtd-rt-send-900  [002] d..1.  10.000002: contention_begin: 00000000a1b2c3d4 (flags=RT)
 rtd-rt-send-900  [002] d..2.  10.000003: sched_pi_setprio: comm=rtd-low pid=950 oldprio=120 newprio=19
 rtd-rt-send-900  [002] d..1.  10.000040: contention_end: 00000000a1b2c3d4 (ret=0)
 rtd-rt-send-900  [002] .....  10.000041: sys_futex -> 0x1
 rtd-rt-send-900  [002] d..1.  10.000050: contention_begin: 00000000ffff0000 (flags=RT)
 rtd-rt-send-900  [002] d..2.  10.000051: sched_pi_setprio: comm=kworker/2:1 pid=88 oldprio=120 newprio=19
 rtd-rt-send-900  [002] d..1.  10.000060: contention_end: 00000000ffff0000 (ret=0)
 rtd-rt-recv-901  [003] .....  10.000100: sys_futex_waitv(waiters: 0x5000, nr_futexes: 0x2, flags: 0, timeout: 0, clockid: 1)
 rtd-rt-recv-901  [003] d..1.  10.000101: contention_begin: 00000000a1b2c3d4 (flags=RT)
 rtd-rt-recv-901  [003] d..2.  10.000102: sched_pi_setprio: comm=rtd-rt-send pid=900 oldprio=19 newprio=19
 rtd-rt-recv-901  [003] d..1.  10.000110: contention_end: 00000000a1b2c3d4 (ret=0)
 rtd-rt-recv-901  [003] .....  10.000200: sys_futex_waitv -> 0x0
 rtd-low-950  [000] .....  10.000300: sys_futex(uaddr: 0x1200, op: 0x1, val: 0x7fffffff, utime: 0, uaddr2: 0, val3: 0)
 rtd-low-950  [000] .....  10.000301: sys_futex -> 0x0
 rtd-low-950  [000] .....  10.000302: sys_futex(uaddr: 0x1300, op: 0x1, val: 0x5, utime: 0, uaddr2: 0, val3: 0)
 rtd-low-950  [000] .....  10.000303: sys_futex(uaddr: 0x1300, op: 0x81, val: 0x5, utime: 0, uaddr2: 0, val3: 0)
 bash-77  [000] .....  10.000303: sys_futex(uaddr: 0x1100, op: 0x81, val: 0x7fffffff, utime: 0, uaddr2: 0, val3: 0)
";
        let p = &run(text)[0];
        // One boost of a lower-priority holder inside a wake: counted.
        assert_eq!(p.counted_waits, 1, "{p:#?}");
        let c = &p.counted[0];
        assert_eq!(
            (
                c.waiter.as_str(),
                c.call.as_str(),
                c.holder.as_str(),
                c.holder_prio,
                c.boosted_to
            ),
            ("rtd-rt-send", "futex", "rtd-low", 120, 19)
        );
        assert_eq!(c.lock.as_deref(), Some("00000000a1b2c3d4"));
        // A boost outside a call, and a wait whose holder ran as high:
        // listed.
        let ctx: Vec<(&str, u64)> = p
            .listed_waits
            .iter()
            .map(|l| (l.context.as_str(), l.count))
            .collect();
        assert_eq!(
            ctx,
            [("futex_waitv", 1), ("outside a wake or wait", 1)],
            "{p:#?}"
        );
        // Words: 0x1100 by the real-time sender and waiter (not by bash:
        // not the robot's), 0x1200 by the waiter and the low process, 0x1300
        // by the low process.
        let w: Vec<(u64, usize, usize)> = p
            .words
            .iter()
            .map(|w| (w.offset, w.real_time.len(), w.best_effort.len()))
            .collect();
        assert_eq!(
            w,
            [(0x100, 2, 0), (0x200, 1, 1), (0x300, 0, 1), (0x1300, 0, 1)]
        );
        // The private word is the process's memory, not the file.
        assert_eq!(p.words[3].file, "private memory of process 95");
        assert_eq!(p.shared_words, 1);
        assert_eq!((p.futex_calls_real_time, p.futex_calls_best_effort), (2, 3));
        assert!(p.buckets.is_none());
    }

    #[test]
    fn buckets_shared_for_one_word_for_two_words_and_with_strangers() {
        let text = "\
 rtd-rt-recv-901  [003] d....  10.000001: futex_hash: (futex_hash+0x0/0x50) k0=0x10 k1=0x0 k2=0x100
 rtd-rt-recv-901  [003] d....  10.000002: futex_hash_ret: (futex_wait_setup+0x7c/0x1a0 <- futex_hash) hb=0xffff0001
 rtd-low-950  [000] d....  10.000003: futex_hash: (futex_hash+0x0/0x50) k0=0x10 k1=0x0 k2=0x100
 rtd-low-950  [000] d....  10.000004: futex_hash_ret: (futex_wake+0x5c/0x1a0 <- futex_hash) hb=0xffff0001
 rtd-rt-send-900  [002] d....  10.000005: futex_hash: (futex_hash+0x0/0x50) k0=0x10 k1=0x0 k2=0x200
 rtd-rt-send-900  [002] d....  10.000006: futex_hash_ret: (futex_wake+0x5c/0x1a0 <- futex_hash) hb=0xffff0002
 rtd-low-951  [000] d....  10.000007: futex_hash: (futex_hash+0x0/0x50) k0=0x10 k1=0x0 k2=0x300
 rtd-low-951  [000] d....  10.000008: futex_hash_ret: (futex_wake+0x5c/0x1a0 <- futex_hash) hb=0xffff0002
 systemd-1  [001] d....  10.000009: futex_hash: (futex_hash+0x0/0x50) k0=0x99 k1=0x1 k2=0x8
 systemd-1  [001] d....  10.000010: futex_hash_ret: (futex_wake+0x5c/0x1a0 <- futex_hash) hb=0xffff0002
";
        let p = &run(text)[0];
        let b = p.buckets.as_ref().unwrap();
        assert_eq!((b.ops_real_time, b.ops_best_effort, b.ops_other), (2, 2, 1));
        assert_eq!(b.real_time_buckets, 2);
        assert_eq!((b.shared_same_word, b.shared_other_word), (1, 1));
        assert_eq!(b.unrelated_collisions, 1);
    }

    #[test]
    fn events_count_only_in_their_phase() {
        let mut a = Aggregator::new(Fake);
        let line = |ts: &str| {
            parse_line(&format!(" rtd-rt-send-900  [002] .....  {ts}: sys_futex(uaddr: 0x1100, op: 0x81, val: 0x1, utime: 0, uaddr2: 0, val3: 0)")).unwrap()
        };
        a.begin_phase("a", 1_000_000_000);
        a.feed(&line("0.500000"));
        a.feed(&line("1.500000"));
        a.begin_phase("b", 2_000_000_000);
        a.feed(&line("2.500000"));
        a.feed(&line("2.600000"));
        a.end_phase(3_000_000_000);
        a.feed(&line("3.500000"));
        let p = a.finish();
        assert_eq!(
            p.iter()
                .map(|p| (p.label.as_str(), p.futex_calls_real_time))
                .collect::<Vec<_>>(),
            [("a", 1), ("b", 2)]
        );
        assert_eq!(p[0].duration_ns, 1_000_000_000);
    }
}
