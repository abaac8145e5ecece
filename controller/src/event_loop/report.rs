//! The loop's timing report: per watcher, timer and sender, what it
//! counted and how late it ran, published on the process's timing channel
//! once a period (the supervisor enforces budgets on it) and readable at
//! any time with [`EventLoop::report_now`].

use crate::channel::{Channel, Publisher};
use crate::timing_report::{self, EntryKind, EntryStats, RawReport};

use super::{EventLoop, EventLoopCreateError, TimingOptions};

pub(super) struct Reporting {
    publisher: Publisher,
    raw: Box<RawReport>,
    seq: u64,
    period: u64,
}

impl EventLoop {
    pub(super) fn enable_reports(&mut self, t: &TimingOptions) -> Result<(), EventLoopCreateError> {
        let err = |reason: String| EventLoopCreateError::Timing {
            process: t.process.clone(),
            reason,
        };
        let name = timing_report::timing_channel_name(&t.process);
        let (ch, _) = Channel::create(
            &t.shm_dir,
            &name,
            &timing_report::timing_geometry(),
            None,
            &self.proc_root,
        )
        .map_err(|e| err(units::error::Chain(&e).to_string()))?;
        let mut publisher = ch
            .publisher(&self.proc_root)
            .map_err(|e| err(units::error::Chain(&e).to_string()))?;
        publisher.set_clock(self.clock.clone());
        let mut raw = Box::<RawReport>::default();
        timing_report::fill_name(&mut raw.process, &t.process);
        raw.pid = self.pid as u64;
        raw.backend = self.backend().code();
        raw.class = timing_report::class_code(self.class);
        let period = t.period.as_nanos().max(1) as u64;
        raw.period_ns = period;
        let timer = self.timers.push(
            "timing-report".into(),
            self.clock.now_ns() + period,
            period,
            None,
        );
        self.timers.report = Some(timer);
        self.reporting = Some(Reporting {
            publisher,
            raw,
            seq: 0,
            period,
        });
        Ok(())
    }

    /// The loop's counters now, as a report (allocates; for tests and
    /// diagnostics, not for the real-time path).
    pub fn report_now(&self) -> timing_report::TimingReport {
        let mut raw = Box::<RawReport>::default();
        self.fill_report(&mut raw, 0);
        timing_report::TimingReport::from_raw(&raw).expect("freshly built report decodes")
    }

    fn fill_report(&self, raw: &mut RawReport, seq: u64) {
        raw.seq = seq;
        raw.time_ns = self.clock.now_ns();
        raw.pid = self.pid as u64;
        raw.backend = self.backend().code();
        raw.class = timing_report::class_code(self.class);
        let mut n = 0;
        for w in &self.watchers {
            if n < timing_report::MAX_ENTRIES {
                raw.entry[n].fill(EntryKind::Watcher, &w.name, &w.stats, w.total);
                n += 1;
            }
        }
        for (i, t) in self.timers.list.iter().enumerate() {
            if self.timers.internal(i) {
                continue;
            }
            if n < timing_report::MAX_ENTRIES {
                raw.entry[n].fill(EntryKind::Timer, &t.name, &t.stats, t.total);
                n += 1;
            }
        }
        for s in &self.senders {
            if n < timing_report::MAX_ENTRIES {
                let (count, errors, total) = s.window();
                let stats = EntryStats {
                    count,
                    errors,
                    ..EntryStats::default()
                };
                raw.entry[n].fill(EntryKind::Sender, &s.name, &stats, total);
                n += 1;
            }
        }
        raw.entries = n as u64;
    }

    /// Timing reports this loop has published.
    pub(super) fn reports_published(&self) -> u64 {
        self.reporting.as_ref().map_or(0, |r| r.seq)
    }

    pub(super) fn publish_report(&mut self) {
        let Some(mut rep) = self.reporting.take() else {
            return;
        };
        rep.seq += 1;
        self.fill_report(&mut rep.raw, rep.seq);
        rep.raw.period_ns = rep.period;
        let _ = rep.publisher.publish_value(&*rep.raw);
        for w in &mut self.watchers {
            w.stats.new_period();
        }
        for t in &mut self.timers.list {
            t.stats.new_period();
        }
        for s in &self.senders {
            s.new_window();
        }
        self.reporting = Some(rep);
    }
}
