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

/// Per task, what it is in.
#[derive(Debug, Default, Clone)]
struct TaskState {
    call: Option<String>,
    /// A lock wait in progress: its lock, flags and start.
    contention: Option<(String, String, u64)>,
    /// A boost counted in the current contention.
    boosted: bool,
    /// The key of a `futex_hash` entry awaiting its return.
    hash_key: Option<(u64, u64, u64)>,
}

#[derive(Debug, Default)]
struct PhaseAgg {
    label: String,
    start_ns: u64,
    end_ns: u64,
    counted_waits: u64,
    counted: Vec<CountedWait>,
    listed: BTreeMap<(String, String), ListedWait>,
    futex_rt: u64,
    futex_be: u64,
    maps_rt: u64,
    maps_be: u64,
    words: BTreeMap<(String, u64), WordUse>,
    words_dropped: u64,
    unresolved: u64,
    unresolved_by: BTreeMap<String, u64>,
    buckets: HashMap<u64, BucketAgg>,
    ops: [u64; 3],
    probed: bool,
}

/// One futex hash bucket's users in a phase.
#[derive(Debug, Default)]
struct BucketAgg {
    rt: BTreeSet<(u64, u64, u64)>,
    be: BTreeSet<(u64, u64, u64)>,
    /// Operations of other tasks, by key (beyond [`MAX_KEYS`] keys, in
    /// `other_overflow`: counted as other words).
    other: BTreeMap<(u64, u64, u64), u64>,
    other_overflow: u64,
}

/// Folds events into per-phase tables. Pure but for the [`Resolver`].
pub struct Aggregator<R: Resolver> {
    resolver: R,
    tasks: HashMap<i32, TaskState>,
    phases: Vec<PhaseAgg>,
}

/// The futex syscalls whose first argument is the word.
fn word_call(name: &str) -> bool {
    matches!(name, "futex" | "futex_wait" | "futex_wake")
}

fn bracket_call(name: &str) -> bool {
    word_call(name) || name == "futex_waitv" || name == "io_uring_enter"
}

fn class_index(c: TaskClass) -> usize {
    match c {
        TaskClass::RealTime => 0,
        TaskClass::BestEffort => 1,
        TaskClass::Other => 2,
    }
}

fn field_u64(text: &str, key: &str) -> Option<u64> {
    let pat = format!("{key}=");
    let i = text.find(&pat)?;
    let v = text[i + pat.len()..].split([' ', ')']).next()?;
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

impl<R: Resolver> Aggregator<R> {
    pub fn new(resolver: R) -> Self {
        Aggregator {
            resolver,
            tasks: HashMap::new(),
            phases: vec![],
        }
    }

    /// A phase from `start_ns` on (the previous one ends there).
    pub fn begin_phase(&mut self, label: &str, start_ns: u64) {
        if let Some(p) = self.phases.last_mut() {
            if p.end_ns == u64::MAX {
                p.end_ns = start_ns;
            }
        }
        self.phases.push(PhaseAgg {
            label: label.into(),
            start_ns,
            end_ns: u64::MAX,
            ..PhaseAgg::default()
        });
    }

    /// Ends the current phase at `end_ns` (events after it count nowhere).
    pub fn end_phase(&mut self, end_ns: u64) {
        if let Some(p) = self.phases.last_mut() {
            if p.end_ns == u64::MAX {
                p.end_ns = end_ns;
            }
        }
    }

    fn phase_at(&mut self, ts: u64) -> Option<&mut PhaseAgg> {
        self.phases
            .iter_mut()
            .rev()
            .find(|p| p.start_ns <= ts && ts < p.end_ns)
    }

    pub fn feed(&mut self, e: &Event) {
        let class = TaskClass::of(&e.comm);

        if self.tasks.len() >= MAX_TASKS && !self.tasks.contains_key(&e.pid) {
            self.tasks.clear();
        }
        match &e.kind {
            EventKind::SysEnter { name, .. }
                if class != TaskClass::Other
                    && matches!(name.as_str(), "mmap" | "munmap" | "mremap") =>
            {
                if let Some(p) = self.phase_at(e.ts_ns) {
                    match class {
                        TaskClass::RealTime => p.maps_rt += 1,
                        _ => p.maps_be += 1,
                    }
                }
            }
            EventKind::SysEnter { name, args } if class != TaskClass::Other => {
                let task = self.tasks.entry(e.pid).or_default();
                if bracket_call(name) {
                    task.call = Some(name.clone());
                }
                let get = |k: &str| args.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
                let mut addrs: Vec<(u64, bool)> = vec![];
                if word_call(name) {
                    let flags = if name == "futex" {
                        get("op")
                    } else {
                        get("flags")
                    };
                    let private = flags.is_some_and(|f| f & PRIVATE != 0);
                    addrs.extend(get("uaddr").map(|a| (a, private)));
                } else if name == "futex_waitv" {
                    if let (Some(p), Some(n)) = (get("waiters"), get("nr_futexes")) {
                        addrs = self.resolver.waitv(e.pid, p, n.min(128));
                    }
                }
                if addrs.is_empty() || !(word_call(name) || name == "futex_waitv") {
                    return;
                }
                // A private word is its process's memory at that address.
                let resolved: Vec<Option<(String, u64)>> = addrs
                    .iter()
                    .map(|&(a, private)| {
                        if private {
                            let pid = self.resolver.process(e.pid);
                            Some((format!("private memory of process {pid}"), a))
                        } else {
                            self.resolver.resolve(e.pid, a)
                        }
                    })
                    .collect();
                let comm = e.comm.clone();
                let Some(p) = self.phase_at(e.ts_ns) else {
                    return;
                };
                match class {
                    TaskClass::RealTime => p.futex_rt += 1,
                    _ => p.futex_be += 1,
                }
                for r in resolved {
                    let Some((file, offset)) = r else {
                        p.unresolved += 1;
                        if p.unresolved_by.len() < 16 || p.unresolved_by.contains_key(&comm) {
                            *p.unresolved_by.entry(comm.clone()).or_default() += 1;
                        }
                        continue;
                    };
                    let key = (file, offset);
                    if !p.words.contains_key(&key) && p.words.len() >= MAX_WORDS {
                        p.words_dropped += 1;
                        continue;
                    }
                    let w = p.words.entry(key.clone()).or_insert_with(|| WordUse {
                        file: key.0.clone(),
                        offset: key.1,
                        real_time: BTreeSet::new(),
                        best_effort: BTreeSet::new(),
                        calls: 0,
                    });
                    w.calls += 1;
                    let set = if class == TaskClass::RealTime {
                        &mut w.real_time
                    } else {
                        &mut w.best_effort
                    };
                    if set.len() < 16 {
                        set.insert(comm.clone());
                    }
                }
            }
            EventKind::SysExit { name, .. } if class != TaskClass::Other && bracket_call(name) => {
                if let Some(t) = self.tasks.get_mut(&e.pid) {
                    t.call = None;
                }
            }
            EventKind::LockWait { lock, flags } if class == TaskClass::RealTime => {
                let t = self.tasks.entry(e.pid).or_default();
                t.contention = Some((lock.clone(), flags.clone(), e.ts_ns));
                t.boosted = false;
            }
            EventKind::LockDone { .. } if class == TaskClass::RealTime => {
                let Some(t) = self.tasks.get_mut(&e.pid) else {
                    return;
                };
                let Some((_, flags, start)) = t.contention.take() else {
                    return;
                };
                let boosted = std::mem::take(&mut t.boosted);
                let context = t
                    .call
                    .clone()
                    .unwrap_or_else(|| "outside a wake or wait".into());
                let waited = e.ts_ns.saturating_sub(start);
                if boosted && t.call.is_some() {
                    return; // counted at the boost
                }
                let Some(p) = self.phase_at(e.ts_ns) else {
                    return;
                };
                let key = (context.clone(), flags.clone());
                if !p.listed.contains_key(&key) && p.listed.len() >= MAX_LISTED {
                    return;
                }
                let l = p.listed.entry(key).or_insert(ListedWait {
                    context,
                    flags,
                    count: 0,
                    total_ns: 0,
                    longest_ns: 0,
                });
                l.count += 1;
                l.total_ns = l.total_ns.saturating_add(waited);
                l.longest_ns = l.longest_ns.max(waited);
            }
            EventKind::PiSetprio {
                comm,
                pid,
                oldprio,
                newprio,
            } if class == TaskClass::RealTime && newprio < oldprio && *pid != e.pid => {
                let t = self.tasks.entry(e.pid).or_default();
                let Some(call) = t.call.clone() else {
                    return;
                };
                t.boosted = true;
                let lock = t.contention.as_ref().map(|c| c.0.clone());
                let w = CountedWait {
                    ts_ns: e.ts_ns,
                    waiter: e.comm.clone(),
                    waiter_pid: e.pid,
                    call,
                    holder: comm.clone(),
                    holder_pid: *pid,
                    holder_prio: *oldprio,
                    boosted_to: *newprio,
                    lock,
                };
                if let Some(p) = self.phase_at(e.ts_ns) {
                    p.counted_waits += 1;
                    if p.counted.len() < MAX_COUNTED {
                        p.counted.push(w);
                    }
                }
            }
            EventKind::Other { name, text } if name == "futex_hash" => {
                let key = (
                    field_u64(text, "k0").unwrap_or(0),
                    field_u64(text, "k1").unwrap_or(0),
                    field_u64(text, "k2").unwrap_or(0),
                );
                self.tasks.entry(e.pid).or_default().hash_key = Some(key);
            }
            EventKind::Other { name, text } if name == "futex_hash_ret" => {
                let Some(key) = self.tasks.get_mut(&e.pid).and_then(|t| t.hash_key.take()) else {
                    return;
                };
                let Some(hb) = field_u64(text, "hb") else {
                    return;
                };
                let ci = class_index(class);
                let Some(p) = self.phase_at(e.ts_ns) else {
                    return;
                };
                p.probed = true;
                p.ops[ci] += 1;
                if !p.buckets.contains_key(&hb) && p.buckets.len() >= MAX_BUCKETS {
                    return;
                }
                let b = p.buckets.entry(hb).or_default();
                match class {
                    TaskClass::RealTime if b.rt.len() < MAX_KEYS => {
                        b.rt.insert(key);
                    }
                    TaskClass::BestEffort if b.be.len() < MAX_KEYS => {
                        b.be.insert(key);
                    }
                    TaskClass::Other => {
                        if b.other.len() < MAX_KEYS || b.other.contains_key(&key) {
                            *b.other.entry(key).or_default() += 1;
                        } else {
                            b.other_overflow += 1;
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }

    /// The phases as reported.
    pub fn finish(self) -> Vec<CensusPhase> {
        self.phases
            .into_iter()
            .map(|p| {
                let duration_ns = if p.end_ns == u64::MAX {
                    0
                } else {
                    p.end_ns - p.start_ns
                };
                let words: Vec<WordUse> = p.words.into_values().collect();
                let shared_words = words
                    .iter()
                    .filter(|w| !w.real_time.is_empty() && !w.best_effort.is_empty())
                    .count() as u64;
                let buckets = p.probed.then(|| {
                    let mut b = BucketCensus {
                        ops_real_time: p.ops[0],
                        ops_best_effort: p.ops[1],
                        ops_other: p.ops[2],
                        ..BucketCensus::default()
                    };
                    for k in p.buckets.values() {
                        if k.rt.is_empty() {
                            continue;
                        }
                        b.real_time_buckets += 1;
                        if k.be.iter().any(|x| k.rt.contains(x)) {
                            b.shared_same_word += 1;
                        }
                        if k.be.iter().any(|x| !k.rt.contains(x)) {
                            b.shared_other_word += 1;
                        }
                        b.unrelated_collisions += k
                            .other
                            .iter()
                            .filter(|(x, _)| !k.rt.contains(x))
                            .map(|(_, n)| n)
                            .sum::<u64>()
                            + k.other_overflow;
                    }
                    if duration_ns > 0 {
                        b.unrelated_collisions_per_s =
                            b.unrelated_collisions as f64 / (duration_ns as f64 / 1e9);
                    }
                    b
                });
                CensusPhase {
                    label: p.label,
                    duration_ns,
                    counted_waits: p.counted_waits,
                    counted: p.counted,
                    listed_waits: p.listed.into_values().collect(),
                    futex_calls_real_time: p.futex_rt,
                    futex_calls_best_effort: p.futex_be,
                    maps_real_time: p.maps_rt,
                    maps_best_effort: p.maps_be,
                    words,
                    shared_words,
                    unresolved: p.unresolved,
                    unresolved_by: p.unresolved_by,
                    buckets,
                }
            })
            .collect()
    }
}

type Maps = Vec<(u64, u64, u64, String)>;

/// The most read of one `/proc/<pid>/maps`: the default
/// `vm.max_map_count` (65530) mappings of 256 bytes a line (73 before the
/// path). A process whose maps hold more is not resolved.
const MAX_MAPS: u64 = 16 << 20;

fn read_maps(path: &Path) -> Option<Maps> {
    // Lossy: a mapped file's name may hold any byte.
    let text = units::bounded::Bound::pseudo(MAX_MAPS)
        .read_lossy(path)
        .ok()?;
    Some(
        text.lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let (a, b) = it.next()?.split_once('-')?;
                let _perms = it.next()?;
                let off = u64::from_str_radix(it.next()?, 16).ok()?;
                let _dev = it.next()?;
                let _inode = it.next()?;
                let path: String = it.collect::<Vec<_>>().join(" ");
                Some((
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(b, 16).ok()?,
                    off,
                    path,
                ))
            })
            .collect(),
    )
}

/// The address spaces of the robot's processes, kept after they exit:
/// the reader of the trace runs behind the kernel, and a low-priority
/// process of the check lives two seconds.
#[derive(Default)]
pub struct MapsCache {
    /// tid -> its process.
    process_of: HashMap<i32, i32>,
    maps: HashMap<i32, Maps>,
}

impl MapsCache {
    /// Reads the maps of every process whose comm is a robot task's
    /// (`rtd-*`), and the thread ids of each (bounded: 4096 processes).
    pub fn snapshot(&mut self, proc_root: &Path) {
        let Ok(rd) = std::fs::read_dir(proc_root) else {
            return;
        };
        for e in rd.filter_map(|e| e.ok()).take(65_536) {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            // A comm is at most 16 bytes.
            let comm = units::bounded::Bound::pseudo(64).read_lossy(&e.path().join("comm"));
            if !comm.is_ok_and(|c| c.starts_with(ROBOT_PREFIX)) {
                continue;
            }
            if self.maps.len() >= MAX_TASKS && !self.maps.contains_key(&pid) {
                continue;
            }
            // An exiting process shows no mappings: keep what it had.
            if let Some(m) = read_maps(&e.path().join("maps")).filter(|m| !m.is_empty()) {
                self.maps.insert(pid, m);
            }
            if let Ok(tasks) = std::fs::read_dir(e.path().join("task")) {
                for t in tasks.filter_map(|t| t.ok()).take(1024) {
                    if let Some(tid) = t.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) {
                        if self.process_of.len() < 16 * MAX_TASKS {
                            self.process_of.insert(tid, pid);
                        }
                    }
                }
            }
        }
    }

    fn find(&self, tid: i32, addr: u64) -> Option<(String, u64)> {
        let pid = self.process_of.get(&tid).copied().unwrap_or(tid);
        let (a, _, off, path) = self
            .maps
            .get(&pid)?
            .iter()
            .find(|(a, b, _, _)| *a <= addr && addr < *b)?;
        Some(if path.is_empty() || path.starts_with('[') {
            // Memory of the process's own (heap, stack, anonymous).
            (format!("memory of process {pid}"), addr)
        } else {
            (path.clone(), addr - a + off)
        })
    }
}

/// Resolves through the [`MapsCache`] a snapshot thread keeps, then
/// `/proc/<tid>/maps` of a task still alive; `futex_waitv` vectors through
/// `/proc/<tid>/mem` (root, or the same user with ptrace permission).
pub struct ProcResolver {
    proc_root: PathBuf,
    cache: Arc<Mutex<MapsCache>>,
}

impl ProcResolver {
    pub fn new(proc_root: &Path, cache: Arc<Mutex<MapsCache>>) -> Self {
        ProcResolver {
            proc_root: proc_root.into(),
            cache,
        }
    }
}

impl Resolver for ProcResolver {
    fn resolve(&mut self, tid: i32, addr: u64) -> Option<(String, u64)> {
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hit) = c.find(tid, addr) {
            return Some(hit);
        }
        // A task the snapshot did not see yet (or a mapping made since).
        let m = read_maps(&self.proc_root.join(tid.to_string()).join("maps"));
        let m = m.filter(|m| !m.is_empty())?;
        let pid = c.process_of.get(&tid).copied().unwrap_or(tid);
        if c.maps.len() < MAX_TASKS || c.maps.contains_key(&pid) {
            c.maps.insert(pid, m);
        }
        c.find(tid, addr)
    }

    fn waitv(&mut self, tid: i32, ptr: u64, nr: u64) -> Vec<(u64, bool)> {
        // struct futex_waitv { u64 val; u64 uaddr; u32 flags; u32 reserved; }
        let mut buf = vec![0u8; (nr as usize) * 24];
        let p = self.proc_root.join(tid.to_string()).join("mem");
        // Opened through units::bounded (a pseudo file: no wait on a FIFO
        // in a fake tree); read only where the vector is, its size bounded
        // by the caller (128 entries).
        let ok = units::bounded::Bound::pseudo(buf.len() as u64)
            .open(&p)
            .map_err(units::bounded::FileReadError::into_io)
            .and_then(|f| f.read_exact_at(&mut buf, ptr))
            .is_ok();
        if !ok {
            return vec![];
        }
        buf.chunks_exact(24)
            .map(|c| {
                let uaddr = u64::from_ne_bytes(c[8..16].try_into().expect("8 bytes"));
                let flags = u32::from_ne_bytes(c[16..20].try_into().expect("4 bytes"));
                (uaddr, flags as u64 & PRIVATE != 0)
            })
            .collect()
    }

    fn process(&mut self, tid: i32) -> i32 {
        let c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        c.process_of.get(&tid).copied().unwrap_or(tid)
    }
}

/// The live census: an instance streaming into an [`Aggregator`].
pub struct Census {
    dir: PathBuf,
    root: PathBuf,
    agg: Arc<Mutex<Aggregator<ProcResolver>>>,
    stop: Arc<AtomicBool>,
    reader: Option<std::thread::JoinHandle<(u64, u64)>>,
    snapshots: Option<std::thread::JoinHandle<()>>,
    events: Vec<String>,
    missing: Vec<String>,
    bucket_probe: String,
    probes_made: bool,
}

/// The robot's tasks but the hammer, whose tight loop of wakes on the
/// best-effort word would flood the buffers (its word is the low-priority
/// processes' word, which their own calls show, and the waits it causes
/// are the real-time threads' events).
const ROBOT_FILTER: &str = "comm ~ \"rtd-*\" && comm != \"rtd-hammer\"";
/// The real-time threads: lock waits and boosts are recorded in the
/// waiter's context, and only theirs are counted or listed.
const RT_FILTER: &str = "comm ~ \"rtd-rt-*\"";
const NOT_HAMMER: &str = "comm != \"rtd-hammer\"";

/// The events the census enables, with their filters.
const EVENTS: &[(&str, &str)] = &[
    ("syscalls/sys_enter_futex", ROBOT_FILTER),
    ("syscalls/sys_exit_futex", ROBOT_FILTER),
    ("syscalls/sys_enter_futex_waitv", ROBOT_FILTER),
    ("syscalls/sys_exit_futex_waitv", ROBOT_FILTER),
    ("syscalls/sys_enter_futex_wait", ROBOT_FILTER),
    ("syscalls/sys_exit_futex_wait", ROBOT_FILTER),
    ("syscalls/sys_enter_futex_wake", ROBOT_FILTER),
    ("syscalls/sys_exit_futex_wake", ROBOT_FILTER),
    ("syscalls/sys_enter_io_uring_enter", ROBOT_FILTER),
    ("syscalls/sys_exit_io_uring_enter", ROBOT_FILTER),
    // Maps and unmaps after start: mmap_lock, and TLB-shootdown IPIs to
    // every CPU the process runs on.
    ("syscalls/sys_enter_mmap", ROBOT_FILTER),
    ("syscalls/sys_enter_munmap", ROBOT_FILTER),
    ("syscalls/sys_enter_mremap", ROBOT_FILTER),
    ("lock/contention_begin", RT_FILTER),
    ("lock/contention_end", RT_FILTER),
    // Unfiltered: its own `comm` field (the boosted task's) would shadow
    // the current task's; it is rare.
    ("sched/sched_pi_setprio", ""),
];

fn write(p: &Path, v: &str) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(p)
        .and_then(|mut f| std::io::Write::write_all(&mut f, v.as_bytes()))
}

/// Adds the `futex_hash` probes (entry with the key, return with the
/// bucket) when the kernel has kprobes and the function; the reason when
/// not.
fn make_probes(root: &Path) -> Result<(), String> {
    let kp = root.join("kprobe_events");
    if !kp.exists() {
        return Err("this kernel has no kprobe events (CONFIG_KPROBE_EVENTS)".into());
    }
    let funcs = root.join("available_filter_functions");
    // A function a line (tens of thousands, a few MiB with the modules'):
    // 64 MiB is far past any kernel's; a file it cannot read is one
    // without the probe point.
    let text = units::bounded::Bound::pseudo(64 << 20)
        .read_lossy(&funcs)
        .unwrap_or_default();
    if !text
        .lines()
        .any(|l| l.split_whitespace().next() == Some("futex_hash"))
    {
        return Err("futex_hash is not a probe point of this kernel (inlined or renamed)".into());
    }
    // A stale pair of an earlier run first.
    let _ = remove_probes(root);
    let add = |def: &str| {
        std::fs::OpenOptions::new()
            .append(true)
            .open(&kp)
            .and_then(|mut f| std::io::Write::write_all(&mut f, def.as_bytes()))
            .map_err(|e| format!("cannot add `{}` to {}: {e}", def.trim(), kp.display()))
    };
    // union futex_key: three words (the shared key's inode sequence,
    // page offset and offset in the page, or the private one's mm,
    // address and offset).
    add(&format!(
        "p:{PROBE_GROUP}/futex_hash futex_hash k0=+0($arg1):u64 k1=+8($arg1):u64 k2=+16($arg1):u32\n"
    ))?;
    add(&format!(
        "r:{PROBE_GROUP}/futex_hash_ret futex_hash hb=$retval:x64\n"
    ))?;
    Ok(())
}

fn remove_probes(root: &Path) -> std::io::Result<()> {
    let kp = root.join("kprobe_events");
    for name in ["futex_hash", "futex_hash_ret"] {
        let _ = std::fs::OpenOptions::new()
            .append(true)
            .open(&kp)
            .and_then(|mut f| {
                std::io::Write::write_all(&mut f, format!("-:{PROBE_GROUP}/{name}\n").as_bytes())
            });
    }
    Ok(())
}

impl Census {
    /// Starts an instance on every CPU (`sys`: `<sysroot>/sys`).
    pub fn start(sys: &Path, proc_root: &Path) -> Result<Census, TraceSetupError> {
        let root = tracefs::find_tracefs(sys)?;
        tracefs::remove_stale(&root, proc_root);
        let dir = root
            .join("instances")
            .join(format!("rtdeploy-{}-census", std::process::id()));
        if dir.is_dir() {
            let _ = std::fs::remove_dir(&dir);
        }
        std::fs::create_dir(&dir).map_err(|source| TraceSetupError::Instance {
            path: dir.clone(),
            source,
        })?;
        let werr = |p: &Path, v: &str| {
            let (p, v) = (p.to_path_buf(), v.to_string());
            move |source| TraceSetupError::Write {
                path: p,
                value: v,
                source,
            }
        };
        let setup = (|| {
            let on = dir.join("tracing_on");
            write(&on, "0").map_err(werr(&on, "0"))?;
            let clock = dir.join("trace_clock");
            write(&clock, "mono").map_err(werr(&clock, "mono"))?;
            let ow = dir.join("options/overwrite");
            write(&ow, "0").map_err(werr(&ow, "0"))?;
            let _ = write(&dir.join("buffer_size_kb"), "32768");
            Ok::<_, TraceSetupError>(())
        })();
        if let Err(e) = setup {
            let _ = std::fs::remove_dir(&dir);
            return Err(e);
        }
        let (probes_made, bucket_probe) = match make_probes(&root) {
            Ok(()) => (
                true,
                "futex_hash (kprobe: key on entry, bucket on return)".to_string(),
            ),
            Err(why) => (false, why),
        };
        let mut events = vec![];
        let mut missing = vec![];
        let mut all: Vec<(String, Option<&str>)> = EVENTS
            .iter()
            .map(|(e, f)| (e.to_string(), Some(*f)))
            .collect();
        if probes_made {
            all.push((format!("{PROBE_GROUP}/futex_hash"), Some(NOT_HAMMER)));
            all.push((format!("{PROBE_GROUP}/futex_hash_ret"), Some(NOT_HAMMER)));
        }
        for (ev, filter) in all {
            let d = dir.join("events").join(&ev);
            if let Some(f) = filter.filter(|f| !f.is_empty()) {
                let _ = write(&d.join("filter"), f);
            }
            match write(&d.join("enable"), "1") {
                Ok(()) => events.push(ev),
                Err(_) => missing.push(ev),
            }
        }
        if !events.iter().any(|e| e.starts_with("syscalls/")) {
            let _ = std::fs::remove_dir(&dir);
            if probes_made {
                let _ = remove_probes(&root);
            }
            return Err(TraceSetupError::NoEvent {
                events: "syscalls/sys_enter_futex".into(),
                path: root,
            });
        }
        let cache = Arc::new(Mutex::new(MapsCache::default()));
        let agg = Arc::new(Mutex::new(Aggregator::new(ProcResolver::new(
            proc_root,
            cache.clone(),
        ))));
        let stop = Arc::new(AtomicBool::new(false));
        let snapshots = {
            let (cache, stop, proc_root) = (cache, stop.clone(), proc_root.to_path_buf());
            std::thread::Builder::new()
                .name("census-maps".into())
                .spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let mut fresh = MapsCache::default();
                        fresh.snapshot(&proc_root);

                        let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
                        if c.maps.len() + fresh.maps.len() > MAX_TASKS {
                            c.maps.clear();
                            c.process_of.clear();
                        }
                        c.maps.extend(fresh.maps);
                        c.process_of.extend(fresh.process_of);
                        drop(c);
                        std::thread::sleep(Duration::from_millis(100));
                    }
                })
                .ok()
        };
        let reader = {
            let (agg, stop, pipe) = (agg.clone(), stop.clone(), dir.join("trace_pipe"));
            std::thread::Builder::new()
                .name("census-reader".into())
                .spawn(move || read_pipe(&pipe, &agg, &stop))
                .ok()
        };
        let _ = write(&dir.join("tracing_on"), "1");
        Ok(Census {
            dir,
            root,
            agg,
            stop,
            reader,
            snapshots,
            events,
            missing,
            bucket_probe,
            probes_made,
        })
    }

    /// Starts phase `label` now (the previous one ends).
    pub fn phase(&self, label: &str) {
        let now = controller::Monotonic::now().as_nanos();
        self.agg
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .begin_phase(label, now);
    }

    /// Ends the current phase now.
    pub fn end_phase(&self) {
        let now = controller::Monotonic::now().as_nanos();
        self.agg
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .end_phase(now);
    }

    /// Stops, drains what the kernel still holds, and reports.
    pub fn finish(mut self) -> CensusReport {
        // Events reach the pipe late: let the reader drain what is there.
        std::thread::sleep(Duration::from_millis(300));
        let _ = write(&self.dir.join("tracing_on"), "0");
        std::thread::sleep(Duration::from_millis(100));
        self.stop.store(true, Ordering::SeqCst);
        let (skipped, _) = self
            .reader
            .take()
            .and_then(|r| r.join().ok())
            .unwrap_or((0, 0));
        let lost = dropped_events(&self.dir);
        if let Some(t) = self.snapshots.take() {
            let _ = t.join();
        }
        let agg = std::mem::replace(
            &mut *self.agg.lock().unwrap_or_else(|e| e.into_inner()),
            Aggregator::new(ProcResolver::new(
                Path::new("/nonexistent"),
                Arc::new(Mutex::new(MapsCache::default())),
            )),
        );
        CensusReport {
            enabled: true,
            reason: None,
            events: std::mem::take(&mut self.events),
            missing: std::mem::take(&mut self.missing),
            bucket_probe: self.bucket_probe.clone(),
            events_lost: lost,
            lines_skipped: skipped,
            phases: agg.finish(),
        }
    }
}

impl Drop for Census {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = write(&self.dir.join("tracing_on"), "0");
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        if let Some(t) = self.snapshots.take() {
            let _ = t.join();
        }
        for ev in self.events.iter().filter(|e| e.starts_with(PROBE_GROUP)) {
            let _ = write(&self.dir.join("events").join(ev).join("enable"), "0");
        }
        for _ in 0..100 {
            match std::fs::remove_dir(&self.dir) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => break,
            }
        }
        if self.probes_made {
            let _ = remove_probes(&self.root);
        }
    }
}

/// What the kernel dropped in the instance's buffers, over every CPU
/// (`per_cpu/cpuN/stats`: `overrun` and `dropped events`).
fn dropped_events(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir.join("per_cpu")) else {
        return 0;
    };
    let mut n = 0u64;
    for e in rd.filter_map(|e| e.ok()).take(4096) {
        // A dozen short lines.
        let text = units::bounded::Bound::pseudo(4096)
            .read_lossy(&e.path().join("stats"))
            .unwrap_or_default();
        for l in text.lines() {
            if let Some(v) = l
                .strip_prefix("overrun: ")
                .or_else(|| l.strip_prefix("dropped events: "))
            {
                n = n.saturating_add(v.trim().parse().unwrap_or(0));
            }
        }
    }
    n
}

/// Streams `trace_pipe` into the aggregator until `stop`; returns the
/// lines skipped. Non-blocking reads, a 20 ms pause when empty, lines cut at
/// [`MAX_LINE`].
fn read_pipe(pipe: &Path, agg: &Mutex<Aggregator<ProcResolver>>, stop: &AtomicBool) -> (u64, u64) {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(pipe)
    else {
        return (0, 0);
    };
    let mut buf = vec![0u8; 1 << 16];
    let mut line: Vec<u8> = Vec::with_capacity(MAX_LINE);
    let (mut skipped, mut lines) = (0u64, 0u64);
    let mut over = false;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => 0,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if n == 0 {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let mut a = agg.lock().unwrap_or_else(|e| e.into_inner());
        for &b in &buf[..n] {
            if b == b'\n' {
                if !over {
                    lines += 1;
                    match std::str::from_utf8(&line).ok().and_then(parse_line) {
                        Some(e) => a.feed(&e),
                        None => skipped += 1,
                    }
                } else {
                    skipped += 1;
                }
                line.clear();
                over = false;
            } else if line.len() < MAX_LINE {
                line.push(b);
            } else {
                over = true;
            }
        }
    }
    (skipped, lines)
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
