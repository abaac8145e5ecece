//! Readiness, liveness and budgets from a process's timing reports
//! (controller crate, channel `/rtdeploy/timing/<process>`). Pure: the
//! supervisor reads the reports and passes them in with the time.
//!
//! - A process is *expected to report* when it uses channels or has
//!   budgets: it runs the controller's event loop, which publishes a
//!   report every period (1 s).
//! - *Ready* (for the processes that name it in `after:`): its first
//!   report from the current pid arrived; a process not expected to report
//!   is ready once it runs.
//! - *Unhealthy*: no new report for three periods (or, before the first,
//!   for [`FIRST_REPORT_GRACE`]).
//! - *Over budget*: a report whose worst wakeup (watchers and timers) is
//!   above `budgets.wakeup` or the watched channel's `budget`, or whose
//!   worst handler run is above `budgets.handler`. Each such report is
//!   counted and marks the process degraded.
//! - *Implausible*: a report whose figures cannot be true ([`plausible`]:
//!   a wakeup or handler run longer than the process has run, a maximum
//!   below its own percentile or average, a period outside 1 ms to an
//!   hour). Any process of the robot group can write its timing channel:
//!   such a report keeps the process alive (it came from its pid) but is
//!   not taken at its word, neither for budgets nor for the metrics, and
//!   the supervisor says so.

use std::collections::BTreeMap;
use std::time::Duration;

use controller::timing_report::{EntryKind, TimingReport};

use crate::config::ProcessConfig;

/// How long a freshly started process may take to publish its first report.
pub const FIRST_REPORT_GRACE: Duration = Duration::from_secs(5);

/// Report periods a loop may have (it publishes once a second).
pub const PERIODS: std::ops::RangeInclusive<u64> = 1_000_000..=3_600_000_000_000;

/// What [`Health::on_report`] made of a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportVerdict {
    /// Not new (a repeat, another pid's): nothing changed.
    Old,
    /// Within budget.
    Ok,
    /// Over budget: why.
    Over(String),
    /// Its figures cannot be true: why. Counted for liveness only.
    Implausible(String),
}

/// Why a timing report's figures cannot be true ([`plausible`]): the
/// first figure that is not, named by its entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportCheckError {
    #[error("period {period_ns} ns (expected 1 ms to an hour)")]
    Period { period_ns: u64 },
    /// A wakeup or handler run longer than the process has run.
    #[error("{entry} {what} {}us is longer than the process has run ({:.1}s)", .ns / 1000, .uptime.as_secs_f64())]
    LongerThanRun {
        entry: String,
        what: &'static str,
        ns: u64,
        uptime: Duration,
    },
    /// A figure above the one that bounds it (`wakeup p99` above `max`).
    #[error("{entry} {what} {}us is above its {bound} {}us", .ns / 1000, .bound_ns / 1000)]
    OutOfOrder {
        entry: String,
        what: &'static str,
        ns: u64,
        bound: &'static str,
        bound_ns: u64,
    },
    #[error("{entry}: {count} events in a period of {period_ns} ns")]
    TooManyEvents {
        entry: String,
        count: u64,
        period_ns: u64,
    },
}

/// Whether `r`'s figures can be true of a process that has run for
/// `uptime`: every wakeup and handler run no longer than that (and a
/// second, for the clocks' granularity), each entry's figures in order
/// (min <= avg <= max, p50 <= p99 <= max), at most one event per
/// nanosecond of the period, and a period of 1 ms to an hour. `Err` names
/// the first figure that is not.
pub fn plausible(r: &TimingReport, uptime: Duration) -> Result<(), ReportCheckError> {
    if !PERIODS.contains(&r.period_ns) {
        return Err(ReportCheckError::Period {
            period_ns: r.period_ns,
        });
    }
    let ran = uptime.saturating_add(Duration::from_secs(1));
    let ran_ns = u64::try_from(ran.as_nanos()).unwrap_or(u64::MAX);
    for e in r
        .entries
        .iter()
        .filter(|e| matches!(e.kind, EntryKind::Watcher | EntryKind::Timer) && e.count > 0)
    {
        let n = &e.name;
        for (what, v) in [
            ("wakeup max", e.latency_max_ns),
            ("handler max", e.handler_max_ns),
            (
                "wakeup max since start",
                e.since_start_latency_max_ns.unwrap_or(0),
            ),
        ] {
            if v > ran_ns {
                return Err(ReportCheckError::LongerThanRun {
                    entry: n.to_string(),
                    what,
                    ns: v,
                    uptime,
                });
            }
        }
        let order = [
            ("wakeup min", e.latency_min_ns, "avg", e.latency_avg_ns),
            ("wakeup avg", e.latency_avg_ns, "max", e.latency_max_ns),
            ("wakeup p99", e.latency_p99_ns, "max", e.latency_max_ns),
            (
                "wakeup p50",
                e.latency_p50_ns.unwrap_or(0),
                "p99",
                e.latency_p99_ns,
            ),
            ("handler avg", e.handler_avg_ns, "max", e.handler_max_ns),
            ("handler p99", e.handler_p99_ns, "max", e.handler_max_ns),
        ];
        for (a, x, b, y) in order {
            if x > y {
                return Err(ReportCheckError::OutOfOrder {
                    entry: n.to_string(),
                    what: a,
                    ns: x,
                    bound: b,
                    bound_ns: y,
                });
            }
        }
        if e.count > r.period_ns {
            return Err(ReportCheckError::TooManyEvents {
                entry: n.to_string(),
                count: e.count,
                period_ns: r.period_ns,
            });
        }
    }
    Ok(())
}

/// What the supervisor knows about one process's reports.
#[derive(Debug, Clone, Default)]
pub struct Health {
    pub expected: bool,
    /// Since the process (re)started, in supervisor time.
    pub started_at: Duration,
    /// `seq` and arrival of the latest new report from the current pid.
    pub last_seq: Option<u64>,
    pub last_at: Option<Duration>,
    pub period: Duration,
    pub wakeup_p99_ns: Option<u64>,
    pub wakeup_max_ns: Option<u64>,
    /// The wake backend the latest report names (`io_uring-futex`,
    /// `futex_waitv`, `doorbell`).
    pub backend: Option<String>,
    pub over_budget: u64,
    /// Why the last report that went over did so.
    pub last_over: Option<String>,
    /// The latest new report of this run, and the worst wakeup and
    /// handler run of this run's reports.
    pub last_report: Option<TimingReport>,
    pub run_wakeup_max_ns: Option<u64>,
    pub run_handler_max_ns: Option<u64>,
    /// The tightest wakeup limit of the latest report's watchers and
    /// timers, and the handler budget.
    pub wakeup_budget: Option<Duration>,
    pub handler_budget: Option<Duration>,
    /// Histograms and totals over every run (the metrics).
    pub metrics: crate::metrics::ProcessMetrics,
}

impl Health {
    pub fn new(p: &ProcessConfig) -> Health {
        Health {
            expected: !p.publishes.is_empty()
                || !p.subscribes.is_empty()
                || p.budgets.wakeup.is_some()
                || p.budgets.handler.is_some(),
            period: Duration::from_secs(1),
            ..Default::default()
        }
    }

    /// The process (re)started at `now`: forget the previous run's reports
    /// (the over-budget count stays, it is a history).
    pub fn restarted(&mut self, now: Duration) {
        self.started_at = now;
        self.last_seq = None;
        self.last_at = None;
        self.wakeup_p99_ns = None;
        self.wakeup_max_ns = None;
        self.backend = None;
        self.last_report = None;
        self.run_wakeup_max_ns = None;
        self.run_handler_max_ns = None;
    }

    pub fn ready(&self) -> bool {
        !self.expected || self.last_seq.is_some()
    }

    /// Takes a report read at `now` for the process running as `pid`: new
    /// or not, within budget, over it (why), or implausible (why:
    /// [`plausible`], against the time since the process started).
    pub fn on_report(
        &mut self,
        r: &TimingReport,
        pid: i32,
        now: Duration,
        p: &ProcessConfig,
        channel_budgets: &BTreeMap<String, Duration>,
    ) -> ReportVerdict {
        if r.pid != pid as u32 || self.last_seq == Some(r.seq) {
            return ReportVerdict::Old;
        }
        self.last_seq = Some(r.seq);
        self.last_at = Some(now);
        if let Err(why) = plausible(r, now.saturating_sub(self.started_at)) {
            return ReportVerdict::Implausible(why.to_string());
        }
        self.period = Duration::from_nanos(r.period_ns.max(1));
        self.backend = Some(r.backend.clone());
        let waits = r
            .entries
            .iter()
            .filter(|e| matches!(e.kind, EntryKind::Watcher | EntryKind::Timer) && e.count > 0);
        self.wakeup_p99_ns = waits.clone().map(|e| e.latency_p99_ns).max();
        self.wakeup_max_ns = waits.clone().map(|e| e.latency_max_ns).max();
        let handler_max = waits.clone().map(|e| e.handler_max_ns).max();
        self.run_wakeup_max_ns = self.run_wakeup_max_ns.max(self.wakeup_max_ns);
        self.run_handler_max_ns = self.run_handler_max_ns.max(handler_max);
        let limit_of = |e: &controller::timing_report::EntryReport| match (
            p.budgets.wakeup,
            channel_budgets.get(&e.name),
        ) {
            (Some(b), Some(c)) => Some(b.0.min(*c)),
            (Some(b), None) => Some(b.0),
            (None, Some(c)) if e.kind == EntryKind::Watcher => Some(*c),
            _ => None,
        };
        self.wakeup_budget = waits.clone().filter_map(limit_of).min();
        self.handler_budget = p.budgets.handler.map(|h| h.0);
        self.metrics
            .observe(r, self.wakeup_budget, self.handler_budget);
        self.last_report = Some(r.clone());
        let mut over = Vec::new();
        for e in waits {
            if let Some(limit) = limit_of(e) {
                if e.latency_max_ns > limit.as_nanos() as u64 {
                    over.push(format!(
                        "{} wakeup max {}us > {}us",
                        e.name,
                        e.latency_max_ns / 1000,
                        limit.as_micros()
                    ));
                }
            }
            if let Some(h) = p.budgets.handler {
                if e.handler_max_ns > h.0.as_nanos() as u64 {
                    over.push(format!(
                        "{} handler max {}us > {}us",
                        e.name,
                        e.handler_max_ns / 1000,
                        h.0.as_micros()
                    ));
                }
            }
        }
        if over.is_empty() {
            return ReportVerdict::Ok;
        }
        self.over_budget += 1;
        let why = over.join(", ");
        self.last_over = Some(why.clone());
        ReportVerdict::Over(why)
    }

    /// The budget column of `deploy status` at `now`.
    pub fn describe(&self, now: Duration) -> String {
        if !self.expected {
            return "not monitored (no channels, no budgets)".into();
        }
        let liveness = match self.last_at {
            None if now.saturating_sub(self.started_at) > FIRST_REPORT_GRACE => Some(format!(
                "unhealthy: no timing report in {:.1}s since start",
                now.saturating_sub(self.started_at).as_secs_f64()
            )),
            None => Some("waiting for the first timing report".to_string()),
            Some(t) if now.saturating_sub(t) > self.period.saturating_mul(3) => Some(format!(
                "unhealthy: no timing report for {:.1}s",
                now.saturating_sub(t).as_secs_f64()
            )),
            Some(_) => None,
        };
        match (liveness, self.over_budget) {
            (Some(l), 0) => l,
            (Some(l), n) => format!("{l}; {n} report(s) over budget"),
            (None, 0) => "ok".into(),
            (None, n) => format!(
                "over: {n} report(s) over budget, last: {}",
                self.last_over.as_deref().unwrap_or("")
            ),
        }
    }

    /// The timing part of the status (none before the first report).
    pub fn timing_status(&self) -> Option<crate::metrics::TimingStatus> {
        use crate::metrics::{EntryStatus, TimingStatus};
        let r = self.last_report.as_ref()?;
        let us = |ns: u64| ns as f64 / 1000.0;
        let waits = r
            .entries
            .iter()
            .filter(|e| matches!(e.kind, EntryKind::Watcher | EntryKind::Timer) && e.count > 0);
        let period_s = r.period_ns.max(1) as f64 / 1e9;
        // The worst over watchers and timers of a figure the previous
        // report layout lacks: `None` when no entry has it.
        let worst = |f: fn(&controller::timing_report::EntryReport) -> Option<u64>| {
            waits.clone().filter_map(f).max().map(us)
        };
        // Since start: every entry the loop has, also those idle in the
        // latest window.
        let since_start = |f: fn(&controller::timing_report::EntryReport) -> Option<u64>| {
            r.entries
                .iter()
                .filter(|e| matches!(e.kind, EntryKind::Watcher | EntryKind::Timer) && e.total > 0)
                .filter_map(f)
                .max()
                .map(us)
        };
        Some(TimingStatus {
            seq: r.seq,
            period_s,
            layout: Some(r.layout),
            wake_class: r.class,
            wakeup_avg_us: waits.clone().map(|e| e.latency_avg_ns).max().map(us),
            wakeup_p50_us: worst(|e| e.latency_p50_ns),
            wakeup_p99_us: self.wakeup_p99_ns.map(us),
            wakeup_max_us: self.wakeup_max_ns.map(us),
            since_start_wakeup_p50_us: since_start(|e| e.since_start_latency_p50_ns),
            since_start_wakeup_p99_us: since_start(|e| e.since_start_latency_p99_ns),
            since_start_wakeup_max_us: since_start(|e| e.since_start_latency_max_ns),
            handler_avg_us: waits.clone().map(|e| e.handler_avg_ns).max().map(us),
            handler_max_us: waits.map(|e| e.handler_max_ns).max().map(us),
            run_wakeup_max_us: self.run_wakeup_max_ns.map(us),
            run_handler_max_us: self.run_handler_max_ns.map(us),
            wakeup_budget_us: self.wakeup_budget.map(|d| d.as_secs_f64() * 1e6),
            handler_budget_us: self.handler_budget.map(|d| d.as_secs_f64() * 1e6),
            reports: self.metrics.reports,
            reports_skipped: self.metrics.reports_skipped,
            wakeup_hist: self.metrics.wakeup.clone(),
            handler_hist: self.metrics.handler.clone(),
            entries: r
                .entries
                .iter()
                .map(|e| {
                    let kind = crate::metrics::kind_name(e.kind);
                    EntryStatus {
                        kind: e.kind,
                        name: e.name.clone(),
                        rate_hz: e.count as f64 / period_s,
                        latency_avg_us: us(e.latency_avg_ns),
                        latency_p50_us: e.latency_p50_ns.map(us),
                        latency_p99_us: us(e.latency_p99_ns),
                        latency_max_us: us(e.latency_max_ns),
                        since_start_latency_p50_us: e.since_start_latency_p50_ns.map(us),
                        since_start_latency_p99_us: e.since_start_latency_p99_ns.map(us),
                        since_start_latency_max_us: e.since_start_latency_max_ns.map(us),
                        handler_max_us: us(e.handler_max_ns),
                        lost: e.lost,
                        cross_class: e.cross_class.filter(|_| e.kind == EntryKind::Watcher),
                        cross_class_max_us: e
                            .cross_class_max_ns
                            .filter(|_| e.kind == EntryKind::Watcher)
                            .map(us),
                        totals: self
                            .metrics
                            .entries
                            .get(&(kind, e.name.clone()))
                            .cloned()
                            .unwrap_or_default(),
                    }
                })
                .collect(),
        })
    }

    pub fn unhealthy(&self, now: Duration) -> bool {
        self.describe(now).starts_with("unhealthy")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use controller::timing_report::EntryReport;

    fn cfg(budget_us: Option<u64>) -> ProcessConfig {
        let mut v = serde_json::json!({"name": "l", "exec": "bin/l", "subscribes": ["/ping"]});
        if let Some(b) = budget_us {
            v["budgets"] = serde_json::json!({"wakeup": format!("{b}us")});
        }
        serde_json::from_value(v).unwrap()
    }

    fn report(pid: u32, seq: u64, max_us: u64) -> TimingReport {
        TimingReport {
            process: "l".into(),
            pid,
            seq,
            time_ns: 0,
            period_ns: 1_000_000_000,
            backend: "io_uring-futex".into(),
            class: None,
            layout: controller::timing_report::LAYOUT,
            entries: vec![EntryReport {
                kind: EntryKind::Watcher,
                name: "/ping".into(),
                count: 10,
                total: 10,
                latency_min_ns: 1000,
                latency_avg_ns: 2000,
                latency_p50_ns: Some(1500),
                latency_p99_ns: 3000,
                latency_max_ns: max_us * 1000,
                since_start_latency_p50_ns: Some(1600),
                since_start_latency_p99_ns: Some(4000),
                since_start_latency_max_ns: Some(seq * 1_000_000),
                handler_avg_ns: 100,
                handler_p99_ns: 100,
                handler_max_ns: 100,
                eagain: 0,
                lost: 0,
                missed: 0,
                errors: 0,
                healed: 0,
                faults: 0,
                cross_class: None,
                cross_class_p99_ns: None,
                cross_class_max_ns: None,
            }],
        }
    }

    #[test]
    fn readiness_liveness_and_budgets() {
        let p = cfg(Some(200));
        let none = BTreeMap::new();
        let mut h = Health::new(&p);
        h.restarted(Duration::from_secs(10));
        assert!(!h.ready());
        assert_eq!(
            h.describe(Duration::from_secs(11)),
            "waiting for the first timing report"
        );
        assert!(h.unhealthy(Duration::from_secs(16)));
        // A report from another pid (a previous run) does not count.
        assert_eq!(
            h.on_report(&report(7, 1, 50), 8, Duration::from_secs(12), &p, &none),
            ReportVerdict::Old
        );
        assert!(!h.ready());
        assert_eq!(
            h.on_report(&report(8, 1, 50), 8, Duration::from_secs(12), &p, &none),
            ReportVerdict::Ok
        );
        assert!(h.ready());
        assert_eq!(h.describe(Duration::from_secs(13)), "ok");
        assert_eq!(
            (h.wakeup_p99_ns, h.wakeup_max_ns),
            (Some(3000), Some(50_000))
        );
        assert_eq!(
            h.on_report(&report(8, 2, 900), 8, Duration::from_secs(13), &p, &none),
            ReportVerdict::Over("/ping wakeup max 900us > 200us".into())
        );
        // The same report read twice is counted once.
        assert_eq!(
            h.on_report(&report(8, 2, 900), 8, Duration::from_secs(14), &p, &none),
            ReportVerdict::Old
        );
        assert_eq!(h.over_budget, 1);
        assert!(h
            .describe(Duration::from_secs(14))
            .starts_with("over: 1 report(s) over budget"));
        assert_eq!(
            h.describe(Duration::from_secs(17)),
            "unhealthy: no timing report for 4.0s; 1 report(s) over budget"
        );
    }

    #[test]
    fn the_status_carries_the_median_and_since_start_figures_or_none() {
        let p = cfg(None);
        let none = BTreeMap::new();
        let mut h = Health::new(&p);
        assert!(h.timing_status().is_none());
        h.on_report(&report(8, 3, 50), 8, Duration::from_secs(1), &p, &none);
        let t = h.timing_status().unwrap();
        assert_eq!(t.layout, Some(controller::timing_report::LAYOUT));
        assert_eq!(t.wakeup_p50_us, Some(1.5));
        assert_eq!(
            (
                t.since_start_wakeup_p50_us,
                t.since_start_wakeup_p99_us,
                t.since_start_wakeup_max_us
            ),
            (Some(1.6), Some(4.0), Some(3000.0))
        );
        assert_eq!(t.entries[0].latency_p50_us, Some(1.5));
        assert_eq!(t.entries[0].since_start_latency_max_us, Some(3000.0));
        // A report of the previous layout: what it has, the rest absent.
        let mut old = report(8, 4, 60);
        old.layout = 2;
        for e in &mut old.entries {
            e.latency_p50_ns = None;
            e.since_start_latency_p50_ns = None;
            e.since_start_latency_p99_ns = None;
            e.since_start_latency_max_ns = None;
        }
        h.on_report(&old, 8, Duration::from_secs(2), &p, &none);
        let t = h.timing_status().unwrap();
        assert_eq!(t.layout, Some(2));
        assert_eq!((t.wakeup_p99_us, t.wakeup_max_us), (Some(3.0), Some(60.0)));
        assert_eq!(t.wakeup_p50_us, None);
        assert_eq!(t.since_start_wakeup_p99_us, None);
        assert_eq!(t.since_start_wakeup_max_us, None);
        assert_eq!(t.entries[0].since_start_latency_p99_us, None);
        let json = serde_json::to_value(&t).unwrap();
        assert_eq!(json["since_start_wakeup_p99_us"], serde_json::Value::Null);
    }

    #[test]
    fn reports_that_cannot_be_true_are_said_so_and_not_counted() {
        let p = cfg(Some(200));
        let none = BTreeMap::new();
        let mut h = Health::new(&p);
        h.restarted(Duration::from_secs(10));
        // A wakeup of 584 years, 2 s after the start.
        let mut r = report(8, 1, 0);
        r.entries[0].latency_max_ns = 18_446_603_336_221_196_000;
        assert_eq!(
            h.on_report(&r, 8, Duration::from_secs(12), &p, &none),
            ReportVerdict::Implausible(
                "/ping wakeup max 18446603336221196us is longer than the process has run (2.0s)"
                    .into()
            )
        );
        assert_eq!(h.over_budget, 0);
        assert_eq!(h.metrics.reports, 0);
        assert!(h.timing_status().is_none());
        // It came from the process: alive, and ready.
        assert!(h.ready());
        assert_eq!(h.describe(Duration::from_secs(12)), "ok");
        // Figures out of order, a period of u64::MAX ns (whose three
        // periods overflowed a Duration), more events than nanoseconds.
        let mut r = report(8, 2, 50);
        r.entries[0].latency_p99_ns = 60_000;
        assert_eq!(
            h.on_report(&r, 8, Duration::from_secs(13), &p, &none),
            ReportVerdict::Implausible("/ping wakeup p99 60us is above its max 50us".into())
        );
        let mut r = report(8, 3, 50);
        r.period_ns = u64::MAX;
        assert!(matches!(
            h.on_report(&r, 8, Duration::from_secs(13), &p, &none),
            ReportVerdict::Implausible(w) if w.starts_with("period 18446744073709551615 ns")
        ));
        assert_eq!(h.describe(Duration::from_secs(14)), "ok");
        let mut r = report(8, 4, 50);
        r.entries[0].count = 2_000_000_000;
        assert!(matches!(
            h.on_report(&r, 8, Duration::from_secs(13), &p, &none),
            ReportVerdict::Implausible(w) if w.contains("events in a period")
        ));
        // A true report after them is taken.
        assert_eq!(
            h.on_report(&report(8, 5, 900), 8, Duration::from_secs(14), &p, &none),
            ReportVerdict::Over("/ping wakeup max 900us > 200us".into())
        );
        assert_eq!(h.over_budget, 1);
    }

    #[test]
    fn channel_budgets_apply_to_watchers() {
        let p = cfg(None);
        let budgets = BTreeMap::from([("/ping".to_string(), Duration::from_micros(100))]);
        let mut h = Health::new(&p);
        assert!(matches!(
            h.on_report(&report(1, 1, 150), 1, Duration::ZERO, &p, &budgets),
            ReportVerdict::Over(_)
        ));
        let plain: ProcessConfig =
            serde_json::from_value(serde_json::json!({"name": "s", "exec": "/bin/sleep"})).unwrap();
        let h = Health::new(&plain);
        assert!(h.ready());
        assert_eq!(
            h.describe(Duration::from_secs(100)),
            "not monitored (no channels, no budgets)"
        );
    }
}
