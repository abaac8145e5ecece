//! The check report: measurements, budgets with their verdicts, host facts,
//! and the human tables (one run, or mechanisms side by side).

use std::fmt::Write as _;

use serde::Serialize;

use crate::hist::{LogBucket, Summary};
use crate::host::HostFacts;
use crate::Mechanism;

/// Version of the JSON document `deploy check --json` prints and the boot
/// check writes (`docs/check-schema.json` describes it).
pub const CHECK_SCHEMA_VERSION: u32 = 1;

/// What a measurement measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MeasurementKind {
    /// Timer wake - deadline on one CPU.
    Timer,
    /// The real-time sender's time in the call that publishes and wakes.
    Send,
    /// Send time stamped in the message -> the real-time receiver's
    /// handler start.
    Delivery,
    /// The same, for the lower-priority subscribers.
    LowPriorityDelivery,
}

/// One measurement's figures; all times in nanoseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// `timer cpu1`, `send`, `delivery`, `low-priority delivery`.
    pub name: String,
    pub kind: MeasurementKind,
    /// The wake mechanism (send and delivery measurements).
    pub mechanism: Option<Mechanism>,
    /// The CPU measured (timer) or the real-time side's CPU.
    pub cpu: Option<usize>,
    pub count: u64,
    pub min_ns: u64,
    pub mean_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    /// The longest.
    pub max_ns: u64,
    pub over_100us: u64,
    pub over_1ms: u64,
    /// Failed sends (send), messages lost (delivery).
    pub errors: u64,
    /// Non-empty buckets of the log-scale histogram.
    pub histogram: Vec<LogBucket>,
    #[serde(skip)]
    pub summary: Summary,
}

impl Measurement {
    pub fn new(
        name: impl Into<String>,
        kind: MeasurementKind,
        mechanism: Option<Mechanism>,
        cpu: Option<usize>,
        s: Summary,
    ) -> Self {
        Measurement {
            name: name.into(),
            kind,
            mechanism,
            cpu,
            count: s.count,
            min_ns: s.min_ns,
            mean_ns: s.mean_ns(),
            p50_ns: s.quantile(0.50),
            p99_ns: s.quantile(0.99),
            p999_ns: s.quantile(0.999),
            max_ns: s.max_ns,
            over_100us: s.over_100us,
            over_1ms: s.over_1ms,
            errors: s.errors,
            histogram: s.log_buckets(),
            summary: s,
        }
    }
}

/// Whether every real-time message the sender published reached the
/// receiver or was counted lost (overwritten before it was read). A message
/// that did neither was dropped without a trace: a lost wakeup, a receiver
/// that stopped waiting, or a runtime bug. Such a run fails whatever its
/// latencies.
#[derive(Debug, Clone, Serialize)]
pub struct DeliveryAccount {
    pub mechanism: Mechanism,
    /// Real-time messages published.
    pub sent: u64,
    /// Real-time messages the receiver handled.
    pub delivered: u64,
    /// Messages the receiver was told it lost (of any sender: an upper
    /// bound on the real-time ones).
    pub lost: u64,
    /// The receiver handled the end-of-run message, so it passed every
    /// real-time message in the channel.
    pub receiver_reached_end: bool,
    /// Real-time messages neither delivered nor counted lost.
    pub unaccounted: u64,
    /// The sequence numbers of the real-time messages never delivered
    /// (ranges, the first ones), when some are unaccounted.
    pub missing: String,
    /// Published beyond the per-message accounting's range.
    pub beyond_range: u64,
    /// A compared mechanism: reported, not deciding.
    pub informational: bool,
    /// A second run of the same mechanism in the check: `traced`,
    /// `logged` or `A/A`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// The runtime's backends: the real-time sender's messages the
    /// receiver's loop found by its own look (a timeout, the wake check),
    /// although they were there before its sleep ended and no wake came
    /// for them (a lost or late wake). Messages of the low-priority
    /// publishers are of the other wake class and never counted here.
    #[serde(default)]
    pub found_without_wake: u64,
}

impl DeliveryAccount {
    /// The mechanism's name, with the run when it is a second one.
    fn name(&self) -> String {
        match &self.run {
            Some(r) => format!("{} ({r})", self.mechanism.short()),
            None => self.mechanism.short().to_string(),
        }
    }

    pub fn pass(&self) -> bool {
        self.unaccounted == 0
    }

    /// One line for the text report.
    pub fn describe(&self) -> String {
        if self.pass() {
            return format!(
                "{}: {} sent, {} delivered, {} lost: every message accounted for{}",
                self.name(),
                self.sent,
                self.delivered,
                self.lost,
                if self.found_without_wake > 0 {
                    format!(
                        " ({} found by the loop's own look before any wake for them: a wake lost or late)",
                        self.found_without_wake
                    )
                } else {
                    String::new()
                }
            );
        }
        format!(
            "{}: {} sent, {} delivered, {} lost: {} never delivered nor counted lost{} (seq {})",
            self.name(),
            self.sent,
            self.delivered,
            self.lost,
            self.unaccounted,
            if self.receiver_reached_end {
                ""
            } else {
                "; the receiver never reached the end of the run (a lost wakeup?)"
            },
            self.missing
        )
    }
}

/// `1-4, 7, 9-12, ...`: the first `max` runs of consecutive numbers.
pub fn seq_ranges(seqs: &[u64], max: usize) -> String {
    let mut runs: Vec<(u64, u64)> = vec![];
    for &s in seqs {
        match runs.last_mut() {
            Some((_, hi)) if *hi + 1 == s => *hi = s,
            _ => runs.push((s, s)),
        }
    }
    let mut out: Vec<String> = runs
        .iter()
        .take(max)
        .map(|&(lo, hi)| {
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}-{hi}")
            }
        })
        .collect();
    if runs.len() > max {
        out.push(format!("... {} more runs", runs.len() - max));
    }
    out.join(", ")
}

/// Which figure of a measurement a budget limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Statistic {
    Max,
    P99,
}

/// One budget and how the run did against it.
#[derive(Debug, Clone, Serialize)]
pub struct BudgetResult {
    /// Where the budget comes from: `check.budgets.delivery_max`,
    /// `channels./demo/ping.budget`, `processes.listener.budgets.wakeup`.
    pub name: String,
    /// The measurement it applies to.
    pub measurement: String,
    pub mechanism: Option<Mechanism>,
    pub statistic: Statistic,
    pub limit_ns: u64,
    /// The measured figure (`null` when nothing was measured).
    pub figure_ns: Option<u64>,
    pub pass: bool,
    /// Shown for comparison only (another mechanism in `--compare`); does
    /// not decide the exit status.
    pub informational: bool,
}

/// What the run was asked to do.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioFacts {
    pub robot: String,
    /// `check` or `boot`.
    pub mode: String,
    pub duration_ns: u64,
    pub timer_duration_ns: u64,
    pub scenario_duration_ns: u64,
    pub period_ns: u64,
    pub priority: u32,
    pub isolated: Vec<usize>,
    pub housekeeping: Vec<usize>,
    pub sender_cpu: Option<usize>,
    pub receiver_cpu: Option<usize>,
    pub low_priority_processes: u32,
    pub low_priority_period_ns: u64,
    pub churn_ns: u64,
    /// Low-priority processes started over the run (churn included).
    pub low_priority_started: u64,
    pub burst_threads: u32,
    pub burst_priority: u32,
    pub burst_min_ns: u64,
    pub burst_max_ns: u64,
    pub cpu_load: u32,
    pub io_load: u32,
    pub mechanisms: Vec<Mechanism>,
}

/// How real-time the run was.
#[derive(Debug, Clone, Serialize)]
pub struct Realtime {
    /// Every measuring thread and real-time worker got SCHED_FIFO.
    pub sched_fifo: bool,
    /// Memory locked in the measuring processes.
    pub memory_locked: bool,
    /// The `/dev/cpu_dma_latency` value held during the run, if any.
    pub cpu_dma_latency_held_us: Option<u32>,
    /// A plain statement when the figures are not real-time figures.
    pub warning: Option<String>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub schema_version: u32,
    /// Seconds since the Unix epoch when the run started.
    pub started_unix: u64,
    pub host: HostFacts,
    pub realtime: Realtime,
    pub scenario: ScenarioFacts,
    pub measurements: Vec<Measurement>,
    pub budgets: Vec<BudgetResult>,
    /// Per mechanism: every real-time message sent is delivered or counted
    /// lost.
    pub accounting: Vec<DeliveryAccount>,
    /// `pass` or `fail`.
    pub verdict: String,
    /// Names of the failed budgets that decide the verdict.
    pub failed: Vec<String>,
    pub notes: Vec<String>,
    /// Tracing of the misses (`--trace`, `check.trace_on_miss`); absent
    /// when not asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceSummary>,
    /// With rounds: each mechanism's delivery p50 over the reference's,
    /// per round, with the reference's A/A floor (see [`crate::harness`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ratios: Vec<crate::harness::Ratio>,
    /// With rounds: a real-time publish's cost over a best-effort one's
    /// (8 bytes, no waiter), per round, with the A/A floor.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub differences: Vec<crate::harness::Difference>,
    /// With `--census`: which task touched which kernel object of a
    /// wake, and the real-time threads' waits on lower-priority holders.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub census: Option<crate::census::CensusReport>,
}

/// What tracing did in a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TraceSummary {
    /// Whether the tracer ran; when not, `reason` says why.
    pub enabled: bool,
    pub reason: Option<String>,
    /// Where saved misses go.
    pub dir: String,
    /// The ftrace instance.
    pub instance: Option<String>,
    /// The CPUs traced: the sender's and receiver's, and the timer
    /// workers' when the timer latency has a budget.
    pub cpus: Vec<usize>,
    /// Events enabled, and those this kernel lacks (with the reason).
    pub events: Vec<String>,
    pub missing_events: Vec<String>,
    /// A delivery over this is a miss (the tightest delivery budget).
    pub miss_threshold_ns: Option<u64>,
    /// Real-time messages over the threshold (traced or not: one miss is
    /// traced at a time).
    pub over_threshold: u64,
    /// A timer wake over this is a miss (`check.budgets.timer_max`);
    /// without it the timer phase is not traced.
    pub timer_miss_threshold_ns: Option<u64>,
    /// Timer wakes over it (traced or not).
    pub timer_over_threshold: u64,
    /// Misses snapshotted and analysed.
    pub snapshots: u64,
    /// The last verdicts (at most the number kept), oldest first.
    pub verdicts: Vec<TraceVerdict>,
}

/// One traced miss.
#[derive(Debug, Clone, Serialize)]
pub struct TraceVerdict {
    /// The mechanism of a delivery's miss; `None` for a timer's.
    pub mechanism: Option<Mechanism>,
    /// The CPU of a timer's miss.
    pub timer_cpu: Option<usize>,
    pub seq: u64,
    pub latency_ns: u64,
    pub verdict: String,
    /// Whether something was named (not "unexplained").
    pub explained: bool,
    /// The saved raw text (`deploy trace show` reads it) and trace-event
    /// JSON; absent when saving failed.
    pub text: Option<String>,
    pub json: Option<String>,
}

impl CheckReport {
    /// Whether every deciding budget passed.
    pub fn passed(&self) -> bool {
        self.failed.is_empty()
    }

    /// Sets `verdict` and `failed` from the budgets and the delivery
    /// accounting.
    pub fn decide(&mut self) {
        self.failed = self
            .budgets
            .iter()
            .filter(|b| !b.pass && !b.informational)
            .map(|b| b.name.clone())
            .chain(
                self.accounting
                    .iter()
                    .filter(|a| !a.pass() && !a.informational)
                    .map(|a| format!("delivery accounting ({})", a.mechanism.short())),
            )
            .collect();
        self.verdict = if self.failed.is_empty() {
            "pass"
        } else {
            "fail"
        }
        .into();
    }

    pub fn measurement(&self, name: &str, mechanism: Option<Mechanism>) -> Option<&Measurement> {
        self.measurements
            .iter()
            .find(|m| m.name == name && m.mechanism == mechanism)
    }

    /// The human report: host line, measurement table (or the mechanisms
    /// side by side), budgets.
    pub fn to_text(&self) -> String {
        let mut o = String::new();
        let h = &self.host;
        let _ = writeln!(
            o,
            "deploy check: {} on {} ({}), {}",
            self.scenario.robot,
            h.kernel_release,
            if h.preempt_rt {
                "PREEMPT_RT".to_string()
            } else {
                format!("{}, not PREEMPT_RT", h.preempt_model)
            },
            h.cpu_model.as_deref().unwrap_or("unknown CPU"),
        );
        let gov = if h.governors.is_empty() {
            "no cpufreq".to_string()
        } else {
            let mut gs: Vec<String> = h
                .governors
                .iter()
                .map(|g| format!("cpu{} {}", g.cpu, g.governor))
                .collect();
            gs.dedup();
            gs.join(", ")
        };
        let _ = writeln!(
            o,
            "  governor: {gov}; cpu_dma_latency: {} before, {} held; isolated (kernel): {}",
            h.cpu_dma_latency_us
                .map_or("unreadable".into(), |v| format!("{v}us")),
            self.realtime
                .cpu_dma_latency_held_us
                .map_or("none".into(), |v| format!("{v}us")),
            if h.isolated_cpus.is_empty() {
                "none"
            } else {
                &h.isolated_cpus
            },
        );
        let _ = writeln!(o, "  kernel: {}", h.kernel_capabilities.summary());
        let s = &self.scenario;
        let _ = writeln!(
            o,
            "  scenario: period {} at SCHED_FIFO {} (sender cpu {}, receiver cpu {}); {} every {} (churn {}); {} at FIFO {} ({}..{}); {}, {}; timer {} + scenario {}{}",
            fmt_ns(s.period_ns),
            s.priority,
            s.sender_cpu.map_or("-".into(), |c| c.to_string()),
            s.receiver_cpu.map_or("-".into(), |c| c.to_string()),
            count(s.low_priority_processes as u64, "low-priority process", "low-priority processes"),
            fmt_ns(s.low_priority_period_ns),
            fmt_ns(s.churn_ns),
            count(s.burst_threads as u64, "burst thread", "burst threads"),
            s.burst_priority,
            fmt_ns(s.burst_min_ns),
            fmt_ns(s.burst_max_ns),
            count(s.cpu_load as u64, "cpu hog", "cpu hogs"),
            count(s.io_load as u64, "io writer", "io writers"),
            fmt_ns(s.timer_duration_ns),
            fmt_ns(s.scenario_duration_ns),
            if s.mechanisms.len() > 1 { " per mechanism" } else { "" },
        );
        if let Some(w) = &self.realtime.warning {
            let _ = writeln!(o, "  WARNING: {w}");
        }
        o.push('\n');
        if self.scenario.mechanisms.len() > 1 {
            self.compare_table(&mut o);
        } else {
            self.measurement_table(&mut o);
        }
        if !self.budgets.is_empty() {
            o.push('\n');
            let _ = writeln!(
                o,
                "{:<50} {:>10} {:>10}  result",
                "budget", "limit", "measured"
            );
            for b in &self.budgets {
                let name = match b.mechanism {
                    Some(m) if self.scenario.mechanisms.len() > 1 => {
                        format!("{} [{}]", b.name, m.short())
                    }
                    _ => b.name.clone(),
                };
                let _ = writeln!(
                    o,
                    "{:<50} {:>10} {:>10}  {}{}",
                    name,
                    fmt_ns(b.limit_ns),
                    b.figure_ns.map_or("-".into(), fmt_ns),
                    if b.pass { "PASS" } else { "FAIL" },
                    if b.informational {
                        " (comparison only)"
                    } else {
                        ""
                    },
                );
            }
        }
        if !self.accounting.is_empty() {
            o.push('\n');
            for a in &self.accounting {
                let _ = writeln!(
                    o,
                    "delivery {}{}",
                    a.describe(),
                    match (a.pass(), a.informational) {
                        (true, _) => "",
                        (false, false) => "  FAIL",
                        (false, true) => "  FAIL (comparison only)",
                    }
                );
            }
        }
        if let Some(t) = &self.trace {
            o.push('\n');
            if t.enabled {
                let timers = t.timer_miss_threshold_ns.map_or(String::new(), |m| {
                    format!(
                        ", {} timer wake(s) over {}",
                        t.timer_over_threshold,
                        fmt_ns(m)
                    )
                });
                let _ = writeln!(
                    o,
                    "trace: cpus {:?}, {} message(s) over {}{timers}, {} traced, saved in {}{}",
                    t.cpus,
                    t.over_threshold,
                    t.miss_threshold_ns.map_or("-".into(), fmt_ns),
                    t.snapshots,
                    t.dir,
                    if t.missing_events.is_empty() {
                        String::new()
                    } else {
                        format!("; not traced: {}", t.missing_events.join(", "))
                    }
                );
                for v in &t.verdicts {
                    match (v.timer_cpu, v.mechanism) {
                        (Some(cpu), _) => {
                            let _ = writeln!(o, "  [timer cpu{cpu}] {}", v.verdict);
                        }
                        (None, Some(m)) if self.scenario.mechanisms.len() > 1 => {
                            let _ = writeln!(o, "  [{}] {}", m.short(), v.verdict);
                        }
                        _ => {
                            let _ = writeln!(o, "  {}", v.verdict);
                        }
                    }
                    if let Some(p) = &v.text {
                        let _ = writeln!(o, "    {p}");
                    }
                }
            } else {
                let _ = writeln!(
                    o,
                    "trace: off: {}",
                    t.reason.as_deref().unwrap_or("not asked for")
                );
            }
        }
        if let Some(c) = &self.census {
            o.push_str(&c.to_text());
        }
        for n in &self.notes {
            let _ = writeln!(o, "note: {n}");
        }
        let _ = writeln!(
            o,
            "\n{}",
            if self.passed() {
                "PASS: every budget met".to_string()
            } else {
                format!("FAIL: {}", self.failed.join(", "))
            }
        );
        o
    }

    fn measurement_table(&self, o: &mut String) {
        let names: Vec<String> = self
            .measurements
            .iter()
            .map(|m| match m.mechanism {
                Some(mech) => format!("{} ({})", m.name, mech.short()),
                None => m.name.clone(),
            })
            .collect();
        // As wide as the longest name (`low-priority delivery (io_uring)`).
        let w = names.iter().map(|n| n.len()).max().unwrap_or(0).max(26);
        let _ = writeln!(
            o,
            "{:<w$} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6} {:>6}",
            "measurement",
            "count",
            "min",
            "p50",
            "p99",
            "p99.9",
            "longest",
            ">100us",
            ">1ms",
            "errors"
        );
        for (m, name) in self.measurements.iter().zip(&names) {
            let _ = writeln!(
                o,
                "{:<w$} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6} {:>6}",
                name,
                m.count,
                fmt_ns(m.min_ns),
                fmt_ns(m.p50_ns),
                fmt_ns(m.p99_ns),
                fmt_ns(m.p999_ns),
                fmt_ns(m.max_ns),
                m.over_100us,
                m.over_1ms,
                m.errors
            );
        }
    }

    /// The letter's table: per mechanism, the sender's calls over 100us and
    /// longest, then messages late by over 100us, over 1ms, and the longest.
    fn compare_table(&self, o: &mut String) {
        for m in self
            .measurements
            .iter()
            .filter(|m| m.kind == MeasurementKind::Timer)
        {
            let _ = writeln!(
                o,
                "{}: {} wakes, p50 {}, p99.9 {}, longest {}, {} over 100us, {} over 1ms",
                m.name,
                m.count,
                fmt_ns(m.p50_ns),
                fmt_ns(m.p999_ns),
                fmt_ns(m.max_ns),
                m.over_100us,
                m.over_1ms
            );
        }
        o.push('\n');
        let _ = writeln!(
            o,
            "{:<30} {:>9} | {:>12} {:>9} | {:>10} {:>10} {:>9} {:>9} {:>9} {:>6}",
            "", "", "sends", "", "late by", "late by", "", "", "", ""
        );
        let _ = writeln!(
            o,
            "{:<30} {:>9} | {:>12} {:>9} | {:>10} {:>10} {:>9} {:>9} {:>9} {:>6}",
            "mechanism",
            "messages",
            "over 100us",
            "longest",
            "over 100us",
            "over 1ms",
            "p50",
            "p99.9",
            "longest",
            "lost"
        );
        // Each mechanism, and the A/A run of the reference under it.
        let rows = self.scenario.mechanisms.iter().flat_map(|&m| {
            [(m, ""), (m, " (A/A)")].into_iter().filter(|(m, suffix)| {
                suffix.is_empty()
                    || self
                        .measurement(&format!("delivery{suffix}"), Some(*m))
                        .is_some()
            })
        });
        for (mech, suffix) in rows {
            let send = self.measurement(&format!("send{suffix}"), Some(mech));
            let del = self.measurement(&format!("delivery{suffix}"), Some(mech));
            let g = |m: Option<&Measurement>, f: fn(&Measurement) -> String| {
                m.map_or("-".to_string(), f)
            };
            let _ = writeln!(
                o,
                "{:<30} {:>9} | {:>12} {:>9} | {:>10} {:>10} {:>9} {:>9} {:>9} {:>6}",
                format!("{}{suffix}", mech.label()),
                g(del, |m| m.count.to_string()),
                g(send, |m| m.over_100us.to_string()),
                g(send, |m| fmt_ns(m.max_ns)),
                g(del, |m| m.over_100us.to_string()),
                g(del, |m| m.over_1ms.to_string()),
                g(del, |m| fmt_ns(m.p50_ns)),
                g(del, |m| fmt_ns(m.p999_ns)),
                g(del, |m| fmt_ns(m.max_ns)),
                g(del, |m| m.errors.to_string()),
            );
        }
        let lp: Vec<&Measurement> = self
            .measurements
            .iter()
            .filter(|m| m.kind == MeasurementKind::LowPriorityDelivery)
            .collect();
        if !lp.is_empty() {
            let _ = writeln!(o, "\nlow-priority subscribers (no budget):");
            for m in lp {
                let _ = writeln!(
                    o,
                    "{:<30} {:>9} messages, p50 {}, longest {}, {} over 100us, {} over 1ms",
                    format!(
                        "{}{}",
                        m.mechanism.map_or("-", |x| x.label()),
                        m.name.strip_prefix("low-priority delivery").unwrap_or("")
                    ),
                    m.count,
                    fmt_ns(m.p50_ns),
                    fmt_ns(m.max_ns),
                    m.over_100us,
                    m.over_1ms
                );
            }
        }
    }
}

/// `1 burst thread`, `2 burst threads`.
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Nanoseconds as a short human figure: `850ns`, `12.3us`, `1.02ms`, `2.5s`.
pub fn fmt_ns(ns: u64) -> String {
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 100_000 {
        format!("{:.1}us", ns as f64 / 1e3)
    } else if ns < 1_000_000 {
        format!("{}us", ns / 1_000)
    } else if ns < 1_000_000_000 {
        format!("{:.2}ms", ns as f64 / 1e6)
    } else {
        format!("{:.2}s", ns as f64 / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_like_the_letters() {
        assert_eq!(fmt_ns(850), "850ns");
        assert_eq!(fmt_ns(30_500), "30.5us");
        assert_eq!(fmt_ns(250_000), "250us");
        assert_eq!(fmt_ns(1_700_000), "1.70ms");
    }
}
