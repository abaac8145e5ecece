//! The census's arithmetic: trace lines in, counts out (waits and wakes
//! per futex word, bucket and wake class, per phase). Pure apart from the
//! [`Resolver`] it is given, so the tests feed it fixture lines.

use super::*;

/// Per task, what it is in.
#[derive(Debug, Default, Clone)]
pub(super) struct TaskState {
    pub(super) call: Option<String>,
    /// A lock wait in progress: its lock, flags and start.
    pub(super) contention: Option<(String, String, u64)>,
    /// A boost counted in the current contention.
    pub(super) boosted: bool,
    /// The key of a `futex_hash` entry awaiting its return.
    pub(super) hash_key: Option<(u64, u64, u64)>,
}

#[derive(Debug, Default)]
pub(super) struct PhaseAgg {
    pub(super) label: String,
    pub(super) start_ns: u64,
    pub(super) end_ns: u64,
    pub(super) counted_waits: u64,
    pub(super) counted: Vec<CountedWait>,
    pub(super) listed: BTreeMap<(String, String), ListedWait>,
    pub(super) futex_rt: u64,
    pub(super) futex_be: u64,
    pub(super) maps_rt: u64,
    pub(super) maps_be: u64,
    pub(super) words: BTreeMap<(String, u64), WordUse>,
    pub(super) words_dropped: u64,
    pub(super) unresolved: u64,
    pub(super) unresolved_by: BTreeMap<String, u64>,
    pub(super) buckets: HashMap<u64, BucketAgg>,
    pub(super) ops: [u64; 3],
    pub(super) probed: bool,
}

/// One futex hash bucket's users in a phase.
#[derive(Debug, Default)]
pub(super) struct BucketAgg {
    pub(super) rt: BTreeSet<(u64, u64, u64)>,
    pub(super) be: BTreeSet<(u64, u64, u64)>,
    /// Operations of other tasks, by key (beyond [`MAX_KEYS`] keys, in
    /// `other_overflow`: counted as other words).
    pub(super) other: BTreeMap<(u64, u64, u64), u64>,
    pub(super) other_overflow: u64,
}

/// Folds events into per-phase tables. Pure but for the [`Resolver`].
pub struct Aggregator<R: Resolver> {
    pub(super) resolver: R,
    pub(super) tasks: HashMap<i32, TaskState>,
    pub(super) phases: Vec<PhaseAgg>,
}

/// The futex syscalls whose first argument is the word.
pub(super) fn word_call(name: &str) -> bool {
    matches!(name, "futex" | "futex_wait" | "futex_wake")
}

pub(super) fn bracket_call(name: &str) -> bool {
    word_call(name) || name == "futex_waitv" || name == "io_uring_enter"
}

pub(super) fn class_index(c: TaskClass) -> usize {
    match c {
        TaskClass::RealTime => 0,
        TaskClass::BestEffort => 1,
        TaskClass::Other => 2,
    }
}

pub(super) fn field_u64(text: &str, key: &str) -> Option<u64> {
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

    pub(super) fn phase_at(&mut self, ts: u64) -> Option<&mut PhaseAgg> {
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
