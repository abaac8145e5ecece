//! The tracefs instance the census reads: its events and filters, the
//! `futex_hash` kprobes when the kernel has them, and the pipe a thread
//! drains into the aggregator.

use super::*;

/// The live census: an instance streaming into an [`Aggregator`].
pub struct Census {
    pub(super) dir: PathBuf,
    pub(super) root: PathBuf,
    pub(super) agg: Arc<Mutex<Aggregator<ProcResolver>>>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) reader: Option<std::thread::JoinHandle<(u64, u64)>>,
    pub(super) snapshots: Option<std::thread::JoinHandle<()>>,
    pub(super) events: Vec<String>,
    pub(super) missing: Vec<String>,
    pub(super) bucket_probe: String,
    pub(super) probes_made: bool,
}

/// The robot's tasks but the hammer, whose tight loop of wakes on the
/// best-effort word would flood the buffers (its word is the low-priority
/// processes' word, which their own calls show, and the waits it causes
/// are the real-time threads' events).
pub(super) const ROBOT_FILTER: &str = "comm ~ \"rtd-*\" && comm != \"rtd-hammer\"";
/// The real-time threads: lock waits and boosts are recorded in the
/// waiter's context, and only theirs are counted or listed.
pub(super) const RT_FILTER: &str = "comm ~ \"rtd-rt-*\"";
pub(super) const NOT_HAMMER: &str = "comm != \"rtd-hammer\"";

/// The events the census enables, with their filters.
pub(super) const EVENTS: &[(&str, &str)] = &[
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

pub(super) fn write(p: &Path, v: &str) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(p)
        .and_then(|mut f| std::io::Write::write_all(&mut f, v.as_bytes()))
}

/// The census could not add its `futex_hash` probes: it runs without the
/// bucket figures, and its report says why ([`CensusReport::bucket_probe`]).
#[derive(Debug, thiserror::Error)]
pub enum ProbeAddError {
    #[error("this kernel has no kprobe events (CONFIG_KPROBE_EVENTS)")]
    NoKprobeEvents,
    #[error("futex_hash is not a probe point of this kernel (inlined or renamed)")]
    NoProbePoint,
    #[error("cannot add `{def}` to {path}")]
    Write {
        def: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Adds the `futex_hash` probes (entry with the key, return with the
/// bucket) when the kernel has kprobes and the function; why not when
/// not.
pub(super) fn make_probes(root: &Path) -> Result<(), ProbeAddError> {
    let kp = root.join("kprobe_events");
    if !kp.exists() {
        return Err(ProbeAddError::NoKprobeEvents);
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
        return Err(ProbeAddError::NoProbePoint);
    }
    // A stale pair of an earlier run first.
    let _ = remove_probes(root);
    let add = |def: &str| {
        std::fs::OpenOptions::new()
            .append(true)
            .open(&kp)
            .and_then(|mut f| std::io::Write::write_all(&mut f, def.as_bytes()))
            .map_err(|source| ProbeAddError::Write {
                def: def.trim().to_string(),
                path: kp.clone(),
                source,
            })
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

pub(super) fn remove_probes(root: &Path) -> std::io::Result<()> {
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
            Err(why) => (false, units::error::Chain(&why).to_string()),
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
        self.end_phase_at(controller::Monotonic::now().as_nanos());
    }

    /// Ends the current phase at `ns` (`CLOCK_MONOTONIC`, the trace's
    /// clock): events after it count nowhere.
    pub fn end_phase_at(&self, ns: u64) {
        self.agg
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .end_phase(ns);
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
pub(super) fn dropped_events(dir: &Path) -> u64 {
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
pub(super) fn read_pipe(
    pipe: &Path,
    agg: &Mutex<Aggregator<ProcResolver>>,
    stop: &AtomicBool,
) -> (u64, u64) {
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
