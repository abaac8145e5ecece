//! Metrics: what the supervisor gathers from the timing reports over
//! time ([`ProcessMetrics`], kept in [`crate::health::Health`]), what the
//! status carries of it ([`TimingStatus`]), and the Prometheus text
//! exposition of a status ([`exposition`]) that `deploy metrics` prints and
//! the supervisor writes for node_exporter's textfile collector
//! ([`Textfile`]: every N seconds, temporary file + rename).
//!
//! Histograms observe one value per timing report: the report's worst
//! wakeup (and worst handler run) of its watchers and timers. Their `le`
//! buckets are in microseconds and end at the budget (then twice the
//! budget, then `+Inf`): Prometheus' default buckets start at 5 ms and
//! would put every wakeup of a real-time loop in the first one. A report
//! published while the supervisor did not look (it reads twice per report
//! period) is counted in `rtdeploy_timing_reports_skipped_total`, not in
//! the histograms or the event counters.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use controller::timing_report::{EntryKind, TimingReport};
use serde::{Deserialize, Serialize};

use crate::status::SupervisorStatus;

/// Bucket bounds for a budget (microseconds): the 1-2-5 series below it,
/// the budget, twice the budget. Without a budget, 1 us to 10 ms.
pub fn bounds_for(budget: Option<Duration>) -> Vec<f64> {
    let top = budget.map(|b| b.as_secs_f64() * 1e6);
    let limit = top.unwrap_or(10_000.0);
    let mut out = Vec::new();
    let mut decade = 1.0;
    'series: loop {
        for m in [1.0, 2.0, 5.0] {
            let v: f64 = m * decade;
            if v >= limit || out.len() >= 24 {
                break 'series;
            }
            out.push(v);
        }
        decade *= 10.0;
    }
    out.push(limit);
    if top.is_some() {
        out.push(limit * 2.0);
    }
    out
}

/// A histogram of one value per report, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportHistogram {
    /// Upper bounds (`le`), ascending, `+Inf` implied.
    pub bounds_us: Vec<f64>,
    /// Observations per bucket (not cumulative); one more than the
    /// bounds: the last is above every bound.
    pub counts: Vec<u64>,
    pub sum_us: f64,
    pub count: u64,
}

impl ReportHistogram {
    pub fn new(bounds_us: Vec<f64>) -> ReportHistogram {
        ReportHistogram {
            counts: vec![0; bounds_us.len() + 1],
            bounds_us,
            sum_us: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, us: f64) {
        let i = self
            .bounds_us
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(self.bounds_us.len());
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.sum_us += us;
        self.count += 1;
    }
}

/// Counters of one watcher, timer or sender, over the reports read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EntryTotals {
    pub events: u64,
    pub lost: u64,
    pub missed: u64,
    pub errors: u64,
    pub faults: u64,
    /// Watchers: messages from publishers of the other wake class.
    #[serde(default)]
    pub cross_class: u64,
}

/// What the supervisor accumulates from one process's reports, across its
/// restarts.
#[derive(Debug, Clone, Default)]
pub struct ProcessMetrics {
    pub reports: u64,
    pub reports_skipped: u64,
    last_seq: Option<(u32, u64)>,
    /// Per-report worst wakeup and handler run; created at the first
    /// report, with the process's tightest wakeup budget and its handler
    /// budget.
    pub wakeup: Option<ReportHistogram>,
    pub handler: Option<ReportHistogram>,
    /// `(kind, name)` -> totals.
    pub entries: BTreeMap<(&'static str, String), EntryTotals>,
}

impl ProcessMetrics {
    /// Takes a new report (the caller has dropped repeats).
    pub fn observe(
        &mut self,
        r: &TimingReport,
        wakeup_budget: Option<Duration>,
        handler_budget: Option<Duration>,
    ) {
        self.reports += 1;
        if let Some((pid, seq)) = self.last_seq {
            if pid == r.pid && r.seq > seq.saturating_add(1) {
                self.reports_skipped = self
                    .reports_skipped
                    .saturating_add((r.seq - seq - 1).min(1 << 32));
            }
        }
        self.last_seq = Some((r.pid, r.seq));
        let waits = r
            .entries
            .iter()
            .filter(|e| matches!(e.kind, EntryKind::Watcher | EntryKind::Timer) && e.count > 0);
        if let Some(max) = waits.clone().map(|e| e.latency_max_ns).max() {
            self.wakeup
                .get_or_insert_with(|| ReportHistogram::new(bounds_for(wakeup_budget)))
                .observe(max as f64 / 1000.0);
        }
        if let Some(max) = waits.map(|e| e.handler_max_ns).max() {
            self.handler
                .get_or_insert_with(|| ReportHistogram::new(bounds_for(handler_budget)))
                .observe(max as f64 / 1000.0);
        }
        for e in r
            .entries
            .iter()
            .take(controller::timing_report::MAX_ENTRIES)
        {
            // Bounded: a process has at most MAX_ENTRIES entries a report,
            // and names it cannot grow past the map's few hundred.
            let key = (kind_name(e.kind), e.name.clone());
            if self.entries.len() >= 256 && !self.entries.contains_key(&key) {
                continue;
            }
            let t = self.entries.entry(key).or_default();
            t.events = t.events.saturating_add(e.count);
            t.lost = t.lost.saturating_add(e.lost);
            t.missed = t.missed.saturating_add(e.missed);
            t.errors = t.errors.saturating_add(e.errors);
            t.faults = t.faults.saturating_add(e.faults);
            t.cross_class = t.cross_class.saturating_add(e.cross_class.unwrap_or(0));
        }
    }
}

/// One watcher, timer or sender as the status shows it: its latest
/// report window and its totals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryStatus {
    pub kind: EntryKind,
    pub name: String,
    /// Events per second in the latest window.
    pub rate_hz: f64,
    pub latency_avg_us: f64,
    /// The window's median (`None` from a report of the previous layout
    /// and from older supervisors).
    #[serde(default)]
    pub latency_p50_us: Option<f64>,
    pub latency_p99_us: f64,
    pub latency_max_us: f64,
    /// Since the process's event loop started (`None` as the median).
    #[serde(default)]
    pub since_start_latency_p50_us: Option<f64>,
    #[serde(default)]
    pub since_start_latency_p99_us: Option<f64>,
    #[serde(default)]
    pub since_start_latency_max_us: Option<f64>,
    pub handler_max_us: f64,
    /// Lost (watchers) in the latest window.
    pub lost: u64,
    /// Watchers: messages of the latest window from publishers of the
    /// other wake class, and the longest wakeup latency among them (`None`
    /// from reports of earlier layouts and from older supervisors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_class: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_class_max_us: Option<f64>,
    pub totals: EntryTotals,
}

/// The timing part of a process's status (absent from supervisors that
/// predate it, and before the first report).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TimingStatus {
    /// The latest report's sequence number and window.
    pub seq: u64,
    pub period_s: f64,
    /// The binary layout of the latest report: 3, or 2 from a controller
    /// built against the previous runtime, which carries no median and
    /// nothing since start (those figures are then `None`). `None` from
    /// older supervisors.
    #[serde(default)]
    pub layout: Option<u32>,
    /// The event loop's wake class (`None` from reports of earlier
    /// layouts and from older supervisors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_class: Option<controller::WakeClass>,
    /// Worst over watchers and timers in the latest window: average,
    /// median, 99th percentile, longest.
    pub wakeup_avg_us: Option<f64>,
    #[serde(default)]
    pub wakeup_p50_us: Option<f64>,
    pub wakeup_p99_us: Option<f64>,
    pub wakeup_max_us: Option<f64>,
    pub handler_avg_us: Option<f64>,
    pub handler_max_us: Option<f64>,
    /// Worst over watchers and timers since the process's event loop
    /// started, from the loop's own histograms (every wakeup, also those
    /// of reports the supervisor did not read).
    #[serde(default)]
    pub since_start_wakeup_p50_us: Option<f64>,
    #[serde(default)]
    pub since_start_wakeup_p99_us: Option<f64>,
    #[serde(default)]
    pub since_start_wakeup_max_us: Option<f64>,
    /// The worst of the reports the supervisor read since this run of the
    /// process started.
    pub run_wakeup_max_us: Option<f64>,
    pub run_handler_max_us: Option<f64>,
    /// The tightest wakeup budget of its watchers and timers, its handler
    /// budget.
    pub wakeup_budget_us: Option<f64>,
    pub handler_budget_us: Option<f64>,
    pub reports: u64,
    pub reports_skipped: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wakeup_hist: Option<ReportHistogram>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler_hist: Option<ReportHistogram>,
    pub entries: Vec<EntryStatus>,
}

fn t(p: &crate::status::ProcessStatus) -> Option<&TimingStatus> {
    p.timing.as_ref()
}

/// A label value escaped for the text format (backslash, double quote,
/// newline).
fn label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// A sample value: Go's float spelling for the specials.
fn num(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// Builds a text exposition family by family.
struct Families {
    out: String,
}

impl Families {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        self.out
            .push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
    }
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            let l: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", label(v)))
                .collect();
            self.out.push_str(&format!("{{{}}}", l.join(",")));
        }
        self.out.push_str(&format!(" {}\n", num(v)));
    }
    fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &ReportHistogram) {
        let mut cum = 0u64;
        for (i, b) in h.bounds_us.iter().enumerate() {
            cum += h.counts.get(i).copied().unwrap_or(0);
            let le = num(*b);
            let mut l = labels.to_vec();
            l.push(("le", &le));
            self.sample(&format!("{name}_bucket"), &l, cum as f64);
        }
        let mut l = labels.to_vec();
        l.push(("le", "+Inf"));
        self.sample(&format!("{name}_bucket"), &l, h.count as f64);
        self.sample(&format!("{name}_sum"), labels, h.sum_us);
        self.sample(&format!("{name}_count"), labels, h.count as f64);
    }
}

pub fn kind_name(k: EntryKind) -> &'static str {
    match k {
        EntryKind::Watcher => "watcher",
        EntryKind::Timer => "timer",
        EntryKind::Sender => "sender",
    }
}

/// The Prometheus text exposition (format 0.0.4) of a status.
pub fn exposition(s: &SupervisorStatus) -> String {
    let mut f = Families { out: String::new() };
    let robot = s.robot.as_str();
    f.family(
        "rtdeploy_supervisor_uptime_seconds",
        "gauge",
        "Seconds since the supervisor started.",
    );
    f.sample(
        "rtdeploy_supervisor_uptime_seconds",
        &[("robot", robot)],
        s.uptime_s,
    );
    f.family(
        "rtdeploy_boot_check_passed",
        "gauge",
        "1 when this boot's timing check passed, 0 when it failed, was skipped or is disabled.",
    );
    f.sample(
        "rtdeploy_boot_check_passed",
        &[("robot", robot)],
        if s.boot_check.starts_with("passed") {
            1.0
        } else {
            0.0
        },
    );
    // A system update counted by the boot loader (`update.boot_attempts`):
    // the attempt this boot was, the limit, and whether it fell back.
    if let Some(b) = s.release.as_ref().and_then(|r| r.boot_loader.as_ref()) {
        let labels = [("robot", robot), ("label", b.label.as_str())];
        for (name, help, v) in [
            (
                "rtdeploy_boot_attempts",
                "Boots of a system update's new label the boot loader started, this one included (the limit + 1 once it booted the previous label).",
                f64::from(b.attempts),
            ),
            (
                "rtdeploy_boot_attempt_limit",
                "Boots of a system update's new label without a verdict before the boot loader boots the previous one (update.boot_attempts.limit).",
                f64::from(b.limit),
            ),
            (
                "rtdeploy_boot_fell_back",
                "1 when the boot loader gave up on a system update's new label and booted the previous one.",
                if b.fell_back { 1.0 } else { 0.0 },
            ),
        ] {
            f.family(name, "gauge", help);
            f.sample(name, &labels, v);
        }
    }
    // The hardware watchdog (robot.yaml `watchdog:`).
    if let Some(w) = &s.watchdog {
        let labels = [("robot", robot), ("device", w.device.as_str())];
        let fed = w.state == "armed" || w.state == "refused";
        f.family(
            "rtdeploy_watchdog_armed",
            "gauge",
            "1 when the supervisor holds the hardware watchdog open and feeds it (the board resets if the supervisor stops), 0 when it is missing or was released.",
        );
        f.sample(
            "rtdeploy_watchdog_armed",
            &labels,
            if fed { 1.0 } else { 0.0 },
        );
        if let Some(t) = w.timeout_s {
            f.family(
                "rtdeploy_watchdog_timeout_seconds",
                "gauge",
                "The hardware watchdog's timeout in force, as its driver set it.",
            );
            f.sample("rtdeploy_watchdog_timeout_seconds", &labels, t as f64);
        }
    }
    // A Jetson's rootfs A/B slots: the one booted, each one's retry count,
    // and the ones the firmware gave up on.
    if let Some(r) = s.rootfs_slots.as_ref().filter(|r| !r.slots.is_empty()) {
        use crate::rootfs_slots::{RootfsSlots, SlotState};
        type Of = fn(&RootfsSlots, &SlotState) -> f64;
        let families: [(&str, &str, Of); 3] = [
            (
                "rtdeploy_rootfs_slot_booted",
                "1 for the rootfs slot this boot runs from (a Jetson's A/B), 0 for the other.",
                |r, sl| f64::from(u8::from(r.current == Some(sl.name))),
            ),
            (
                "rtdeploy_rootfs_slot_retry_count",
                "Boots of the slot the firmware still allows before it gives the slot up.",
                |_, sl| f64::from(sl.retry_count),
            ),
            (
                "rtdeploy_rootfs_slot_unbootable",
                "1 when the firmware gave the slot up (its retry count used up) and boots the other.",
                |_, sl| f64::from(u8::from(sl.unbootable)),
            ),
        ];
        for (fam, help, of) in families {
            f.family(fam, "gauge", help);
            for sl in &r.slots {
                let n = sl.name.to_string();
                f.sample(fam, &[("robot", robot), ("slot", n.as_str())], of(r, sl));
            }
        }
        if let Some(c) = r.confirmed {
            let fam = "rtdeploy_rootfs_slot_confirmed";
            f.family(
                fam,
                "gauge",
                "1 when this boot's verdict confirmed the slot it runs from (its retry count reset), 0 when the boot was not good.",
            );
            f.sample(fam, &[("robot", robot)], f64::from(u8::from(c)));
        }
    }
    // The bridge (robot.yaml `bridge:`): its peers, memory, each link's
    // messages, losses and drops by reason, and other boards' clocks.
    if let Some(b) = &s.bridge {
        let r = [("robot", robot)];
        for (name, help, v) in [
            (
                "rtdeploy_bridge_peers",
                "Zenoh peers and routers the bridge is connected to (0: the network is lost).",
                (b.peers.len() + b.routers.len()) as f64,
            ),
            (
                "rtdeploy_bridge_memory_bytes",
                "The bridge's resident set.",
                b.rss_bytes as f64,
            ),
            (
                "rtdeploy_bridge_memory_bound_bytes",
                "bridge.memory: over it, what comes in is dropped.",
                b.memory_bound as f64,
            ),
            (
                "rtdeploy_bridge_alone_seconds",
                "Seconds the bridge has reached no peer or router (0 while it reaches one).",
                b.alone_s.unwrap_or(0) as f64,
            ),
        ] {
            f.family(name, "gauge", help);
            f.sample(name, &r, v);
        }
        f.family(
            "rtdeploy_bridge_disconnections_total",
            "counter",
            "Times the bridge lost its last peer or router (it reconnects by itself).",
        );
        f.sample(
            "rtdeploy_bridge_disconnections_total",
            &r,
            b.disconnections as f64,
        );
        if !b.links.is_empty() {
            fn link_labels<'a>(
                robot: &'a str,
                l: &'a crate::bridge::LinkStatus,
            ) -> [(&'static str, &'a str); 3] {
                [
                    ("robot", robot),
                    ("channel", l.channel.as_str()),
                    ("direction", l.direction.as_str()),
                ]
            }
            let labels = |l| link_labels(robot, l);
            f.family(
                "rtdeploy_bridge_messages_total",
                "counter",
                "Messages the bridge sent (out) or delivered into the channel (in).",
            );
            for l in &b.links {
                let n = if l.direction == "out" {
                    l.sent
                } else {
                    l.received
                };
                f.sample("rtdeploy_bridge_messages_total", &labels(l), n as f64);
            }
            f.family(
                "rtdeploy_bridge_lost_total",
                "counter",
                "Messages that never came (gaps in the sender's sequence) or that the channel overwrote before the bridge read them.",
            );
            for l in &b.links {
                f.sample("rtdeploy_bridge_lost_total", &labels(l), l.lost as f64);
            }
            f.family(
                "rtdeploy_bridge_dropped_total",
                "counter",
                "Messages the bridge dropped, by reason (garbage, wrong_type, size, rate, ttl, memory, failed, stale).",
            );
            for l in &b.links {
                let d = &l.dropped;
                for (reason, n) in [
                    ("garbage", d.garbage),
                    ("wrong_type", d.wrong_type),
                    ("size", d.size),
                    ("rate", d.rate),
                    ("ttl", d.ttl),
                    ("memory", d.memory),
                    ("failed", d.failed),
                    ("stale", d.stale),
                ] {
                    let [a, b2, c] = labels(l);
                    f.sample(
                        "rtdeploy_bridge_dropped_total",
                        &[a, b2, c, ("reason", reason)],
                        n as f64,
                    );
                }
            }
        }
        if !b.clocks.is_empty() {
            f.family(
                "rtdeploy_bridge_clock_offset_seconds",
                "gauge",
                "Another board's monotonic clock minus this one's, as the bridges estimate it.",
            );
            for c in &b.clocks {
                f.sample(
                    "rtdeploy_bridge_clock_offset_seconds",
                    &[("robot", robot), ("remote", c.robot.as_str())],
                    c.offset_ns as f64 / 1e9,
                );
            }
            f.family(
                "rtdeploy_bridge_clock_error_seconds",
                "gauge",
                "The most the clock offset estimate is wrong by: half the round trip it comes from.",
            );
            for c in &b.clocks {
                f.sample(
                    "rtdeploy_bridge_clock_error_seconds",
                    &[("robot", robot), ("remote", c.robot.as_str())],
                    c.rtt_ns as f64 / 2e9,
                );
            }
        }
    }
    let procs = &s.processes;
    let per = |f: &mut Families,
               name: &str,
               kind: &str,
               help: &str,
               v: &dyn Fn(&crate::status::ProcessStatus) -> Option<f64>| {
        if procs.iter().all(|p| v(p).is_none()) {
            return;
        }
        f.family(name, kind, help);
        for p in procs {
            if let Some(x) = v(p) {
                f.sample(name, &[("robot", robot), ("process", &p.name)], x);
            }
        }
    };
    per(
        &mut f,
        "rtdeploy_process_running",
        "gauge",
        "1 when the process runs.",
        &|p| Some(if p.state == "running" { 1.0 } else { 0.0 }),
    );
    per(
        &mut f,
        "rtdeploy_process_restarts_total",
        "counter",
        "Restarts by the supervisor.",
        &|p| Some(p.restarts as f64),
    );
    per(
        &mut f,
        "rtdeploy_process_over_budget_reports_total",
        "counter",
        "Timing reports over a budget.",
        &|p| Some(p.over_budget_reports as f64),
    );
    per(
        &mut f,
        "rtdeploy_timing_reports_total",
        "counter",
        "Timing reports the supervisor read.",
        &|p| t(p).map(|t| t.reports as f64),
    );
    per(
        &mut f,
        "rtdeploy_timing_reports_skipped_total",
        "counter",
        "Timing reports published but not read (not in the histograms).",
        &|p| t(p).map(|t| t.reports_skipped as f64),
    );
    per(
        &mut f,
        "rtdeploy_wakeup_p50_microseconds",
        "gauge",
        "Worst median wakeup of the latest report.",
        &|p| t(p).and_then(|t| t.wakeup_p50_us),
    );
    per(
        &mut f,
        "rtdeploy_wakeup_p99_microseconds",
        "gauge",
        "Worst 99th percentile wakeup of the latest report.",
        &|p| t(p).and_then(|t| t.wakeup_p99_us),
    );
    per(
        &mut f,
        "rtdeploy_wakeup_since_start_p50_microseconds",
        "gauge",
        "Worst median wakeup since the process's event loop started.",
        &|p| t(p).and_then(|t| t.since_start_wakeup_p50_us),
    );
    per(
        &mut f,
        "rtdeploy_wakeup_since_start_p99_microseconds",
        "gauge",
        "Worst 99th percentile wakeup since the process's event loop started.",
        &|p| t(p).and_then(|t| t.since_start_wakeup_p99_us),
    );
    per(
        &mut f,
        "rtdeploy_wakeup_since_start_max_microseconds",
        "gauge",
        "Longest wakeup since the process's event loop started.",
        &|p| t(p).and_then(|t| t.since_start_wakeup_max_us),
    );
    per(
        &mut f,
        "rtdeploy_wakeup_budget_microseconds",
        "gauge",
        "The tightest wakeup budget of the process.",
        &|p| t(p).and_then(|t| t.wakeup_budget_us),
    );
    per(
        &mut f,
        "rtdeploy_handler_budget_microseconds",
        "gauge",
        "The handler budget of the process.",
        &|p| t(p).and_then(|t| t.handler_budget_us),
    );
    for (name, help, pick) in [
        (
            "rtdeploy_report_wakeup_max_microseconds",
            "Worst wakeup (event to handler start) per timing report.",
            (|t: &TimingStatus| t.wakeup_hist.as_ref())
                as fn(&TimingStatus) -> Option<&ReportHistogram>,
        ),
        (
            "rtdeploy_report_handler_max_microseconds",
            "Longest handler run per timing report.",
            |t: &TimingStatus| t.handler_hist.as_ref(),
        ),
    ] {
        let hs: Vec<(&str, &ReportHistogram)> = procs
            .iter()
            .filter_map(|p| Some((p.name.as_str(), pick(p.timing.as_ref()?)?)))
            .collect();
        if hs.is_empty() {
            continue;
        }
        f.family(name, "histogram", help);
        for (p, h) in &hs {
            f.histogram(name, &[("robot", robot), ("process", p)], h);
        }
    }
    for (name, help, pick) in [
        (
            "rtdeploy_events_total",
            "Messages handled (watcher), firings (timer), messages sent (sender).",
            (|t: &EntryTotals| t.events) as fn(&EntryTotals) -> u64,
        ),
        (
            "rtdeploy_lost_total",
            "Messages overwritten before the watcher read them.",
            |t: &EntryTotals| t.lost,
        ),
        (
            "rtdeploy_timer_missed_total",
            "Timer periods skipped because the loop was late.",
            |t: &EntryTotals| t.missed,
        ),
        (
            "rtdeploy_send_errors_total",
            "Sends refused.",
            |t: &EntryTotals| t.errors,
        ),
        (
            "rtdeploy_channel_faults_total",
            "Corrupt or truncated shared memory seen.",
            |t: &EntryTotals| t.faults,
        ),
        (
            "rtdeploy_cross_class_total",
            "Messages a watcher got from publishers of the other wake class (found by its own look at the index, within the channel's cross-class bound).",
            |t: &EntryTotals| t.cross_class,
        ),
    ] {
        let rows: Vec<(&str, &EntryStatus)> = procs
            .iter()
            .filter_map(|p| Some((p.name.as_str(), p.timing.as_ref()?)))
            .flat_map(|(p, t)| t.entries.iter().map(move |e| (p, e)))
            .collect();
        if rows.is_empty() {
            continue;
        }
        f.family(name, "counter", help);
        for (p, e) in rows {
            f.sample(
                name,
                &[
                    ("robot", robot),
                    ("process", p),
                    ("kind", kind_name(e.kind)),
                    ("name", &e.name),
                ],
                pick(&e.totals) as f64,
            );
        }
    }
    f.out
}

/// The supervisor's textfile writer (robot.yaml `metrics.textfile` and
/// `metrics.every`).
#[derive(Debug)]
pub struct Textfile {
    pub path: PathBuf,
    /// The root `path` must stay inside, once links are resolved (the
    /// install prefix), checked before every write.
    pub root: Option<PathBuf>,
    pub every: Duration,
    next: Option<Instant>,
    /// The last write error, said once until a write succeeds.
    last_error: Option<String>,
}

impl Textfile {
    pub fn new(path: PathBuf, every: Duration) -> Textfile {
        Textfile {
            path,
            root: None,
            every: every.max(Duration::from_millis(100)),
            next: None,
            last_error: None,
        }
    }

    /// Written only while its path stays inside `root` once links are
    /// resolved.
    pub fn within(self, root: PathBuf) -> Textfile {
        Textfile {
            root: Some(root),
            ..self
        }
    }

    /// When the next write is due (now, before the first).
    pub fn due(&self) -> Option<Instant> {
        self.next
    }

    /// Writes `status()`'s exposition when due; returns an error message
    /// the first time a write fails (and nothing while it keeps failing
    /// the same way).
    pub fn write_if_due(
        &mut self,
        now: Instant,
        status: impl FnOnce() -> SupervisorStatus,
    ) -> Option<String> {
        if self.next.is_some_and(|t| now < t) {
            return None;
        }
        self.next = Some(now + self.every);
        let text = exposition(&status());
        let inside = match &self.root {
            Some(root) => units::path::resolved_within(root, &self.path)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string())),
            None => Ok(()),
        };
        match inside.and_then(|()| crate::boot_history::write_atomic(&self.path, text.as_bytes())) {
            Ok(()) => {
                self.last_error = None;
                None
            }
            Err(e) => {
                let msg = format!(
                    "cannot write the metrics textfile {}: {e}",
                    self.path.display()
                );
                if self.last_error.as_deref() == Some(msg.as_str()) {
                    return None;
                }
                self.last_error = Some(msg.clone());
                Some(msg)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_textfile_is_not_written_through_a_link_out_of_the_prefix() {
        let prefix = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(prefix.path().join("var/lib")).unwrap();
        std::os::unix::fs::symlink(outside.path(), prefix.path().join("var/lib/node_exporter"))
            .unwrap();
        let path =
            units::path::join_under(prefix.path(), "/var/lib/node_exporter/rtdeploy.prom").unwrap();
        let mut t = Textfile::new(path, Duration::from_secs(1)).within(prefix.path().into());
        let e = t
            .write_if_due(Instant::now(), SupervisorStatus::default)
            .expect("an error");
        assert!(e.contains("leads out of"), "{e}");
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        // Inside the prefix it is written.
        let inside = units::path::join_under(prefix.path(), "/var/lib/x.prom").unwrap();
        let mut t =
            Textfile::new(inside.clone(), Duration::from_secs(1)).within(prefix.path().into());
        assert_eq!(
            t.write_if_due(Instant::now(), SupervisorStatus::default),
            None
        );
        assert!(inside.is_file());
    }

    #[test]
    fn buckets_end_at_the_budget_in_microseconds() {
        assert_eq!(
            bounds_for(Some(Duration::from_micros(300))),
            [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 300.0, 600.0]
        );
        assert_eq!(
            bounds_for(Some(Duration::from_micros(100))).last(),
            Some(&200.0)
        );
        let none = bounds_for(None);
        assert_eq!((none[0], *none.last().unwrap()), (1.0, 10_000.0));
        let mut h = ReportHistogram::new(bounds_for(Some(Duration::from_micros(100))));
        for us in [0.5, 3.0, 100.0, 150.0, 5000.0] {
            h.observe(us);
        }
        assert_eq!(h.count, 5);
        assert_eq!(h.counts.iter().sum::<u64>(), 5);
        // 100 is in the `le="100"` bucket, 5000 above every bound.
        let at = |b: f64| h.counts[h.bounds_us.iter().position(|&x| x == b).unwrap()];
        assert_eq!((at(1.0), at(5.0), at(100.0), at(200.0)), (1, 1, 1, 1));
        assert_eq!(*h.counts.last().unwrap(), 1);
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(num(f64::INFINITY), "+Inf");
        assert_eq!(num(2.5), "2.5");
        assert_eq!(num(3.0), "3");
    }

    #[test]
    fn rootfs_slots_are_in_the_metrics() {
        use crate::rootfs_slots::{RootfsSlots, SlotState};
        let s = SupervisorStatus {
            robot: "arm".into(),
            rootfs_slots: Some(RootfsSlots {
                current: Some('A'),
                active: Some('A'),
                retry_max: Some(3),
                slots: vec![
                    SlotState {
                        name: 'A',
                        retry_count: 3,
                        unbootable: false,
                    },
                    SlotState {
                        name: 'B',
                        retry_count: 0,
                        unbootable: true,
                    },
                ],
                problem: None,
                confirmed: Some(false),
            }),
            ..Default::default()
        };
        let text = exposition(&s);
        for line in [
            "rtdeploy_rootfs_slot_confirmed{robot=\"arm\"} 0",
            "rtdeploy_rootfs_slot_booted{robot=\"arm\",slot=\"A\"} 1",
            "rtdeploy_rootfs_slot_booted{robot=\"arm\",slot=\"B\"} 0",
            "rtdeploy_rootfs_slot_retry_count{robot=\"arm\",slot=\"A\"} 3",
            "rtdeploy_rootfs_slot_unbootable{robot=\"arm\",slot=\"B\"} 1",
        ] {
            assert!(text.contains(line), "{line} not in:\n{text}");
        }
    }

    #[test]
    fn the_bridge_is_in_the_metrics() {
        let s = SupervisorStatus {
            robot: "arm".into(),
            bridge: Some(crate::bridge::BridgeStatus {
                peers: vec!["a".into()],
                disconnections: 2,
                rss_bytes: 1 << 20,
                memory_bound: 64 << 20,
                links: vec![crate::bridge::LinkStatus {
                    channel: "/demo/chatter".into(),
                    direction: "in".into(),
                    received: 7,
                    lost: 2,
                    dropped: crate::bridge::Dropped {
                        rate: 3,
                        ..Default::default()
                    },
                    ..Default::default()
                }],
                clocks: vec![crate::bridge::ClockStatus {
                    robot: "base".into(),
                    offset_ns: -1_500_000_000,
                    rtt_ns: 40_000,
                    samples: 16,
                    boot_id: String::new(),
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let text = exposition(&s);
        for line in [
            "rtdeploy_bridge_peers{robot=\"arm\"} 1",
            "rtdeploy_bridge_alone_seconds{robot=\"arm\"} 0",
            "rtdeploy_bridge_disconnections_total{robot=\"arm\"} 2",
            "rtdeploy_bridge_memory_bound_bytes{robot=\"arm\"} 67108864",
            "rtdeploy_bridge_messages_total{robot=\"arm\",channel=\"/demo/chatter\",direction=\"in\"} 7",
            "rtdeploy_bridge_lost_total{robot=\"arm\",channel=\"/demo/chatter\",direction=\"in\"} 2",
            "rtdeploy_bridge_dropped_total{robot=\"arm\",channel=\"/demo/chatter\",direction=\"in\",reason=\"rate\"} 3",
            "rtdeploy_bridge_clock_offset_seconds{robot=\"arm\",remote=\"base\"} -1.5",
            "rtdeploy_bridge_clock_error_seconds{robot=\"arm\",remote=\"base\"} 0.00002",
        ] {
            assert!(text.contains(line), "{line} not in:\n{text}");
        }
        assert_eq!(
            text.matches("# TYPE rtdeploy_bridge_dropped_total counter")
                .count(),
            1
        );
    }
}
