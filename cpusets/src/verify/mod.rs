//! Proves that the live system matches a [`RuntimePlan`]: reads /proc and
//! /sys under a sysroot (never writes) and reports each check as ok,
//! drift, unmovable or unsupported, with how to fix it.

mod cgroup;
mod irq;
mod kernel_log;
mod power;
mod tasks;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use units::kernel::KernelVersion;

use crate::cmdline;
use crate::config::DeclaredKernel;
use crate::model::live::{
    read_cpu_list, read_cpu_mask, read_interrupts, read_opt, sys_path, Live, ModelReadError,
};
use crate::model::{is_preempt_rt, sched_text, Irq, Task};
use crate::plan::{RuntimePlan, Source};
use units::cpu::CpuSet;

use cgroup::check_cgroups;
use irq::{check_irq, check_irq_activity};
use kernel_log::check_kernel_log;
pub use kernel_log::{read_kernel_log, MAX_KERNEL_LOG};
use power::check_cpufreq;
pub use power::power_checks;
use tasks::{check_foreign_tasks, rt_cgroup_members};

/// How verify samples and what it tolerates.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// How long to watch /proc/interrupts for device interrupts on isolated
    /// CPUs.
    pub sample_window: Duration,
    /// Read the second /proc/interrupts sample from this file instead of
    /// re-reading /proc/interrupts after the window (replays a captured
    /// pair, as the fixtures hold).
    pub interrupts_after: Option<PathBuf>,
    /// Globs on `comm` of tasks that belong on the isolated CPUs (the
    /// robot's real-time processes).
    pub allow_tasks: Vec<String>,
    /// Interrupts `apply` found the kernel would not move.
    pub unmovable_irqs: Vec<u32>,
    /// The kernel robot.yaml says the board runs, compared with the one
    /// that does.
    pub declared_kernel: Option<DeclaredKernel>,
    /// What the kernel of release `uname -r` offers the runtime (its wake
    /// backend), probed when the second argument says it is the kernel
    /// running here: the runtime's to say (`deploy` passes
    /// `controller::kernel::KernelFacts`' summary), reported as the
    /// `kernel.capabilities` check. `None`: no such check.
    pub kernel_offers: Option<fn(&str, bool) -> String>,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            sample_window: Duration::from_secs(1),
            interrupts_after: None,
            allow_tasks: Vec::new(),
            unmovable_irqs: Vec::new(),
            declared_kernel: None,
            kernel_offers: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    /// The live system differs from the plan.
    Drift,
    /// Differs, but the kernel does not allow it to change.
    Unmovable,
    /// Set as planned, not in force yet: an interrupt whose affinity was
    /// written but that has not fired since, so the kernel has not moved
    /// it (x86 moves an I/O APIC or MSI interrupt at its next interrupt).
    /// Not drift: it moves by itself the next time it fires.
    Pending,
    /// The kernel or machine has no such thing to check.
    Unsupported,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Ok => "ok",
            Status::Drift => "DRIFT",
            Status::Unmovable => "unmovable",
            Status::Pending => "pending",
            Status::Unsupported => "unsupported",
        })
    }
}

/// One check and its result.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Stable name: `cmdline.isolcpus`, `irq.36`, `thread.50`, ...
    pub id: String,
    pub status: Status,
    pub detail: String,
    /// The offending items, for checks over many (tasks, interrupts).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<String>,
    /// How to fix it, when not ok.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct VerifySummary {
    pub ok: usize,
    pub drift: usize,
    pub unmovable: usize,
    pub unsupported: usize,
    /// Interrupts whose move waits for their next interrupt.
    #[serde(default)]
    pub pending: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub in_sync: bool,
    pub summary: VerifySummary,
    pub checks: Vec<Check>,
}

impl VerifyReport {
    fn new(checks: Vec<Check>) -> Self {
        let mut s = VerifySummary::default();
        for c in &checks {
            match c.status {
                Status::Ok => s.ok += 1,
                Status::Drift => s.drift += 1,
                Status::Unmovable => s.unmovable += 1,
                Status::Pending => s.pending += 1,
                Status::Unsupported => s.unsupported += 1,
            }
        }
        VerifyReport {
            in_sync: s.drift == 0,
            summary: s,
            checks,
        }
    }

    pub fn summary(&self) -> VerifySummary {
        self.summary
    }

    /// True when nothing drifted (unmovable and unsupported items do not
    /// count against it).
    pub fn in_sync(&self) -> bool {
        self.in_sync
    }

    pub fn drifted(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.status == Status::Drift)
    }

    pub fn check(&self, id: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.id == id)
    }

    /// The report as text: every check that is not ok (all with
    /// `verbose`), with items and fix hints, then the summary.
    pub fn render(&self, verbose: bool) -> String {
        let mut out = String::new();
        let mut last_hint: Option<&String> = None;
        for c in &self.checks {
            if c.status == Status::Ok && !verbose {
                continue;
            }
            out.push_str(&format!(
                "{:<11} {:<34} {}\n",
                c.status.to_string(),
                c.id,
                c.detail
            ));
            let shown = if verbose {
                c.items.len()
            } else {
                c.items.len().min(12)
            };
            for i in &c.items[..shown] {
                out.push_str(&format!("{:<11}   - {i}\n", ""));
            }
            if shown < c.items.len() {
                out.push_str(&format!(
                    "{:<11}   - ... and {} more (-v or --json for all)\n",
                    "",
                    c.items.len() - shown
                ));
            }
            // A hint repeated check after check is said once.
            if let Some(h) = &c.hint {
                if last_hint != Some(h) || verbose {
                    out.push_str(&format!("{:<11}   fix: {h}\n", ""));
                }
            }
            last_hint = c.hint.as_ref();
        }
        let s = self.summary;
        out.push_str(&format!(
            "{}: {} ok, {} drift, {} unmovable, {} unsupported{}\n",
            if self.in_sync { "in sync" } else { "DRIFT" },
            s.ok,
            s.drift,
            s.unmovable,
            s.unsupported,
            if s.pending > 0 {
                format!(", {} pending (moved at their next interrupt)", s.pending)
            } else {
                String::new()
            }
        ));
        out
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(false))
    }
}

/// Why verify could not run.
#[derive(Debug, thiserror::Error)]
pub enum VerifyRunError {
    #[error(transparent)]
    Read(#[from] ModelReadError),
}

fn check(
    id: impl Into<String>,
    status: Status,
    detail: impl Into<String>,
    hint: Option<&str>,
) -> Check {
    Check {
        id: id.into(),
        status,
        detail: detail.into(),
        items: Vec::new(),
        hint: if status == Status::Ok {
            None
        } else {
            hint.map(String::from)
        },
    }
}

const HINT_APPLY: &str = "run `deploy apply` (the supervisor does at boot)";
const HINT_CMDLINE: &str =
    "put the planned command line on the kernel (`deploy plan` prints it; `deploy image` writes extlinux.conf APPEND) and reboot";

/// Compares the live system under `sysroot` with `plan`.
pub fn verify(
    plan: &RuntimePlan,
    sysroot: &Path,
    opts: &VerifyOptions,
) -> Result<VerifyReport, VerifyRunError> {
    let p = |abs: &str| sys_path(sysroot, abs);
    let mut checks = Vec::new();

    // The kernel.
    let realtime = read_opt(&p("/sys/kernel/realtime"))?;
    let version = match read_opt(&p("/proc/sys/kernel/version"))? {
        Some(v) => Some(v),
        None => read_opt(&p("/proc/version"))?,
    };
    let version = version.unwrap_or_default().trim().to_string();
    checks.push(if realtime.as_deref().map(str::trim) == Some("1") || is_preempt_rt(&version) {
        check("kernel.preempt_rt", Status::Ok, format!("PREEMPT_RT ({version})"), None)
    } else {
        check(
            "kernel.preempt_rt",
            Status::Drift,
            format!("not a PREEMPT_RT kernel (/sys/kernel/realtime absent, version `{version}`)"),
            Some("boot a PREEMPT_RT kernel (Debian: linux-image-rt-<arch>; Jetson Linux: the real-time kernel packages)"),
        )
    });

    // What the kernel offers, and whether it is the one robot.yaml names.
    // `uname -r`; a captured tree may hold only /proc/version
    // (`Linux version <release> ...`).
    let release = match read_opt(&p("/proc/sys/kernel/osrelease"))? {
        Some(r) => r,
        None => read_opt(&p("/proc/version"))?
            .and_then(|v| v.split_whitespace().nth(2).map(String::from))
            .unwrap_or_default(),
    };
    let release: String = release.trim().chars().take(64).collect();
    if let Some(offers) = opts.kernel_offers {
        let live = sysroot == Path::new("/");
        checks.push(check(
            "kernel.capabilities",
            Status::Ok,
            format!("{release}: {}", offers(&release, live)),
            None,
        ));
    }
    if let Some(d) = &opts.declared_kernel {
        let live = KernelVersion::parse(&release).ok();
        checks.push(match live {
            Some(v) if (v.major, v.minor) == (d.version.major, d.version.minor) => check(
                "kernel.declared",
                Status::Ok,
                format!("runs {release}, as robot.yaml says ({})", d.source),
                None,
            ),
            _ => check(
                "kernel.declared",
                Status::Drift,
                format!(
                    "runs `{release}`, robot.yaml says {}.{} ({})",
                    d.version.major, d.version.minor, d.source
                ),
                Some("correct `kernel.version` or `kernel.l4t` in robot.yaml (config check and plan reason from it), or boot the kernel it names"),
            ),
        });
    }

    // The command line, and whether it took effect.
    let cmdline_text = read_opt(&p("/proc/cmdline"))?.unwrap_or_default();
    let live_tokens = cmdline::split(&cmdline_text);
    for t in &plan.cmdline {
        let id = format!("cmdline.{}", t.key());
        let c = if live_tokens.iter().any(|l| l == &t.token) {
            check(
                id,
                Status::Ok,
                format!("`{}` in /proc/cmdline", t.token),
                None,
            )
        } else if let Some(other) = live_tokens.iter().find(|l| cmdline::key_of(l) == t.key()) {
            check(
                id,
                Status::Drift,
                format!("/proc/cmdline has `{other}`, planned `{}`", t.token),
                Some(HINT_CMDLINE),
            )
        } else {
            check(
                id,
                Status::Drift,
                format!("`{}` missing from /proc/cmdline", t.token),
                Some(HINT_CMDLINE),
            )
        };
        checks.push(c);
    }
    let isolated = &plan.cpus.isolated;
    match read_cpu_list(&p("/sys/devices/system/cpu/isolated"))? {
        Some(live) if &live == isolated => checks.push(check(
            "cmdline.effect.isolated",
            Status::Ok,
            format!("kernel isolates {live}"),
            None,
        )),
        Some(live) => checks.push(check(
            "cmdline.effect.isolated",
            Status::Drift,
            format!(
                "kernel isolates `{live}`, planned {isolated} (/sys/devices/system/cpu/isolated)"
            ),
            Some(HINT_CMDLINE),
        )),
        None => checks.push(check(
            "cmdline.effect.isolated",
            Status::Unsupported,
            "/sys/devices/system/cpu/isolated does not exist",
            Some("a kernel older than 4.x; trust /proc/cmdline"),
        )),
    }
    if plan.cmdline.iter().any(|t| t.key() == "nohz_full") {
        let c = match read_opt(&p("/sys/devices/system/cpu/nohz_full"))? {
            None => check(
                "cmdline.effect.nohz_full",
                Status::Unsupported,
                "/sys/devices/system/cpu/nohz_full does not exist: kernel built without CONFIG_NO_HZ_FULL",
                Some("use a kernel with CONFIG_NO_HZ_FULL=y (PREEMPT_RT kernels from Debian and NVIDIA have it)"),
            ),
            Some(text) => {
                // Reads `(null)` when no CPU is tickless.
                let live = CpuSet::parse_list(text.trim()).unwrap_or_default();
                if &live == isolated {
                    check("cmdline.effect.nohz_full", Status::Ok, format!("tickless CPUs {live}"), None)
                } else {
                    check(
                        "cmdline.effect.nohz_full",
                        Status::Drift,
                        format!("tickless CPUs `{}`, planned {isolated}", text.trim()),
                        Some(HINT_CMDLINE),
                    )
                }
            }
        };
        checks.push(c);
    }

    checks.push(check_kernel_log(plan, &p("/dev/kmsg")));

    // Interrupts.
    let live = Live::read(sysroot)?;
    let placed: BTreeMap<u32, &CpuSet> = plan.irqs.iter().map(|i| (i.irq, &i.cpus)).collect();
    let unmovable = |irq: &Irq| opts.unmovable_irqs.contains(&irq.irq) || irq.is_per_cpu();
    let want_irq = |n: u32| -> &CpuSet { placed.get(&n).copied().unwrap_or(&plan.irq_default) };
    match read_cpu_mask(&p("/proc/irq/default_smp_affinity"))? {
        Some(m) if m == plan.irq_default => checks.push(check(
            "irq.default_affinity",
            Status::Ok,
            format!("new interrupts start on {m}"),
            None,
        )),
        Some(m) => checks.push(check(
            "irq.default_affinity",
            Status::Drift,
            format!("new interrupts start on {m}, planned {}", plan.irq_default),
            Some(HINT_APPLY),
        )),
        None => checks.push(check(
            "irq.default_affinity",
            Status::Unsupported,
            "/proc/irq/default_smp_affinity does not exist",
            None,
        )),
    }
    let after = match &opts.interrupts_after {
        Some(path) => read_interrupts(path)?,
        None => {
            std::thread::sleep(opts.sample_window);
            read_interrupts(&p("/proc/interrupts"))?
        }
    };
    // An interrupt whose affinity is right but whose effective affinity
    // is not has a move pending: x86 moves an I/O APIC or MSI interrupt
    // at its next interrupt, on the old CPU. Its effective affinity is
    // read again after the window: moved by then, the interrupt on the
    // old CPU was the move; still not moved and silent, the move is
    // pending; still not moved although it fired, it drifted.
    let deltas = live.interrupts.deltas(&after);
    let fired = |n: u32| {
        deltas
            .iter()
            .filter(|(id, _, _)| id.parse() == Ok(n))
            .map(|(_, _, d)| d)
            .sum::<u64>()
    };
    let mut moved = Vec::new();
    for irq in &live.irqs {
        let want = want_irq(irq.irq);
        let settling = irq.affinity.as_ref().is_none_or(|a| a.is_subset(want))
            && irq.effective.as_ref().is_some_and(|e| !e.is_subset(want));
        let effective_after = if settling {
            read_cpu_list(&p(&format!(
                "/proc/irq/{}/effective_affinity_list",
                irq.irq
            )))?
        } else {
            irq.effective.clone()
        };
        let c = check_irq(
            irq,
            want,
            unmovable(irq),
            fired(irq.irq),
            effective_after.as_ref(),
        );
        if settling && effective_after.as_ref().is_some_and(|e| e.is_subset(want)) {
            moved.push(irq.irq);
        }
        checks.push(c);
    }
    checks.extend(check_irq_activity(
        &live.interrupts,
        &after,
        &live.irqs,
        isolated,
        &want_irq,
        &unmovable,
        &moved,
        opts,
    ));

    // Kernel threads.
    let tasks: BTreeMap<u32, &Task> = live
        .tasks
        .iter()
        .filter(|t| t.pid == t.tid)
        .map(|t| (t.pid, t))
        .collect();
    for t in &plan.threads {
        let id = format!("thread.{}", t.pid);
        let Some(task) = tasks.get(&t.pid).filter(|task| task.comm == t.comm) else {
            checks.push(check(
                id,
                Status::Unsupported,
                format!("`{}` (pid {}) no longer exists", t.comm, t.pid),
                None,
            ));
            continue;
        };
        let mut problems = Vec::new();
        if let (Some(policy), Some(prio)) = (t.policy, t.priority) {
            let prio = if policy.is_realtime() { prio } else { 0 };
            if task.policy != policy.sched_number() || task.rt_priority != prio {
                problems.push(format!(
                    "is {}, planned {}",
                    sched_text(task.policy, task.rt_priority),
                    sched_text(policy.sched_number(), prio)
                ));
            }
        }
        let mut pinned = false;
        if let Some(cpus) = &t.cpus {
            if !task.cpus_allowed.is_subset(cpus) {
                pinned = task.no_setaffinity;
                problems.push(format!("runs on {}, planned {cpus}", task.cpus_allowed));
            }
        }
        checks.push(if problems.is_empty() {
            check(
                id,
                Status::Ok,
                format!(
                    "{} {} on {}",
                    t.comm,
                    sched_text(task.policy, task.rt_priority),
                    task.cpus_allowed
                ),
                None,
            )
        } else {
            let status = if pinned && problems.len() == 1 {
                Status::Unmovable
            } else {
                Status::Drift
            };
            check(
                id,
                status,
                format!("{} {}", t.comm, problems.join("; ")),
                Some(HINT_APPLY),
            )
        });
    }
    let in_rt = rt_cgroup_members(sysroot)?;
    checks.extend(check_foreign_tasks(&live.tasks, plan, opts, &in_rt));

    // Sysctls.
    for s in &plan.sysctls {
        let id = format!("sysctl.{}", s.key);
        let c = match read_opt(&p(&s.path()))? {
            None => check(
                id,
                if s.source == Source::Planned {
                    Status::Unsupported
                } else {
                    Status::Drift
                },
                format!("{} does not exist on this kernel", s.path()),
                Some("remove it from robot.yaml or use a kernel that has it"),
            ),
            Some(v) if v.split_whitespace().eq(s.value.split_whitespace()) => {
                check(id, Status::Ok, format!("{} = {}", s.key, v.trim()), None)
            }
            Some(v) => check(
                id,
                Status::Drift,
                format!("{} = {}, planned {}", s.key, v.trim(), s.value),
                Some(HINT_APPLY),
            ),
        };
        checks.push(c);
    }

    // Unbound workqueues.
    checks.push(
        match read_cpu_mask(&p("/sys/devices/virtual/workqueue/cpumask"))? {
            Some(m) if m == plan.workqueue_cpumask => check(
                "workqueue.cpumask",
                Status::Ok,
                format!("unbound workqueues on {m}"),
                None,
            ),
            Some(m) => check(
                "workqueue.cpumask",
                Status::Drift,
                format!(
                    "unbound workqueues on {m}, planned {}",
                    plan.workqueue_cpumask
                ),
                Some(HINT_APPLY),
            ),
            None => check(
                "workqueue.cpumask",
                Status::Unsupported,
                "/sys/devices/virtual/workqueue/cpumask does not exist",
                None,
            ),
        },
    );

    checks.extend(check_cgroups(plan, sysroot)?);
    checks.extend(check_cpufreq(plan, sysroot)?);
    checks.extend(power_checks(plan, sysroot)?);
    Ok(VerifyReport::new(checks))
}
