//! `deploy supervise`: run the supervisor (also as PID 1, and under
//! systemd with `Type=notify`).
//!
//! Exit codes: 0 after an orderly shutdown; 2 when robot.yaml is invalid
//! (nothing is started) or the supervisor cannot start.

use anyhow::Context as _;
use clap::Args;
use cpusets::apply::{self as cpu_apply, ApplyOptions};
use services::notify::Notifier;
use services::pid1::AtExit;
use services::status::StepStatus;
use services::supervisor::{BootCheckOutcome, Hooks, Options, Roots, Supervisor, SupervisorConfig};

use crate::cmd::load_robot;
use crate::config::Robot;
use crate::ctx::{Ctx, Exit};

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
    let loaded = load_robot(ctx)?;
    let robot = loaded.robot;
    let cfg = SupervisorConfig {
        robot: robot.robot.clone(),
        cpus: robot
            .processes
            .iter()
            .map(|p| robot.process_cpus(p))
            .collect(),
        processes: robot.processes.clone(),
        channels: robot.channels.clone(),
        boot_check: robot.boot_check.clone(),
        cpu_dma_latency: robot.power.cpu_dma_latency.map(|m| m.0),
    };
    let roots = Roots {
        prefix: ctx.prefix.clone(),
        proc_root: ctx.sys("/proc"),
        sys_root: ctx.sys("/sys"),
        dev_root: ctx.sys("/dev"),
    };
    let (plan_ctx, plan_robot) = (ctx.clone(), robot.clone());
    let (check_ctx, check_robot) = (ctx.clone(), robot.clone());
    let hooks = Hooks {
        apply_cpu_plan: if args.skip_cpu_plan {
            Some(Box::new(|| StepStatus {
                step: "cpu plan".into(),
                result: "skipped".into(),
                detail: "--skip-cpu-plan".into(),
            }))
        } else {
            Some(Box::new(move || apply_cpu_plan(&plan_ctx, &plan_robot)))
        },
        boot_check: Some(Box::new(move |d| boot_check(&check_ctx, &check_robot, d))),
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
        ..Default::default()
    };
    let sup = Supervisor::new(cfg, roots, opts, hooks, notifier)
        .context("cannot start the supervisor")?;
    sup.run().context("supervisor")?;
    Ok(Exit::Ok)
}

/// The cpusets runtime plan for this machine, applied (as `deploy apply`
/// does, including the state file `deploy verify` reads).
fn apply_cpu_plan(ctx: &Ctx, robot: &Robot) -> StepStatus {
    let step = |result: &str, detail: String| StepStatus {
        step: "cpu plan".into(),
        result: result.into(),
        detail,
    };
    let plan = match super::apply::live_plan(ctx, robot) {
        Ok(p) => p,
        Err(e) => return step("failed", format!("{e:#}")),
    };
    let report = match cpu_apply::apply(
        &plan,
        &ctx.sysroot,
        &ApplyOptions::for_sysroot(&ctx.sysroot, false),
    ) {
        Ok(r) => r,
        Err(e) => return step("failed", e.to_string()),
    };
    let state = super::apply::ApplyState {
        unmovable_irqs: report.unmovable_irqs(),
    };
    let path = releases::Layout::new(&ctx.prefix).cpusets_apply_state();
    let saved = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&path, serde_json::to_string(&state).unwrap_or_default()));
    let s = report.summary();
    let mut detail = format!(
        "cgroup {}: {} changed, {} unchanged, {} unmovable, {} unsupported, {} invalid, {} failed",
        report.cgroup, s.changed, s.unchanged, s.unmovable, s.unsupported, s.invalid, s.failed
    );
    if let Err(e) = saved {
        detail.push_str(&format!("; cannot save {}: {e}", path.display()));
    }
    if s.failed > 0 || s.invalid > 0 {
        let failures: Vec<String> = report
            .actions
            .iter()
            .filter(|a| {
                matches!(
                    a.outcome,
                    cpu_apply::Outcome::Failed { .. } | cpu_apply::Outcome::Invalid { .. }
                )
            })
            .take(5)
            .map(|a| format!("{} {:?}", a.path, a.outcome))
            .collect();
        step("failed", format!("{detail}; {}", failures.join("; ")))
    } else {
        step("ok", detail)
    }
}

/// The boot timing check: `deploy check`'s engine, shortened to
/// `boot_check.duration`; the report goes to
/// `<prefix>/var/lib/rtdeploy/boot-check.json`.
fn boot_check(ctx: &Ctx, robot: &Robot, duration: std::time::Duration) -> BootCheckOutcome {
    let mut inputs = super::check::inputs_from_robot(robot);
    inputs.duration = Some(controller::config::Dur(duration));
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            return BootCheckOutcome::Failed(format!(
                "cannot find the deploy binary for the check workers: {e}"
            ))
        }
    };
    let path = releases::Layout::new(&ctx.prefix).boot_check_report();
    match check::run_boot(&inputs, &ctx.prefix, &ctx.sysroot, &exe, &path) {
        Ok(r) if r.passed() => BootCheckOutcome::Passed(format!("report {}", path.display())),
        Ok(r) => BootCheckOutcome::Failed(format!(
            "over budget: {} (report {})",
            r.failed.join(", "),
            path.display()
        )),
        Err(e) => {
            BootCheckOutcome::Failed(format!("could not run: {}", controller::error::Chain(&e)))
        }
    }
}
