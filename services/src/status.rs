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
    pub processes: Vec<ProcessStatus>,
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
    /// `ok`, `over` (N reports over budget), `no reports`, `unmonitored: why`.
    pub budget: String,
    pub over_budget_reports: u64,
    /// Started although the boot check failed (`on_failure: degrade`), or
    /// a report went over budget.
    pub degraded: bool,
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
    for st in &s.startup {
        if st.result != "ok" {
            out.push_str(&format!("{}: {} ({})\n", st.step, st.result, st.detail));
        }
    }
    out.push_str(&format!(
        "{:<16} {:<9} {:>7} {:>4} {:>8} {:<10} {:<8} {:>9} {:>9} {:<10} {}\n",
        "NAME",
        "STATE",
        "PID",
        "RST",
        "UPTIME",
        "SCHED",
        "CPUS",
        "WAKE_P99",
        "WAKE_MAX",
        "BUDGET",
        "LAST EXIT / REASON"
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
        if let Some(r) = &p.reason {
            tail.push(r.clone());
        }
        if let Some(e) = &p.last_exit {
            tail.push(format!("last: {e}"));
        }
        out.push_str(&format!(
            "{:<16} {:<9} {:>7} {:>4} {:>8} {:<10} {:<8} {:>9} {:>9} {:<10} {}\n",
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
            us(p.wakeup_p99_us),
            us(p.wakeup_max_us),
            p.budget,
            tail.join("; ")
        ));
    }
    out
}
