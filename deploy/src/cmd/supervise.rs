//! `deploy supervise`: run the supervisor (also as PID 1, and under
//! systemd with `Type=notify`).
//!
//! Exit codes: 0 after an orderly shutdown; 2 when robot.yaml is invalid
//! (nothing is started) or the supervisor cannot start.

use std::path::Path;

use anyhow::Context as _;
use clap::Args;
use cpusets::apply::{self as cpu_apply, ApplyOptions};
use cpusets::model::live::Live;
use cpusets::plan::{self as cpu_plan, Inventory, Isolation};
use services::notify::Notifier;
use services::pid1::AtExit;
use services::status::StepStatus;
use services::supervisor::{Hooks, Options, Roots, Supervisor, SupervisorConfig};

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
    let sysroot = ctx.sysroot.clone();
    let hooks = Hooks {
        apply_cpu_plan: if args.skip_cpu_plan {
            Some(Box::new(|| StepStatus {
                step: "cpu plan".into(),
                result: "skipped".into(),
                detail: "--skip-cpu-plan".into(),
            }))
        } else {
            Some(Box::new(move || apply_cpu_plan(&robot, &sysroot)))
        },
        boot_check: None,
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
        ..Default::default()
    };
    let sup = Supervisor::new(cfg, roots, opts, hooks, notifier)
        .context("cannot start the supervisor")?;
    sup.run().context("supervisor")?;
    Ok(Exit::Ok)
}

/// The cpusets runtime plan for this machine, applied.
fn apply_cpu_plan(robot: &Robot, sysroot: &Path) -> StepStatus {
    let step = |result: &str, detail: String| StepStatus {
        step: "cpu plan".into(),
        result: result.into(),
        detail,
    };
    let live = match Live::read(sysroot) {
        Ok(l) => l,
        Err(e) => return step("failed", format!("reading the live system: {e}")),
    };
    let iso = Isolation {
        board: &robot.board,
        cpus: &robot.cpus,
        kernel: &robot.kernel,
        irqs: &robot.irqs,
        sysctl: &robot.sysctl,
        power: &robot.power,
    };
    let inv = Inventory {
        irqs: &live.irqs,
        tasks: &live.tasks,
    };
    let plan = match cpu_plan::plan(&iso, &inv) {
        Ok(p) => p,
        Err(e) => return step("failed", e.to_string()),
    };
    match cpu_apply::apply(&plan, sysroot, &ApplyOptions::for_sysroot(sysroot, false)) {
        Ok(report) => {
            let s = report.summary();
            let detail = format!(
                "cgroup {}: {} changed, {} unchanged, {} unmovable, {} unsupported, {} invalid, {} failed",
                report.cgroup, s.changed, s.unchanged, s.unmovable, s.unsupported, s.invalid, s.failed
            );
            if s.failed > 0 || s.invalid > 0 {
                let failures: Vec<String> = report
                    .failures()
                    .map(|a| format!("{a:?}"))
                    .take(5)
                    .collect();
                step("failed", format!("{detail}; {}", failures.join("; ")))
            } else {
                step("ok", detail)
            }
        }
        Err(e) => step("failed", e.to_string()),
    }
}
