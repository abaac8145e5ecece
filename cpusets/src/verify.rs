//! Proves that the live system matches a [`RuntimePlan`]: reads /proc and
//! /sys under a sysroot (never writes) and reports each check as ok,
//! drift, unmovable or unsupported, with how to fix it.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use units::kernel::KernelVersion;

use crate::cmdline;
use crate::config::DeclaredKernel;
use crate::model::live::{
    find_cgroup_root, read_cpu_list, read_cpu_mask, read_interrupts, read_opt, sys_path, Live,
    ModelReadError,
};
use crate::model::{
    glob_match, is_preempt_rt, partition_invalid_reason, sched_text, CgroupRoot, Interrupts, Irq,
    Task,
};
use crate::plan::{is_per_cpu_kthread, FreqLock, RuntimePlan, Source, ThreadKind};
use crate::power::{self, NvpmodelTool};
use units::cpu::CpuSet;

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

/// The most of the kernel log [`read_kernel_log`] reads.
pub const MAX_KERNEL_LOG: u64 = 8 << 20;

/// The kernel log's records (`/dev/kmsg`: `prio,seq,usec,flags;text`,
/// continuation lines start with a space), without blocking.
/// At most [`MAX_KERNEL_LOG`] bytes are read (the kernel's log buffer is
/// 2^CONFIG_LOG_BUF_SHIFT bytes, 128 KiB to a few MiB on the kernels we
/// meet): a sysroot whose `dev/kmsg` never ends is cut there.
pub fn read_kernel_log(path: &Path) -> std::io::Result<Vec<String>> {
    use std::io::Read;
    let mut f = units::bounded::Bound::pseudo(MAX_KERNEL_LOG)
        .open(path)
        .map_err(|e| e.into_io())?;
    let mut text = String::new();
    let mut buf = vec![0u8; 16 * 1024];
    while (text.len() as u64) < MAX_KERNEL_LOG {
        // /dev/kmsg returns one record per read; a plain file, chunks.
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => text.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            // EPIPE: the record was overwritten while we read; go on.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) if text.is_empty() => return Err(e),
            Err(_) => break,
        }
    }
    Ok(text
        .lines()
        .filter(|l| !l.starts_with(' '))
        .map(|l| l.split_once(';').map_or(l, |(_, msg)| msg).to_string())
        .collect())
}

/// Boot messages about the isolation parameters: warnings the kernel
/// printed while parsing them, and the tickless CPUs it settled on.
fn check_kernel_log(plan: &RuntimePlan, kmsg: &Path) -> Check {
    let lines = match read_kernel_log(kmsg) {
        Ok(lines) => lines,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return check(
                "cmdline.kernel_log",
                Status::Unsupported,
                format!("no kernel log at {}", kmsg.display()),
                None,
            )
        }
        Err(e) => {
            return check(
                "cmdline.kernel_log",
                Status::Unsupported,
                format!("cannot read the kernel log {}: {e}", kmsg.display()),
                Some("run as root (dmesg_restrict) to read the kernel's warnings about isolcpus=/nohz_full="),
            )
        }
    };
    const TOPICS: &[&str] = &[
        "isolcpus",
        "nohz_full",
        "no_hz",
        "housekeeping",
        "rcu_nocb",
        "irqaffinity",
    ];
    const TROUBLE: &[&str] = &[
        "error",
        "invalid",
        "incorrect",
        "unsupported",
        "not supported",
        "clearing",
        "must include",
        "ignor",
    ];
    let mut problems: Vec<String> = lines
        .iter()
        .filter(|l| {
            let low = l.to_ascii_lowercase();
            TOPICS.iter().any(|t| low.contains(t)) && TROUBLE.iter().any(|t| low.contains(t))
        })
        .cloned()
        .collect();
    let isolated = &plan.cpus.isolated;
    let nohz = lines
        .iter()
        .find_map(|l| l.strip_prefix("NO_HZ: Full dynticks CPUs: "));
    if plan.cmdline.iter().any(|t| t.key() == "nohz_full") {
        if let Some(cpus) = nohz {
            let cpus = cpus.trim_end_matches('.');
            if CpuSet::parse_list(cpus).ok().as_ref() != Some(isolated) {
                problems.push(format!(
                    "NO_HZ: Full dynticks CPUs: {cpus} (planned {isolated})"
                ));
            }
        }
    }
    let mut c = if problems.is_empty() {
        let seen = nohz
            .map(|n| format!("; NO_HZ: Full dynticks CPUs: {n}"))
            .unwrap_or_default();
        check(
            "cmdline.kernel_log",
            Status::Ok,
            format!(
                "no kernel warning about the isolation parameters in {} records{seen}",
                lines.len()
            ),
            None,
        )
    } else {
        check(
            "cmdline.kernel_log",
            Status::Drift,
            format!(
                "the kernel warned about the isolation parameters ({} messages)",
                problems.len()
            ),
            Some("fix the command line the messages name; `deploy plan` prints the planned one"),
        )
    };
    c.items = problems;
    c
}

/// One interrupt: `fired` is how many times it fired during the window
/// (on any CPU), `effective_after` its effective affinity read after it.
fn check_irq(
    irq: &Irq,
    want: &CpuSet,
    unmovable: bool,
    fired: u64,
    effective_after: Option<&CpuSet>,
) -> Check {
    let id = format!("irq.{}", irq.irq);
    let name = if irq.actions.is_empty() {
        "(no handler)".to_string()
    } else {
        irq.name()
    };
    let aff = irq.affinity.as_ref();
    let eff = irq.effective.as_ref();
    let aff_inside = aff.is_none_or(|a| a.is_subset(want));
    let eff_inside = eff.is_none_or(|e| e.is_subset(want));
    let after_inside = effective_after.is_none_or(|e| e.is_subset(want));
    let show = |s: Option<&CpuSet>| s.map(|s| s.to_string()).unwrap_or_else(|| "-".into());
    let detail = format!(
        "{name}: affinity {} effective {}, planned {want}",
        show(aff),
        show(eff)
    );
    if aff_inside && eff_inside {
        check(id, Status::Ok, detail, None)
    } else if aff_inside && after_inside && !unmovable {
        check(
            id,
            Status::Ok,
            format!(
                "{name}: affinity {} effective {} after it fired, planned {want} (moved during the window)",
                show(aff),
                show(effective_after)
            ),
            None,
        )
    } else if aff_inside && fired == 0 && !unmovable {
        check(
            id,
            Status::Pending,
            format!("{detail} (move pending: it did not fire in the window, and the kernel moves it at its next interrupt)"),
            Some("nothing to do: it moves by itself when it next fires (run verify again after it has)"),
        )
    } else if unmovable {
        check(
            id,
            Status::Unmovable,
            detail,
            Some("per-CPU or kernel-managed interrupt: it cannot move (isolcpus=managed_irq keeps managed ones off isolated CPUs from boot)"),
        )
    } else {
        check(id, Status::Drift, detail, Some(HINT_APPLY))
    }
}

/// Device interrupts on isolated CPUs during the window; those of the
/// interrupts in `moved` (whose effective affinity came inside the plan
/// during the window) were their move, and are listed apart.
#[allow(clippy::too_many_arguments)]
fn check_irq_activity<'p>(
    before: &Interrupts,
    after: &Interrupts,
    irqs: &[Irq],
    isolated: &CpuSet,
    want: &dyn Fn(u32) -> &'p CpuSet,
    unmovable: &dyn Fn(&Irq) -> bool,
    moved: &[u32],
    opts: &VerifyOptions,
) -> Vec<Check> {
    let by_num: BTreeMap<u32, &Irq> = irqs.iter().map(|i| (i.irq, i)).collect();
    let mut drift = Vec::new();
    let mut pinned = Vec::new();
    let mut moving = Vec::new();
    for (id, cpu, n) in before.deltas(after) {
        let Ok(num) = id.parse::<u32>() else {
            // Named rows (LOC, RES, IPIs) are per-CPU by nature.
            continue;
        };
        if !isolated.contains(cpu) || want(num).contains(cpu) {
            continue;
        }
        let name = by_num.get(&num).map(|i| i.name()).unwrap_or_default();
        let line = format!("irq {num} {name} fired {n} times on CPU {cpu}");
        match by_num.get(&num) {
            Some(i) if unmovable(i) => pinned.push(line),
            _ if moved.contains(&num) => moving.push(format!("{line}, then moved")),
            _ => drift.push(line),
        }
    }
    let window = match &opts.interrupts_after {
        Some(p) => format!("between /proc/interrupts and {}", p.display()),
        None => format!("in {} ms", opts.sample_window.as_millis()),
    };
    let mut out = Vec::new();
    let mut c = if drift.is_empty() && !moving.is_empty() {
        let mut c = check(
            "irq.activity",
            Status::Ok,
            format!("no device interrupt on isolated CPUs {isolated} {window} but the moves of interrupts whose affinity had been set"),
            None,
        );
        c.items = std::mem::take(&mut moving);
        c
    } else if drift.is_empty() {
        check(
            "irq.activity",
            Status::Ok,
            format!("no device interrupt on isolated CPUs {isolated} {window}"),
            None,
        )
    } else {
        check(
            "irq.activity",
            Status::Drift,
            format!(
                "{} device interrupts fired on isolated CPUs {window}",
                drift.len()
            ),
            Some(HINT_APPLY),
        )
    };
    if c.items.is_empty() {
        c.items = drift;
        c.items.extend(moving);
    }
    out.push(c);
    if !pinned.is_empty() {
        let mut c = check(
            "irq.activity.unmovable",
            Status::Unmovable,
            format!("unmovable interrupts fired on isolated CPUs {window}"),
            Some("per-CPU or kernel-managed interrupts cannot move: nohz_full keeps timer ticks rare, isolcpus=managed_irq keeps managed ones off isolated CPUs from boot"),
        );
        c.items = pinned;
        out.push(c);
    }
    out
}

/// Tasks the supervisor put in `rtdeploy/rt` (and their children, which
/// inherit the cgroup): process ids under cgroup v2 (`cgroup.procs`),
/// thread ids under v1 (`tasks`).
#[derive(Debug, Default)]
struct RtMembers {
    pids: Vec<u32>,
    tids: Vec<u32>,
}

fn rt_cgroup_members(root: &Path) -> Result<RtMembers, VerifyRunError> {
    let ids = |abs: String| -> Result<Vec<u32>, VerifyRunError> {
        Ok(read_opt(&sys_path(root, &abs))?
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    };
    Ok(match find_cgroup_root(root)? {
        CgroupRoot::V2(m) => RtMembers {
            pids: ids(format!("{m}/rtdeploy/rt/cgroup.procs"))?,
            tids: Vec::new(),
        },
        CgroupRoot::V1(m) => RtMembers {
            pids: Vec::new(),
            tids: ids(format!("{m}/rtdeploy/rt/tasks"))?,
        },
        CgroupRoot::None => RtMembers::default(),
    })
}

/// Tasks that may run on the isolated CPUs and should not: not bound to one
/// CPU by the kernel, not placed there by the plan, not in `rtdeploy/rt`,
/// not one of the robot's processes.
fn check_foreign_tasks(
    tasks: &[Task],
    plan: &RuntimePlan,
    opts: &VerifyOptions,
    in_rt: &RtMembers,
) -> Vec<Check> {
    let isolated = &plan.cpus.isolated;
    let planned_on_isolated: Vec<u32> = plan
        .threads
        .iter()
        .filter(|t| {
            t.cpus.as_ref().is_some_and(|c| !c.is_disjoint(isolated))
                || t.kind == ThreadKind::Irq && t.cpus.is_none()
        })
        .map(|t| t.pid)
        .collect();
    let mut foreign = Vec::new();
    let mut pinned = Vec::new();
    for t in tasks {
        if t.cpus_allowed.is_disjoint(isolated)
            || is_per_cpu_kthread(t)
            || planned_on_isolated.contains(&t.pid)
            || in_rt.pids.contains(&t.pid)
            || in_rt.tids.contains(&t.tid)
            || opts.allow_tasks.iter().any(|g| glob_match(g, &t.comm))
        {
            continue;
        }
        let line = format!("{} `{}` may run on {}", t.tid, t.comm, t.cpus_allowed);
        if t.kernel_thread && t.no_setaffinity {
            pinned.push(line);
        } else {
            foreign.push(line);
        }
    }
    let mut out = Vec::new();
    let mut c = if foreign.is_empty() {
        check(
            "tasks.isolated",
            Status::Ok,
            format!("no foreign task may run on {isolated}"),
            None,
        )
    } else {
        check(
            "tasks.isolated",
            Status::Drift,
            format!("{} tasks may run on isolated CPUs {isolated}", foreign.len()),
            Some("boot with the planned isolcpus= (new tasks then start on housekeeping CPUs) and let the supervisor place its processes; kernel threads move with `deploy apply`"),
        )
    };
    c.items = foreign;
    out.push(c);
    if !pinned.is_empty() {
        let mut c = check(
            "tasks.isolated.pinned",
            Status::Unmovable,
            format!("{} kernel-pinned threads may run on isolated CPUs", pinned.len()),
            Some("workqueue workers follow the workqueue cpumask once idle; isolcpus= keeps them off at boot"),
        );
        c.items = pinned;
        out.push(c);
    }
    out
}

fn check_cgroups(plan: &RuntimePlan, root: &Path) -> Result<Vec<Check>, VerifyRunError> {
    let g = &plan.cgroups;
    let mut out = Vec::new();
    let cpus_check = |id: &str, abs: &str, want: &CpuSet| -> Result<Check, VerifyRunError> {
        Ok(match read_cpu_list(&sys_path(root, abs))? {
            Some(c) if &c == want => check(id, Status::Ok, format!("{abs} = {c}"), None),
            Some(c) => check(
                id,
                Status::Drift,
                format!("{abs} = {c}, planned {want}"),
                Some(HINT_APPLY),
            ),
            None => check(
                id,
                Status::Drift,
                format!("{abs} does not exist"),
                Some(HINT_APPLY),
            ),
        })
    };
    let cgroup = find_cgroup_root(root)?;
    let m = match &cgroup {
        CgroupRoot::None => {
            out.push(check(
                "cgroup",
                Status::Unsupported,
                "no cgroup hierarchy with the cpuset controller is mounted",
                Some("enable CONFIG_CPUSETS and mount cgroup2 (or the v1 cpuset hierarchy)"),
            ));
            return Ok(out);
        }
        CgroupRoot::V2(m) | CgroupRoot::V1(m) => m,
    };
    for (name, want) in [("rt", &g.rt), ("housekeeping", &g.housekeeping)] {
        out.push(cpus_check(
            &format!("cgroup.{name}.cpus"),
            &format!("{m}/rtdeploy/{name}/cpuset.cpus"),
            want,
        )?);
    }
    match (&cgroup, g.partition_value()) {
        (CgroupRoot::V2(_), Some(kind)) => out.push(check_partition_v2(root, m, kind)?),
        (CgroupRoot::V1(_), Some(_)) => out.push(check_exclusive_v1(root, m)?),
        _ => {}
    }
    Ok(out)
}

/// The cgroup v2 partition of rtdeploy/rt under the mount `m`.
fn check_partition_v2(root: &Path, m: &str, kind: &str) -> Result<Check, VerifyRunError> {
    let abs = format!("{m}/rtdeploy/rt/cpuset.cpus.partition");
    let exclusive = sys_path(root, &format!("{m}/rtdeploy/cpuset.cpus.exclusive")).exists();
    Ok(match read_opt(&sys_path(root, &abs))? {
        _ if !exclusive && sys_path(root, &format!("{m}/rtdeploy")).is_dir() => check(
            "cgroup.rt.partition",
            Status::Unsupported,
            "nested partitions need cpuset.cpus.exclusive (Linux 6.7+)",
            Some("the command line's isolcpus= isolates without a partition"),
        ),
        None => check("cgroup.rt.partition", Status::Drift, format!("{abs} does not exist"), Some(HINT_APPLY)),
        Some(v) => match partition_invalid_reason(&v) {
            Some(reason) => check(
                "cgroup.rt.partition",
                Status::Drift,
                format!("partition invalid: {reason} ({abs} = `{}`)", v.trim()),
                Some("the kernel refused the partition: a partition under rtdeploy needs the CPUs in cpuset.cpus.exclusive of rtdeploy and rtdeploy/rt (`deploy apply` writes both); a partition that mixes isolcpus= CPUs with housekeeping ones conflicts with the housekeeping setup; or set cpus.partition: none"),
            ),
            None if v.trim() == kind => check("cgroup.rt.partition", Status::Ok, format!("partition {kind}"), None),
            None => check(
                "cgroup.rt.partition",
                Status::Drift,
                format!("partition `{}`, planned {kind}", v.trim()),
                Some(HINT_APPLY),
            ),
        },
    })
}

/// The cgroup v1 `cpu_exclusive` flag of rtdeploy/rt under the mount `m`.
fn check_exclusive_v1(root: &Path, m: &str) -> Result<Check, VerifyRunError> {
    let abs = format!("{m}/rtdeploy/rt/cpuset.cpu_exclusive");
    Ok(match read_opt(&sys_path(root, &abs))? {
        Some(v) if v.trim() == "1" => check(
            "cgroup.rt.exclusive",
            Status::Ok,
            "v1 cpuset rtdeploy/rt is cpu_exclusive",
            None,
        ),
        Some(v) => check(
            "cgroup.rt.exclusive",
            Status::Drift,
            format!("{abs} = {}, planned 1", v.trim()),
            Some(HINT_APPLY),
        ),
        None => check(
            "cgroup.rt.exclusive",
            Status::Drift,
            format!("{abs} does not exist"),
            Some(HINT_APPLY),
        ),
    })
}

fn check_cpufreq(plan: &RuntimePlan, root: &Path) -> Result<Vec<Check>, VerifyRunError> {
    let f = &plan.cpufreq;
    if f.governor.is_none() && f.lock_cpus.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for cpu in plan.cpus.all.iter() {
        let dir = format!("/sys/devices/system/cpu/cpu{cpu}/cpufreq");
        if !sys_path(root, &dir).is_dir() {
            out.push(check(
                format!("cpufreq.cpu{cpu}"),
                Status::Unsupported,
                format!("{dir} does not exist (no cpufreq driver)"),
                None,
            ));
            continue;
        }
        let read = |name: &str| read_opt(&sys_path(root, &format!("{dir}/{name}")));
        if let Some(want) = &f.governor {
            let id = format!("cpufreq.cpu{cpu}.governor");
            out.push(match read("scaling_governor")? {
                Some(g) if g.trim() == want => {
                    check(id, Status::Ok, format!("governor {want}"), None)
                }
                Some(g) => check(
                    id,
                    Status::Drift,
                    format!("governor {}, planned {want}", g.trim()),
                    Some(HINT_APPLY),
                ),
                None => check(id, Status::Unsupported, "no scaling_governor", None),
            });
        }
        if f.lock_cpus.contains(cpu) {
            let id = format!("cpufreq.cpu{cpu}.locked");
            // The nvpmodel mode's cap, when the clock is pinned to it.
            let cap = match f.lock_to {
                FreqLock::CurrentMax => None,
                FreqLock::Khz { khz } => Some(khz.to_string()),
                FreqLock::HardwareMax => read("cpuinfo_max_freq")?.map(|t| t.trim().to_string()),
            };
            out.push(
                match (read("scaling_min_freq")?, read("scaling_max_freq")?) {
                    (Some(lo), Some(hi))
                        if lo.trim() == hi.trim()
                            && cap.as_ref().is_some_and(|c| c != hi.trim()) =>
                    {
                        check(
                            id,
                            Status::Drift,
                            format!(
                                "min = max = {} kHz, the nvpmodel mode's cap is {} kHz",
                                hi.trim(),
                                cap.as_deref().unwrap_or_default()
                            ),
                            Some(HINT_APPLY),
                        )
                    }
                    (Some(lo), Some(hi)) if lo.trim() == hi.trim() => check(
                        id,
                        Status::Ok,
                        format!("min = max = {} kHz", hi.trim()),
                        None,
                    ),
                    (Some(lo), Some(hi)) => check(
                        id,
                        Status::Drift,
                        format!("min {} kHz, max {} kHz: not locked", lo.trim(), hi.trim()),
                        Some(HINT_APPLY),
                    ),
                    _ => check(
                        id,
                        Status::Unsupported,
                        "no scaling_min_freq/scaling_max_freq",
                        None,
                    ),
                },
            );
        }
    }
    Ok(out)
}

/// The CPUs the plan uses are online, and the nvpmodel mode is the one
/// robot.yaml names (also the supervisor's gate before its boot check).
pub fn power_checks(plan: &RuntimePlan, root: &Path) -> Result<Vec<Check>, VerifyRunError> {
    let mut out = Vec::new();
    let want = &plan.power.cpus_in_use;
    let online = read_cpu_list(&sys_path(root, "/sys/devices/system/cpu/online"))?;
    let nvp = plan.power.nvpmodel.as_ref();
    out.push(match &online {
        None => check(
            "cpus.online",
            Status::Unsupported,
            "/sys/devices/system/cpu/online does not exist",
            None,
        ),
        Some(on) if want.is_subset(on) => check(
            "cpus.online",
            Status::Ok,
            format!("CPUs {on} online, the plan uses {want}"),
            None,
        ),
        Some(on) => check(
            "cpus.online",
            Status::Drift,
            format!(
                "CPUs {} the plan uses are offline (online: {on}; the plan uses {want})",
                want.difference(on)
            ),
            Some(match nvp {
                Some(_) => "set the nvpmodel mode robot.yaml names (`deploy apply`) and reboot, or bring the CPUs online (echo 1 > /sys/devices/system/cpu/cpuN/online)",
                None => "bring the CPUs online (echo 1 > /sys/devices/system/cpu/cpuN/online) or choose an nvpmodel mode that keeps them online (`power.nvpmodel`) and reboot",
            }),
        ),
    });
    let Some(m) = nvp else {
        return Ok(out);
    };
    const HINT_MODE: &str =
        "run `deploy apply` (it runs nvpmodel -m; reboot when it says a reboot is required)";
    // nvpmodel's own record of the mode, else its answer.
    let status_path = sys_path(root, power::STATUS_FILE);
    let (live, source) = match read_opt(&status_path)? {
        Some(text) => (
            power::parse_status(&text).map(|id| power::LiveMode {
                id,
                name: power::find_conf(&m.conf)
                    .and_then(|c| c.mode(id))
                    .map(|md| md.name.to_string())
                    .unwrap_or_default(),
            }),
            power::STATUS_FILE.to_string(),
        ),
        None => match NvpmodelTool::find(root) {
            Some(tool) => match tool.query() {
                Ok(live) => (Some(live), "nvpmodel -q".to_string()),
                Err(e) => {
                    out.push(check(
                        "power.nvpmodel",
                        Status::Unsupported,
                        format!(
                            "no {} and nvpmodel does not answer: {}",
                            power::STATUS_FILE,
                            units::error::Chain(&e)
                        ),
                        None,
                    ));
                    return Ok(out);
                }
            },
            None => {
                out.push(check(
                    "power.nvpmodel",
                    Status::Unsupported,
                    format!(
                        "neither {} nor an nvpmodel binary: the power mode cannot be read",
                        power::STATUS_FILE
                    ),
                    None,
                ));
                return Ok(out);
            }
        },
    };
    let planned = format!("{} ({}, L4T {})", m.label(), m.conf, m.release);
    out.push(match live {
        None => check(
            "power.nvpmodel",
            Status::Drift,
            format!("{source} holds no mode (`pmode:NNNN`), planned {planned}"),
            Some(HINT_MODE),
        ),
        Some(live) if live.id != m.id => check(
            "power.nvpmodel",
            Status::Drift,
            format!("nvpmodel mode {live} is set ({source}), planned {planned}"),
            Some(HINT_MODE),
        ),
        Some(live) if online.as_ref().is_some_and(|on| on != &m.online) => check(
            "power.nvpmodel",
            Status::Drift,
            format!(
                "nvpmodel mode {live} is set ({source}) but CPUs {} are online, the mode keeps {}",
                online.as_ref().map(|c| c.to_string()).unwrap_or_default(),
                m.online
            ),
            Some("reboot: nvpmodel changes the online CPUs at boot"),
        ),
        Some(live) => check(
            "power.nvpmodel",
            Status::Ok,
            format!("nvpmodel mode {live} ({source}), CPUs {} online", m.online),
            None,
        ),
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn irq(affinity: &str, effective: &str) -> Irq {
        Irq {
            irq: 31,
            actions: vec!["virtio0-stats".into()],
            chip: "PCI-MSIX-0000:00:03.0".into(),
            hwirq: Some(1),
            affinity: Some(CpuSet::parse_list(affinity).unwrap()),
            effective: Some(CpuSet::parse_list(effective).unwrap()),
            interfaces: Vec::new(),
        }
    }

    fn interrupts(cpu0: u64, cpu1: u64) -> Interrupts {
        let text = format!(
            "           CPU0       CPU1\n 31: {cpu0} {cpu1} PCI-MSIX-0000:00:03.0 1-edge virtio0-stats\n"
        );
        Interrupts::parse(&text, Path::new("/proc/interrupts")).unwrap()
    }

    #[test]
    fn a_move_waiting_for_the_next_interrupt_is_pending_then_ok_or_drift() {
        let want = CpuSet::parse_list("0").unwrap();
        let i = irq("0", "1");
        let after = |e: &str| CpuSet::parse_list(e).unwrap();
        // Silent during the window, still on CPU 1: pending.
        let c = check_irq(&i, &want, false, 0, Some(&after("1")));
        assert_eq!(c.status, Status::Pending, "{c:?}");
        // Fired, and moved by the time the window ended: ok.
        let c = check_irq(&i, &want, false, 1, Some(&after("0")));
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(c.detail.ends_with("(moved during the window)"), "{c:?}");
        // Fired, and still on CPU 1: drift.
        let c = check_irq(&i, &want, false, 4, Some(&after("1")));
        assert_eq!(c.status, Status::Drift, "{c:?}");
        // Its affinity itself is wrong: drift however quiet it was.
        let c = check_irq(&irq("1", "1"), &want, false, 0, Some(&after("1")));
        assert_eq!(c.status, Status::Drift, "{c:?}");
    }

    #[test]
    fn the_interrupt_that_moved_it_is_not_activity_on_the_isolated_cpu() {
        let isolated = CpuSet::parse_list("1").unwrap();
        let want = CpuSet::parse_list("0").unwrap();
        let irqs = [irq("0", "1")];
        let (before, after) = (interrupts(10, 5), interrupts(10, 6));
        let opts = VerifyOptions::default();
        let run = |moved: &[u32]| {
            check_irq_activity(
                &before,
                &after,
                &irqs,
                &isolated,
                &|_| &want,
                &|_| false,
                moved,
                &opts,
            )
        };
        let c = &run(&[31])[0];
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert_eq!(
            c.items,
            ["irq 31 virtio0-stats fired 1 times on CPU 1, then moved"]
        );
        let c = &run(&[])[0];
        assert_eq!(c.status, Status::Drift, "{c:?}");
        assert_eq!(c.items, ["irq 31 virtio0-stats fired 1 times on CPU 1"]);
    }
}
