//! The timer phase's measuring role and the loads around the scenario:
//! SCHED_FIFO bursts, CPU hogs, fsync'ing writers, and the hammer on the
//! best-effort futex word.

use super::*;

/// A small xorshift generator (no allocation, no dependency).
pub(super) struct Rng(u64);
impl Rng {
    pub(super) fn new() -> Rng {
        Rng(monotonic_ns() ^ ((std::process::id() as u64) << 32) | 1)
    }
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Log-uniform in `[lo, hi]`, so short and long bursts both happen.
    pub(super) fn log_between(&mut self, lo: u64, hi: u64) -> u64 {
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
pub(super) fn timer(a: &Args) -> Result<(), WorkerRunError> {
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
pub(super) struct TimerTrace {
    pub(super) marker: Option<TraceMarker>,
    pub(super) on: std::fs::File,
    pub(super) miss_ns: u64,
    pub(super) slot: usize,
    pub(super) ctl: &'static Control,
}

impl TimerTrace {
    pub(super) fn open(
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

    pub(super) fn woke(&self, n: u64, deadline: u64, now: u64) {
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

pub(super) fn burst(a: &Args) -> Result<(), WorkerRunError> {
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

pub(super) fn hog(a: &Args) -> Result<(), WorkerRunError> {
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

pub(super) fn io_writer(a: &Args) -> Result<(), WorkerRunError> {
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
pub(super) fn name_thread(name: &str) {
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
pub(super) fn hammer(a: &Args) -> Result<(), WorkerRunError> {
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
