//! The `board`, `cpus`, `kernel`, `irqs`, `sysctl` and `power` sections of
//! `robot.yaml`, and their validation.
//!
//! Every validator appends `(field path, message)` pairs; the caller maps a
//! path such as `irqs.threads[2].priority` back to its line and column.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use units::duration::{Dur, DurParseError};
use units::kernel::{needs, KernelVersion};

use crate::board::{self, Board};
use crate::model::glob_match;
use crate::power::{self, NvpmodelMode};
use units::cpu::CpuSet;

/// A validation problem: the field path and what is wrong with it.
pub type Problem = (String, String);

/// The most CPUs a board may have: every CPU number up to
/// [`units::cpu::MAX_CPU`], the largest a CPU list accepts.
pub const MAX_CPUS: u32 = units::cpu::MAX_CPU + 1;

/// `board:`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BoardSection {
    /// A model from [`board::BOARDS`].
    pub model: String,
    /// CPU count: required for `generic`, optional for the QEMU machines
    /// (`-smp`), refused for boards whose count is fixed.
    #[serde(default)]
    pub cpus: Option<u32>,
    /// The board's memory, where the model does not fix it (`generic`,
    /// the QEMU machines) or the module has more than the model's
    /// smallest: channels are held against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<units::size::ByteSize>,
}

impl BoardSection {
    /// The board's memory in bytes: `board.memory`, else the model's.
    pub fn memory(&self) -> Option<u64> {
        self.memory
            .map(|m| m.0)
            .or_else(|| self.board().and_then(|b| b.memory))
            .filter(|&m| m > 0)
    }

    /// The board's table entry, when the model is known.
    pub fn board(&self) -> Option<&'static Board> {
        board::find(&self.model)
    }

    /// The number of CPUs, when it is known and within 1 to [`MAX_CPUS`]
    /// (a count out of range is refused by [`Self::validate`], and never
    /// turned into a set of billions of CPUs).
    pub fn cpu_count(&self) -> Option<u32> {
        let n = match self.board() {
            Some(b) if b.takes_cpu_count() => self.cpus.or(b.cpus),
            Some(b) => b.cpus.or(self.cpus),
            None => None,
        };
        n.filter(|n| (1..=MAX_CPUS).contains(n))
    }

    /// Every CPU of the board.
    pub fn all_cpus(&self) -> Option<CpuSet> {
        self.cpu_count().map(CpuSet::first)
    }

    pub fn validate(&self, out: &mut Vec<Problem>) {
        match self.board() {
            None => out.push((
                "board.model".into(),
                format!(
                    "unknown board `{}` (expected one of: {})",
                    self.model,
                    board::model_names().join(", ")
                ),
            )),
            Some(b) if b.model == "generic" && self.cpus.is_none() => out.push((
                "board.model".into(),
                "board `generic` needs `cpus:` with the CPU count".into(),
            )),
            Some(b) if !b.takes_cpu_count() && self.cpus.is_some() => {
                out.push((
                    "board.cpus".into(),
                    format!(
                        "board `{}` has {} CPUs; remove `cpus:` (only `generic` and the `qemu-*` machines take it)",
                        b.model,
                        b.cpus.unwrap_or(0)
                    ),
                ))
            }
            Some(_) => {}
        }
        if let Some(n) = self.cpus {
            if !(1..=MAX_CPUS).contains(&n) {
                out.push((
                    "board.cpus".into(),
                    format!("{n} CPUs is out of range (expected 1 to {MAX_CPUS})"),
                ));
            }
        }
    }
}

/// `cpus:`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CpusSection {
    /// CPUs for the kernel, interrupts and everything not real-time.
    /// Default: every CPU that is not isolated.
    #[serde(default)]
    pub housekeeping: Option<CpuSet>,
    /// CPUs reserved for the real-time processes.
    pub isolated: CpuSet,
    /// Stop the scheduler tick on isolated CPUs (`nohz_full=`).
    #[serde(default = "yes")]
    pub nohz_full: bool,
    /// The cgroup v2 partition type for the isolated CPUs.
    #[serde(default)]
    pub partition: PartitionKind,
}

fn yes() -> bool {
    true
}

/// How the isolated CPUs are partitioned with cgroup v2 cpusets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PartitionKind {
    /// `cpuset.cpus.partition = isolated` (Linux 6.1+): no load balancing.
    #[default]
    Isolated,
    /// `cpuset.cpus.partition = root`: a scheduling domain of its own.
    Root,
    /// No partition; the kernel command line alone isolates.
    None,
}

impl CpusSection {
    /// The housekeeping CPUs: as written, or every board CPU not isolated.
    pub fn housekeeping(&self, all: &CpuSet) -> CpuSet {
        self.housekeeping
            .clone()
            .unwrap_or_else(|| all.difference(&self.isolated))
    }

    pub fn validate(&self, board: &BoardSection, out: &mut Vec<Problem>) {
        if self.isolated.contains(0) {
            out.push((
                "cpus.isolated".into(),
                format!(
                    "CPU 0 cannot be isolated: it takes interrupts that cannot move (expected a set without 0, got `{}`)",
                    self.isolated
                ),
            ));
        }
        if self.isolated.is_empty() {
            out.push((
                "cpus.isolated".into(),
                "no CPU is isolated (expected at least one CPU, like `1` or `4-5`)".into(),
            ));
        }
        if let Some(hk) = &self.housekeeping {
            if hk.is_empty() {
                out.push((
                    "cpus.housekeeping".into(),
                    "no housekeeping CPU (expected at least CPU 0)".into(),
                ));
            } else if !hk.contains(0) {
                out.push((
                    "cpus.housekeeping".into(),
                    format!("CPU 0 must be a housekeeping CPU (got `{hk}`)"),
                ));
            }
            let both = hk.intersection(&self.isolated);
            if !both.is_empty() {
                out.push((
                    "cpus.housekeeping".into(),
                    format!("CPUs {both} are both housekeeping and isolated (the two sets must be disjoint)"),
                ));
            }
        }
        if let Some(all) = board.all_cpus() {
            let check = |field: &str, set: &CpuSet, out: &mut Vec<Problem>| {
                let beyond = set.difference(&all);
                if !beyond.is_empty() {
                    out.push((
                        format!("cpus.{field}"),
                        format!(
                            "CPUs {beyond} do not exist on board `{}` (expected CPUs within {all})",
                            board.model
                        ),
                    ));
                }
            };
            check("isolated", &self.isolated, out);
            if let Some(hk) = &self.housekeeping {
                check("housekeeping", hk, out);
            }
        }
    }
}

/// `kernel:`
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KernelSection {
    /// The kernel the board runs, like `5.15` or `6.12.6`; what `config
    /// check` and `deploy plan` reason from. Omitted: known only on the
    /// board (the runtime probes it at start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The Jetson Linux (L4T) release the board is flashed with, like
    /// `36.4.3` or `R35.6.0`: the kernel it implies, and the release the
    /// flashing tools must match. The one place the L4T release is
    /// declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l4t: Option<String>,
    /// Extra command line tokens, appended after the planned ones.
    #[serde(default)]
    pub cmdline: Vec<String>,
}

/// Command line keys rtdeploy derives from `cpus:`; writing them by hand
/// would fight the plan.
pub const PLANNED_KEYS: &[&str] = &["isolcpus", "nohz_full", "rcu_nocbs", "irqaffinity", "nohz"];

/// A Jetson Linux (L4T) release, `R36.4.3` or `36.4`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct L4tRelease {
    pub major: u32,
    pub minor: u32,
    pub revision: u32,
}

/// The kernel series each L4T major release ships (its JetPack).
pub const L4T_KERNELS: &[(u32, KernelVersion, &str)] = &[
    (32, KernelVersion::new(4, 9, 0), "JetPack 4"),
    (
        34,
        KernelVersion::new(5, 10, 0),
        "JetPack 5 (developer preview)",
    ),
    (35, KernelVersion::new(5, 10, 0), "JetPack 5"),
    (36, KernelVersion::new(5, 15, 0), "JetPack 6"),
    (38, KernelVersion::new(6, 8, 0), "JetPack 7"),
];

/// Why a text is not an L4T release, or names one rtdeploy does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum L4tReleaseError {
    #[error("`{text}` is not an L4T release (expected like `36.4.3` or `R35.6.0`)")]
    NotARelease { text: String },
    #[error("L4T R{major} is not a release rtdeploy knows the kernel of (expected R{}; or give `kernel.version`)", L4T_KERNELS.iter().map(|k| k.0.to_string()).collect::<Vec<_>>().join(", R"))]
    Unknown { major: u32 },
}

impl L4tRelease {
    pub fn parse(text: &str) -> Result<L4tRelease, L4tReleaseError> {
        let t = text.trim();
        let bad = || L4tReleaseError::NotARelease {
            text: t.chars().take(40).collect(),
        };
        let digits = t.strip_prefix(['R', 'r']).unwrap_or(t);
        let mut parts = digits.split('.');
        let mut next = |required: bool| match parts.next() {
            Some(p) if !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse::<u32>().map_err(|_| bad())
            }
            None if !required => Ok(0),
            _ => Err(bad()),
        };
        let major = next(true)?;
        let minor = next(true)?;
        let revision = next(false)?;
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(L4tRelease {
            major,
            minor,
            revision,
        })
    }

    /// The kernel series the release ships, and its JetPack.
    pub fn kernel(self) -> Result<(KernelVersion, &'static str), L4tReleaseError> {
        L4T_KERNELS
            .iter()
            .find(|k| k.0 == self.major)
            .map(|k| (k.1, k.2))
            .ok_or(L4tReleaseError::Unknown { major: self.major })
    }
}

impl fmt::Display for L4tRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "R{}.{}.{}", self.major, self.minor, self.revision)
    }
}

/// The board's kernel as `robot.yaml` declares it, and where it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredKernel {
    pub version: KernelVersion,
    /// `kernel.version`, or `kernel.l4t` with the release and its JetPack.
    pub source: String,
}

impl KernelSection {
    /// The kernel the board runs, when `kernel.version` or `kernel.l4t`
    /// says (`version` wins; [`Self::validate`] refuses the two
    /// disagreeing).
    pub fn declared(&self) -> Option<DeclaredKernel> {
        if let Some(v) = self
            .version
            .as_deref()
            .and_then(|v| KernelVersion::parse(v).ok())
        {
            return Some(DeclaredKernel {
                version: v,
                source: "kernel.version".into(),
            });
        }
        let l4t = L4tRelease::parse(self.l4t.as_deref()?).ok()?;
        let (version, jetpack) = l4t.kernel().ok()?;
        Some(DeclaredKernel {
            version,
            source: format!("kernel.l4t {l4t}, {jetpack}"),
        })
    }

    /// The L4T release, when declared and valid.
    pub fn l4t_release(&self) -> Option<L4tRelease> {
        L4tRelease::parse(self.l4t.as_deref()?).ok()
    }

    pub fn validate(&self, out: &mut Vec<Problem>) {
        let version = self.version.as_deref().map(|v| {
            KernelVersion::parse(v).map_err(|e| out.push(("kernel.version".into(), e.to_string())))
        });
        let l4t = self.l4t.as_deref().map(|t| {
            L4tRelease::parse(t)
                .and_then(|r| r.kernel().map(|k| (r, k)))
                .map_err(|e| out.push(("kernel.l4t".into(), e.to_string())))
        });
        if let (Some(Ok(v)), Some(Ok((r, (k, jetpack))))) = (version, l4t) {
            if (v.major, v.minor) != (k.major, k.minor) {
                out.push((
                    "kernel.version".into(),
                    format!(
                        "kernel {}.{} disagrees with L4T {r} ({jetpack} ships {}.{}); give one of the two, or the kernel that release ships",
                        v.major, v.minor, k.major, k.minor
                    ),
                ));
            }
        }
        for (i, tok) in self.cmdline.iter().enumerate() {
            let path = format!("kernel.cmdline[{i}]");
            if tok.is_empty() || tok.chars().any(|c| c.is_whitespace() || c == '"') {
                out.push((
                    path,
                    format!("`{tok}` is not one command line token (expected key or key=value without spaces or quotes)"),
                ));
                continue;
            }
            let key = tok.split('=').next().unwrap_or(tok);
            if PLANNED_KEYS.contains(&key) {
                out.push((
                    path,
                    format!("`{key}=` is planned from `cpus:`; remove it here and set `cpus.isolated` instead"),
                ));
            }
        }
    }

    /// An L4T release on a board that does not run Jetson Linux, or one
    /// older than the board (every Jetson in the table is an Orin: L4T
    /// R34 brought them).
    pub fn validate_board(&self, board: &BoardSection, out: &mut Vec<Problem>) {
        let (Some(l4t), Some(b)) = (self.l4t_release(), board.board()) else {
            return;
        };
        if b.flash_config.is_none() {
            out.push((
                "kernel.l4t".into(),
                format!(
                    "board `{}` does not run Jetson Linux; remove `kernel.l4t` (give `kernel.version` instead)",
                    b.model
                ),
            ));
        } else if l4t.major < 34 {
            out.push((
                "kernel.l4t".into(),
                format!(
                    "board `{}` is a Jetson Orin, which L4T {l4t} does not support (expected R35 or later: JetPack 5, 6 or 7)",
                    b.model
                ),
            ));
        }
    }

    /// What the declared kernel cannot do of what `cpus:` asks: a
    /// partition of `rtdeploy/rt` (nested under `rtdeploy`) needs
    /// `cpuset.cpus.exclusive`, and an `isolated` one the partition type.
    pub fn validate_cpus(&self, cpus: &CpusSection, out: &mut Vec<Problem>) {
        let Some(k) = self.declared() else { return };
        let v = k.version;
        let show = units::kernel::needs::show;
        if cpus.partition == PartitionKind::Isolated && !v.at_least(needs::ISOLATED_PARTITION) {
            out.push((
                "cpus.partition".into(),
                format!(
                    "`isolated` partitions need Linux {} or later; the board runs {}.{} ({}); set `partition: none` (isolcpus= on the command line still isolates)",
                    show(needs::ISOLATED_PARTITION),
                    v.major,
                    v.minor,
                    k.source
                ),
            ));
        } else if cpus.partition != PartitionKind::None && !v.at_least(needs::CPUS_EXCLUSIVE) {
            out.push((
                "cpus.partition".into(),
                format!(
                    "the `{}` partition rtdeploy/rt is nested under rtdeploy, which needs cpuset.cpus.exclusive (Linux {} or later); the board runs {}.{} ({}); set `partition: none` (isolcpus= on the command line still isolates)",
                    match cpus.partition {
                        PartitionKind::Root => "root",
                        _ => "isolated",
                    },
                    show(needs::CPUS_EXCLUSIVE),
                    v.major,
                    v.minor,
                    k.source
                ),
            ));
        }
    }
}

/// A scheduling policy, as `robot.yaml` writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// SCHED_FIFO.
    Fifo,
    /// SCHED_RR.
    Rr,
    /// SCHED_OTHER.
    Other,
}

impl Policy {
    pub fn is_realtime(self) -> bool {
        !matches!(self, Policy::Other)
    }

    /// The scheduling policy this is.
    pub fn sched(self) -> units::sched::Policy {
        match self {
            Policy::Other => units::sched::Policy::Other,
            Policy::Fifo => units::sched::Policy::Fifo,
            Policy::Rr => units::sched::Policy::Rr,
        }
    }

    /// The kernel's number for this policy (`SCHED_*`).
    pub fn sched_number(self) -> u32 {
        self.sched().raw() as u32
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::Fifo => "fifo",
            Policy::Rr => "rr",
            Policy::Other => "other",
        })
    }
}

/// Checks a real-time priority against its policy.
pub fn validate_priority(
    path: &str,
    policy: Policy,
    priority: Option<u32>,
    out: &mut Vec<Problem>,
) {
    match (policy.is_realtime(), priority) {
        (true, None) => out.push((
            path.to_string(),
            format!("policy `{policy}` needs a priority (expected 1 to 99)"),
        )),
        (true, Some(p)) if !(1..=99).contains(&p) => out.push((
            path.to_string(),
            format!("priority {p} is out of range (expected 1 to 99)"),
        )),
        (false, Some(p)) if p != 0 => out.push((
            path.to_string(),
            format!("policy `other` takes no priority (got {p}; use `nice` or a real-time policy)"),
        )),
        _ => {}
    }
}

/// `irqs:`
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IrqsSection {
    /// Where interrupts go unless overridden. Default: the housekeeping CPUs.
    #[serde(default)]
    pub default_affinity: Option<CpuSet>,
    /// Per-interrupt placement, by number or by action-name glob.
    #[serde(default)]
    pub overrides: Vec<IrqOverride>,
    /// Threaded IRQ handlers (`irq/N-name`): policy, priority, CPUs.
    #[serde(default)]
    pub threads: Vec<ThreadRule>,
    /// Other kernel threads (`ktimers/*`, `rcuc/*`, `kworker/u*`, ...).
    #[serde(default)]
    pub kthreads: Vec<ThreadRule>,
    /// How often the supervisor looks for interrupts and IRQ threads that
    /// appeared since it applied the plan (a CAN interface brought up, a
    /// USB device plugged in, a driver loaded late) and places them;
    /// default 1s, `0s` never. While scanning is on, the kernel's device
    /// events (a device added or bound) and a network link going up also
    /// bring the next scan forward, to about 100 ms after the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescan: Option<Dur>,
}

impl IrqsSection {
    /// The scan period, or `None` when scanning is off.
    pub fn rescan_every(&self) -> Option<std::time::Duration> {
        match self.rescan {
            None => Some(std::time::Duration::from_secs(1)),
            Some(d) if d.is_zero() => None,
            Some(d) => Some(d.0),
        }
    }
}

/// One `irqs.overrides` entry: exactly one of `irq`, `name` and
/// `interface`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IrqOverride {
    #[serde(default)]
    pub irq: Option<u32>,
    /// A glob on the interrupt's action name in /proc/interrupts.
    #[serde(default)]
    pub name: Option<String>,
    /// A glob on the network interface that owns the interrupt (see
    /// [`crate::model::Irq::interfaces`]): `can0`, `eth*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    pub cpus: CpuSet,
}

impl IrqOverride {
    /// True when this override selects `irq`.
    pub fn selects(&self, irq: &crate::model::Irq) -> bool {
        match (&self.irq, &self.name, &self.interface) {
            (Some(n), _, _) => *n == irq.irq,
            (None, Some(g), _) => irq.actions.iter().any(|a| glob_match(g, a)),
            (None, None, Some(g)) => irq.interfaces.iter().any(|i| glob_match(g, i)),
            (None, None, None) => false,
        }
    }
}

/// A rule for kernel threads: those whose name matches a glob, the IRQ
/// threads of the interrupts a network interface owns, or both at once.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ThreadRule {
    /// A glob on the thread name (`comm`), like `irq/*-eth0*`.
    #[serde(rename = "match", default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// A glob on the network interface that owns the thread's interrupt
    /// (`irqs.threads` only): `can0`, `eth*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    pub policy: Policy,
    #[serde(default)]
    pub priority: Option<u32>,
    /// Where the threads may run. Default: leave their affinity alone.
    #[serde(default)]
    pub cpus: Option<CpuSet>,
    /// Processes that consume what these interrupts deliver; a real-time
    /// process running above its feeding IRQ threads on the same CPUs can
    /// starve them (checked as a warning).
    #[serde(default)]
    pub feeds: Vec<String>,
}

impl ThreadRule {
    /// The selectors as the plan and its reasons name the rule:
    /// `` `irq/*-can0` ``, `` interface `can0` `` or both.
    pub fn describe(&self) -> String {
        match (&self.pattern, &self.interface) {
            (Some(p), Some(i)) => format!("`{p}` on interface `{i}`"),
            (Some(p), None) => format!("`{p}`"),
            (None, Some(i)) => format!("interface `{i}`"),
            (None, None) => "(no selector)".into(),
        }
    }

    /// True when the rule selects a thread known by `names` (its `comm`
    /// and, for an IRQ thread, `irq/N-<action>`), whose interrupt (if any)
    /// is `irq`. Every selector given must hold.
    pub fn selects(&self, names: &[String], irq: Option<&crate::model::Irq>) -> bool {
        if self.pattern.is_none() && self.interface.is_none() {
            return false;
        }
        let by_name = self
            .pattern
            .as_ref()
            .is_none_or(|p| names.iter().any(|n| glob_match(p, n)));
        let by_interface = self
            .interface
            .as_ref()
            .is_none_or(|g| irq.is_some_and(|irq| irq.interfaces.iter().any(|i| glob_match(g, i))));
        by_name && by_interface
    }
}

/// Checks a glob as the thread and IRQ rules use it: `*`, `?` and `[...]`.
pub fn validate_glob(path: &str, glob: &str, out: &mut Vec<Problem>) {
    if glob.is_empty() {
        out.push((
            path.to_string(),
            "empty pattern (expected a glob like `irq/*-eth0*`)".into(),
        ));
        return;
    }
    let mut depth = 0;
    for c in glob.chars() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => {}
            ']' if depth == 1 => depth = 0,
            _ => {}
        }
    }
    if depth != 0 {
        out.push((
            path.to_string(),
            format!("pattern `{glob}` has an unclosed `[` (expected a glob like `irq/*-eth[01]`)"),
        ));
    }
}

impl IrqsSection {
    pub fn validate(&self, all: Option<&CpuSet>, out: &mut Vec<Problem>) {
        let within = |path: String, set: &CpuSet, out: &mut Vec<Problem>| {
            if set.is_empty() {
                out.push((path, "empty CPU set (expected at least one CPU)".into()));
            } else if let Some(all) = all {
                let beyond = set.difference(all);
                if !beyond.is_empty() {
                    out.push((
                        path,
                        format!("CPUs {beyond} do not exist (expected CPUs within {all})"),
                    ));
                }
            }
        };
        if let Some(set) = &self.default_affinity {
            within("irqs.default_affinity".into(), set, out);
        }
        for (i, o) in self.overrides.iter().enumerate() {
            let base = format!("irqs.overrides[{i}]");
            match (&o.irq, &o.name, &o.interface) {
                (Some(_), None, None) => {}
                (None, Some(glob), None) => validate_glob(&format!("{base}.name"), glob, out),
                (None, None, Some(glob)) => {
                    validate_glob(&format!("{base}.interface"), glob, out)
                }
                _ => out.push((
                    base.clone(),
                    "give exactly one of `irq` (a number), `name` (a glob on the action) and `interface` (a glob on the network interface)".into(),
                )),
            }
            within(format!("{base}.cpus"), &o.cpus, out);
        }
        for (field, rules) in [("threads", &self.threads), ("kthreads", &self.kthreads)] {
            for (i, r) in rules.iter().enumerate() {
                let base = format!("irqs.{field}[{i}]");
                match (&r.pattern, &r.interface) {
                    (None, None) => out.push((
                        base.clone(),
                        "give `match` (a glob on the thread name), `interface` (a glob on the network interface that owns its interrupt), or both".into(),
                    )),
                    (Some(p), i) => {
                        validate_glob(&format!("{base}.match"), p, out);
                        if let Some(i) = i {
                            validate_glob(&format!("{base}.interface"), i, out);
                        }
                    }
                    (None, Some(i)) => validate_glob(&format!("{base}.interface"), i, out),
                }
                if field == "kthreads" && r.interface.is_some() {
                    out.push((
                        format!("{base}.interface"),
                        "only IRQ threads have an interface (move the rule to `irqs.threads`)"
                            .into(),
                    ));
                }
                validate_priority(&format!("{base}.priority"), r.policy, r.priority, out);
                if let Some(set) = &r.cpus {
                    within(format!("{base}.cpus"), set, out);
                }
            }
        }
    }
}

/// A sysctl value: a number or a string, written as the kernel reads it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum SysctlValue {
    Int(i64),
    Text(String),
}

impl fmt::Display for SysctlValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SysctlValue::Int(v) => write!(f, "{v}"),
            SysctlValue::Text(s) => f.write_str(s),
        }
    }
}

/// `sysctl:` — `kernel.sched_rt_runtime_us: -1` and friends, added to (and
/// overriding) the planned ones.
pub type SysctlSection = BTreeMap<String, SysctlValue>;

pub fn validate_sysctl(sysctl: &SysctlSection, out: &mut Vec<Problem>) {
    for key in sysctl.keys() {
        let ok = !key.is_empty()
            && key.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            })
            && key.contains('.');
        if !ok {
            out.push((
                format!("sysctl.{key}"),
                format!("`{key}` is not a sysctl name (expected dotted words like `kernel.timer_migration`)"),
            ));
        }
    }
}

/// cpufreq governors the kernel ships.
pub const GOVERNORS: &[&str] = &[
    "performance",
    "schedutil",
    "ondemand",
    "conservative",
    "powersave",
    "userspace",
];

/// `power:`
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PowerSection {
    /// cpufreq governor for every CPU.
    #[serde(default)]
    pub governor: Option<String>,
    /// Pin `scaling_min_freq` to `scaling_max_freq` on the isolated CPUs.
    #[serde(default)]
    pub lock_frequency: bool,
    /// The value the supervisor holds in /dev/cpu_dma_latency (`0us` keeps
    /// CPUs out of deep idle states).
    #[serde(default)]
    pub cpu_dma_latency: Option<Micros>,
    /// The Jetson power mode (`nvpmodel -m`) to run in, by name (`15W`,
    /// `MAXN`) or id: it decides which CPUs are online and how fast they
    /// run. `apply` sets it and pins the CPU clocks to its maximum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvpmodel: Option<NvpmodelMode>,
    /// Which of NVIDIA's nvpmodel configuration files the module uses
    /// (`p3767_0003_super` for `nvpmodel_p3767_0003_super.conf`), for
    /// boards whose modules or releases define the mode differently.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvpmodel_conf: Option<String>,
}

impl PowerSection {
    /// The nvpmodel mode `power.nvpmodel` names on this board, `None` when
    /// it names none.
    pub fn nvpmodel_mode(
        &self,
        board: &BoardSection,
    ) -> Result<Option<power::Resolved>, power::ModeResolveError> {
        let (Some(mode), Some(b)) = (&self.nvpmodel, board.board()) else {
            return Ok(None);
        };
        power::resolve(b, self.nvpmodel_conf.as_deref(), mode).map(Some)
    }

    /// The nvpmodel mode against the board and the CPUs the robot uses
    /// (`uses`: each CPU set with the field it comes from): a mode of the
    /// board's modules, and one that keeps every CPU in use online.
    pub fn validate_board(
        &self,
        board: &BoardSection,
        uses: &[(String, CpuSet)],
        out: &mut Vec<Problem>,
    ) {
        match self.nvpmodel_mode(board) {
            Ok(None) => {}
            Ok(Some(r)) => {
                if let Some(why) = power::offline_in_use(&r, uses) {
                    out.push(("power.nvpmodel".into(), why));
                }
            }
            Err(e @ power::ModeResolveError::UnknownConf { .. }) => {
                out.push(("power.nvpmodel_conf".into(), e.to_string()))
            }
            Err(e) => out.push(("power.nvpmodel".into(), e.to_string())),
        }
    }

    pub fn validate(&self, out: &mut Vec<Problem>) {
        if let Some(NvpmodelMode::Name(n)) = &self.nvpmodel {
            if n.trim().is_empty() || n.trim().chars().any(char::is_whitespace) {
                out.push((
                    "power.nvpmodel".into(),
                    format!("`{n}` is not an nvpmodel mode (expected a name like `15W` or `MAXN`, or an id like `2`)"),
                ));
            }
        }
        if self.nvpmodel_conf.is_some() && self.nvpmodel.is_none() {
            out.push((
                "power.nvpmodel_conf".into(),
                "names an nvpmodel configuration but `power.nvpmodel` names no mode (add `nvpmodel: <mode>` or remove this)".into(),
            ));
        }
        if let Some(g) = &self.governor {
            if !GOVERNORS.contains(&g.as_str()) {
                out.push((
                    "power.governor".into(),
                    format!(
                        "unknown governor `{g}` (expected one of: {})",
                        GOVERNORS.join(", ")
                    ),
                ));
            }
        }
    }
}

/// A latency in whole microseconds that fits in 32 bits, written as a
/// [`Dur`] (`0us`, `10us`, `1ms`) or a bare number of microseconds; what
/// /dev/cpu_dma_latency takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(into = "String")]
pub struct Micros(pub u32);

impl Micros {
    /// Parses a latency written as a duration: [`Dur::parse`], then
    /// whole microseconds within 32 bits.
    pub fn parse(text: &str) -> Result<Self, MicrosParseError> {
        let text = text.trim();
        let d = Dur::parse(text).map_err(|source| MicrosParseError::NotALatency {
            text: text.into(),
            source,
        })?;
        let ns = d.0.as_nanos();
        if ns % 1000 != 0 {
            return Err(MicrosParseError::NotWhole { text: text.into() });
        }
        u32::try_from(ns / 1000)
            .map(Micros)
            .map_err(|_| MicrosParseError::TooLarge { text: text.into() })
    }
}

/// Why a text or number is not a [`Micros`].
#[derive(Debug, thiserror::Error)]
pub enum MicrosParseError {
    #[error("`{text}` is not a latency (expected whole microseconds like `0us` or `1ms`)")]
    NotALatency {
        text: String,
        #[source]
        source: DurParseError,
    },
    #[error("`{text}` is not a whole number of microseconds (expected like `20us` or `1ms`)")]
    NotWhole { text: String },
    #[error("`{text}` is too large (expected at most {}us)", u32::MAX)]
    TooLarge { text: String },
    #[error("latency {value} is negative (expected 0us or more)")]
    Negative { value: i64 },
}

impl From<Micros> for String {
    fn from(m: Micros) -> String {
        format!("{}us", m.0)
    }
}

impl<'de> Deserialize<'de> for Micros {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Micros;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a latency in whole microseconds, like `0us`, `20us` or `1ms`")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Micros, E> {
                u32::try_from(v).map(Micros).map_err(|_| {
                    E::custom(MicrosParseError::TooLarge {
                        text: format!("{v}us"),
                    })
                })
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Micros, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(MicrosParseError::Negative { value: v })),
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Micros, E> {
                Micros::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(cpus: u32) -> BoardSection {
        BoardSection {
            model: "generic".into(),
            cpus: Some(cpus),
            memory: None,
        }
    }

    #[test]
    fn latencies_are_whole_microseconds_within_32_bits() {
        for (text, us) in [("0us", 0), ("20us", 20), ("1ms", 1000), ("1.5ms", 1500)] {
            assert_eq!(Micros::parse(text).unwrap(), Micros(us), "{text}");
        }
        for (text, why) in [
            ("fast", "is not a latency (expected whole microseconds"),
            ("20", "is not a latency"),
            ("1500ns", "is not a whole number of microseconds"),
            ("2h", "is too large (expected at most 4294967295us)"),
        ] {
            let e = Micros::parse(text).unwrap_err().to_string();
            assert!(e.starts_with(&format!("`{text}` ")), "{text}: {e}");
            assert!(e.contains(why), "{text}: {e}");
        }
        let m: Micros = serde_json::from_str("20").unwrap();
        assert_eq!(m, Micros(20));
        let e = serde_json::from_str::<Micros>("-1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("latency -1 is negative"), "{e}");
        assert_eq!(serde_json::to_string(&Micros(7)).unwrap(), "\"7us\"");
    }

    #[test]
    fn cpu_counts_out_of_range_are_refused_and_build_no_set() {
        for n in [0, MAX_CPUS + 1, u32::MAX] {
            let board = generic(n);
            // No set of n CPUs is built (u32::MAX would be 4 billion
            // inserts and 512 MiB).
            assert_eq!(board.cpu_count(), None, "{n} CPUs");
            assert!(board.all_cpus().is_none(), "{n} CPUs");
            let mut out = Vec::new();
            board.validate(&mut out);
            assert_eq!(out.len(), 1, "{n} CPUs: {out:?}");
            assert_eq!(out[0].0, "board.cpus");
            assert!(
                out[0]
                    .1
                    .contains(&format!("{n} CPUs is out of range (expected 1 to 1024)")),
                "{}",
                out[0].1
            );
        }
        let board = generic(MAX_CPUS);
        assert_eq!(board.all_cpus().map(|s| s.len()), Some(1024));
        let mut out = Vec::new();
        board.validate(&mut out);
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn l4t_releases_and_the_kernels_they_ship() {
        for (text, want, kernel) in [
            ("36.4.3", (36, 4, 3), (5, 15)),
            ("R36.4", (36, 4, 0), (5, 15)),
            ("r35.6.0", (35, 6, 0), (5, 10)),
            ("R38.2.1", (38, 2, 1), (6, 8)),
        ] {
            let r = L4tRelease::parse(text).unwrap();
            assert_eq!((r.major, r.minor, r.revision), want, "{text}");
            let (k, _) = r.kernel().unwrap();
            assert_eq!((k.major, k.minor), kernel, "{text}");
        }
        for bad in [
            "",
            "36",
            "R",
            "R36.",
            "36.4.3.1",
            "JetPack 6",
            "36.x",
            "123456.1",
        ] {
            assert!(L4tRelease::parse(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(
            L4tRelease::parse("33.1").unwrap().kernel().unwrap_err(),
            L4tReleaseError::Unknown { major: 33 }
        );
    }

    #[test]
    fn the_declared_kernel_prefers_the_version_and_says_where_it_came_from() {
        let k = KernelSection {
            l4t: Some("36.4.3".into()),
            ..KernelSection::default()
        };
        let d = k.declared().unwrap();
        assert_eq!(d.version, KernelVersion::new(5, 15, 0));
        assert_eq!(d.source, "kernel.l4t R36.4.3, JetPack 6");
        let k = KernelSection {
            version: Some("5.15.148-tegra".into()),
            ..k
        };
        assert_eq!(
            k.declared().unwrap().version,
            KernelVersion::new(5, 15, 148)
        );
        let mut out = Vec::new();
        k.validate(&mut out);
        assert!(out.is_empty(), "{out:?}");
        assert!(KernelSection::default().declared().is_none());
    }
}
