//! The live system as data: parsers for the text of /proc and /sys (pure),
//! and in [`live`] the one reader that fetches that text from a sysroot.
//!
//! Parsers take the text and the path it came from (for error messages) and
//! never touch the file system, so every format is unit-tested on captured
//! text.

pub mod live;

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use units::cpu::CpuSet;

/// Why a /proc or /sys text did not parse.
#[derive(Debug, thiserror::Error)]
pub enum ModelParseError {
    #[error("cannot parse {}: {what}", path.display())]
    Format { path: PathBuf, what: String },
}

fn bad(path: &Path, what: impl Into<String>) -> ModelParseError {
    ModelParseError::Format {
        path: path.to_path_buf(),
        what: what.into(),
    }
}

/// `PF_KTHREAD` in the `flags` field of /proc/PID/stat.
pub const PF_KTHREAD: u64 = 0x0020_0000;

/// `PF_NO_SETAFFINITY`: the kernel refuses `sched_setaffinity` on this task
/// (per-CPU threads, workqueue workers that follow the workqueue cpumask).
pub const PF_NO_SETAFFINITY: u64 = 0x0400_0000;

/// One row of /proc/interrupts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InterruptRow {
    /// The first column without its colon: `24`, `LOC`, `IPI0`.
    pub id: String,
    /// The interrupt number, for numbered rows.
    pub irq: Option<u32>,
    /// Counts per CPU column (shorter than the column list for `ERR:`).
    pub counts: Vec<u64>,
    /// The text after the counts: chip, hardware number, trigger, actions.
    pub desc: String,
}

impl InterruptRow {
    /// The interrupt chip (`IO-APIC`, `GICv3`, `PCI-MSIX-0000:00:01.0`).
    pub fn chip(&self) -> &str {
        self.desc.split_whitespace().next().unwrap_or("")
    }

    /// The hardware interrupt number on its chip: `30` in `GICv3  30 Level`,
    /// `5` in `IO-APIC   5-edge`.
    pub fn hwirq(&self) -> Option<u32> {
        let second = self.desc.split_whitespace().nth(1)?;
        let digits: String = second.chars().take_while(|c| c.is_ascii_digit()).collect();
        digits.parse().ok()
    }

    /// The action names as printed after the trigger column; used when
    /// /proc/irq/N has no action directories.
    pub fn actions(&self) -> Vec<String> {
        let words: Vec<&str> = self.desc.split_whitespace().collect();
        let trigger = words.iter().position(|w| {
            let w = w.to_ascii_lowercase();
            w.ends_with("edge") || w.ends_with("level") || w.ends_with("fasteoi")
        });
        let rest = match trigger {
            Some(i) => words[i + 1..].join(" "),
            None if words.len() > 1 => words[words.len() - 1].to_string(),
            None => String::new(),
        };
        rest.split(", ")
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    }
}

/// /proc/interrupts: the CPU columns and the rows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Interrupts {
    /// The CPU number of each count column (`CPU0 CPU1` -> 0, 1).
    pub cpus: Vec<u32>,
    pub rows: Vec<InterruptRow>,
}

impl Interrupts {
    pub fn parse(text: &str, path: &Path) -> Result<Self, ModelParseError> {
        let mut lines = text.lines();
        let header = lines.next().ok_or_else(|| bad(path, "empty file"))?;
        let cpus = header
            .split_whitespace()
            .map(|w| {
                w.strip_prefix("CPU")
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| bad(path, format!("header word `{w}` is not CPUn")))
            })
            .collect::<Result<Vec<u32>, _>>()?;
        let mut rows = Vec::new();
        for line in lines {
            let Some((id, rest)) = line.split_once(':') else {
                continue;
            };
            let id = id.trim().to_string();
            if id.is_empty() {
                continue;
            }
            let mut counts = Vec::new();
            let mut rest = rest;
            while counts.len() < cpus.len() {
                let trimmed = rest.trim_start();
                let end = trimmed
                    .find(|c: char| c.is_whitespace())
                    .unwrap_or(trimmed.len());
                match trimmed[..end].parse::<u64>() {
                    Ok(n) if end > 0 => {
                        counts.push(n);
                        rest = &trimmed[end..];
                    }
                    _ => break,
                }
            }
            rows.push(InterruptRow {
                irq: id.parse().ok(),
                id,
                counts,
                desc: rest.trim().to_string(),
            });
        }
        Ok(Interrupts { cpus, rows })
    }

    pub fn row(&self, id: &str) -> Option<&InterruptRow> {
        self.rows.iter().find(|r| r.id == id)
    }

    /// How often each row fired on each CPU between `self` and `later`:
    /// `(row id, cpu, delta)` for every non-zero delta.
    pub fn deltas(&self, later: &Interrupts) -> Vec<(String, u32, u64)> {
        let mut out = Vec::new();
        for row in &later.rows {
            let before = self.row(&row.id);
            for (col, &count) in row.counts.iter().enumerate() {
                let Some(&cpu) = later.cpus.get(col) else {
                    continue;
                };
                let prev = before
                    .and_then(|b| {
                        let bcol = self.cpus.iter().position(|&c| c == cpu)?;
                        b.counts.get(bcol).copied()
                    })
                    .unwrap_or(0);
                let d = count.saturating_sub(prev);
                if d > 0 {
                    out.push((row.id.clone(), cpu, d));
                }
            }
        }
        out
    }
}

/// The fields of /proc/PID/stat rtdeploy uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaskStat {
    pub pid: u32,
    pub comm: String,
    pub ppid: u32,
    /// Field 9, `PF_*` flags.
    pub flags: u64,
    /// Field 39: the CPU the task last ran on.
    pub processor: u32,
    /// Field 40.
    pub rt_priority: u32,
    /// Field 41: `SCHED_*`.
    pub policy: u32,
}

impl TaskStat {
    /// Parses one /proc/PID/stat line. `comm` is in parentheses and may hold
    /// spaces and parentheses itself, so the fields are counted from the
    /// last `)`.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ModelParseError> {
        let open = text
            .find('(')
            .ok_or_else(|| bad(path, "no `(` before comm"))?;
        let close = text
            .rfind(')')
            .ok_or_else(|| bad(path, "no `)` after comm"))?;
        let pid = text[..open].trim().parse().map_err(|_| {
            bad(
                path,
                format!("pid `{}` is not a number", text[..open].trim()),
            )
        })?;
        let comm = text[open + 1..close].to_string();
        // Fields from 3 (state) on.
        let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
        let field = |n: usize| -> Result<u64, ModelParseError> {
            let s = rest
                .get(n - 3)
                .ok_or_else(|| bad(path, format!("field {n} is missing")))?;
            s.parse()
                .map_err(|_| bad(path, format!("field {n} `{s}` is not a number")))
        };
        Ok(TaskStat {
            pid,
            comm,
            ppid: field(4)? as u32,
            flags: field(9)?,
            processor: field(39)? as u32,
            rt_priority: field(40)? as u32,
            policy: field(41)? as u32,
        })
    }

    /// The same line with fields 40 and 41 replaced (used only to stand in
    /// for the kernel in a fake tree).
    pub fn with_sched(text: &str, policy: u32, rt_priority: u32) -> Option<String> {
        let close = text.rfind(')')?;
        let mut rest: Vec<String> = text[close + 1..]
            .split_whitespace()
            .map(String::from)
            .collect();
        if rest.len() < 41 - 2 {
            return None;
        }
        rest[40 - 3] = rt_priority.to_string();
        rest[41 - 3] = policy.to_string();
        Some(format!("{} {}\n", &text[..=close], rest.join(" ")))
    }
}

/// `Cpus_allowed_list` from /proc/PID/status.
pub fn parse_cpus_allowed(text: &str, path: &Path) -> Result<CpuSet, ModelParseError> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .ok_or_else(|| bad(path, "no Cpus_allowed_list line"))?;
    CpuSet::parse_list(line.trim()).map_err(|e| bad(path, e.to_string()))
}

/// The same status text with `Cpus_allowed_list` (and `Cpus_allowed`)
/// replaced (used only to stand in for the kernel in a fake tree).
pub fn status_with_cpus(text: &str, cpus: &CpuSet) -> String {
    let mut out = String::new();
    for l in text.lines() {
        if l.starts_with("Cpus_allowed_list:") {
            out.push_str(&format!("Cpus_allowed_list:\t{cpus}\n"));
        } else if l.starts_with("Cpus_allowed:") {
            out.push_str(&format!("Cpus_allowed:\t{}\n", cpus.to_mask()));
        } else {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// One line of /proc/mounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mount {
    pub source: String,
    pub target: String,
    pub fstype: String,
    pub options: Vec<String>,
}

pub fn parse_mounts(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 4 {
                return None;
            }
            Some(Mount {
                source: f[0].to_string(),
                target: unescape_mount(f[1]),
                fstype: f[2].to_string(),
                options: f[3].split(',').map(String::from).collect(),
            })
        })
        .collect()
}

/// /proc/mounts writes space, tab, newline and backslash as octal escapes.
fn unescape_mount(s: &str) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v as char);
            i += 4;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// Where the cpusets live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupRoot {
    /// The cgroup v2 mount, with the cpuset controller available.
    V2(String),
    /// The cgroup v1 cpuset hierarchy.
    V1(String),
    None,
}

impl fmt::Display for CgroupRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CgroupRoot::V2(m) => write!(f, "v2 {m}"),
            CgroupRoot::V1(m) => write!(f, "v1 {m}"),
            CgroupRoot::None => f.write_str("none"),
        }
    }
}

/// The `invalid (...)` reason in a `cpuset.cpus.partition` value.
pub fn partition_invalid_reason(value: &str) -> Option<String> {
    let i = value.find("invalid")?;
    let rest = value[i + "invalid".len()..].trim();
    let reason = rest.trim_start_matches('(').trim_end_matches(')').trim();
    Some(if reason.is_empty() {
        value.trim().to_string()
    } else {
        reason.to_string()
    })
}

fn policy_name(policy: u32) -> String {
    match policy {
        0 => "other".into(),
        1 => "fifo".into(),
        2 => "rr".into(),
        3 => "batch".into(),
        5 => "idle".into(),
        6 => "deadline".into(),
        n => format!("policy{n}"),
    }
}

/// A scheduling policy number and priority as text: `fifo 50`, `other`.
pub fn sched_text(policy: u32, prio: u32) -> String {
    if policy == 1 || policy == 2 {
        format!("{} {prio}", policy_name(policy))
    } else {
        policy_name(policy)
    }
}

/// True when a kernel version string (`uname -v`, /proc/sys/kernel/version
/// or /proc/version) names a PREEMPT_RT kernel.
pub fn is_preempt_rt(version: &str) -> bool {
    version.split_whitespace().any(|w| w == "PREEMPT_RT")
}

/// An interrupt as /proc/irq/N shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Irq {
    pub irq: u32,
    /// Handler names (the action directories in /proc/irq/N, else the
    /// /proc/interrupts row).
    pub actions: Vec<String>,
    /// The chip column of /proc/interrupts, when the row exists.
    pub chip: String,
    pub hwirq: Option<u32>,
    /// `smp_affinity_list`.
    pub affinity: Option<CpuSet>,
    /// `effective_affinity_list`, where the architecture has it.
    pub effective: Option<CpuSet>,
    /// The network interfaces that own this interrupt: those whose device
    /// lists it (a PCI function's `msi_irqs/N` or legacy `irq`, a virtio
    /// device's parent's), and those it is named after (an action that is
    /// the interface's name or starts with `<name>-`, as `can0` from
    /// mttcan's `open` or `eth0-TxRx-0`). Sorted, no duplicates.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<String>,
}

impl Irq {
    /// The actions joined as /proc/interrupts prints them.
    pub fn name(&self) -> String {
        self.actions.join(", ")
    }

    /// Interrupts that are per-CPU by construction and cannot move: the
    /// GIC's SGIs and PPIs (hardware numbers below 32: arch_timer, PMU,
    /// IPIs on arm64).
    pub fn is_per_cpu(&self) -> bool {
        self.chip.starts_with("GIC") && self.hwirq.is_some_and(|h| h < 32)
    }
}

/// A task (process or thread) as /proc shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Task {
    /// The thread id (equal to `pid` for a process's main thread).
    pub tid: u32,
    pub pid: u32,
    pub comm: String,
    pub kernel_thread: bool,
    /// The kernel pins this thread itself (`PF_NO_SETAFFINITY`).
    pub no_setaffinity: bool,
    pub policy: u32,
    pub rt_priority: u32,
    pub cpus_allowed: CpuSet,
    pub last_cpu: u32,
}

impl Task {
    /// The interrupt number of a threaded handler `irq/N-name`.
    pub fn irq_number(&self) -> Option<u32> {
        if !self.kernel_thread {
            return None;
        }
        let rest = self.comm.strip_prefix("irq/")?;
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        digits.parse().ok()
    }
}

/// Matches `text` against a shell-style glob: `*` any run, `?` one
/// character, `[abc]`, `[a-z]` and `[!a]` classes. No escapes: thread and
/// interrupt names hold none of these characters.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative matcher with one backtrack point for the last `*`.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() {
            match p[pi] {
                '*' => {
                    star = Some((pi, ti));
                    pi += 1;
                    continue;
                }
                '?' => {
                    pi += 1;
                    ti += 1;
                    continue;
                }
                '[' => {
                    if let Some((matched, next)) = class_match(&p, pi, t[ti]) {
                        if matched {
                            pi = next;
                            ti += 1;
                            continue;
                        }
                    } else if t[ti] == '[' {
                        pi += 1;
                        ti += 1;
                        continue;
                    }
                }
                c if c == t[ti] => {
                    pi += 1;
                    ti += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, st)) => {
                pi = sp + 1;
                ti = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Matches `c` against the class starting at `p[start] == '['`; returns
/// whether it matched and the index after `]`, or `None` if unclosed.
fn class_match(p: &[char], start: usize, c: char) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negate = matches!(p.get(i), Some('!') | Some('^'));
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    while i < p.len() {
        if p[i] == ']' && !first {
            return Some((matched != negate, i + 1));
        }
        first = false;
        if i + 2 < p.len() && p[i + 1] == '-' && p[i + 2] != ']' {
            if p[i] <= c && c <= p[i + 2] {
                matched = true;
            }
            i += 3;
        } else {
            if p[i] == c {
                matched = true;
            }
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const X86: &str = "           CPU0       CPU1       \n 24:          1          0  IO-APIC   5-edge      ACPI:Ged\n 36:          0       7031 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0\n 18:   9   0   IO-APIC  18-fasteoi   ehci_hcd:usb1, i801_smbus\nNMI:          0          0   Non-maskable interrupts\nLOC:      12886      13208   Local timer interrupts\nERR:          0\n";

    #[test]
    fn reads_partition_reasons() {
        assert_eq!(
            partition_invalid_reason(
                "isolated invalid (Invalid cpu list in cpuset.cpus.exclusive)"
            )
            .as_deref(),
            Some("Invalid cpu list in cpuset.cpus.exclusive")
        );
        assert_eq!(partition_invalid_reason("isolated"), None);
        assert_eq!(
            partition_invalid_reason("root invalid").as_deref(),
            Some("root invalid")
        );
    }

    #[test]
    fn parses_interrupts() {
        let i = Interrupts::parse(X86, Path::new("/proc/interrupts")).unwrap();
        assert_eq!(i.cpus, vec![0, 1]);
        let r = i.row("36").unwrap();
        assert_eq!(r.irq, Some(36));
        assert_eq!(r.counts, vec![0, 7031]);
        assert_eq!(r.chip(), "PCI-MSIX-0000:00:02.0");
        assert_eq!(r.hwirq(), Some(1));
        assert_eq!(r.actions(), vec!["virtio1-req.0"]);
        assert_eq!(
            i.row("18").unwrap().actions(),
            vec!["ehci_hcd:usb1", "i801_smbus"]
        );
        assert_eq!(i.row("LOC").unwrap().irq, None);
        assert_eq!(i.row("ERR").unwrap().counts, vec![0]);
        assert!(Interrupts::parse("", Path::new("/x")).is_err());
    }

    #[test]
    fn interrupt_deltas() {
        let a = Interrupts::parse(X86, Path::new("a")).unwrap();
        let b = Interrupts::parse(&X86.replace("7031", "7040"), Path::new("b")).unwrap();
        assert_eq!(a.deltas(&b), vec![("36".to_string(), 1, 9)]);
        assert!(a.deltas(&a).is_empty());
    }

    const STAT: &str = "50 (irq/24-ACPI:Ged) S 2 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 -51 0 1 0 31 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 0 0 0 17 0 50 1 0 0 0 0 0 0 0 0 0 0 0\n";

    #[test]
    fn parses_stat_and_rewrites_sched() {
        let s = TaskStat::parse(STAT, Path::new("/proc/50/stat")).unwrap();
        assert_eq!(s.pid, 50);
        assert_eq!(s.comm, "irq/24-ACPI:Ged");
        assert_eq!(s.ppid, 2);
        assert!(s.flags & PF_KTHREAD != 0);
        assert_eq!((s.processor, s.rt_priority, s.policy), (0, 50, 1));
        let odd = STAT.replace("(irq/24-ACPI:Ged)", "(a) b (c)");
        assert_eq!(
            TaskStat::parse(&odd, Path::new("x")).unwrap().comm,
            "a) b (c"
        );
        let changed = TaskStat::with_sched(STAT, 2, 80).unwrap();
        let s = TaskStat::parse(&changed, Path::new("x")).unwrap();
        assert_eq!((s.rt_priority, s.policy, s.processor), (80, 2, 0));
        assert!(TaskStat::parse("1 (x) S 0", Path::new("/proc/1/stat")).is_err());
    }

    #[test]
    fn parses_status_cpus() {
        let st = "Name:\tx\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\n";
        assert_eq!(
            parse_cpus_allowed(st, Path::new("s")).unwrap().to_string(),
            "0-1"
        );
        let one: CpuSet = "0".parse().unwrap();
        let re = status_with_cpus(st, &one);
        assert_eq!(parse_cpus_allowed(&re, Path::new("s")).unwrap(), one);
        assert!(re.contains("Cpus_allowed:\t1\n"));
        assert!(parse_cpus_allowed("Name: x\n", Path::new("s")).is_err());
    }

    #[test]
    fn parses_mounts_and_versions() {
        let m = parse_mounts("cgroup2 /sys/fs/cgroup/my\\040dir cgroup2 rw,nsdelegate 0 0\n");
        assert_eq!(m[0].target, "/sys/fs/cgroup/my dir");
        assert_eq!(m[0].options, vec!["rw", "nsdelegate"]);
        assert!(is_preempt_rt("#1 SMP PREEMPT_RT Debian 6.12.6-1"));
        assert!(!is_preempt_rt("#1 SMP PREEMPT_DYNAMIC @0"));
    }

    #[test]
    fn globs() {
        assert!(glob_match("irq/*-eth0*", "irq/45-eth0-rx"));
        assert!(!glob_match("irq/*-eth0*", "irq/45-eth1"));
        assert!(glob_match("irq/*", "irq/24-ACPI:Ged"));
        assert!(glob_match("ksoftirqd/?", "ksoftirqd/1"));
        assert!(!glob_match("ksoftirqd/?", "ksoftirqd/10"));
        assert!(glob_match("eth[01]", "eth1"));
        assert!(!glob_match("eth[!01]", "eth1"));
        assert!(glob_match("cpu[0-3]", "cpu2"));
        assert!(glob_match("*a*b*", "xxaybz"));
        assert!(!glob_match("*a*b", "xxaybz"));
        assert!(glob_match("", ""));
        assert!(glob_match("*", ""));
        assert!(glob_match("a[b", "a[b"));
    }

    #[test]
    fn per_cpu_interrupts() {
        let irq = |chip: &str, hw| Irq {
            irq: 11,
            actions: vec!["arch_timer".into()],
            chip: chip.into(),
            hwirq: Some(hw),
            affinity: None,
            effective: None,
            interfaces: Vec::new(),
        };
        assert!(irq("GICv3", 30).is_per_cpu());
        assert!(!irq("GICv3", 200).is_per_cpu());
        assert!(!irq("IO-APIC", 2).is_per_cpu());
    }
}
