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
use services::boot::{BootSetup, RobotBoot};
use services::notify::Notifier;
use services::pid1::AtExit;
use services::supervisor::{Ended, Options, Roots, Supervisor};

use crate::cmd::load_robot;
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
    // The release recovery before robot.yaml is read: a trial it rolls
    // back must not leave its configuration (its CPU plan) in force, and a
    // system update's trial it keeps after its reboot runs with the new
    // one (robot.yaml links to the current release's). As PID 1, /proc
    // and /run are mounted by the start-up first, which then recovers.
    let recovered = (!pid1).then(|| services::supervisor::recover(&ctx.prefix, &ctx.sys("/proc")));
    let loaded = load_robot(ctx)?;
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
    let boot = RobotBoot::new(
        loaded.robot,
        BootSetup {
            prefix: ctx.prefix.clone(),
            sysroot: ctx.sysroot.clone(),
            skip_cpu_plan: args.skip_cpu_plan,
            follows_releases,
        },
    );
    let roots = Roots {
        prefix: ctx.prefix.clone(),
        proc_root: ctx.sys("/proc"),
        sys_root: ctx.sys("/sys"),
        dev_root: ctx.sys("/dev"),
    };
    let env = |k: &str| std::env::var(k).ok();
    let notifier = Notifier::new(
        env("NOTIFY_SOCKET").as_deref(),
        env("WATCHDOG_USEC").as_deref(),
        env("WATCHDOG_PID").as_deref(),
        std::process::id(),
    )
    .context("systemd notification socket")?;
    // A robot under --prefix on this machine's own /dev is a development
    // or test robot: the machine's watchdog is not its to arm (a stop
    // that is not orderly would reset the machine). With --sysroot the
    // device is the one under it.
    let watchdog_skip = (ctx.prefix != std::path::Path::new("/")
        && ctx.sysroot == std::path::Path::new("/"))
    .then(|| {
        format!(
            "not opened: a robot under --prefix {} does not hold this machine's watchdog (give --sysroot for a device tree of its own)",
            ctx.prefix.display()
        )
    });
    let opts = boot.options(Options {
        watchdog_skip,
        handle_signals: true,
        pid1,
        at_exit,
        log_max_bytes: args.log_max_bytes,
        verbose: !ctx.quiet,
        irq_scan_on_events: true,
        journal: true,
        recovered,
        // As PID 1 the start-up mounts and reaps: not done twice.
        restart_to_reload: !pid1,
        ..Default::default()
    })?;
    let sup = Supervisor::new(boot.config(), roots, opts, Some(Box::new(boot)), notifier)
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
