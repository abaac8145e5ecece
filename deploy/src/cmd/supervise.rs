//! `deploy supervise`: run the supervisor (also as PID 1, and under
//! systemd with `Type=notify`).
//!
//! A release whose robot.yaml adds, removes or renames a process or
//! changes a channel is loaded by starting again: every process stops and
//! this program executes itself anew with the same arguments and pid
//! (not as PID 1).
//!
//! Exit codes: 0 after an orderly shutdown; 2 when robot.yaml is invalid
//! (nothing is started) or the supervisor cannot start.

use anyhow::Context as _;
use clap::Args;
use cpusets::apply::{self as cpu_apply, ApplyOptions};
use cpusets::rescan::IrqWatch;
use services::notify::Notifier;
use services::pid1::AtExit;
use services::status::StepStatus;
use services::supervisor::{
    BootCheckOutcome, Ended, Hooks, Options, Roots, Supervisor, SupervisorConfig,
};

use crate::cmd::load_robot;
use crate::ctx::{Ctx, Exit};
use services::robot::Robot;

#[derive(Debug, Args)]
pub struct SuperviseArgs {
    /// When the supervisor stops as PID 1, power the machine off.
    #[arg(long, conflicts_with = "reboot_on_exit")]
    pub poweroff_on_exit: bool,
    /// When the supervisor stops as PID 1, reboot the machine.
    #[arg(long)]
    pub reboot_on_exit: bool,
    /// Do not apply the CPU plan (development machines and tests); the
    /// status says it was skipped.
    #[arg(long)]
    pub skip_cpu_plan: bool,
    /// Rotate each process's log when it reaches this many bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20)]
    pub log_max_bytes: u64,
}

pub fn run(ctx: &Ctx, args: SuperviseArgs) -> anyhow::Result<Exit> {
    let pid1 = std::process::id() == 1;
    let at_exit = if args.poweroff_on_exit {
        AtExit::PowerOff
    } else if args.reboot_on_exit {
        AtExit::Reboot
    } else {
        AtExit::Exit
    };
    let result = supervise(ctx, &args, pid1, at_exit);
    if pid1 {
        // init must not just return an error: say why, then do what was
        // asked at exit (a plain exit ends the PID namespace, or panics the
        // kernel on a real machine).
        if let Err(e) = &result {
            eprintln!("deploy: {e:#}");
        }
        if at_exit != AtExit::Exit {
            services::pid1::finish(at_exit).context("reboot(2)")?;
        }
    }
    result
}

fn supervise(ctx: &Ctx, args: &SuperviseArgs, pid1: bool, at_exit: AtExit) -> anyhow::Result<Exit> {
    // The release recovery before robot.yaml is read: a trial it rolls
    // back must not leave its configuration (its CPU plan) in force, and a
    // system update's trial it keeps after its reboot runs with the new
    // one (robot.yaml links to the current release's). As PID 1, /proc
    // and /run are mounted by the start-up first, which then recovers.
    let recovered = (!pid1).then(|| services::supervisor::recover(&ctx.prefix, &ctx.sys("/proc")));
    let loaded = load_robot(ctx)?;
    let robot = loaded.robot;
    let trace = MissTrace::of(ctx, &robot);
    let cfg = supervisor_config(&robot, trace.as_ref());
    // The configuration in force is the current release's (the default
    // link, or -c naming it): a release restarted from later (a trial, a
    // rollback) brings its own robot.yaml.
    let layout = releases::Layout::new(&ctx.prefix);
    let follows_releases = matches!(
        (
            std::fs::canonicalize(&ctx.config_path),
            std::fs::canonicalize(layout.current_config())
        ),
        (Ok(a), Ok(b)) if a == b
    );
    let roots = Roots {
        prefix: ctx.prefix.clone(),
        proc_root: ctx.sys("/proc"),
        sys_root: ctx.sys("/sys"),
        dev_root: ctx.sys("/dev"),
    };
    let (plan_ctx, plan_robot) = (ctx.clone(), robot.clone());
    let (check_ctx, check_robot) = (ctx.clone(), robot.clone());
    let (scan_ctx, scan_robot) = (ctx.clone(), robot.clone());
    let plan_watch = std::sync::Arc::new(std::sync::Mutex::new(None::<IrqWatch>));
    let scan_watch = plan_watch.clone();
    let mut scan_error: Option<String> = None;
    let hooks = Hooks {
        apply_cpu_plan: if args.skip_cpu_plan {
            Some(Box::new(|| StepStatus {
                step: "cpu plan".into(),
                result: "skipped".into(),
                detail: "--skip-cpu-plan".into(),
            }))
        } else {
            Some(Box::new(move || {
                // What exists before the plan is applied is placed by it;
                // what a later scan finds beyond this is placed then.
                if let Ok(w) = IrqWatch::read(&plan_ctx.sysroot) {
                    *plan_watch.lock().unwrap_or_else(|e| e.into_inner()) = Some(w);
                }
                apply_cpu_plan(&plan_ctx, &plan_robot)
            }))
        },
        boot_check: Some(Box::new(move |d| boot_check(&check_ctx, &check_robot, d))),
        irq_scan: (!args.skip_cpu_plan).then(|| -> services::supervisor::IrqScanHook {
            Box::new(move || scan_irqs(&scan_ctx, &scan_robot, &scan_watch, &mut scan_error))
        }),
        load_config: follows_releases.then(|| -> services::supervisor::ConfigHook {
            let trace = trace.clone();
            Box::new(move |path| {
                services::robot::load(path)
                    .map(|l| supervisor_config(&l.robot, trace.as_ref()))
                    .map_err(|e| format!("{e}"))
            })
        }),
        trace_watch: trace.map(|t| t.hook(ctx)),
    };
    let env = |k: &str| std::env::var(k).ok();
    let notifier = Notifier::new(
        env("NOTIFY_SOCKET").as_deref(),
        env("WATCHDOG_USEC").as_deref(),
        env("WATCHDOG_PID").as_deref(),
        std::process::id(),
    )
    .context("systemd notification socket")?;
    let opts = Options {
        handle_signals: true,
        pid1,
        at_exit,
        log_max_bytes: args.log_max_bytes,
        verbose: !ctx.quiet,
        health_window: robot.update.health_window.0,
        keep: robot.update.keep,
        irq_scan_every: robot.irqs.rescan_every(),
        irq_scan_on_events: true,
        journal: true,
        metrics_textfile: match &robot.metrics.textfile {
            // Absolute paths are on the robot's root, under the prefix
            // like every other on-robot path (validated: no `..`).
            Some(t) => Some((
                units::path::join_under(&ctx.prefix, t)
                    .map_err(|e| anyhow::anyhow!("metrics.textfile: {e}"))?,
                robot.metrics.every.0,
            )),
            None => None,
        },
        recovered,
        // As PID 1 the start-up mounts and reaps: not done twice.
        restart_to_reload: !pid1,
        ..Default::default()
    };
    let sup = Supervisor::new(cfg, roots, opts, hooks, notifier)
        .map_err(|e| super::with_shm_hint(ctx, anyhow::Error::new(e)))
        .context("cannot start the supervisor")?;
    match sup.run_to_end().context("supervisor")? {
        Ended::Stopped => Ok(Exit::Ok),
        Ended::Restart(why) => Err(start_again(&why)),
    }
}

/// Executes this program again with the same arguments and environment
/// (the same pid, so systemd's `Type=notify` unit and its watchdog follow
/// it): the new start reads the current release's robot.yaml. Returns
/// only when the exec failed.
fn start_again(why: &str) -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| "deploy".into());
    eprintln!("deploy supervise: starting again ({why})");
    let err = std::process::Command::new("/proc/self/exe")
        .arg0(arg0)
        .args(args)
        .exec();
    anyhow::anyhow!("cannot start the supervisor again ({why}): exec /proc/self/exe: {err}")
}

/// The tracing of the running processes' misses: robot.yaml
/// `check.trace_on_miss` with a process that has a `budgets.wakeup`. The
/// instance is this process's (its path known before it exists, for the
/// processes' environment).
#[derive(Debug, Clone)]
struct MissTrace {
    /// `None` without tracefs: the processes are not told of one.
    instance: Option<std::path::PathBuf>,
    cpus: Vec<usize>,
    dir: std::path::PathBuf,
    keep: usize,
}

impl MissTrace {
    fn of(ctx: &Ctx, robot: &Robot) -> Option<MissTrace> {
        let keep = robot.check.trace_on_miss? as usize;
        if !robot.processes.iter().any(|p| p.budgets.wakeup.is_some()) {
            return None;
        }
        let req = robot.trace_request(&ctx.prefix, false, None)?;
        // Without tracefs the hook's start says why.
        let instance = check::trace::tracefs::instance_dir(&ctx.sys("/sys")).ok();
        // The isolated CPUs, and those of every process with a wakeup
        // budget and of the publishers of what they subscribe to: the
        // receiver's and the sender's side of each miss.
        let budgeted: Vec<_> = robot
            .processes
            .iter()
            .filter(|p| p.budgets.wakeup.is_some())
            .collect();
        let mut cpus: std::collections::BTreeSet<usize> =
            robot.cpus.isolated.iter().map(|c| c as usize).collect();
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

    /// The hook: starts the tracer on its first call (before any process
    /// starts), then takes what the processes stopped it on.
    fn hook(self, ctx: &Ctx) -> services::supervisor::TraceWatchHook {
        use services::supervisor::{TraceTurn, TracedMiss};
        let (sys, proc_root) = (ctx.sys("/sys"), ctx.sys("/proc"));
        let mut running: Option<check::trace::watch::RuntimeTrace> = None;
        let mut started = false;
        Box::new(move || {
            let mut turn = TraceTurn::default();
            if !std::mem::replace(&mut started, true) {
                match check::trace::watch::RuntimeTrace::start(
                    &sys,
                    &proc_root,
                    &self.cpus,
                    self.dir.clone(),
                    self.keep,
                ) {
                    Ok(t) => {
                        turn.say.push(format!(
                            "miss trace: recording on CPUs {:?} in {}, misses saved in {} (at most {} of each kind){}",
                            self.cpus,
                            t.tracer().dir().display(),
                            self.dir.display(),
                            self.keep,
                            if t.tracer().missing.is_empty() {
                                String::new()
                            } else {
                                format!("; not traced: {}", t.tracer().missing.join(", "))
                            }
                        ));
                        turn.say.extend(t.tracer().notes.iter().cloned());
                        running = Some(t);
                    }
                    Err(e) => turn
                        .say
                        .push(format!("miss trace off: {}", units::error::Chain(&e))),
                }
                return turn;
            }
            if let Some(m) = running.as_mut().and_then(|t| t.poll()) {
                if let Some(p) = &m.problem {
                    turn.say.push(format!("a traced miss was not saved: {p}"));
                }
                turn.misses.push(TracedMiss {
                    pid: m.receiver_pid,
                    verdict: m.verdict,
                    file: m.text.map(|p| p.display().to_string()),
                });
            }
            turn
        })
    }
}

/// The supervisor's part of robot.yaml; with `trace`, the processes with
/// a wakeup budget are told where to write their markers and what a miss
/// is (see `controller::miss_trace`).
fn supervisor_config(robot: &Robot, trace: Option<&MissTrace>) -> SupervisorConfig {
    let mut processes = robot.processes.clone();
    // Each process's wake class, from robot.yaml (config check refuses
    // these variables in a process's own `env`).
    for (p, c) in processes.iter_mut().zip(robot.wake_classes()) {
        let env = services::wake_class::environment(p, c.class);
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
fn apply_cpu_plan(ctx: &Ctx, robot: &Robot) -> StepStatus {
    let step = |result: &str, detail: String| StepStatus {
        step: "cpu plan".into(),
        result: result.into(),
        detail,
    };
    let plan = match robot.cpu_plan(&ctx.sysroot) {
        Ok(p) => p,
        Err(e) => return step("failed", units::error::Chain(&e).to_string()),
    };
    let report = match cpu_apply::apply(
        &plan,
        &ctx.sysroot,
        &ApplyOptions::for_sysroot(&ctx.sysroot, false),
    ) {
        Ok(r) => r,
        Err(e) => return step("failed", e.to_string()),
    };
    let path = releases::Layout::new(&ctx.prefix).cpusets_apply_state();
    let saved = cpusets::apply_state::ApplyState::from_report(&report).write(&path);
    let s = report.summary();
    let mut detail = format!(
        "cgroup {}: {} changed, {} unchanged, {} unmovable, {} unsupported, {} invalid, {} failed",
        report.cgroup, s.changed, s.unchanged, s.unmovable, s.unsupported, s.invalid, s.failed
    );
    if let Err(e) = saved {
        detail.push_str(&format!("; {}", units::error::Chain(&e)));
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
    ctx: &Ctx,
    robot: &Robot,
    known: &std::sync::Mutex<Option<IrqWatch>>,
    last_error: &mut Option<String>,
) -> Option<StepStatus> {
    let mut known = known.lock().unwrap_or_else(|e| e.into_inner());
    let scanned = match known.as_ref() {
        Some(k) => k.rescan(&ctx.sysroot),
        None => IrqWatch::read(&ctx.sysroot),
    };
    let now = match scanned {
        Ok(w) => w,
        Err(e) => {
            let msg = units::error::Chain(&e).to_string();
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
    drop(known);
    if first || appeared.is_empty() {
        return None;
    }
    let st = apply_cpu_plan(ctx, robot);
    Some(StepStatus {
        step: "irq scan".into(),
        result: st.result,
        detail: format!("placed {}: {}", appeared.describe(), st.detail),
    })
}

/// The boot timing check: `deploy check`'s engine, shortened to
/// `boot_check.duration`; the report goes to
/// `<prefix>/var/lib/rtdeploy/boot-check.json`.
fn boot_check(ctx: &Ctx, robot: &Robot, duration: std::time::Duration) -> BootCheckOutcome {
    // A power mode that switched off a planned CPU, or another mode than
    // robot.yaml names, fails the check before any timing is measured.
    if let Ok(plan) = robot.cpu_plan(&ctx.sysroot) {
        if let Ok(checks) = cpusets::verify::power_checks(&plan, &ctx.sysroot) {
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
    inputs.trace = robot.trace_request(&ctx.prefix, false, None);
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            return BootCheckOutcome::Failed(format!(
                "cannot find the deploy binary for the check workers: {e}"
            ))
        }
    };
    let path = releases::Layout::new(&ctx.prefix).boot_check_report();
    let result = check::run_boot(&inputs, &ctx.prefix, &ctx.sysroot, &exe, &path);
    let kept = keep_in_history(ctx, robot, &result);
    match result {
        Ok(r) if r.passed() => BootCheckOutcome::Passed(format!("report {}{kept}", path.display())),
        Ok(r) => BootCheckOutcome::Failed(format!(
            "over budget: {} (report {}){}{kept}",
            r.failed.join(", "),
            path.display(),
            last_trace_verdict(&r)
        )),
        Err(e) => {
            BootCheckOutcome::Failed(format!("could not run: {}{kept}", units::error::Chain(&e)))
        }
    }
}

/// Adds this boot check to the history (`boot_check.history` kept);
/// returns `; ...` for the status when that failed or dropped damaged
/// lines of the old file, else nothing.
fn keep_in_history(
    ctx: &Ctx,
    robot: &Robot,
    result: &Result<check::CheckReport, check::CheckRunError>,
) -> String {
    let layout = releases::Layout::new(&ctx.prefix);
    let release = std::fs::read_link(layout.current())
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()));
    let record = super::check::boot_record(result, release, || {
        check::host::read_host_facts(&ctx.sysroot).kernel_release
    });
    let path = layout.boot_check_history();
    match services::boot_history::append(&path, record, robot.boot_check.history as usize) {
        Ok((notes, _)) if notes.is_empty() => String::new(),
        Ok((notes, skipped)) => format!(
            "; history {}: {skipped} damaged line(s) dropped ({})",
            path.display(),
            notes[0]
        ),
        Err(e) => format!("; {}", units::error::Chain(&e)),
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
