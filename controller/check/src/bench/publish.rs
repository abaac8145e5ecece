//! `deploy bench publish`: the cost of one publish, without and with a
//! subscriber process waiting, and the wake syscalls it made.

use super::*;

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

pub(super) fn channel_for(
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

pub(super) fn publisher_for(
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
pub(super) const COST_PUBLISHES: u64 = 100_000;
pub(super) const COST_BATCHES: usize = 50;

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

pub(super) fn publish_with_waiter(
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

/// Everything `bench publish` reports: the cost of one publish (without
/// and with a waiting subscriber), then publishing by copy and by loan.
#[derive(Debug, Clone, Serialize)]
pub struct PublishBenchReport {
    #[serde(flatten)]
    pub cost: PublishReport,
    pub copy_and_loan: CopyLoanReport,
    /// A large message held by several subscribers (skipped: `None`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fanout: Option<FanoutReport>,
}

impl PublishBenchReport {
    pub fn table(&self) -> String {
        format!(
            "{}
{}{}",
            self.cost.table(),
            self.copy_and_loan.table(),
            self.fanout
                .as_ref()
                .map_or(String::new(), |f| format!("\n{}", f.table()))
        )
    }
}
