//! Writes a [`RuntimePlan`] to the live system: the only module that
//! changes anything.
//!
//! Every write reads the file first and skips it when it already holds the
//! planned value, so applying twice changes nothing the second time. Files
//! are opened without `O_CREAT`: a wrong path fails here exactly as it would
//! on the kernel's /proc and /sys (cgroup directories are the one thing
//! created, with `mkdir`, as the kernel expects). One interrupt, thread or
//! sysctl that cannot be set does not stop the others: each write's outcome
//! is recorded in the [`ApplyReport`].

mod nvpmodel;

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::Policy;
use crate::model::live::{
    find_cgroup_root, read_cpu_list, read_opt, read_task, sys_path, task_dir, ModelReadError,
};
use crate::model::{partition_invalid_reason, sched_text, status_with_cpus, CgroupRoot, TaskStat};
use crate::plan::{FreqLock, RuntimePlan, Source, ThreadPlacement};
use crate::power::NvpmodelTool;
use units::cpu::CpuSet;
use units::error::Chain;
use units::sched::{self, AffinitySetError, SchedAttr};

/// How thread scheduling changes reach the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ThreadControl {
    /// `sched_setscheduler` and `sched_setaffinity` on the thread ids: the
    /// sysroot is the live system.
    Syscalls,
    /// The sysroot is a fake tree that stands for the kernel: the new policy,
    /// priority and CPUs are written into its /proc/PID/stat and status, as
    /// the kernel would show them. Threads the kernel pins
    /// (`PF_NO_SETAFFINITY`) are refused, as the kernel refuses them.
    FakeTree,
}

#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// Read everything and report what would change; write nothing.
    pub dry_run: bool,
    pub threads: ThreadControl,
    /// The `nvpmodel` binary that sets `power.nvpmodel`; `None` when the
    /// system has none (the mode is then reported unsupported).
    pub nvpmodel: Option<NvpmodelTool>,
}

impl ApplyOptions {
    /// Syscalls when `sysroot` is `/`, else a fake tree; nvpmodel where
    /// [`NvpmodelTool::find`] finds it for the sysroot.
    pub fn for_sysroot(sysroot: &Path, dry_run: bool) -> Self {
        let live = sysroot
            .canonicalize()
            .map(|p| p == Path::new("/"))
            .unwrap_or(false);
        ApplyOptions {
            dry_run,
            threads: if live {
                ThreadControl::Syscalls
            } else {
                ThreadControl::FakeTree
            },
            nvpmodel: NvpmodelTool::find(sysroot),
        }
    }
}

/// What happened to one planned value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Outcome {
    /// It already held the planned value.
    Unchanged,
    Changed,
    /// `--dry-run`: it would be written.
    WouldChange,
    /// The kernel refuses to move this interrupt or thread (per-CPU
    /// timers, IPIs, managed interrupts, pinned kernel threads).
    Unmovable {
        reason: String,
    },
    /// This kernel or machine has no such setting.
    Unsupported {
        reason: String,
    },
    /// Written, but the kernel reports the result invalid (a cgroup
    /// partition it could not make).
    Invalid {
        reason: String,
    },
    /// Set, but it takes effect at the next boot (an nvpmodel mode that
    /// changes which CPUs are online).
    RebootRequired {
        reason: String,
    },
    Failed {
        error: String,
    },
}

impl Outcome {
    /// A failure the kernel gave for want of a privilege (EACCES or
    /// EPERM: the plan needs root). The error texts come from
    /// `std::io::Error`, which ends them with the errno.
    pub fn is_permission_denied(&self) -> bool {
        matches!(self, Outcome::Failed { error }
            if error.ends_with("(os error 13)") || error.ends_with("(os error 1)"))
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Unchanged => f.write_str("unchanged"),
            Outcome::Changed => f.write_str("changed"),
            Outcome::WouldChange => f.write_str("would change"),
            Outcome::Unmovable { reason } => write!(f, "unmovable: {reason}"),
            Outcome::Unsupported { reason } => write!(f, "unsupported: {reason}"),
            Outcome::Invalid { reason } => write!(f, "invalid: {reason}"),
            Outcome::RebootRequired { reason } => write!(f, "reboot required: {reason}"),
            Outcome::Failed { error } => f.write_str(error),
        }
    }
}

/// One planned write and its outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Action {
    /// What is set, in words: `irq 36 virtio1-req.0`.
    pub item: String,
    /// The kernel path (as on the robot, without the sysroot), or the
    /// syscall and thread id.
    pub path: String,
    /// The value before, when there was one.
    pub old: Option<String>,
    pub new: String,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// Counts of outcomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ApplySummary {
    pub changed: usize,
    pub unchanged: usize,
    pub would_change: usize,
    pub unmovable: usize,
    pub unsupported: usize,
    pub invalid: usize,
    pub reboot_required: usize,
    pub failed: usize,
}

/// Everything `apply` did, or would do.
#[derive(Debug, Clone, Serialize)]
pub struct ApplyReport {
    pub sysroot: PathBuf,
    pub dry_run: bool,
    pub threads: ThreadControl,
    /// Which cgroup hierarchy holds the cpusets: `v2 <mount>`, `v1 <mount>`
    /// or `none`.
    pub cgroup: String,
    /// The outcomes counted, as [`ApplyReport::summary`] returns them.
    pub summary: ApplySummary,
    pub actions: Vec<Action>,
    /// What apply deliberately leaves alone, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl ApplyReport {
    pub fn summary(&self) -> ApplySummary {
        Self::count(&self.actions)
    }

    fn count(actions: &[Action]) -> ApplySummary {
        let mut s = ApplySummary::default();
        for a in actions {
            match a.outcome {
                Outcome::Unchanged => s.unchanged += 1,
                Outcome::Changed => s.changed += 1,
                Outcome::WouldChange => s.would_change += 1,
                Outcome::Unmovable { .. } => s.unmovable += 1,
                Outcome::Unsupported { .. } => s.unsupported += 1,
                Outcome::Invalid { .. } => s.invalid += 1,
                Outcome::RebootRequired { .. } => s.reboot_required += 1,
                Outcome::Failed { .. } => s.failed += 1,
            }
        }
        s
    }

    /// Interrupts the kernel would not move.
    pub fn unmovable_irqs(&self) -> Vec<u32> {
        self.actions
            .iter()
            .filter(|a| matches!(a.outcome, Outcome::Unmovable { .. }))
            .filter_map(|a| {
                a.path
                    .strip_prefix("/proc/irq/")?
                    .strip_suffix("/smp_affinity_list")?
                    .parse()
                    .ok()
            })
            .collect()
    }

    pub fn failures(&self) -> impl Iterator<Item = &Action> {
        self.actions
            .iter()
            .filter(|a| matches!(a.outcome, Outcome::Failed { .. }))
    }

    /// The report as text: every action that is not `unchanged` (all of them
    /// with `verbose`), then the summary.
    pub fn render(&self, verbose: bool) -> String {
        let mut out = String::new();
        for a in &self.actions {
            let (word, extra) = match &a.outcome {
                Outcome::Unchanged if !verbose => continue,
                Outcome::Unchanged => ("unchanged", String::new()),
                Outcome::Changed => ("changed", String::new()),
                Outcome::WouldChange => ("would write", String::new()),
                Outcome::Unmovable { reason } => ("unmovable", format!(": {reason}")),
                Outcome::Unsupported { reason } => ("unsupported", format!(": {reason}")),
                Outcome::Invalid { reason } => ("INVALID", format!(": {reason}")),
                Outcome::RebootRequired { reason } => ("REBOOT", format!(": {reason}")),
                Outcome::Failed { error } => ("FAILED", format!(": {error}")),
            };
            let old = a
                .old
                .as_deref()
                .map(|o| o.trim().to_string())
                .unwrap_or_else(|| "(absent)".into());
            out.push_str(&format!(
                "{word:<11} {}  {old} -> {}  [{}]{extra}\n",
                a.path, a.new, a.item
            ));
        }
        for n in &self.notes {
            out.push_str(&format!("note: {n}\n"));
        }
        let s = self.summary();
        let reboot = if s.reboot_required > 0 {
            format!(", {} reboot required", s.reboot_required)
        } else {
            String::new()
        };
        out.push_str(&format!(
            "{}: {} changed, {} would change, {} unchanged, {} unmovable, {} unsupported, {} invalid{reboot}, {} failed\n",
            if self.dry_run { "dry run" } else { "applied" },
            s.changed,
            s.would_change,
            s.unchanged,
            s.unmovable,
            s.unsupported,
            s.invalid,
            s.failed
        ));
        out
    }

    /// True when something set takes effect only after a reboot.
    pub fn reboot_required(&self) -> bool {
        self.actions
            .iter()
            .any(|a| matches!(a.outcome, Outcome::RebootRequired { .. }))
    }
}

impl fmt::Display for ApplyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(false))
    }
}

/// Why apply could not run at all (a single write failing is an
/// [`Outcome::Failed`] instead).
#[derive(Debug, thiserror::Error)]
pub enum ApplyRunError {
    #[error(transparent)]
    Read(#[from] ModelReadError),
}

/// What to do when the file to write does not exist.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Missing {
    /// An error: the path must exist.
    Fail,
    /// The kernel lacks the feature.
    Unsupported,
    /// Its cgroup directory is created by this (dry) run.
    CreatedLater,
}

struct Applier<'a> {
    root: &'a Path,
    opts: &'a ApplyOptions,
    actions: Vec<Action>,
}

/// Opens an existing file for writing (never creating it) and writes the
/// value in one `write`, as /proc and /sys expect.
pub fn write_existing(path: &Path, value: &str) -> io::Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)?;
    f.write_all(value.as_bytes())
}

/// Errors with which the kernel refuses to move an interrupt or a thread.
pub fn is_unmovable_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO) | Some(libc::EPERM) | Some(libc::EINVAL)
    )
}

impl Applier<'_> {
    fn push(
        &mut self,
        item: String,
        path: String,
        old: Option<String>,
        new: String,
        outcome: Outcome,
    ) {
        self.actions.push(Action {
            item,
            path,
            old,
            new,
            outcome,
        });
    }

    /// Reads `abs`, and writes `new` unless `same(old)` says it already
    /// holds it. With `movable_errors`, EIO/EPERM/EINVAL mean unmovable.
    fn set(
        &mut self,
        item: String,
        abs: &str,
        new: String,
        same: impl Fn(&str) -> bool,
        missing: Missing,
        unmovable_errors: bool,
    ) -> Outcome {
        let path = sys_path(self.root, abs);
        let old = match read_opt(&path) {
            Ok(o) => o,
            Err(e) => {
                let outcome = Outcome::Failed {
                    error: e.to_string(),
                };
                self.push(item, abs.into(), None, new, outcome.clone());
                return outcome;
            }
        };
        let outcome = match (&old, missing) {
            (None, Missing::Fail) => Outcome::Failed {
                error: format!("{} does not exist", path.display()),
            },
            (None, Missing::Unsupported) => Outcome::Unsupported {
                reason: format!("{abs} does not exist on this kernel"),
            },
            (None, Missing::CreatedLater) if self.opts.dry_run => Outcome::WouldChange,
            (None, Missing::CreatedLater) => Outcome::Failed {
                error: format!("{} does not exist", path.display()),
            },
            (Some(o), _) if same(o.trim()) => Outcome::Unchanged,
            (Some(_), _) if self.opts.dry_run => Outcome::WouldChange,
            (Some(_), _) => match write_existing(&path, &new) {
                Ok(()) => Outcome::Changed,
                Err(e) if unmovable_errors && is_unmovable_error(&e) => Outcome::Unmovable {
                    reason: format!("the kernel refused the write: {e}"),
                },
                Err(e) => Outcome::Failed {
                    error: format!("cannot write `{new}` to {}: {e}", path.display()),
                },
            },
        };
        self.push(
            item,
            abs.into(),
            old.map(|o| o.trim().to_string()),
            new,
            outcome.clone(),
        );
        outcome
    }

    fn mkdir(&mut self, item: &str, abs: &str) -> Outcome {
        let path = sys_path(self.root, abs);
        let outcome = if path.is_dir() {
            Outcome::Unchanged
        } else if self.opts.dry_run {
            Outcome::WouldChange
        } else {
            match fs::create_dir(&path) {
                Ok(()) => Outcome::Changed,
                Err(e) => Outcome::Failed {
                    error: format!("cannot create {}: {e}", path.display()),
                },
            }
        };
        let old = path.is_dir().then(|| "directory".to_string());
        self.push(
            item.into(),
            abs.into(),
            old,
            "directory".into(),
            outcome.clone(),
        );
        outcome
    }
}

fn same_list(want: &CpuSet) -> impl Fn(&str) -> bool + '_ {
    move |old| CpuSet::parse_list(old).is_ok_and(|s| &s == want)
}

fn same_mask(want: &CpuSet) -> impl Fn(&str) -> bool + '_ {
    move |old| CpuSet::parse_mask(old).is_ok_and(|s| &s == want)
}

fn same_words(want: &str) -> impl Fn(&str) -> bool + '_ {
    move |old| old.split_whitespace().eq(want.split_whitespace())
}

/// True when a `cgroup.subtree_control` text enables the cpuset controller.
fn has_cpuset(old: &str) -> bool {
    old.split_whitespace()
        .any(|w| w.trim_start_matches('+') == "cpuset")
}

/// Writes `plan` under `sysroot` (or, with `dry_run`, reports what it
/// would write).
pub fn apply(
    plan: &RuntimePlan,
    sysroot: &Path,
    opts: &ApplyOptions,
) -> Result<ApplyReport, ApplyRunError> {
    let mut a = Applier {
        root: sysroot,
        opts,
        actions: Vec::new(),
    };
    let mut notes = Vec::new();

    // The power mode first: it decides which CPUs are online and caps
    // their clocks, which the rest writes to.
    if let Some(m) = &plan.power.nvpmodel {
        nvpmodel::apply_mode(&mut a, m)?;
        notes.push(format!(
            "nvpmodel mode {} also caps the GPU, EMC (memory), DLA and PVA clocks; apply pins only the CPU clocks (min = max on every CPU the mode keeps online, as jetson_clocks does for the CPUs) and leaves the EMC and GPU clocks to the mode's frequency scaling (jetson_clocks would pin those too)",
            m.label()
        ));
    }

    for s in &plan.sysctls {
        let missing = match s.source {
            Source::Planned => Missing::Unsupported,
            Source::RobotYaml => Missing::Fail,
        };
        a.set(
            format!("sysctl {}", s.key),
            &s.path(),
            s.value.clone(),
            same_words(&s.value),
            missing,
            false,
        );
    }

    a.set(
        "default affinity of new interrupts".into(),
        "/proc/irq/default_smp_affinity",
        plan.irq_default.to_mask(),
        same_mask(&plan.irq_default),
        Missing::Fail,
        false,
    );
    for p in &plan.irqs {
        a.set(
            format!("irq {} {}", p.irq, p.name),
            &format!("/proc/irq/{}/smp_affinity_list", p.irq),
            p.cpus.to_string(),
            same_list(&p.cpus),
            Missing::Fail,
            true,
        );
    }

    a.set(
        "unbound workqueues".into(),
        "/sys/devices/virtual/workqueue/cpumask",
        plan.workqueue_cpumask.to_mask(),
        same_mask(&plan.workqueue_cpumask),
        Missing::Unsupported,
        false,
    );

    let cgroup = find_cgroup_root(sysroot)?;
    match &cgroup {
        CgroupRoot::V2(m) => apply_cgroup_v2(&mut a, plan, m),
        CgroupRoot::V1(m) => apply_cgroup_v1(&mut a, plan, m)?,
        CgroupRoot::None => a.push(
            "cgroup cpusets".into(),
            "/proc/mounts".into(),
            None,
            "rtdeploy/{rt,housekeeping}".into(),
            Outcome::Unsupported {
                reason: "no cgroup hierarchy with the cpuset controller is mounted".into(),
            },
        ),
    }

    for t in &plan.threads {
        apply_thread(&mut a, t)?;
    }

    // CPUs the kernel reports online; `None` when it does not say.
    let online = read_cpu_list(&sys_path(sysroot, "/sys/devices/system/cpu/online"))?;
    for cpu in plan.cpus.all.iter() {
        if let Some(g) = &plan.cpufreq.governor {
            a.set(
                format!("cpu{cpu} cpufreq governor"),
                &format!("/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor"),
                g.clone(),
                same_words(g),
                Missing::Unsupported,
                false,
            );
        }
        if plan.cpufreq.lock_cpus.contains(cpu) && plan.cpufreq.lock_to != FreqLock::CurrentMax {
            nvpmodel::pin_clock(&mut a, plan, cpu, online.as_ref())?;
        } else if plan.cpufreq.lock_cpus.contains(cpu) {
            let dir = format!("/sys/devices/system/cpu/cpu{cpu}/cpufreq");
            match read_opt(&sys_path(sysroot, &format!("{dir}/scaling_max_freq")))? {
                Some(max) => {
                    let max = max.trim().to_string();
                    a.set(
                        format!("cpu{cpu} minimum frequency = maximum"),
                        &format!("{dir}/scaling_min_freq"),
                        max.clone(),
                        same_words(&max),
                        Missing::Unsupported,
                        false,
                    );
                }
                None => a.push(
                    format!("cpu{cpu} minimum frequency = maximum"),
                    format!("{dir}/scaling_min_freq"),
                    None,
                    "scaling_max_freq".into(),
                    Outcome::Unsupported {
                        reason: format!("{dir} does not exist (no cpufreq driver)"),
                    },
                ),
            }
        }
    }

    Ok(ApplyReport {
        sysroot: sysroot.to_path_buf(),
        dry_run: opts.dry_run,
        threads: opts.threads,
        cgroup: cgroup.to_string(),
        summary: ApplyReport::count(&a.actions),
        actions: a.actions,
        notes,
    })
}

fn apply_cgroup_v2(a: &mut Applier, plan: &RuntimePlan, m: &str) {
    let g = &plan.cgroups;
    let base = format!("{m}/rtdeploy");
    a.set(
        "cgroup v2: cpuset controller for children".into(),
        &format!("{m}/cgroup.subtree_control"),
        "+cpuset".into(),
        has_cpuset,
        Missing::Fail,
        false,
    );
    if matches!(a.mkdir("cgroup rtdeploy", &base), Outcome::Failed { .. }) {
        return;
    }
    let all = plan.cpus.all.to_string();
    a.set(
        "cgroup rtdeploy cpus".into(),
        &format!("{base}/cpuset.cpus"),
        all,
        same_list(&plan.cpus.all),
        Missing::CreatedLater,
        false,
    );
    // Nested partitions need the CPUs granted exclusively by every
    // ancestor (`cpuset.cpus.exclusive`, Linux 6.7+).
    let exclusive_file = sys_path(a.root, &format!("{base}/cpuset.cpus.exclusive"));
    let base_created_later = !sys_path(a.root, &base).is_dir();
    let exclusive =
        g.partition_value().is_some() && (exclusive_file.exists() || base_created_later);
    if exclusive {
        a.set(
            "cgroup rtdeploy exclusive cpus".into(),
            &format!("{base}/cpuset.cpus.exclusive"),
            g.rt.to_string(),
            same_list(&g.rt),
            Missing::CreatedLater,
            false,
        );
    }
    a.set(
        "cgroup rtdeploy: cpuset controller for children".into(),
        &format!("{base}/cgroup.subtree_control"),
        "+cpuset".into(),
        has_cpuset,
        Missing::CreatedLater,
        false,
    );
    for (name, cpus) in [("rt", &g.rt), ("housekeeping", &g.housekeeping)] {
        let dir = format!("{base}/{name}");
        if matches!(
            a.mkdir(&format!("cgroup rtdeploy/{name}"), &dir),
            Outcome::Failed { .. }
        ) {
            continue;
        }
        a.set(
            format!("cgroup rtdeploy/{name} cpus"),
            &format!("{dir}/cpuset.cpus"),
            cpus.to_string(),
            same_list(cpus),
            Missing::CreatedLater,
            false,
        );
        if name != "rt" {
            continue;
        }
        let Some(kind) = g.partition_value() else {
            continue;
        };
        if !exclusive {
            a.push(
                "cgroup rtdeploy/rt partition".into(),
                format!("{dir}/cpuset.cpus.partition"),
                None,
                kind.into(),
                Outcome::Unsupported {
                    reason: "a nested partition needs cpuset.cpus.exclusive (Linux 6.7+); rtdeploy/rt stays a member cgroup".into(),
                },
            );
            continue;
        }
        a.set(
            "cgroup rtdeploy/rt exclusive cpus".into(),
            &format!("{dir}/cpuset.cpus.exclusive"),
            cpus.to_string(),
            same_list(cpus),
            Missing::CreatedLater,
            false,
        );
        let part_abs = format!("{dir}/cpuset.cpus.partition");
        let outcome = a.set(
            "cgroup rtdeploy/rt partition".into(),
            &part_abs,
            kind.into(),
            |old| old == kind,
            Missing::CreatedLater,
            false,
        );
        // The kernel accepts any partition write and says afterwards
        // whether it could make it: `isolated invalid (<reason>)`.
        if matches!(outcome, Outcome::Changed | Outcome::Unchanged) {
            if let Ok(Some(now)) = read_opt(&sys_path(a.root, &part_abs)) {
                if let Some(reason) = partition_invalid_reason(&now) {
                    if let Some(last) = a.actions.last_mut() {
                        last.outcome = Outcome::Invalid { reason };
                    }
                }
            }
        }
    }
}

fn apply_cgroup_v1(a: &mut Applier, plan: &RuntimePlan, m: &str) -> Result<(), ApplyRunError> {
    let g = &plan.cgroups;
    let base = format!("{m}/rtdeploy");
    // v1 cpusets take no task until `cpuset.mems` is set: use the root's.
    let mems = read_opt(&sys_path(a.root, &format!("{m}/cpuset.mems")))?
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "0".into());
    if matches!(a.mkdir("cgroup v1 rtdeploy", &base), Outcome::Failed { .. }) {
        return Ok(());
    }
    let partition = g.partition_value().is_some();
    let files = |dir: &str, cpus: &CpuSet| {
        vec![
            (format!("{dir}/cpuset.cpus"), cpus.to_string()),
            (format!("{dir}/cpuset.mems"), mems.clone()),
        ]
    };
    // CPU and memory lists count as equal when they name the same set
    // (`0-1` and `0,1`).
    let write_all = |a: &mut Applier, writes: Vec<(String, String)>| {
        for (abs, value) in writes {
            let same = |old: &str| {
                old == value
                    || (abs.ends_with(".cpus") || abs.ends_with(".mems"))
                        && same_list(&CpuSet::parse_list(&value).unwrap_or_default())(old)
            };
            a.set(
                format!("cgroup v1 {}", rel(&abs, m)),
                &abs,
                value.clone(),
                same,
                Missing::CreatedLater,
                false,
            );
        }
    };
    let mut writes = files(&base, &plan.cpus.all);
    if partition {
        // A v1 cpuset can be exclusive only under an exclusive parent.
        writes.push((format!("{base}/cpuset.cpu_exclusive"), "1".into()));
    }
    write_all(a, writes);
    for (name, cpus) in [("rt", &g.rt), ("housekeeping", &g.housekeeping)] {
        let dir = format!("{base}/{name}");
        if matches!(
            a.mkdir(&format!("cgroup v1 rtdeploy/{name}"), &dir),
            Outcome::Failed { .. }
        ) {
            continue;
        }
        let mut writes = files(&dir, cpus);
        if name == "rt" && partition {
            writes.push((format!("{dir}/cpuset.cpu_exclusive"), "1".into()));
            if g.partition_value() == Some("isolated") {
                // Takes effect only where the root cpuset balances no load
                // either; the isolcpus= domain flag does the rest.
                writes.push((format!("{dir}/cpuset.sched_load_balance"), "0".into()));
            }
        }
        write_all(a, writes);
    }
    Ok(())
}

fn rel<'p>(abs: &'p str, mount: &str) -> &'p str {
    abs.strip_prefix(mount)
        .map(|s| s.trim_start_matches('/'))
        .unwrap_or(abs)
}

fn apply_thread(a: &mut Applier, t: &ThreadPlacement) -> Result<(), ApplyRunError> {
    let dir = task_dir(a.root, t.pid, t.pid);
    let item = format!("thread {} {}", t.pid, t.comm);
    let task = match read_task(t.pid, t.pid, &dir) {
        Ok(Some(task)) if task.comm == t.comm => task,
        // Gone, or the pid now belongs to another task.
        Ok(_) => {
            a.push(
                item,
                format!("/proc/{}", t.pid),
                None,
                "-".into(),
                Outcome::Unsupported {
                    reason: format!("thread {} `{}` no longer exists", t.pid, t.comm),
                },
            );
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let fake = a.opts.threads == ThreadControl::FakeTree;
    if let (Some(policy), Some(prio)) = (t.policy, t.priority) {
        let prio = if policy == Policy::Other { 0 } else { prio };
        let old = sched_text(task.policy, task.rt_priority);
        let new = sched_text(policy.sched_number(), prio);
        let path = if fake {
            format!("/proc/{}/stat", t.pid)
        } else {
            format!("sched_setattr({})", t.pid)
        };
        let outcome = if task.policy == policy.sched_number() && task.rt_priority == prio {
            Outcome::Unchanged
        } else if a.opts.dry_run {
            Outcome::WouldChange
        } else if fake {
            let stat_path = dir.join("stat");
            let text = crate::model::live::read_text(&stat_path).unwrap_or_default();
            match TaskStat::with_sched(&text, policy.sched_number(), prio) {
                Some(new_text) => match write_existing(&stat_path, &new_text) {
                    Ok(()) => Outcome::Changed,
                    Err(e) => Outcome::Failed {
                        error: format!("cannot write {}: {e}", stat_path.display()),
                    },
                },
                None => Outcome::Failed {
                    error: format!("{} has too few fields", stat_path.display()),
                },
            }
        } else {
            // The thread's nice value kept, as sched_setscheduler(2)
            // keeps it.
            match sched::set_attr(t.pid, &SchedAttr::new(policy.sched(), prio)) {
                Ok(()) => Outcome::Changed,
                Err(e) => Outcome::Failed {
                    error: format!(
                        "sched_setattr({}, {new}) for `{}`: {}",
                        t.pid, t.comm, e.source
                    ),
                },
            }
        };
        a.push(format!("{item} policy"), path, Some(old), new, outcome);
    }
    if let Some(cpus) = &t.cpus {
        let path = if fake {
            format!("/proc/{}/status", t.pid)
        } else {
            format!("sched_setaffinity({})", t.pid)
        };
        let outcome = if &task.cpus_allowed == cpus {
            Outcome::Unchanged
        } else if task.no_setaffinity {
            Outcome::Unmovable {
                reason: "the kernel pins this thread (PF_NO_SETAFFINITY)".into(),
            }
        } else if a.opts.dry_run {
            Outcome::WouldChange
        } else if fake {
            let status_path = dir.join("status");
            let text = crate::model::live::read_text(&status_path).unwrap_or_default();
            match write_existing(&status_path, &status_with_cpus(&text, cpus)) {
                Ok(()) => Outcome::Changed,
                Err(e) => Outcome::Failed {
                    error: format!("cannot write {}: {e}", status_path.display()),
                },
            }
        } else {
            match sched::set_affinity(t.pid, cpus) {
                Ok(()) => Outcome::Changed,
                Err(AffinitySetError::Set { source, .. })
                    if source.raw_os_error() == Some(libc::EINVAL) =>
                {
                    Outcome::Unmovable {
                        reason: format!("sched_setaffinity refused: {source}"),
                    }
                }
                Err(AffinitySetError::Set { source, .. }) => Outcome::Failed {
                    error: format!(
                        "sched_setaffinity({}, {cpus}) for `{}`: {source}",
                        t.pid, t.comm
                    ),
                },
                Err(e) => Outcome::Failed {
                    error: format!(
                        "sched_setaffinity({}, {cpus}) for `{}`: {}",
                        t.pid,
                        t.comm,
                        Chain(&e)
                    ),
                },
            }
        };
        a.push(
            format!("{item} cpus"),
            path,
            Some(task.cpus_allowed.to_string()),
            cpus.to_string(),
            outcome,
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_write_errors() {
        for (errno, unmovable) in [
            (libc::EIO, true),
            (libc::EPERM, true),
            (libc::EINVAL, true),
            (libc::EACCES, false),
            (libc::ENOENT, false),
        ] {
            assert_eq!(
                is_unmovable_error(&io::Error::from_raw_os_error(errno)),
                unmovable,
                "errno {errno}"
            );
        }
    }

    #[test]
    fn write_existing_never_creates() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("smp_affinity_list");
        assert_eq!(
            write_existing(&p, "0").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert!(!p.exists());
        fs::write(&p, "0-5\n").unwrap();
        write_existing(&p, "0").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "0");
    }
}
