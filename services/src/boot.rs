//! The supervisor's boot on a robot: what robot.yaml asks of the start and
//! of the running supervisor beyond its own work, done through the crates
//! below it. In order: the CPU plan applied (cpusets, as `deploy apply`
//! does, with the state file `deploy verify` reads), the boot timing check
//! (the `check` engine, shortened to `boot_check.duration`) kept in the
//! boot history, then while the supervisor runs the IRQ scans
//! (`irqs.rescan`), the tracing of the processes' misses
//! (`check.trace_on_miss`) and the loading of a later release's robot.yaml.
//!
//! [`RobotBoot`] is that work for one robot, given to the supervisor as its
//! [`Boot`]; [`supervisor_config`] is the supervisor's part of robot.yaml.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cpusets::apply::{self as cpu_apply, ApplyOptions};
use cpusets::apply_state::ApplyState;
use cpusets::rescan::IrqWatch;
use units::error::Chain;

use crate::boot_history::BootRecord;
use crate::robot::Robot;
use crate::status::{ReleaseStatus, StepStatus};
use crate::supervisor::{
    Boot, BootCheckOutcome, ConfigHook, Options, SupervisorConfig, TraceTurn, TracedMiss,
};

/// Jetson Linux's `nvbootctrl`, under the sysroot.
const NVBOOTCTRL: &str = "/usr/sbin/nvbootctrl";

/// Where the boot works and what it was told.
#[derive(Debug, Clone)]
pub struct BootSetup {
    /// The install prefix (`/` on a robot).
    pub prefix: PathBuf,
    /// `/proc` and `/sys` are under this directory (`/` on a robot).
    pub sysroot: PathBuf,
    /// Do not apply the CPU plan (development machines and tests): the
    /// status says it was skipped, and no IRQ scan runs.
    pub skip_cpu_plan: bool,
    /// The robot.yaml loaded is the current release's: a release the
    /// processes restart from later (a trial, a rollback) brings its own.
    pub follows_releases: bool,
}

/// Why the supervisor's options could not be made from robot.yaml.
#[derive(Debug, thiserror::Error)]
pub enum BootOptionsError {
    #[error("metrics.textfile: {0}")]
    MetricsTextfile(units::path::PathJoinError),
}

/// The supervisor's boot for one robot (see the module's documentation).
pub struct RobotBoot {
    robot: Robot,
    setup: BootSetup,
    trace: Option<MissTrace>,
    /// The tracer, once started.
    running: Option<check::trace::watch::RuntimeTrace>,
    trace_started: bool,
    /// The interrupts and IRQ threads known at the last scan.
    irqs: Option<IrqWatch>,
    /// The last scan's error, said once rather than every period.
    scan_error: Option<String>,
    /// The rootfs A/B slots, once read (`Some(None)`: no A/B).
    slots: Option<Option<crate::rootfs_slots::RootfsSlots>>,
}

impl RobotBoot {
    pub fn new(robot: Robot, setup: BootSetup) -> RobotBoot {
        let trace = MissTrace::of(&robot, &setup);
        RobotBoot {
            robot,
            setup,
            trace,
            running: None,
            trace_started: false,
            irqs: None,
            scan_error: None,
            slots: None,
        }
    }

    /// The supervisor's part of robot.yaml (see [`supervisor_config`]).
    pub fn config(&self) -> SupervisorConfig {
        supervisor_config(&self.robot, self.trace.as_ref())
    }

    /// `base` with what robot.yaml says of the supervisor's running: the
    /// trial's health window and releases kept, the IRQ rescans (none
    /// without the CPU plan), the metrics textfile (under the prefix).
    pub fn options(&self, base: Options) -> Result<Options, BootOptionsError> {
        let r = &self.robot;
        let metrics_textfile = match &r.metrics.textfile {
            // Absolute paths are on the robot's root, under the prefix
            // like every other on-robot path (validated: no `..`).
            Some(t) => Some((
                units::path::join_under(&self.setup.prefix, t)
                    .map_err(BootOptionsError::MetricsTextfile)?,
                r.metrics.every.0,
            )),
            None => None,
        };
        Ok(Options {
            health_window: r.update.health_window.0,
            keep: r.update.keep,
            irq_scan_every: if self.setup.skip_cpu_plan {
                None
            } else {
                r.irqs.rescan_every()
            },
            metrics_textfile,
            watchdog: r.watchdog.clone(),
            ..base
        })
    }

    fn sys(&self, abs: &str) -> PathBuf {
        under(&self.setup.sysroot, abs)
    }
}

impl Boot for RobotBoot {
    fn apply_cpu_plan(&mut self) -> StepStatus {
        if self.setup.skip_cpu_plan {
            return StepStatus {
                step: "cpu plan".into(),
                result: "skipped".into(),
                detail: "--skip-cpu-plan".into(),
            };
        }
        // What exists before the plan is applied is placed by it; what a
        // later scan finds beyond this is placed then.
        if let Ok(w) = IrqWatch::read(&self.setup.sysroot) {
            self.irqs = Some(w);
        }
        apply_cpu_plan(&self.setup, &self.robot)
    }

    fn boot_check(&mut self, duration: Duration, release: &ReleaseStatus) -> BootCheckOutcome {
        let slots = self.rootfs_slots();
        let at_boot = AtBoot::of(&self.setup, &self.robot, release, slots.as_ref());
        boot_check(&self.setup, &self.robot, duration, &at_boot)
    }

    /// Read where efivarfs says rootfs A/B is on (a Jetson), with the
    /// system's `nvbootctrl`; once.
    fn rootfs_slots(&mut self) -> Option<crate::rootfs_slots::RootfsSlots> {
        if self.slots.is_none() {
            self.slots = Some(crate::rootfs_slots::RootfsSlots::read(
                &self.sys("/sys/firmware/efi/efivars"),
                &self.sys(NVBOOTCTRL),
            ));
        }
        self.slots.clone().flatten()
    }

    fn confirm_rootfs_slot(&mut self) -> Option<Result<String, String>> {
        self.rootfs_slots()?;
        Some(crate::rootfs_slots::confirm(&self.sys(NVBOOTCTRL)))
    }

    fn scan_irqs(&mut self) -> Option<StepStatus> {
        if self.setup.skip_cpu_plan {
            return None;
        }
        scan_irqs(
            &self.setup,
            &self.robot,
            &mut self.irqs,
            &mut self.scan_error,
        )
    }

    fn watch_traces(&mut self) -> Option<TraceTurn> {
        let trace = self.trace.as_ref()?;
        let mut turn = TraceTurn::default();
        if !std::mem::replace(&mut self.trace_started, true) {
            match check::trace::watch::RuntimeTrace::start(
                &self.sys("/sys"),
                &self.sys("/proc"),
                &trace.cpus,
                trace.dir.clone(),
                trace.keep,
            ) {
                Ok(t) => {
                    turn.say.push(format!(
                        "miss trace: recording on CPUs {:?} in {}, misses saved in {} (at most {} of each kind){}",
                        trace.cpus,
                        t.tracer().dir().display(),
                        trace.dir.display(),
                        trace.keep,
                        if t.tracer().missing.is_empty() {
                            String::new()
                        } else {
                            format!("; not traced: {}", t.tracer().missing.join(", "))
                        }
                    ));
                    turn.say.extend(t.tracer().notes.iter().cloned());
                    self.running = Some(t);
                }
                Err(e) => turn.say.push(format!("miss trace off: {}", Chain(&e))),
            }
            return Some(turn);
        }
        if let Some(m) = self.running.as_mut().and_then(|t| t.poll()) {
            if let Some(p) = &m.problem {
                turn.say.push(format!("a traced miss was not saved: {p}"));
            }
            turn.misses.push(TracedMiss {
                pid: m.receiver_pid,
                verdict: m.verdict,
                file: m.text.map(|p| p.display().to_string()),
            });
        }
        Some(turn)
    }

    fn release_config(&mut self) -> Option<ConfigHook> {
        if !self.setup.follows_releases {
            return None;
        }
        let trace = self.trace.clone();
        Some(Box::new(move |path| {
            crate::robot::load(path).map(|l| supervisor_config(&l.robot, trace.as_ref()))
        }))
    }
}

/// The tracing of the running processes' misses: robot.yaml
/// `check.trace_on_miss` with a process that has a `budgets.wakeup`. The
/// instance is this process's (its path known before it exists, for the
/// processes' environment).
#[derive(Debug, Clone)]
pub struct MissTrace {
    /// `None` without tracefs: the processes are not told of one.
    instance: Option<PathBuf>,
    cpus: Vec<usize>,
    dir: PathBuf,
    keep: usize,
}

impl MissTrace {
    fn of(robot: &Robot, setup: &BootSetup) -> Option<MissTrace> {
        let keep = robot.check.trace_on_miss? as usize;
        if !robot.processes.iter().any(|p| p.budgets.wakeup.is_some()) {
            return None;
        }
        let req = robot.trace_request(&setup.prefix, false, None)?;
        // Without tracefs the watch's start says why.
        let instance = check::trace::tracefs::instance_dir(&under(&setup.sysroot, "/sys")).ok();
        // The isolated CPUs, and those of every process with a wakeup
        // budget and of the publishers of what they subscribe to: the
        // receiver's and the sender's side of each miss.
        let budgeted: Vec<_> = robot
            .processes
            .iter()
            .filter(|p| p.budgets.wakeup.is_some())
            .collect();
        let mut cpus: BTreeSet<usize> = robot.cpus.isolated.iter().map(|c| c as usize).collect();
        for p in &robot.processes {
            let feeds = p
                .publishes
                .iter()
                .any(|c| budgeted.iter().any(|b| b.subscribes.contains(c)));
            if feeds || p.budgets.wakeup.is_some() {
                cpus.extend(robot.process_cpus(p).iter().map(|c| c as usize));
            }
        }
        Some(MissTrace {
            instance,
            cpus: cpus.into_iter().collect(),
            dir: req.dir,
            keep,
        })
    }
}

/// The supervisor's part of robot.yaml; with `trace`, the processes with
/// a wakeup budget are told where to write their markers and what a miss
/// is (see `controller::miss_trace`).
pub fn supervisor_config(robot: &Robot, trace: Option<&MissTrace>) -> SupervisorConfig {
    let mut processes = robot.processes.clone();
    // Each process's wake class, from robot.yaml (config check refuses
    // these variables in a process's own `env`).
    for (p, c) in processes.iter_mut().zip(robot.wake_classes()) {
        let env = crate::wake_class::environment(p, c.class);
        p.env
            .extend(env.to_env().into_iter().map(|(k, v)| (k.to_string(), v)));
    }
    if let Some(instance) = trace.and_then(|t| t.instance.as_ref()) {
        for p in &mut processes {
            if let Some(b) = p.budgets.wakeup {
                let env = units::env::ProcessEnv {
                    trace: Some(instance.clone()),
                    trace_miss_ns: Some(b.as_nanos()),
                    ..units::env::ProcessEnv::default()
                };
                p.env
                    .extend(env.to_env().into_iter().map(|(k, v)| (k.to_string(), v)));
            }
        }
    }
    SupervisorConfig {
        robot: robot.robot.clone(),
        cpus: robot
            .processes
            .iter()
            .map(|p| robot.process_cpus(p))
            .collect(),
        processes,
        channels: robot.channels.clone(),
        boot_check: robot.boot_check.clone(),
        cpu_dma_latency: robot.power.cpu_dma_latency.map(|m| m.0),
        log: robot.log.clone(),
        housekeeping: robot.housekeeping(),
    }
}

/// The cpusets runtime plan for this machine, applied (as `deploy apply`
/// does, including the state file `deploy verify` reads).
fn apply_cpu_plan(setup: &BootSetup, robot: &Robot) -> StepStatus {
    let step = |result: &str, detail: String| StepStatus {
        step: "cpu plan".into(),
        result: result.into(),
        detail,
    };
    let plan = match robot.cpu_plan(&setup.sysroot) {
        Ok(p) => p,
        Err(e) => return step("failed", Chain(&e).to_string()),
    };
    let report = match cpu_apply::apply(
        &plan,
        &setup.sysroot,
        &ApplyOptions::for_sysroot(&setup.sysroot, false),
    ) {
        Ok(r) => r,
        Err(e) => return step("failed", e.to_string()),
    };
    let path = releases::Layout::new(&setup.prefix).cpusets_apply_state();
    let saved = ApplyState::from_report(&report).write(&path);
    let s = report.summary();
    let mut detail = format!(
        "cgroup {}: {} changed, {} unchanged, {} unmovable, {} unsupported, {} invalid, {} failed",
        report.cgroup, s.changed, s.unchanged, s.unmovable, s.unsupported, s.invalid, s.failed
    );
    if let Err(e) = saved {
        detail.push_str(&format!("; {}", Chain(&e)));
    }
    if s.failed > 0 || s.invalid > 0 {
        step("failed", failure_detail(&report, &detail))
    } else {
        step("ok", detail)
    }
}

/// What failed in an applied CPU plan, in words: when every failure was a
/// refused permission (a supervisor started as a user), that and the fix;
/// otherwise the first failures, each as the kernel said it.
fn failure_detail(report: &cpu_apply::ApplyReport, counts: &str) -> String {
    let failed: Vec<&cpu_apply::Action> = report
        .actions
        .iter()
        .filter(|a| {
            matches!(
                a.outcome,
                cpu_apply::Outcome::Failed { .. } | cpu_apply::Outcome::Invalid { .. }
            )
        })
        .collect();
    const SHOWN: usize = 3;
    let mut first: Vec<String> = failed
        .iter()
        .take(SHOWN)
        .map(|a| a.outcome.to_string())
        .collect();
    if failed.len() > SHOWN {
        first.push(format!(
            "and {} more (`deploy apply --dry-run` lists each)",
            failed.len() - SHOWN
        ));
    }
    if failed.iter().all(|a| a.outcome.is_permission_denied()) {
        // /proc/self belongs to the process's effective uid.
        let who = std::fs::metadata("/proc/self")
            .map(|m| format!("uid {}", std::os::unix::fs::MetadataExt::uid(&m)))
            .unwrap_or_else(|_| "a user".into());
        format!(
            "{} of {} writes to /proc and /sys were refused: applying the CPU plan needs root \
             (the supervisor runs as {who}); run it as root, or pass --skip-cpu-plan \
             where no CPU plan is wanted (a development machine); first: {}",
            failed.len(),
            report.actions.len(),
            first.join("; ")
        )
    } else {
        format!("{counts}; {}", first.join("; "))
    }
}

/// One scan for interrupts and IRQ threads that appeared since the last
/// (`irqs.rescan`): when something did, the plan is applied again (only
/// what differs changes) and the status says what was placed. A scan that
/// cannot read /proc says so once, not every period.
fn scan_irqs(
    setup: &BootSetup,
    robot: &Robot,
    known: &mut Option<IrqWatch>,
    last_error: &mut Option<String>,
) -> Option<StepStatus> {
    let scanned = match known.as_ref() {
        Some(k) => k.rescan(&setup.sysroot),
        None => IrqWatch::read(&setup.sysroot),
    };
    let now = match scanned {
        Ok(w) => w,
        Err(e) => {
            let msg = Chain(&e).to_string();
            if last_error.as_deref() == Some(msg.as_str()) {
                return None;
            }
            *last_error = Some(msg.clone());
            return Some(StepStatus {
                step: "irq scan".into(),
                result: "failed".into(),
                detail: msg,
            });
        }
    };
    *last_error = None;
    let appeared = known.as_ref().map(|k| k.appeared(&now)).unwrap_or_default();
    let first = known.is_none();
    *known = Some(now);
    if first || appeared.is_empty() {
        return None;
    }
    let st = apply_cpu_plan(setup, robot);
    Some(StepStatus {
        step: "irq scan".into(),
        result: st.result,
        detail: format!("placed {}: {}", appeared.describe(), st.detail),
    })
}

/// The boot timing check: `deploy check`'s engine, shortened to
/// `boot_check.duration`; the report goes to
/// `<prefix>/var/lib/rtdeploy/boot-check.json`.
fn boot_check(
    setup: &BootSetup,
    robot: &Robot,
    duration: Duration,
    at_boot: &AtBoot,
) -> BootCheckOutcome {
    // A power mode that switched off a planned CPU, or another mode than
    // robot.yaml names, fails the check before any timing is measured.
    if let Ok(plan) = robot.cpu_plan(&setup.sysroot) {
        if let Ok(checks) = cpusets::verify::power_checks(&plan, &setup.sysroot) {
            let off: Vec<String> = checks
                .iter()
                .filter(|c| c.status == cpusets::verify::Status::Drift)
                .map(|c| format!("{}: {}", c.id, c.detail))
                .collect();
            if !off.is_empty() {
                return BootCheckOutcome::Failed(format!(
                    "the board is not as planned: {}",
                    off.join("; ")
                ));
            }
        }
    }
    let mut inputs = robot.check_inputs();
    inputs.duration = Some(units::duration::Dur(duration));
    inputs.trace = robot.trace_request(&setup.prefix, false, None);
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            return BootCheckOutcome::Failed(format!(
                "cannot find the deploy binary for the check workers: {e}"
            ))
        }
    };
    let path = releases::Layout::new(&setup.prefix).boot_check_report();
    let result = check::run_boot(&inputs, &setup.prefix, &setup.sysroot, &exe, &path);
    let kept = keep_in_history(setup, robot, &result, at_boot);
    match result {
        Ok(r) if r.passed() => BootCheckOutcome::Passed(format!("report {}{kept}", path.display())),
        Ok(r) => BootCheckOutcome::Failed(format!(
            "over budget: {} (report {}){}{kept}",
            r.failed.join(", "),
            path.display(),
            last_trace_verdict(&r)
        )),
        Err(e) => BootCheckOutcome::Failed(format!("could not run: {}{kept}", Chain(&e))),
    }
}

/// Adds this boot check to the history (`boot_check.history` kept);
/// returns `; ...` for the status when that failed or dropped damaged
/// lines of the old file, else nothing.
fn keep_in_history(
    setup: &BootSetup,
    robot: &Robot,
    result: &Result<check::CheckReport, check::CheckRunError>,
    at_boot: &AtBoot,
) -> String {
    let layout = releases::Layout::new(&setup.prefix);
    let release = std::fs::read_link(layout.current())
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()));
    let record = at_boot.add_to(boot_record(result, release, || {
        check::host::read_host_facts(&setup.sysroot).kernel_release
    }));
    let path = layout.boot_check_history();
    match crate::boot_history::append(&path, record, robot.boot_check.history as usize) {
        Ok((notes, _)) if notes.is_empty() => String::new(),
        Ok((notes, skipped)) => format!(
            "; history {}: {skipped} damaged line(s) dropped ({})",
            path.display(),
            notes[0]
        ),
        Err(e) => format!("; {}", Chain(&e)),
    }
}

/// What the boot history keeps of a boot beside its check: the boot
/// loader's count, the fallback the release recovery made, the watchdog
/// as the kernel showed it before the supervisor took it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AtBoot {
    pub boot_loader: Option<crate::boot_history::BootAttempt>,
    pub fallback: Option<String>,
    pub watchdog: Option<String>,
    pub rootfs_slots: Option<String>,
}

impl AtBoot {
    /// From what the release recovery at this start found (`release`),
    /// robot.yaml's `watchdog:` read in sysfs under the sysroot and the
    /// rootfs A/B slots as the start read them.
    pub fn of(
        setup: &BootSetup,
        robot: &Robot,
        release: &ReleaseStatus,
        slots: Option<&crate::rootfs_slots::RootfsSlots>,
    ) -> AtBoot {
        AtBoot {
            boot_loader: release.boot_loader.as_ref().map(Into::into),
            fallback: (release.state == "rolled-back").then(|| {
                format!(
                    "{} rolled back to {}: {}",
                    release.other.as_deref().unwrap_or("(unknown)"),
                    release.current.as_deref().unwrap_or("(none)"),
                    release.detail.as_deref().unwrap_or("(no reason recorded)")
                )
            }),
            watchdog: robot
                .watchdog
                .as_ref()
                .map(|w| crate::watchdog::at_boot(&under(&setup.sysroot, "/sys"), &w.device)),
            rootfs_slots: slots.map(|r| r.describe()),
        }
    }

    /// `record` with these added.
    pub fn add_to(&self, record: BootRecord) -> BootRecord {
        BootRecord {
            boot_loader: self.boot_loader.clone(),
            fallback: self.fallback.clone(),
            watchdog: self.watchdog.clone(),
            rootfs_slots: self.rootfs_slots.clone(),
            ..record
        }
    }
}

/// `; why: <verdict> (trace <file>)` for the last traced miss of a boot
/// check (robot.yaml `check.trace_on_miss`), so that `deploy status`
/// names it; empty without one.
fn last_trace_verdict(r: &check::CheckReport) -> String {
    r.trace
        .as_ref()
        .and_then(|t| t.verdicts.last())
        .map_or(String::new(), |v| {
            format!(
                "; why: {}{}",
                v.verdict,
                v.text
                    .as_deref()
                    .map_or(String::new(), |p| format!(" (trace {p})"))
            )
        })
}

/// The history record of a boot check: the real-time delivery's worst
/// p99 and longest (the figures the budgets hold), the verdict, and what
/// failed; `kernel` is asked for only when the check did not run.
pub fn boot_record(
    result: &Result<check::CheckReport, check::CheckRunError>,
    release: Option<String>,
    kernel: impl FnOnce() -> String,
) -> BootRecord {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    match result {
        Ok(r) => {
            let delivery = r
                .measurements
                .iter()
                .filter(|m| m.kind == check::MeasurementKind::Delivery && m.count > 0);
            BootRecord {
                unix_time: r.started_unix,
                kernel: r.host.kernel_release.clone(),
                release,
                verdict: r.verdict.clone(),
                p99_ns: delivery.clone().map(|m| m.p99_ns).max(),
                max_ns: delivery.map(|m| m.max_ns).max(),
                failed: r.failed.clone(),
                boot_loader: None,
                fallback: None,
                watchdog: None,
                rootfs_slots: None,
            }
        }
        Err(e) => BootRecord {
            unix_time: now,
            kernel: kernel(),
            release,
            verdict: "error".into(),
            p99_ns: None,
            max_ns: None,
            failed: vec![units::error::Chain(e).to_string()],
            boot_loader: None,
            fallback: None,
            watchdog: None,
            rootfs_slots: None,
        },
    }
}

/// `sysroot` joined with a kernel path of the program's own (`/sys`,
/// `/proc`: no `..`).
fn under(sysroot: &Path, abs: &str) -> PathBuf {
    units::path::join_under(sysroot, abs).expect("a kernel path of the program's own")
}
