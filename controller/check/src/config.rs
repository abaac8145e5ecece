//! The `check` and `boot_check` sections of `robot.yaml`: the timing
//! check's scenario and budgets, and the short check the supervisor runs
//! at boot, with their validation.
//!
//! Every validator appends `(field path, message)` pairs
//! ([`units::problem::Problem`]); the caller maps a path such as
//! `check.bursts.min` back to its line and column.

use serde::{Deserialize, Serialize};
use units::duration::Dur;
use units::problem::Problem;

/// `check:` — the timing check's scenario and budgets.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckSection {
    pub duration: Dur,
    /// The real-time sender's period.
    pub period: Dur,
    /// Priority of the real-time sender and receiver.
    pub priority: u32,
    /// Lower-priority publishers/subscribers on housekeeping CPUs.
    pub low_priority: LowPriorityLoad,
    /// SCHED_FIFO burst threads below the real-time priority.
    pub bursts: BurstLoad,
    /// Plain CPU hogs and I/O writers on housekeeping CPUs.
    pub cpu_load: u32,
    pub io_load: u32,
    /// Budgets the check enforces.
    pub budgets: CheckBudgets,
    /// Trace the kernel around every delivery over its budget (and every
    /// timer wake over `budgets.timer_max`) and keep at most this many
    /// traced misses of each kind (`deploy check --trace` without it
    /// keeps 10); unset: no tracing, no cost.
    pub trace_on_miss: Option<u32>,
}

impl Default for CheckSection {
    fn default() -> Self {
        CheckSection {
            duration: Dur::from_secs(60),
            period: Dur::from_micros(500),
            priority: 80,
            low_priority: LowPriorityLoad::default(),
            bursts: BurstLoad::default(),
            cpu_load: 1,
            io_load: 1,
            budgets: CheckBudgets::default(),
            trace_on_miss: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LowPriorityLoad {
    /// How many lower-priority processes publish and subscribe.
    pub processes: u32,
    pub period: Dur,
    /// Each one stops and a new one starts this often.
    pub churn: Dur,
}

impl Default for LowPriorityLoad {
    fn default() -> Self {
        LowPriorityLoad {
            processes: 2,
            period: Dur::from_micros(200),
            churn: Dur::from_secs(2),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BurstLoad {
    pub threads: u32,
    pub priority: u32,
    pub min: Dur,
    pub max: Dur,
}

impl Default for BurstLoad {
    fn default() -> Self {
        BurstLoad {
            threads: 1,
            priority: 40,
            min: Dur::from_micros(20),
            max: Dur::from_millis(1),
        }
    }
}

/// Each budget applies to the measurement's maximum; p99 budgets to p99.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckBudgets {
    pub delivery_max: Option<Dur>,
    pub delivery_p99: Option<Dur>,
    pub timer_max: Option<Dur>,
    pub timer_p99: Option<Dur>,
    pub send_max: Option<Dur>,
}

impl CheckSection {
    pub fn validate(&self, path: &str, out: &mut Vec<Problem>) {
        let positive = |field: &str, d: Dur, out: &mut Vec<Problem>| {
            if d.is_zero() {
                out.push((
                    format!("{path}.{field}"),
                    "0 (expected a positive duration)".into(),
                ));
            }
        };
        positive("duration", self.duration, out);
        positive("period", self.period, out);
        positive("low_priority.period", self.low_priority.period, out);
        positive("low_priority.churn", self.low_priority.churn, out);
        positive("bursts.min", self.bursts.min, out);
        positive("bursts.max", self.bursts.max, out);
        if self.bursts.min > self.bursts.max {
            out.push((
                format!("{path}.bursts.min"),
                format!(
                    "min {} is above max {} (expected min <= max)",
                    self.bursts.min, self.bursts.max
                ),
            ));
        }
        for (field, p) in [
            ("priority", self.priority),
            ("bursts.priority", self.bursts.priority),
        ] {
            if !(1..=99).contains(&p) {
                out.push((
                    format!("{path}.{field}"),
                    format!("priority {p} is out of range (expected 1 to 99)"),
                ));
            }
        }
        if self.bursts.threads > 0 && self.bursts.priority >= self.priority {
            out.push((
                format!("{path}.bursts.priority"),
                format!(
                    "burst priority {} must be below the real-time priority {} (the scenario measures lower-priority interference)",
                    self.bursts.priority, self.priority
                ),
            ));
        }
        if self.trace_on_miss == Some(0) {
            out.push((
                format!("{path}.trace_on_miss"),
                "0 (expected how many traced misses to keep, 1 or more; leave it out for no tracing)"
                    .into(),
            ));
        }
        let b = &self.budgets;
        for (field, d) in [
            ("delivery_max", b.delivery_max),
            ("delivery_p99", b.delivery_p99),
            ("timer_max", b.timer_max),
            ("timer_p99", b.timer_p99),
            ("send_max", b.send_max),
        ] {
            if let Some(d) = d {
                positive(&format!("budgets.{field}"), d, out);
            }
        }
    }
}

/// What the supervisor does when the boot check fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFailure {
    /// Start no real-time process.
    #[default]
    Refuse,
    /// Start them, marked degraded.
    Degrade,
}

/// `boot_check:` — the short check the supervisor runs before starting
/// the real-time processes (same scenario and budgets as `check:`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BootCheckSection {
    pub enabled: bool,
    pub duration: Dur,
    pub on_failure: OnFailure,
    /// Boot checks kept in the history (`deploy check --history`), the
    /// newest last; older ones are dropped.
    pub history: u32,
}

/// The most boot checks `boot_check.history` may keep.
pub const MAX_BOOT_HISTORY: u32 = 1000;

impl Default for BootCheckSection {
    fn default() -> Self {
        BootCheckSection {
            enabled: true,
            duration: Dur::from_secs(5),
            on_failure: OnFailure::Refuse,
            history: 20,
        }
    }
}

impl BootCheckSection {
    pub fn validate(&self, out: &mut Vec<Problem>) {
        if self.enabled && self.duration.is_zero() {
            out.push((
                "boot_check.duration".into(),
                "0 (expected a positive duration like `5s`, or `enabled: false`)".into(),
            ));
        }
        if self.history == 0 || self.history > MAX_BOOT_HISTORY {
            out.push((
                "boot_check.history".into(),
                format!(
                    "{} (expected the number of boot checks to keep, 1 to {MAX_BOOT_HISTORY})",
                    self.history
                ),
            ));
        }
    }
}
