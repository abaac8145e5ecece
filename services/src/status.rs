//! What `deploy status` shows: the supervisor's start-up steps and, per
//! process, its state, restarts, the attributes the kernel reports for it,
//! its last exit and its timing-report figures.

use serde::{Deserialize, Serialize};

/// The outcome of one start-up step (CPU plan, cpu_dma_latency, channels,
/// boot check).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepStatus {
    pub step: String,
    /// `ok`, `skipped`, `failed`.
    pub result: String,
    pub detail: String,
}

/// The whole supervisor.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SupervisorStatus {
    pub robot: String,
    pub pid: i32,
    pub pid1: bool,
    pub uptime_s: f64,
    /// `starting`, `running`, `stopping`.
    pub state: String,
    /// `passed`, `failed`, `skipped: ...`, `disabled`.
    pub boot_check: String,
    pub startup: Vec<StepStatus>,
    /// The release the processes run from and its trial state (absent
    /// from supervisors that predate releases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<ReleaseStatus>,
    /// What the last scan for late interrupts and IRQ threads placed
    /// (absent until one appeared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub irq_scan: Option<StepStatus>,
    /// The hardware watchdog (robot.yaml `watchdog:`): armed and fed, or
    /// why the board does not reset if the supervisor stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watchdog: Option<crate::watchdog::WatchdogStatus>,
    /// A Jetson's rootfs A/B slots at this boot (absent without A/B).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs_slots: Option<crate::rootfs_slots::RootfsSlots>,
    /// The logger (robot.yaml `log:`), when it runs or ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logger: Option<logbook::LogStatus>,
    /// The bridge's last status (robot.yaml `bridge:`), when it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<crate::bridge::BridgeStatus>,
    /// What woke the supervisor's own event loop, counted since it
    /// started (absent from supervisors that predate the count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_loop: Option<LoopCounts>,
    pub processes: Vec<ProcessStatus>,
}

/// The supervisor's event loop, counted: an idle supervisor wakes for its
/// timers (at least once a second) and its clients, not once per turn for
/// a descriptor it has nothing more to read from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopCounts {
    /// Returns from poll(2).
    pub turns: u64,
    /// Returns that found a process's output pipe readable (data, or its
    /// hang-up: a pipe at end of file is dropped from the poll set).
    pub output_wakes: u64,
}

/// The installed release as the supervisor sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReleaseStatus {
    /// `committed`, `trial`, `rolled-back` (committed again, after a
    /// failed trial), `none` (nothing installed under the prefix), `error`.
    pub state: String,
    /// The release `opt/rtdeploy/current` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    /// Trial: the release it goes back to on failure. Rolled back: the
    /// release that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other: Option<String>,
    /// Trial: when it began (Unix seconds, from `state.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    /// Trial: seconds since the supervisor took it up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_s: Option<f64>,
    /// Trial: `restarting` (the processes are being restarted from the
    /// new release) or `watching` (health observed once a second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Trial: seconds of `update.health_window` still to go once every
    /// process is healthy (absent until then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_left_s: Option<f64>,
    /// Rolled back: why. Error: what failed. At start: what recovery did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// This boot of a system update counted by the boot loader
    /// (`update.boot_attempts`): the attempt it was, or the fallback it
    /// booted. Kept for the whole boot, through the trial's verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_loader: Option<releases::boot_attempts::BootLoaderSaw>,
}

impl ReleaseStatus {
    /// One line for the table.
    pub fn describe(&self) -> String {
        let cur = self.current.as_deref().unwrap_or("(none)");
        let mut s = match self.state.as_str() {
            "trial" => {
                let mut s = format!("trial {cur}");
                if let Some(f) = self.for_s {
                    s.push_str(&format!(" for {f:.0}s"));
                }
                match (self.phase.as_deref(), self.window_left_s) {
                    (_, Some(left)) => s.push_str(&format!(", {left:.0}s of the window left")),
                    (Some(phase), None) => s.push_str(&format!(", {phase}")),
                    (None, None) => {}
                }
                if let Some(o) = &self.other {
                    s.push_str(&format!("; rollback to {o}"));
                }
                s
            }
            "rolled-back" => format!(
                "rolled back to {cur}{}",
                self.other
                    .as_deref()
                    .map(|o| format!(" from {o}"))
                    .unwrap_or_default()
            ),
            "none" => "none installed".to_string(),
            other => format!("{other} {cur}"),
        };
        if let Some(d) = &self.detail {
            s.push_str(&format!(" ({d})"));
        }
        if let Some(b) = &self.boot_loader {
            s.push_str(&format!("; boot loader: {}", b.describe()));
        }
        s
    }
}

/// Attributes read back from `/proc/<pid>/stat` and `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InForceStatus {
    pub policy: String,
    pub priority: u32,
    pub nice: i64,
    pub cpus: String,
    pub uid: u32,
    pub gid: u32,
}

/// One process.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProcessStatus {
    pub name: String,
    /// `waiting`, `running`, `backoff`, `stopping`, `stopped`, `exited`,
    /// `failed`, `refused`.
    pub state: String,
    /// Why it is in that state, when it is not plainly running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    pub restarts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uptime_s: Option<f64>,
    /// What the kernel says; `None` when not running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_force: Option<InForceStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<String>,
    /// From the latest timing report, when the process reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wakeup_p99_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wakeup_max_us: Option<f64>,
    /// The wake backend its event loop runs on (from its timing report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// `ok`, `over` (N reports over budget), `no reports`, `unmonitored: why`.
    pub budget: String,
    pub over_budget_reports: u64,
    /// Started although the boot check failed (`on_failure: degrade`), or
    /// a report went over budget.
    pub degraded: bool,
    /// The latest timing report in detail and the metrics gathered from
    /// the reports (absent from older supervisors and before the first
    /// report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<crate::metrics::TimingStatus>,
    /// Why its last traced miss was late, and the trace file
    /// (robot.yaml `check.trace_on_miss`): `late 1.2ms (budget 500us):
    /// <who> ran ... (trace <file>)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_trace: Option<String>,
}

/// Renders the human table of `deploy status`.
pub fn render_table(s: &SupervisorStatus) -> String {
    let mut out = format!(
        "robot {}  supervisor pid {}{}  up {:.0}s  {}\nboot check: {}\n",
        s.robot,
        s.pid,
        if s.pid1 { " (init)" } else { "" },
        s.uptime_s,
        s.state,
        s.boot_check
    );
    if let Some(r) = &s.release {
        out.push_str(&format!("release: {}\n", r.describe()));
    }
    if let Some(st) = &s.irq_scan {
        out.push_str(&format!("{}: {} ({})\n", st.step, st.result, st.detail));
    }
    if let Some(w) = &s.watchdog {
        out.push_str(&format!("watchdog: {}\n", w.describe()));
    }
    if let Some(r) = &s.rootfs_slots {
        out.push_str(&format!("rootfs slots: {}\n", r.describe()));
    }
    if let Some(l) = &s.logger {
        out.push_str(&describe_logger(l));
    }
    if let Some(b) = &s.bridge {
        out.push_str(&b.render());
    }
    for st in &s.startup {
        // The watchdog's own line above is the live one.
        if st.result != "ok" && !(st.step == "watchdog" && s.watchdog.is_some()) {
            out.push_str(&format!("{}: {} ({})\n", st.step, st.result, st.detail));
        }
    }
    out.push_str(&format!(
        "{:<16} {:<9} {:>7} {:>4} {:>8} {:<10} {:<8} {:<14} {:>9} {:>9}  {}\n",
        "NAME",
        "STATE",
        "PID",
        "RST",
        "UPTIME",
        "SCHED",
        "CPUS",
        "BACKEND",
        "WAKE_P99",
        "WAKE_MAX",
        "BUDGET / REASON / LAST EXIT"
    ));
    for p in &s.processes {
        let sched = p
            .in_force
            .as_ref()
            .map(|f| {
                if f.policy == "other" {
                    format!("other/{}", f.nice)
                } else {
                    format!("{}/{}", f.policy, f.priority)
                }
            })
            .unwrap_or_else(|| "-".into());
        let cpus = p
            .in_force
            .as_ref()
            .map(|f| f.cpus.clone())
            .unwrap_or_else(|| "-".into());
        let us = |v: Option<f64>| v.map(|v| format!("{v:.1}us")).unwrap_or_else(|| "-".into());
        let mut tail = Vec::new();
        if p.budget != "-" {
            tail.push(format!("budget: {}", p.budget));
        }
        if let Some(r) = &p.reason {
            tail.push(r.clone());
        }
        if let Some(e) = &p.last_exit {
            tail.push(format!("last: {e}"));
        }
        out.push_str(&format!(
            "{:<16} {:<9} {:>7} {:>4} {:>8} {:<10} {:<8} {:<14} {:>9} {:>9}  {}\n",
            p.name,
            if p.degraded && p.state == "running" {
                "degraded"
            } else {
                &p.state
            },
            p.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            p.restarts,
            p.uptime_s
                .map(|u| format!("{u:.0}s"))
                .unwrap_or_else(|| "-".into()),
            sched,
            cpus,
            p.backend.as_deref().unwrap_or("-"),
            us(p.wakeup_p99_us),
            us(p.wakeup_max_us),
            tail.join("; ")
        ));
        if let Some(why) = &p.last_trace {
            out.push_str(&format!("{:<16} why: {why}\n", ""));
        }
        if let Some(t) = &p.timing {
            for e in &t.entries {
                if let (Some(n @ 1..), Some(max)) = (e.cross_class, e.cross_class_max_us) {
                    let from = t.wake_class.map_or("the other class".to_string(), |c| {
                        format!("{} publishers", c.other())
                    });
                    out.push_str(&format!(
                        "{:<16} across classes: {} {n} message(s) in the last report from {from}, longest {max:.1}us\n",
                        "", e.name
                    ));
                }
            }
        }
    }
    out
}

/// The logger's line of the status table, and one line per channel that
/// lost messages or met faults.
pub fn describe_logger(l: &logbook::LogStatus) -> String {
    let logged: u64 = l.channels.values().map(|c| c.logged).sum();
    let gaps: u64 = l.channels.values().map(|c| c.gaps).sum();
    let mut out = format!(
        "logger: {} ({} messages, {} lost, {} events{}; {} file(s) written, {} deleted by the quota; {})\n",
        l.state,
        logged,
        gaps,
        l.events_logged,
        if l.events_dropped > 0 {
            format!(", {} events dropped", l.events_dropped)
        } else {
            String::new()
        },
        l.files_written,
        l.files_deleted,
        l.file
            .as_ref()
            .map_or_else(|| l.dir.display().to_string(), |f| f.display().to_string()),
    );
    for (name, c) in &l.channels {
        if c.gaps > 0 || c.faults > 0 {
            out.push_str(&format!(
                "logger: {name}: {} logged, {} lost, {} faults\n",
                c.logged, c.gaps, c.faults
            ));
        }
    }
    if gaps > 0 {
        // Three counts of loss, each its own reader's: the logger's here,
        // each subscriber's in its own output and in `deploy top`'s LOST.
        out.push_str(
            "logger: lost counts the messages the logger itself missed (overwritten in the channel before it read them, or dropped while its writer was behind by more than log.buffer), each on /rtdeploy/log/gaps; a subscriber counts its own, so the listener and `deploy top` may say 0; the logger falls behind when a channel keeps less than log.poll of messages, or when its CPU (a housekeeping CPU, at log.nice) is taken by other work: a longer retention, a shorter log.poll or a CPU of its own\n",
        );
    }
    if let Some(p) = &l.last_problem {
        out.push_str(&format!("logger: last problem: {p}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_shows_what_the_kernel_reports_and_why() {
        let s = SupervisorStatus {
            robot: "arm".into(),
            pid: 1,
            pid1: true,
            uptime_s: 12.0,
            state: "running".into(),
            boot_check: "skipped: engine not available".into(),
            startup: vec![StepStatus {
                step: "cpu plan".into(),
                result: "failed".into(),
                detail: "no cgroup".into(),
            }],
            processes: vec![ProcessStatus {
                name: "imu".into(),
                state: "running".into(),
                pid: Some(42),
                restarts: 2,
                uptime_s: Some(3.0),
                in_force: Some(InForceStatus {
                    policy: "fifo".into(),
                    priority: 80,
                    nice: 0,
                    cpus: "2-3".into(),
                    uid: 0,
                    gid: 0,
                }),
                last_exit: Some("killed by SIGSEGV".into()),
                wakeup_p99_us: Some(12.5),
                wakeup_max_us: Some(40.0),
                backend: Some("doorbell".into()),
                budget: "over: 1 report(s) over budget, last: /imu wakeup max 40us > 30us".into(),
                over_budget_reports: 1,
                degraded: true,
                last_trace: Some(
                    "late 1.2ms (budget 30us): spin (FIFO 90, pid 7) ran 1.1ms on CPU 2 after the wake (trace /t/miss-1.txt)"
                        .into(),
                ),
                ..Default::default()
            }],
            ..Default::default()
        };
        let t = render_table(&s);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "robot arm  supervisor pid 1 (init)  up 12s  running"
        );
        assert_eq!(lines[2], "cpu plan: failed (no cgroup)");
        let row: Vec<&str> = lines[4].split_whitespace().collect();
        assert_eq!(
            &row[..10],
            [
                "imu", "degraded", "42", "2", "3s", "fifo/80", "2-3", "doorbell", "12.5us",
                "40.0us"
            ]
        );
        assert!(lines[4].ends_with("budget: over: 1 report(s) over budget, last: /imu wakeup max 40us > 30us; last: killed by SIGSEGV"));
        // Why its last traced miss was late, under its row.
        assert_eq!(
            lines[5].trim_start(),
            "why: late 1.2ms (budget 30us): spin (FIFO 90, pid 7) ran 1.1ms on CPU 2 after the wake (trace /t/miss-1.txt)"
        );
    }

    #[test]
    fn release_line_says_trial_window_or_rollback_reason() {
        let mut s = SupervisorStatus {
            release: Some(ReleaseStatus {
                state: "trial".into(),
                current: Some("2-bbbbbbbb".into()),
                other: Some("1-aaaaaaaa".into()),
                since: Some(1_700_000_000),
                for_s: Some(3.2),
                phase: Some("watching".into()),
                window_left_s: Some(12.4),
                detail: None,
                boot_loader: None,
            }),
            ..Default::default()
        };
        let t = render_table(&s);
        assert_eq!(
            t.lines().nth(2),
            Some(
                "release: trial 2-bbbbbbbb for 3s, 12s of the window left; rollback to 1-aaaaaaaa"
            )
        );
        s.release = Some(ReleaseStatus {
            state: "rolled-back".into(),
            current: Some("1-aaaaaaaa".into()),
            other: Some("2-bbbbbbbb".into()),
            detail: Some("process ctl is not running".into()),
            ..Default::default()
        });
        let t = render_table(&s);
        assert_eq!(
            t.lines().nth(2),
            Some("release: rolled back to 1-aaaaaaaa from 2-bbbbbbbb (process ctl is not running)")
        );
    }
}
