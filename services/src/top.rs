//! What `deploy top` shows, as a value: one [`Frame`] from the
//! supervisor's status (or why there is none) and two samples of the CPUs
//! ([`CpuSample`]: `/proc/stat`, `/proc/interrupts`, the CPUs' `online`
//! and `cpufreq` frequencies, nvpmodel's status file for the power mode,
//! the thermal zones). A CPU whose `scaling_max_freq` is below
//! `cpuinfo_max_freq` shows the cap: a power mode or thermal throttling
//! holds it there; a thermal zone at or past a passive trip point is one
//! the kernel throttles ([`crate::thermal`]). The terminal view and
//! `--once --json` both print a frame; building one is pure, reading a
//! sample is the only I/O, bounded ([`MAX_PROC_BYTES`]) since /proc text
//! is read as hostile as any other input: a file that does not parse
//! leaves its columns empty with a note, never an error.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::metrics::TimingStatus;
use crate::status::SupervisorStatus;
use crate::thermal::ThermalZone;

/// The most read of a /proc or /sys file (a 256-CPU machine's
/// /proc/interrupts is well under this).
pub const MAX_PROC_BYTES: u64 = 4 << 20;

/// The most CPUs shown.
pub const MAX_CPUS: usize = 1024;

/// Reads a pseudo file of at most `max` bytes as text (units::bounded: a
/// FIFO is refused rather than waited on, a device is cut at `max`).
fn read_bounded(path: &Path, max: u64) -> Result<String, units::bounded::FileReadError> {
    units::bounded::Bound::pseudo(max).read_lossy(path)
}

/// One reading of the CPUs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CpuSample {
    /// Per CPU: (busy, total) jiffies from /proc/stat.
    pub stat: BTreeMap<u32, (u64, u64)>,
    /// Per CPU: interrupts counted in /proc/interrupts (every row).
    pub interrupts: BTreeMap<u32, u64>,
    /// Per CPU present in sysfs: online, and its current frequency (kHz).
    pub online: BTreeMap<u32, bool>,
    pub freq_khz: BTreeMap<u32, u64>,
    /// Per CPU: the frequency it may reach now (`scaling_max_freq`, lowered
    /// by a power mode or thermal throttling) and its hardware's
    /// (`cpuinfo_max_freq`), kHz.
    pub max_khz: BTreeMap<u32, u64>,
    pub hw_max_khz: BTreeMap<u32, u64>,
    /// The Jetson power mode in force (nvpmodel's status file), where the
    /// board has one.
    pub power_mode: Option<u32>,
    /// The thermal zones, where the board has them.
    pub thermal: Vec<ThermalZone>,
    /// What could not be read or parsed.
    pub notes: Vec<String>,
}

/// Parses /proc/stat's `cpuN` lines: busy is every field but idle and
/// iowait; guest time is already inside user and nice.
pub fn parse_stat(text: &str) -> BTreeMap<u32, (u64, u64)> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        let Some(cpu) = w
            .next()
            .and_then(|c| c.strip_prefix("cpu"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let f: Vec<u64> = w.take(8).map_while(|x| x.parse().ok()).collect();
        if f.len() < 4 || out.len() >= MAX_CPUS {
            continue;
        }
        let total = f.iter().fold(0u64, |a, &b| a.saturating_add(b));
        let idle = f[3].saturating_add(f.get(4).copied().unwrap_or(0));
        out.insert(cpu, (total.saturating_sub(idle), total));
    }
    out
}

/// Per-CPU sums of /proc/interrupts.
pub fn parse_interrupts(text: &str) -> Result<BTreeMap<u32, u64>, cpusets::model::ModelParseError> {
    let ints = cpusets::model::Interrupts::parse(text, Path::new("/proc/interrupts"))?;
    let mut out = BTreeMap::new();
    for row in &ints.rows {
        for (col, &n) in row.counts.iter().enumerate() {
            if let Some(&cpu) = ints.cpus.get(col) {
                let e = out.entry(cpu).or_insert(0u64);
                *e = e.saturating_add(n);
            }
        }
    }
    Ok(out)
}

impl CpuSample {
    /// Reads the CPUs under `sysroot` (`/` on a robot).
    pub fn read(sysroot: &Path) -> CpuSample {
        let mut s = CpuSample::default();
        match read_bounded(&sysroot.join("proc/stat"), MAX_PROC_BYTES) {
            Ok(t) => s.stat = parse_stat(&t),
            Err(e) => s.notes.push(format!("utilisation unknown: {e}")),
        }
        let interrupts = read_bounded(&sysroot.join("proc/interrupts"), MAX_PROC_BYTES);
        match interrupts.as_deref().map(parse_interrupts) {
            Ok(Ok(i)) => s.interrupts = i,
            Ok(Err(e)) => s.notes.push(format!("interrupts unknown: {e}")),
            Err(e) => s.notes.push(format!("interrupts unknown: {e}")),
        }
        let dir = sysroot.join("sys/devices/system/cpu");
        let cpus: Vec<u32> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.file_name()
                        .to_str()?
                        .strip_prefix("cpu")?
                        .parse::<u32>()
                        .ok()
                })
                .take(MAX_CPUS)
                .collect(),
            Err(e) => {
                s.notes
                    .push(format!("CPUs unknown: {}: {e}", dir.display()));
                Vec::new()
            }
        };
        for cpu in cpus {
            let c = dir.join(format!("cpu{cpu}"));
            // CPU 0 often has no `online` file: it cannot go offline.
            let online = read_bounded(&c.join("online"), 16)
                .map(|t| t.trim() == "1")
                .unwrap_or(true);
            s.online.insert(cpu, online);
            for (file, map) in [
                ("cpufreq/scaling_cur_freq", &mut s.freq_khz),
                ("cpufreq/scaling_max_freq", &mut s.max_khz),
                ("cpufreq/cpuinfo_max_freq", &mut s.hw_max_khz),
            ] {
                if let Ok(t) = read_bounded(&c.join(file), 32) {
                    if let Ok(khz) = t.trim().parse() {
                        map.insert(cpu, khz);
                    }
                }
            }
        }
        let status = sysroot.join(cpusets::power::STATUS_FILE.trim_start_matches('/'));
        s.power_mode = read_bounded(&status, 4096)
            .ok()
            .and_then(|t| cpusets::power::parse_status(&t));
        let (thermal, notes) = crate::thermal::read(sysroot);
        s.thermal = thermal;
        s.notes.extend(notes);
        s
    }
}

/// One CPU's row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuRow {
    pub cpu: u32,
    pub online: bool,
    pub isolated: bool,
    pub freq_mhz: Option<u64>,
    /// The frequency it is held under, when below its hardware's maximum
    /// (a power mode's cap or thermal throttling).
    pub capped_mhz: Option<u64>,
    /// Busy share since the previous sample, percent.
    pub util_pct: Option<f64>,
    /// Interrupts per second since the previous sample.
    pub irqs_per_s: Option<f64>,
    /// Isolated and interrupted: highlighted.
    pub alarm: bool,
}

/// The CPU rows between two samples `secs` apart.
pub fn cpu_rows(prev: &CpuSample, cur: &CpuSample, secs: f64, isolated: &[u32]) -> Vec<CpuRow> {
    let mut cpus: Vec<u32> = cur.online.keys().chain(cur.stat.keys()).copied().collect();
    cpus.sort_unstable();
    cpus.dedup();
    cpus.truncate(MAX_CPUS);
    cpus.into_iter()
        .map(|cpu| {
            let util_pct = match (prev.stat.get(&cpu), cur.stat.get(&cpu)) {
                (Some(&(b0, t0)), Some(&(b1, t1))) if t1 > t0 => {
                    Some(100.0 * b1.saturating_sub(b0) as f64 / (t1 - t0) as f64)
                }
                _ => None,
            };
            let irqs_per_s = match (prev.interrupts.get(&cpu), cur.interrupts.get(&cpu)) {
                (Some(&a), Some(&b)) if secs > 0.0 => Some(b.saturating_sub(a) as f64 / secs),
                _ => None,
            };
            let iso = isolated.contains(&cpu);
            CpuRow {
                cpu,
                online: cur.online.get(&cpu).copied().unwrap_or(true),
                isolated: iso,
                freq_mhz: cur.freq_khz.get(&cpu).map(|k| k / 1000),
                capped_mhz: match (cur.max_khz.get(&cpu), cur.hw_max_khz.get(&cpu)) {
                    (Some(&m), Some(&hw)) if m < hw => Some(m / 1000),
                    _ => None,
                },
                util_pct,
                irqs_per_s,
                alarm: iso && irqs_per_s.is_some_and(|r| r > 0.0),
            }
        })
        .collect()
}

/// One process's row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessRow {
    pub name: String,
    pub state: String,
    pub backend: Option<String>,
    /// `fifo/80`, `other/0`.
    pub sched: Option<String>,
    pub cpus: Option<String>,
    /// Latest report (worst over watchers and timers), microseconds.
    pub wakeup_avg_us: Option<f64>,
    pub wakeup_p50_us: Option<f64>,
    pub wakeup_p99_us: Option<f64>,
    pub wakeup_max_us: Option<f64>,
    /// Since the process's event loop started (worst over watchers and
    /// timers); `None` when its reports have the previous layout or the
    /// supervisor is older.
    pub since_start_wakeup_p50_us: Option<f64>,
    pub since_start_wakeup_p99_us: Option<f64>,
    pub since_start_wakeup_max_us: Option<f64>,
    /// Worst of the reports the supervisor read since this run started.
    pub run_wakeup_max_us: Option<f64>,
    /// The layout of its latest timing report (3; 2 from a controller
    /// built against the previous runtime).
    pub report_layout: Option<u32>,
    pub handler_avg_us: Option<f64>,
    pub handler_max_us: Option<f64>,
    pub wakeup_budget_us: Option<f64>,
    pub handler_budget_us: Option<f64>,
    /// The latest report missed a budget: highlighted.
    pub miss: bool,
    pub over_budget_reports: u64,
    pub restarts: u32,
}

/// One channel's row, from the reports of every process using it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChannelRow {
    pub name: String,
    pub publishers: u32,
    pub subscribers: u32,
    /// Messages sent per second (every publisher's latest window).
    pub rate_hz: f64,
    /// Lost by its subscribers in their latest windows, and in total.
    pub lost: u64,
    pub lost_total: u64,
}

/// How the process rows are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SortKey {
    /// As in robot.yaml.
    #[default]
    Config,
    Name,
    WakeupP99,
    WakeupMax,
    Misses,
    Restarts,
}

impl SortKey {
    pub const ALL: [SortKey; 6] = [
        SortKey::Config,
        SortKey::Name,
        SortKey::WakeupP99,
        SortKey::WakeupMax,
        SortKey::Misses,
        SortKey::Restarts,
    ];
    pub fn name(self) -> &'static str {
        match self {
            SortKey::Config => "config",
            SortKey::Name => "name",
            SortKey::WakeupP99 => "p99",
            SortKey::WakeupMax => "max",
            SortKey::Misses => "misses",
            SortKey::Restarts => "restarts",
        }
    }
    pub fn parse(s: &str) -> Option<SortKey> {
        SortKey::ALL.into_iter().find(|k| k.name() == s)
    }
    pub fn next(self) -> SortKey {
        let i = SortKey::ALL.iter().position(|&k| k == self).unwrap_or(0);
        SortKey::ALL[(i + 1) % SortKey::ALL.len()]
    }
}

/// One screen of `deploy top`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Frame {
    pub robot: Option<String>,
    pub supervisor_uptime_s: Option<f64>,
    pub boot_check: Option<String>,
    /// The Jetson power mode in force (nvpmodel), where there is one.
    pub power_mode: Option<u32>,
    /// The thermal zones, where the board has them; `throttling` marks one
    /// at or past a passive trip point.
    pub thermal: Vec<ThermalZone>,
    /// The supervisor could not be asked, or answered oddly: why.
    pub error: Option<String>,
    /// Things worth knowing about the data (an older status layout, a
    /// /proc file that did not parse).
    pub notes: Vec<String>,
    pub sort: SortKey,
    /// Only processes whose name contains this.
    pub filter: Option<String>,
    pub processes: Vec<ProcessRow>,
    pub channels: Vec<ChannelRow>,
    pub cpus: Vec<CpuRow>,
}

fn process_row(p: &crate::status::ProcessStatus) -> ProcessRow {
    let t: Option<&TimingStatus> = p.timing.as_ref();
    let wakeup_max_us = t.and_then(|t| t.wakeup_max_us).or(p.wakeup_max_us);
    let handler_max_us = t.and_then(|t| t.handler_max_us);
    let wakeup_budget_us = t.and_then(|t| t.wakeup_budget_us);
    let handler_budget_us = t.and_then(|t| t.handler_budget_us);
    let over = |v: Option<f64>, b: Option<f64>| matches!((v, b), (Some(v), Some(b)) if v > b);
    ProcessRow {
        name: p.name.clone(),
        state: if p.degraded && p.state == "running" {
            "degraded".into()
        } else {
            p.state.clone()
        },
        backend: p.backend.clone(),
        sched: p.in_force.as_ref().map(|f| {
            if f.policy == "other" || f.policy == "batch" || f.policy == "idle" {
                format!("{}/{}", f.policy, f.nice)
            } else {
                format!("{}/{}", f.policy, f.priority)
            }
        }),
        cpus: p.in_force.as_ref().map(|f| f.cpus.clone()),
        wakeup_avg_us: t.and_then(|t| t.wakeup_avg_us),
        wakeup_p50_us: t.and_then(|t| t.wakeup_p50_us),
        wakeup_p99_us: t.and_then(|t| t.wakeup_p99_us).or(p.wakeup_p99_us),
        wakeup_max_us,
        since_start_wakeup_p50_us: t.and_then(|t| t.since_start_wakeup_p50_us),
        since_start_wakeup_p99_us: t.and_then(|t| t.since_start_wakeup_p99_us),
        since_start_wakeup_max_us: t.and_then(|t| t.since_start_wakeup_max_us),
        run_wakeup_max_us: t.and_then(|t| t.run_wakeup_max_us),
        report_layout: t.and_then(|t| t.layout),
        handler_avg_us: t.and_then(|t| t.handler_avg_us),
        handler_max_us,
        wakeup_budget_us,
        handler_budget_us,
        miss: p.state == "running"
            && (over(wakeup_max_us, wakeup_budget_us) || over(handler_max_us, handler_budget_us)),
        over_budget_reports: p.over_budget_reports,
        restarts: p.restarts,
    }
}

fn channel_rows(s: &SupervisorStatus) -> Vec<ChannelRow> {
    let mut by: BTreeMap<&str, ChannelRow> = BTreeMap::new();
    for p in &s.processes {
        let Some(t) = &p.timing else { continue };
        if p.state != "running" {
            continue;
        }
        for e in &t.entries {
            use controller::timing_report::EntryKind;
            if e.kind == EntryKind::Timer {
                continue;
            }
            let row = by.entry(e.name.as_str()).or_insert_with(|| ChannelRow {
                name: e.name.clone(),
                ..Default::default()
            });
            match e.kind {
                EntryKind::Sender => {
                    row.publishers += 1;
                    row.rate_hz += e.rate_hz;
                }
                _ => {
                    row.subscribers += 1;
                    row.lost = row.lost.saturating_add(e.lost);
                    row.lost_total = row.lost_total.saturating_add(e.totals.lost);
                }
            }
        }
    }
    by.into_values().collect()
}

/// `a, b, c and 2 more`: at most `max` names.
fn names(all: &[&str], max: usize) -> String {
    let shown = all[..all.len().min(max)].join(", ");
    match all.len().saturating_sub(max) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

/// Builds a frame from what was fetched: the supervisor's status, or the
/// caller's words for why there is none (shown as the frame's error, as
/// they are).
pub fn frame(
    status: Result<&SupervisorStatus, &str>,
    cpus: Vec<CpuRow>,
    cpu_notes: &[String],
    sort: SortKey,
    filter: Option<&str>,
) -> Frame {
    let mut f = Frame {
        sort,
        filter: filter.map(String::from),
        cpus,
        notes: cpu_notes.to_vec(),
        ..Default::default()
    };
    let s = match status {
        Ok(s) => s,
        Err(e) => {
            f.error = Some(e.to_string());
            return f;
        }
    };
    f.robot = Some(s.robot.clone());
    f.supervisor_uptime_s = Some(s.uptime_s);
    f.boot_check = Some(s.boot_check.clone());
    let running_without_detail = s
        .processes
        .iter()
        .filter(|p| p.state == "running" && p.timing.is_none() && p.wakeup_p99_us.is_some())
        .count();
    if running_without_detail > 0 {
        f.notes.push(format!(
            "{running_without_detail} process(es) report timing but the status has no detail: an older supervisor (wakeup p99 and max only; no handler times, channels or budgets)"
        ));
    }
    let old_layout: Vec<&str> = s
        .processes
        .iter()
        .filter(|p| {
            p.state == "running"
                && p.timing.as_ref().is_some_and(|t| {
                    t.layout
                        .is_some_and(|l| l < controller::timing_report::LAYOUT_WITH_MEDIANS)
                })
        })
        .map(|p| p.name.as_str())
        .collect();
    if !old_layout.is_empty() {
        f.notes.push(format!(
            "{} {} timing reports of an older layout (built against an earlier runtime): no median and nothing since start (-)",
            names(&old_layout, 4),
            if old_layout.len() == 1 { "publishes" } else { "publish" },
        ));
    }
    let without_layout = s
        .processes
        .iter()
        .filter(|p| p.state == "running" && p.timing.as_ref().is_some_and(|t| t.layout.is_none()))
        .count();
    if without_layout > 0 {
        f.notes.push(format!(
            "{without_layout} process(es) with timing from an older supervisor: no median and nothing since start (-)"
        ));
    }
    let matches = |name: &str| filter.is_none_or(|q| name.contains(q));
    f.processes = s
        .processes
        .iter()
        .filter(|p| matches(&p.name))
        .map(process_row)
        .collect();
    let key = |v: Option<f64>| v.unwrap_or(f64::NEG_INFINITY);
    match sort {
        SortKey::Config => {}
        SortKey::Name => f.processes.sort_by(|a, b| a.name.cmp(&b.name)),
        SortKey::WakeupP99 => f
            .processes
            .sort_by(|a, b| key(b.wakeup_p99_us).total_cmp(&key(a.wakeup_p99_us))),
        SortKey::WakeupMax => f
            .processes
            .sort_by(|a, b| key(b.wakeup_max_us).total_cmp(&key(a.wakeup_max_us))),
        SortKey::Misses => f
            .processes
            .sort_by_key(|p| std::cmp::Reverse((p.miss, p.over_budget_reports))),
        SortKey::Restarts => f.processes.sort_by_key(|p| std::cmp::Reverse(p.restarts)),
    }
    // The filter is on process names; every channel stays.
    f.channels = channel_rows(s);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_busy_and_total() {
        let t = "cpu  10 0 10 100 0 0 0 0 0 0\ncpu0 4 1 5 50 10 0 0 0 0 0\ncpu1 1 2 3\ncpux 1 2 3 4\nintr 1 2 3\ncpu2 garbage\n";
        let s = parse_stat(t);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[&0], (10, 70));
    }

    #[test]
    fn interrupts_are_summed_per_cpu_and_isolated_ones_raise_an_alarm() {
        let t = "           CPU0       CPU1\n  0:         10          0   IO-APIC   2-edge      timer\nLOC:       100         5   Local timer interrupts\nERR:          0\n";
        let i = parse_interrupts(t).unwrap();
        assert_eq!(i, BTreeMap::from([(0, 110), (1, 5)]));
        assert!(parse_interrupts("").is_err());
        let prev = CpuSample {
            stat: BTreeMap::from([(0, (10, 100)), (1, (0, 100))]),
            interrupts: i.clone(),
            online: BTreeMap::from([(0, true), (1, true)]),
            ..Default::default()
        };
        let mut cur = prev.clone();
        cur.stat = BTreeMap::from([(0, (60, 200)), (1, (0, 200))]);
        cur.interrupts = BTreeMap::from([(0, 130), (1, 7)]);
        cur.freq_khz = BTreeMap::from([(1, 1_510_400)]);
        cur.max_khz = BTreeMap::from([(0, 1_984_000), (1, 1_510_400)]);
        cur.hw_max_khz = BTreeMap::from([(0, 1_984_000), (1, 1_984_000)]);
        let rows = cpu_rows(&prev, &cur, 2.0, &[1]);
        assert_eq!(rows[0].util_pct, Some(50.0));
        assert_eq!(rows[0].irqs_per_s, Some(10.0));
        assert!(!rows[0].alarm, "CPU 0 is not isolated");
        assert_eq!(
            (rows[1].util_pct, rows[1].irqs_per_s),
            (Some(0.0), Some(1.0))
        );
        assert!(rows[1].alarm && rows[1].isolated);
        assert_eq!(rows[1].freq_mhz, Some(1510));
        assert_eq!((rows[0].capped_mhz, rows[1].capped_mhz), (None, Some(1510)));
        // A counter that went backwards (CPU hot-unplug) is no negative rate.
        cur.interrupts.insert(1, 0);
        assert_eq!(cpu_rows(&prev, &cur, 2.0, &[1])[1].irqs_per_s, Some(0.0));
    }

    #[test]
    fn the_power_mode_and_caps_are_read_from_the_sysroot() {
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path().join("sys/devices/system/cpu/cpu2/cpufreq");
        std::fs::create_dir_all(&c).unwrap();
        std::fs::write(c.join("scaling_cur_freq"), "729600\n").unwrap();
        std::fs::write(c.join("scaling_max_freq"), "1510400\n").unwrap();
        std::fs::write(c.join("cpuinfo_max_freq"), "1984000\n").unwrap();
        std::fs::write(c.parent().unwrap().join("online"), "0\n").unwrap();
        let nv = dir.path().join("var/lib/nvpmodel");
        std::fs::create_dir_all(&nv).unwrap();
        std::fs::write(nv.join("status"), "pmode:0002 fmode:quiet\n").unwrap();
        let s = CpuSample::read(dir.path());
        assert_eq!(s.power_mode, Some(2));
        let rows = cpu_rows(&s, &s, 1.0, &[2]);
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (rows[0].online, rows[0].freq_mhz, rows[0].capped_mhz),
            (false, Some(729), Some(1510))
        );
    }

    #[test]
    fn a_missing_sysroot_gives_notes_not_errors() {
        let dir = tempfile::tempdir().unwrap();
        let s = CpuSample::read(dir.path());
        assert_eq!(s.notes.len(), 3, "{:?}", s.notes);
        assert!(cpu_rows(&s, &s, 1.0, &[]).is_empty());
        assert!(s.thermal.is_empty());
    }

    #[test]
    fn the_sample_carries_the_thermal_zones() {
        let dir = tempfile::tempdir().unwrap();
        let z = dir.path().join("sys/class/thermal/thermal_zone0");
        std::fs::create_dir_all(&z).unwrap();
        std::fs::write(z.join("type"), "cpu-thermal\n").unwrap();
        std::fs::write(z.join("temp"), "99000\n").unwrap();
        std::fs::write(z.join("trip_point_0_type"), "passive\n").unwrap();
        std::fs::write(z.join("trip_point_0_temp"), "95500\n").unwrap();
        let s = CpuSample::read(dir.path());
        assert_eq!(s.thermal.len(), 1);
        assert!(s.thermal[0].throttling);
    }

    fn status_json() -> &'static str {
        r#"{
            "robot": "arm", "pid": 1, "pid1": false, "uptime_s": 5.0, "state": "running",
            "boot_check": "passed", "startup": [],
            "processes": [
                {"name": "talker", "state": "running", "restarts": 0, "budget": "ok",
                 "over_budget_reports": 0, "degraded": false, "backend": "io_uring-futex",
                 "timing": {"seq": 4, "period_s": 1.0, "layout": 3, "wakeup_avg_us": 5.0,
                    "wakeup_p50_us": 4.5, "wakeup_p99_us": 9.0,
                    "wakeup_max_us": 12.0, "handler_avg_us": 1.0, "handler_max_us": 2.0,
                    "since_start_wakeup_p50_us": 4.0, "since_start_wakeup_p99_us": 11.0,
                    "since_start_wakeup_max_us": 35.0,
                    "run_wakeup_max_us": 30.0, "run_handler_max_us": 3.0,
                    "wakeup_budget_us": 200.0, "handler_budget_us": null,
                    "reports": 4, "reports_skipped": 0,
                    "entries": [
                        {"kind": "timer", "name": "talk", "rate_hz": 1000.0, "latency_avg_us": 5.0,
                         "latency_p99_us": 9.0, "latency_max_us": 12.0, "handler_max_us": 2.0, "lost": 0,
                         "totals": {"events": 4000, "lost": 0, "missed": 0, "errors": 0, "faults": 0}},
                        {"kind": "sender", "name": "/ping", "rate_hz": 1000.0, "latency_avg_us": 0.0,
                         "latency_p99_us": 0.0, "latency_max_us": 0.0, "handler_max_us": 0.0, "lost": 0,
                         "totals": {"events": 4000, "lost": 0, "missed": 0, "errors": 0, "faults": 0}}]}},
                {"name": "listener", "state": "running", "restarts": 2, "budget": "over",
                 "over_budget_reports": 3, "degraded": true,
                 "timing": {"seq": 4, "period_s": 1.0, "layout": 2, "wakeup_avg_us": 5.0, "wakeup_p99_us": 40.0,
                    "wakeup_max_us": 80.0, "handler_avg_us": 1.0, "handler_max_us": 2.0,
                    "run_wakeup_max_us": 80.0, "run_handler_max_us": 3.0,
                    "wakeup_budget_us": 1.0, "handler_budget_us": null,
                    "reports": 4, "reports_skipped": 1,
                    "entries": [
                        {"kind": "watcher", "name": "/ping", "rate_hz": 990.0, "latency_avg_us": 5.0,
                         "latency_p99_us": 40.0, "latency_max_us": 80.0, "handler_max_us": 2.0, "lost": 10,
                         "totals": {"events": 3900, "lost": 25, "missed": 0, "errors": 0, "faults": 0}}]}},
                {"name": "old", "state": "running", "restarts": 0, "budget": "ok",
                 "over_budget_reports": 0, "degraded": false, "wakeup_p99_us": 3.0, "wakeup_max_us": 4.0}
            ]
        }"#
    }

    #[test]
    fn rows_misses_channels_sorting_and_filtering() {
        let s: SupervisorStatus = serde_json::from_str(status_json()).unwrap();
        let f = frame(Ok(&s), vec![], &[], SortKey::Config, None);
        assert_eq!(f.processes.len(), 3);
        assert!(!f.processes[0].miss);
        assert!(f.processes[1].miss, "80us over a 1us budget");
        assert_eq!(f.processes[1].state, "degraded");
        assert_eq!(f.processes[2].wakeup_p99_us, Some(3.0));
        assert!(f.notes[0].contains("an older supervisor"), "{:?}", f.notes);
        let t = &f.processes[0];
        assert_eq!(
            (
                t.wakeup_p50_us,
                t.since_start_wakeup_p99_us,
                t.since_start_wakeup_max_us
            ),
            (Some(4.5), Some(11.0), Some(35.0))
        );
        // The listener's controller publishes the previous layout: its
        // figures are there, the new ones absent and the frame says why.
        let l = &f.processes[1];
        assert_eq!((l.report_layout, l.wakeup_p99_us), (Some(2), Some(40.0)));
        assert_eq!((l.wakeup_p50_us, l.since_start_wakeup_max_us), (None, None));
        assert_eq!(
            f.notes[1],
            "listener publishes timing reports of an older layout (built against an earlier runtime): no median and nothing since start (-)"
        );
        assert_eq!(f.notes.len(), 2, "{:?}", f.notes);
        assert_eq!(
            f.channels,
            [ChannelRow {
                name: "/ping".into(),
                publishers: 1,
                subscribers: 1,
                rate_hz: 1000.0,
                lost: 10,
                lost_total: 25
            }]
        );
        let f = frame(Ok(&s), vec![], &[], SortKey::WakeupMax, None);
        let names: Vec<&str> = f.processes.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["listener", "talker", "old"]);
        let f = frame(Ok(&s), vec![], &[], SortKey::Name, Some("ste"));
        let names: Vec<&str> = f.processes.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["listener"]);
        let f = frame(Err("no supervisor"), vec![], &[], SortKey::Config, None);
        assert_eq!(f.error.as_deref(), Some("no supervisor"));
        assert!(f.processes.is_empty());
    }

    #[test]
    fn names_are_bounded() {
        assert_eq!(names(&["a"], 2), "a");
        assert_eq!(names(&["a", "b", "c", "d"], 2), "a, b and 2 more");
    }

    #[test]
    fn timing_from_an_older_supervisor_is_said_so() {
        let mut s: SupervisorStatus = serde_json::from_str(status_json()).unwrap();
        for p in &mut s.processes {
            if let Some(t) = p.timing.as_mut() {
                t.layout = None;
            }
        }
        let f = frame(Ok(&s), vec![], &[], SortKey::Config, None);
        assert!(
            f.notes
                .iter()
                .any(|n| n.starts_with("2 process(es) with timing from an older supervisor")),
            "{:?}",
            f.notes
        );
    }

    #[test]
    fn sort_keys_cycle_and_parse() {
        let mut k = SortKey::Config;
        for _ in 0..SortKey::ALL.len() {
            assert_eq!(SortKey::parse(k.name()), Some(k));
            k = k.next();
        }
        assert_eq!(k, SortKey::Config);
        assert_eq!(SortKey::parse("nope"), None);
    }
}
