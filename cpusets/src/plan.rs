//! The runtime plan: everything `apply` writes and `verify` checks, decided
//! from the robot.yaml sections and the interrupts and threads the live
//! system has. Pure: no I/O here.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::cmdline::{self, Token};
use crate::config::{
    BoardSection, CpusSection, IrqsSection, KernelSection, PartitionKind, Policy, PowerSection,
    SysctlSection, ThreadRule,
};
use crate::model::{glob_match, Irq, Task};
use crate::power::ModeResolveError;
use units::cpu::CpuSet;

/// The robot.yaml sections this crate plans from.
#[derive(Debug, Clone, Copy)]
pub struct Isolation<'a> {
    pub board: &'a BoardSection,
    pub cpus: &'a CpusSection,
    pub kernel: &'a KernelSection,
    pub irqs: &'a IrqsSection,
    pub sysctl: &'a SysctlSection,
    pub power: &'a PowerSection,
}

/// The interrupts and threads the plan places. Empty for a plan made away
/// from the robot (`deploy plan` on the build host): the rules are then
/// listed but resolve to nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Inventory<'a> {
    pub irqs: &'a [Irq],
    pub tasks: &'a [Task],
}

impl crate::model::live::Live {
    /// The interrupts and threads read from the live system, for [`plan`].
    pub fn inventory(&self) -> Inventory<'_> {
        Inventory {
            irqs: &self.irqs,
            tasks: &self.tasks,
        }
    }
}

/// Why no plan could be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanBuildError {
    #[error("board `{0}` has no known CPU count (set board.cpus)")]
    UnknownCpuCount(String),
    #[error("power.nvpmodel: {0}")]
    PowerMode(#[from] ModeResolveError),
}

/// The CPU partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuMap {
    pub all: CpuSet,
    pub housekeeping: CpuSet,
    pub isolated: CpuSet,
}

/// Where one interrupt goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IrqPlacement {
    pub irq: u32,
    pub name: String,
    pub cpus: CpuSet,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ThreadKind {
    /// A threaded interrupt handler, `irq/N-name`.
    Irq,
    /// Any other kernel thread.
    Kthread,
}

/// What one kernel thread gets. `None` fields are left alone.
///
/// The kernel points an IRQ thread at its interrupt's effective CPUs
/// whenever that interrupt's affinity changes; `apply` therefore writes
/// interrupts before threads, and a rule's CPUs hold until the interrupt
/// is next moved (a later `apply` moves nothing that is already in place).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadPlacement {
    pub pid: u32,
    pub comm: String,
    pub kind: ThreadKind,
    pub policy: Option<Policy>,
    pub priority: Option<u32>,
    pub cpus: Option<CpuSet>,
    pub reason: String,
}

/// Where a sysctl value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// rtdeploy's default for real-time work.
    Planned,
    /// The `sysctl:` section of robot.yaml.
    RobotYaml,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SysctlSetting {
    pub key: String,
    pub value: String,
    pub source: Source,
    pub reason: String,
}

impl SysctlSetting {
    /// The file under /proc/sys: `kernel.timer_migration` ->
    /// `/proc/sys/kernel/timer_migration`.
    pub fn path(&self) -> String {
        format!("/proc/sys/{}", self.key.replace('.', "/"))
    }
}

/// The cgroup cpusets for real-time and housekeeping work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupPlan {
    /// `rtdeploy/rt`: the isolated CPUs.
    pub rt: CpuSet,
    /// `rtdeploy/housekeeping`.
    pub housekeeping: CpuSet,
    /// The partition type of `rtdeploy/rt` under cgroup v2.
    pub partition: PartitionKind,
}

impl CgroupPlan {
    /// What `cpuset.cpus.partition` should read for `rtdeploy/rt`.
    pub fn partition_value(&self) -> Option<&'static str> {
        match self.partition {
            PartitionKind::Isolated => Some("isolated"),
            PartitionKind::Root => Some("root"),
            PartitionKind::None => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpufreqPlan {
    /// The governor for every CPU, when robot.yaml names one.
    pub governor: Option<String>,
    /// CPUs whose clock is pinned: `scaling_min_freq` raised to the
    /// maximum [`Self::lock_to`] says.
    pub lock_cpus: CpuSet,
    pub lock_to: FreqLock,
}

/// The frequency a pinned CPU runs at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "to", rename_all = "kebab-case")]
pub enum FreqLock {
    /// `scaling_max_freq` as it is (`power.lock_frequency`).
    CurrentMax,
    /// The nvpmodel mode's cap: `scaling_max_freq` and `scaling_min_freq`
    /// both set to it, as jetson_clocks does for the CPUs.
    Khz { khz: u32 },
    /// An nvpmodel mode that does not cap the CPUs: both set to the CPU's
    /// own maximum, `cpuinfo_max_freq`.
    HardwareMax,
}

/// The CPUs' power: which must be online, and the nvpmodel mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PowerPlan {
    /// The CPUs the plan puts work on: the isolated CPUs and those that
    /// IRQ-thread and kernel-thread rules, IRQ overrides and
    /// `irqs.default_affinity` name. All must be online.
    pub cpus_in_use: CpuSet,
    /// The mode `power.nvpmodel` names.
    pub nvpmodel: Option<NvpmodelPlan>,
}

/// An nvpmodel mode, as NVIDIA's configuration file defines it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvpmodelPlan {
    /// `nvpmodel_p3767_0000_super.conf`.
    pub conf: String,
    /// The Jetson Linux release the table was read from.
    pub release: String,
    pub id: u32,
    pub name: String,
    /// The CPUs it keeps online.
    pub online: CpuSet,
    /// Its CPU clock cap in kHz; `None`: the CPUs' own maximum.
    pub cpu_max_khz: Option<u32>,
}

impl NvpmodelPlan {
    /// `1 7W`.
    pub fn label(&self) -> String {
        format!("{} {}", self.id, self.name)
    }
}

/// Everything `apply` writes and `verify` checks.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RuntimePlan {
    pub cpus: CpuMap,
    /// The kernel command line (written by `deploy image`/`flash`; `verify`
    /// checks it in /proc/cmdline).
    pub cmdline: Vec<Token>,
    /// /proc/irq/default_smp_affinity: where new interrupts start.
    pub irq_default: CpuSet,
    pub irqs: Vec<IrqPlacement>,
    /// The `irqs.threads` and `irqs.kthreads` rules as written.
    pub thread_rules: Vec<ThreadRule>,
    pub threads: Vec<ThreadPlacement>,
    pub sysctls: Vec<SysctlSetting>,
    /// /sys/devices/virtual/workqueue/cpumask: unbound workqueue workers.
    pub workqueue_cpumask: CpuSet,
    pub cgroups: CgroupPlan,
    pub cpufreq: CpufreqPlan,
    pub power: PowerPlan,
    /// The value the supervisor holds open in /dev/cpu_dma_latency.
    pub cpu_dma_latency_us: Option<u32>,
    /// Rules that matched nothing, and similar notes.
    pub warnings: Vec<String>,
}

/// The sysctls planned for every robot, with the reason for each.
/// `kernel.hung_task_timeout_secs` is deliberately not among them: the
/// detector only warns, and a warning that a housekeeping task starved for
/// two minutes is worth having on a robot.
pub const DEFAULT_SYSCTLS: &[(&str, &str, &str)] = &[
    (
        "kernel.sched_rt_runtime_us",
        "-1",
        "no real-time throttling: a busy real-time loop is never paused for the last 50 ms of each second",
    ),
    (
        "kernel.timer_migration",
        "0",
        "timers stay on the CPU that armed them instead of migrating between CPUs",
    ),
    (
        "vm.stat_interval",
        "10",
        "fold per-CPU VM statistics every 10 s instead of every second: one periodic wakeup less on every CPU",
    ),
];

/// The sysctls to set: the planned defaults ([`DEFAULT_SYSCTLS`]), then
/// robot.yaml's `sysctl:` (overriding a default in its place), each with
/// its reason.
pub fn plan_sysctls(section: &SysctlSection) -> Vec<SysctlSetting> {
    let mut sysctls: Vec<SysctlSetting> = DEFAULT_SYSCTLS
        .iter()
        .map(|(k, v, why)| SysctlSetting {
            key: k.to_string(),
            value: v.to_string(),
            source: Source::Planned,
            reason: why.to_string(),
        })
        .collect();
    for (key, value) in section {
        let setting = SysctlSetting {
            key: key.clone(),
            value: value.to_string(),
            source: Source::RobotYaml,
            reason: "from sysctl in robot.yaml".into(),
        };
        match sysctls.iter_mut().find(|s| &s.key == key) {
            Some(s) => *s = setting,
            None => sysctls.push(setting),
        }
    }
    sysctls
}

/// Per-CPU kernel threads that exist on every CPU by design, run only
/// when their CPU asks for them, and cannot move.
pub const PER_CPU_KTHREADS: &[&str] = &[
    "ksoftirqd/*",
    "cpuhp/*",
    "migration/*",
    "ktimers/*",
    "rcuc/*",
    "rcuop/*",
    "rcuog/*",
    "rcuos/*",
    "kworker/[0-9]*:*",
    "kworker/R-*",
    "idle_inject/*",
    "watchdog/*",
    "irq_work/*",
    "posixcputmr/*",
    "backlog_napi/*",
];

/// True for a kernel thread that is bound to one CPU by design: one the
/// kernel pins to a single CPU, or one of [`PER_CPU_KTHREADS`] on one CPU.
pub fn is_per_cpu_kthread(task: &Task) -> bool {
    task.kernel_thread
        && task.cpus_allowed.len() <= 1
        && (task.no_setaffinity || PER_CPU_KTHREADS.iter().any(|g| glob_match(g, &task.comm)))
}

/// Makes the runtime plan.
pub fn plan(iso: &Isolation, inv: &Inventory) -> Result<RuntimePlan, PlanBuildError> {
    let all = iso
        .board
        .all_cpus()
        .ok_or_else(|| PlanBuildError::UnknownCpuCount(iso.board.model.clone()))?;
    let isolated = iso.cpus.isolated.clone();
    let housekeeping = iso.cpus.housekeeping(&all);
    let irq_default = iso
        .irqs
        .default_affinity
        .clone()
        .unwrap_or_else(|| housekeeping.clone());
    let mut warnings = Vec::new();

    // Interrupts: the default, then overrides in file order (a later
    // override wins).
    let mut irqs = Vec::new();
    for irq in inv.irqs {
        let name = irq.name();
        let mut placement = IrqPlacement {
            irq: irq.irq,
            name: name.clone(),
            cpus: irq_default.clone(),
            reason: if iso.irqs.default_affinity.is_some() {
                "irqs.default_affinity".to_string()
            } else {
                "default: the housekeeping CPUs".to_string()
            },
        };
        for (i, o) in iso.irqs.overrides.iter().enumerate() {
            if o.selects(irq) {
                placement.cpus = o.cpus.clone();
                placement.reason = format!("irqs.overrides[{i}]");
            }
        }
        irqs.push(placement);
    }
    if !inv.irqs.is_empty() {
        for (i, o) in iso.irqs.overrides.iter().enumerate() {
            let used = inv.irqs.iter().any(|irq| o.selects(irq));
            if !used {
                warnings.push(format!("irqs.overrides[{i}] matches no interrupt"));
            }
        }
    }

    // Kernel threads.
    let irq_cpus: BTreeMap<u32, &CpuSet> = irqs.iter().map(|p| (p.irq, &p.cpus)).collect();
    let mut threads = Vec::new();
    let mut used = vec![false; iso.irqs.threads.len() + iso.irqs.kthreads.len()];
    for task in inv
        .tasks
        .iter()
        .filter(|t| t.kernel_thread && t.pid == t.tid)
    {
        let (kind, rules, offset) = match task.irq_number() {
            Some(_) => (ThreadKind::Irq, &iso.irqs.threads, 0),
            None => (
                ThreadKind::Kthread,
                &iso.irqs.kthreads,
                iso.irqs.threads.len(),
            ),
        };
        // `comm` is cut at 15 characters (`irq/201-3210000`), so an IRQ
        // thread is also matched by its full name, `irq/N-<action>`.
        let mut names = vec![task.comm.clone()];
        let irq = task
            .irq_number()
            .and_then(|n| inv.irqs.iter().find(|i| i.irq == n));
        if let Some(irq) = irq {
            let n = irq.irq;
            names.extend(irq.actions.iter().map(|a| format!("irq/{n}-{a}")));
        }
        // The last matching rule wins, as with overrides.
        let rule = rules
            .iter()
            .enumerate()
            .rfind(|(_, r)| r.selects(&names, irq));
        if let Some((i, _)) = rule {
            used[offset + i] = true;
        }
        let field = if kind == ThreadKind::Irq {
            "threads"
        } else {
            "kthreads"
        };
        let placement = match (kind, rule) {
            (_, Some((i, r))) => {
                let cpus = r.cpus.clone().or_else(|| match kind {
                    ThreadKind::Irq => task
                        .irq_number()
                        .and_then(|n| irq_cpus.get(&n))
                        .map(|c| (*c).clone()),
                    ThreadKind::Kthread => None,
                });
                Some(ThreadPlacement {
                    pid: task.pid,
                    comm: task.comm.clone(),
                    kind,
                    policy: Some(r.policy),
                    priority: Some(r.priority.unwrap_or(0)),
                    cpus,
                    reason: format!("irqs.{field}[{i}] {}", r.describe()),
                })
            }
            (ThreadKind::Irq, None) => {
                task.irq_number()
                    .and_then(|n| irq_cpus.get(&n))
                    .map(|c| ThreadPlacement {
                        pid: task.pid,
                        comm: task.comm.clone(),
                        kind,
                        policy: None,
                        priority: None,
                        cpus: Some((*c).clone()),
                        reason: "follows its interrupt's CPUs".into(),
                    })
            }
            (ThreadKind::Kthread, None) => {
                // Unbound kernel threads leave the isolated CPUs; threads
                // bound to one CPU by design stay.
                (!is_per_cpu_kthread(task)
                    && !task.no_setaffinity
                    && task.cpus_allowed.len() > 1
                    && !task.cpus_allowed.is_disjoint(&isolated))
                .then(|| ThreadPlacement {
                    pid: task.pid,
                    comm: task.comm.clone(),
                    kind,
                    policy: None,
                    priority: None,
                    cpus: Some(housekeeping.clone()),
                    reason: "unbound kernel thread: housekeeping CPUs".into(),
                })
            }
        };
        threads.extend(placement);
    }
    if !inv.tasks.is_empty() {
        let all_rules = iso
            .irqs
            .threads
            .iter()
            .map(|r| ("threads", r))
            .chain(iso.irqs.kthreads.iter().map(|r| ("kthreads", r)));
        for (n, (field, r)) in all_rules.enumerate() {
            if !used[n] {
                let i = if field == "threads" {
                    n
                } else {
                    n - iso.irqs.threads.len()
                };
                warnings.push(format!(
                    "irqs.{field}[{i}] {} matches no kernel thread",
                    r.describe()
                ));
            }
        }
    }

    let sysctls = plan_sysctls(iso.sysctl);

    let nvpmodel = iso.power.nvpmodel_mode(iso.board)?.map(|r| NvpmodelPlan {
        conf: r.conf.file_name(),
        release: r.conf.release.into(),
        id: r.mode.id,
        name: r.mode.name.into(),
        online: r.mode.online_cpus(),
        cpu_max_khz: r.mode.cpu_max_khz,
    });
    let cpus_in_use = iso
        .irqs
        .threads
        .iter()
        .chain(&iso.irqs.kthreads)
        .filter_map(|r| r.cpus.as_ref())
        .chain(iso.irqs.overrides.iter().map(|o| &o.cpus))
        .chain(&iso.irqs.default_affinity)
        .fold(isolated.clone(), |acc, set| acc.union(set));
    let cpufreq = match &nvpmodel {
        // As jetson_clocks does for the CPUs: every CPU the mode keeps
        // online at the mode's cap.
        Some(m) => {
            let off = cpus_in_use.difference(&m.online);
            if !off.is_empty() {
                warnings.push(format!(
                    "nvpmodel mode {} keeps CPUs {} online: CPUs {off} the plan uses would be offline",
                    m.label(),
                    m.online
                ));
            }
            CpufreqPlan {
                governor: iso.power.governor.clone(),
                lock_cpus: m.online.intersection(&all),
                lock_to: match m.cpu_max_khz {
                    Some(khz) => FreqLock::Khz { khz },
                    None => FreqLock::HardwareMax,
                },
            }
        }
        None => CpufreqPlan {
            governor: iso.power.governor.clone(),
            lock_cpus: if iso.power.lock_frequency {
                isolated.clone()
            } else {
                CpuSet::new()
            },
            lock_to: FreqLock::CurrentMax,
        },
    };

    Ok(RuntimePlan {
        cmdline: cmdline::plan(iso.cpus, iso.kernel, &all),
        irq_default,
        irqs,
        thread_rules: iso
            .irqs
            .threads
            .iter()
            .chain(&iso.irqs.kthreads)
            .cloned()
            .collect(),
        threads,
        sysctls,
        workqueue_cpumask: housekeeping.clone(),
        cgroups: CgroupPlan {
            rt: isolated.clone(),
            housekeeping: housekeeping.clone(),
            partition: iso.cpus.partition,
        },
        cpufreq,
        power: PowerPlan {
            cpus_in_use,
            nvpmodel,
        },
        cpu_dma_latency_us: iso.power.cpu_dma_latency.map(|m| m.0),
        cpus: CpuMap {
            all,
            housekeeping,
            isolated,
        },
        warnings,
    })
}

impl fmt::Display for RuntimePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.cpus;
        writeln!(
            f,
            "CPUs: all {}  housekeeping {}  isolated {}",
            c.all, c.housekeeping, c.isolated
        )?;
        writeln!(f, "kernel command line:")?;
        for t in &self.cmdline {
            writeln!(f, "  {:<40} {}", t.token, t.reason)?;
        }
        writeln!(f, "interrupts: new ones start on {}", self.irq_default)?;
        for p in &self.irqs {
            writeln!(
                f,
                "  irq {:<4} {:<28} -> {:<6} ({})",
                p.irq,
                p.name,
                p.cpus.to_string(),
                p.reason
            )?;
        }
        if self.irqs.is_empty() {
            writeln!(
                f,
                "  (placed on the robot: every interrupt to {})",
                self.irq_default
            )?;
        }
        writeln!(f, "kernel threads:")?;
        for r in &self.thread_rules {
            let prio = r.priority.map(|p| format!(" {p}")).unwrap_or_default();
            let cpus = r
                .cpus
                .as_ref()
                .map(|c| format!(" on {c}"))
                .unwrap_or_default();
            writeln!(f, "  rule {}: {}{prio}{cpus}", r.describe(), r.policy)?;
        }
        for t in &self.threads {
            let sched = match (t.policy, t.priority) {
                (Some(p), Some(n)) if p.is_realtime() => format!("{p} {n}"),
                (Some(p), _) => p.to_string(),
                _ => "-".into(),
            };
            let cpus = t
                .cpus
                .as_ref()
                .map(|c| c.to_string())
                .unwrap_or_else(|| "-".into());
            writeln!(
                f,
                "  {:<6} {:<24} {:<8} cpus {:<6} ({})",
                t.pid, t.comm, sched, cpus, t.reason
            )?;
        }
        writeln!(f, "sysctls:")?;
        for s in &self.sysctls {
            writeln!(f, "  {} = {}  ({})", s.key, s.value, s.reason)?;
        }
        writeln!(f, "unbound workqueues: {}", self.workqueue_cpumask)?;
        let g = &self.cgroups;
        let part = g.partition_value().unwrap_or("no partition");
        writeln!(
            f,
            "cgroups: rtdeploy/rt {} ({part}), rtdeploy/housekeeping {}",
            g.rt, g.housekeeping
        )?;
        match &self.cpufreq.governor {
            Some(gov) => writeln!(f, "cpufreq: governor {gov} on every CPU")?,
            None => writeln!(f, "cpufreq: governor left alone")?,
        }
        if !self.cpufreq.lock_cpus.is_empty() {
            let to = match self.cpufreq.lock_to {
                FreqLock::CurrentMax => String::new(),
                FreqLock::Khz { khz } => format!(" ({khz} kHz)"),
                FreqLock::HardwareMax => " (cpuinfo_max_freq)".into(),
            };
            writeln!(
                f,
                "cpufreq: min = max frequency on {}{to}",
                self.cpufreq.lock_cpus
            )?;
        }
        match &self.power.nvpmodel {
            Some(m) => writeln!(
                f,
                "power: nvpmodel mode {} of {} (L4T {}): CPUs {} online; EMC and GPU clocks left to the mode",
                m.label(),
                m.conf,
                m.release,
                m.online
            )?,
            None => writeln!(f, "power: nvpmodel mode left alone")?,
        }
        writeln!(
            f,
            "power: CPUs in use, must be online: {}",
            self.power.cpus_in_use
        )?;
        match self.cpu_dma_latency_us {
            Some(us) => writeln!(f, "cpu_dma_latency: {us}us, held by the supervisor")?,
            None => writeln!(f, "cpu_dma_latency: not held")?,
        }
        for w in &self.warnings {
            writeln!(f, "warning: {w}")?;
        }
        Ok(())
    }
}
