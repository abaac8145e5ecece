//! `deploy bench throughput`: messages per second publishers reach.

use super::*;

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
