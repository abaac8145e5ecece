//! Timer latency, the way cyclictest measures it: one thread per CPU,
//! SCHED_FIFO where permitted, sleeping to absolute `CLOCK_MONOTONIC`
//! deadlines one period apart; the latency of each wake is the time read on
//! waking minus the deadline.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use super::hist::Histogram;
use super::rt;
use crate::sys::monotonic_ns;

/// What one timer thread found about its own setup.
#[derive(Debug, Clone, Copy, Default)]
pub struct TimerThreadSetup {
    pub cpu: usize,
    pub pinned: bool,
    pub fifo: bool,
}

/// A running timer-latency measurement on a set of CPUs.
pub struct TimerRun {
    pub hists: Vec<Arc<Histogram>>,
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<TimerThreadSetup>>,
}

/// Sleeps to absolute `CLOCK_MONOTONIC` deadlines `period_ns` apart and
/// records each wake's lateness into `h`, until `stop()` says so. Shared by
/// the in-process timer threads and the check's timer worker processes.
pub fn measure(h: &Histogram, period_ns: u64, stop: impl Fn() -> bool) {
    let period_ns = period_ns.max(1);
    let mut next = monotonic_ns() + period_ns;
    while !stop() {
        rt::sleep_until(next);
        let now = monotonic_ns();
        h.record(now.saturating_sub(next));
        next += period_ns;
        if now > next {
            // Overran whole periods: skip them, as cyclictest does, rather
            // than bunching.
            let behind = (now - next) / period_ns + 1;
            next += behind * period_ns;
        }
    }
}

impl TimerRun {
    /// Starts one measuring thread per CPU in `cpus`. The histograms are
    /// allocated here, before any thread measures.
    pub fn start(cpus: &[usize], priority: u32, period: Duration) -> std::io::Result<TimerRun> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut hists = vec![];
        let mut threads = vec![];
        for &cpu in cpus {
            let h: Arc<Histogram> = Arc::from(Histogram::boxed());
            hists.push(h.clone());
            let stop = stop.clone();
            let period_ns = period.as_nanos().max(1) as u64;
            threads.push(
                thread::Builder::new()
                    .name(format!("check-timer{cpu}"))
                    .spawn(move || {
                        let pinned = rt::pin_to_set(&[cpu]).is_ok();
                        let fifo = rt::set_fifo(priority).unwrap_or(false);
                        // Relaxed: a stop request; the join that follows
                        // is what synchronises the results.
                        measure(&h, period_ns, || stop.load(Ordering::Relaxed));
                        TimerThreadSetup { cpu, pinned, fifo }
                    })?,
            );
        }
        Ok(TimerRun {
            hists,
            stop,
            threads,
        })
    }

    /// The live worst case over all CPUs (for progress display).
    pub fn live_worst(&self) -> u64 {
        self.hists.iter().map(|h| h.live().1).max().unwrap_or(0)
    }

    /// Stops the threads; returns each one's setup and histogram.
    pub fn stop(self) -> (Vec<TimerThreadSetup>, Vec<Arc<Histogram>>) {
        self.stop.store(true, Ordering::Relaxed); // see the load above
        let setups = self
            .threads
            .into_iter()
            .map(|t| t.join().unwrap_or_default())
            .collect();
        (setups, self.hists)
    }
}
