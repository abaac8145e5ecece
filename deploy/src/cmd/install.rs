//! `deploy install BUNDLE`: installs a signed bundle on this robot and
//! switches to it in trial (the supervisor commits it once healthy, or
//! rolls back). Also the hidden `deploy serve-update`, the robot's end of
//! `deploy update`.
//!
//! The signature is checked against <prefix>/etc/rtdeploy/keys/*.pub and
//! `update.public_keys` before anything else is read; the bundle must be
//! for this robot's `robot.name` and `board.model`; the new robot.yaml must
//! validate. Exit: 0 installed (or already current), 2 refused or error.
//!
//! A release whose robot.yaml changes the kernel command line or the CPU
//! plan is a system update ([`releases::system_plan`]): install writes the
//! new boot entry and asks for a reboot, by the report (`"reboot": true`
//! and `"system"` in `--json`, a line in the text) and by
//! `<prefix>/run/rtdeploy/reboot-required`; the exit status stays 0. The
//! supervisor keeps the running processes until the reboot, then judges the
//! trial with the new plan applied.
//!
//! After a switch, a running supervisor is told at once (`release-changed`
//! on its control socket) and restarts the processes from the new release;
//! without a supervisor answering, a note says so (a supervisor also looks
//! at the release state once a second by itself).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use releases::bundle::Compat;
use releases::{InstallOptions, InstallReport, RobotYamlError};

use crate::ctx::{Ctx, Exit};

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// The bundle from `deploy bundle`.
    pub bundle: PathBuf,
}

#[derive(Debug, Args)]
pub struct ServeUpdateArgs {}

/// Checks a release's robot.yaml with the same loader `deploy config check`
/// uses; the programs it runs, which the release must hold.
fn validate_yaml(text: &str) -> Result<Vec<String>, RobotYamlError> {
    services::robot::load_str(Path::new("robot.yaml"), text.to_string())
        .map(|l| l.robot.programs())
        .map_err(|e| RobotYamlError::Invalid(Box::new(e)))
}

/// The install options from this robot's robot.yaml.
pub fn install_options(ctx: &Ctx, holder: &str) -> anyhow::Result<InstallOptions<'static>> {
    let loaded = super::load_robot(ctx)
        .context("this robot's robot.yaml (for its name, board and update keys)")?;
    let r = &loaded.robot;
    Ok(InstallOptions {
        compat: Compat {
            robot: r.robot.name.clone(),
            board: r.board.model.clone(),
        },
        public_keys: r.update.public_keys.clone(),
        keep: r.update.keep,
        lock_timeout: r.update.lock_timeout.0,
        holder: holder.to_string(),
        validate_robot_yaml: Some(&validate_yaml),
        plan_system: Some(system_planner(ctx, r.clone())),
    })
}

/// The system-update planner the installer is given: this robot's
/// robot.yaml against each new release's ([`releases::system_plan`]),
/// with the image builder's extlinux.conf editor
/// ([`rootfs::extlinux::add_system_entry`]).
fn system_planner(ctx: &Ctx, old: services::robot::Robot) -> Box<releases::PlanSystem> {
    old.system_planner(
        ctx.prefix.clone(),
        ctx.sys("/proc/sys/kernel/random/boot_id"),
        Box::new(|text, release, old_t, new_t| {
            rootfs::extlinux::add_system_entry(text, release, old_t, new_t)
                .map(|e| (e.text, e.label, e.previous_label))
        }),
    )
}

pub fn print_report(ctx: &Ctx, rep: &InstallReport) -> anyhow::Result<()> {
    for w in &rep.warnings {
        ctx.note(format!("deploy: warning: {w}"));
    }
    if ctx.json {
        return ctx.print_json(rep);
    }
    let what = match rep.state.as_str() {
        "trial" if rep.reboot => "installed; in trial from the next boot: REBOOT to run it (its trial is judged after the reboot, with the new plan applied)",
        "trial" => "installed; running in trial until healthy for update.health_window",
        "committed" => "installed and committed (the first release: nothing to roll back to)",
        _ => "already current; nothing changed",
    };
    crate::ctx::write_stdout(&format!(
        "{}: {what}\n  previous {}\n  {} files, {} bytes, {} new blobs, signed by {}\n{}",
        rep.release,
        rep.previous.as_deref().unwrap_or("(none)"),
        rep.files,
        rep.bytes,
        rep.new_blobs,
        rep.signer,
        if rep.pruned_releases.is_empty() {
            String::new()
        } else {
            format!("  pruned {}\n", rep.pruned_releases.join(", "))
        }
    ))?;
    if let Some(sys) = &rep.system {
        let mut t = String::from("  system update:\n");
        for c in &sys.changes {
            t += &format!("    {c}\n");
        }
        match &sys.boot_entry {
            Some(e) => {
                t += &format!(
                    "    /{}: DEFAULT {} (was {}, kept as the fallback)\n",
                    e.path, e.label, e.previous_label
                )
            }
            None => t += "    the boot loader's entry is unchanged (the kernel command line is the same, or given outside this robot)\n",
        }
        t += &format!(
            "    reboot needed (/{}); a failed trial restores the previous label and release and asks for a reboot back\n",
            releases::system::REBOOT_MARKER
        );
        crate::ctx::write_stdout(&t)?;
    }
    Ok(())
}

pub fn run(ctx: &Ctx, args: InstallArgs) -> anyhow::Result<Exit> {
    let opts = install_options(ctx, "deploy install")?;
    let rep = releases::install_bundle(&ctx.prefix, &args.bundle, &opts)
        .with_context(|| format!("install {}", args.bundle.display()))?;
    print_report(ctx, &rep)?;
    notify_supervisor(ctx, &rep);
    Ok(Exit::Ok)
}

/// Tells a running supervisor that `current` moved. Notes only: the
/// install itself is done either way.
pub fn notify_supervisor(ctx: &Ctx, rep: &InstallReport) {
    if rep.state == "already-current" || rep.reboot {
        return;
    }
    let socket = services::control::socket_path(&ctx.prefix);
    if !socket.exists() {
        ctx.note(format!(
            "deploy: no supervisor socket at {}: the processes start from {} when the supervisor starts{}",
            socket.display(),
            rep.release,
            if rep.state == "trial" {
                " (a trial that finds no supervisor running is rolled back at its start)"
            } else {
                ""
            }
        ));
        return;
    }
    match services::control::request(&socket, &services::control::Request::ReleaseChanged) {
        Ok(r) if r.ok => ctx.note(format!(
            "deploy: supervisor told: {}",
            r.message.unwrap_or_default()
        )),
        Ok(r) => ctx.note(format!(
            "deploy: warning: the supervisor refused `release-changed`: {}",
            r.error.unwrap_or_default()
        )),
        Err(e) => ctx.note(format!(
            "deploy: warning: {e}; a running supervisor sees the new release within a second by itself"
        )),
    }
}

/// Speaks the update protocol on stdin/stdout (nothing else may go to
/// stdout); diagnostics go to stderr, which ssh carries back.
pub fn run_serve(ctx: &Ctx, _args: ServeUpdateArgs) -> anyhow::Result<Exit> {
    let opts = install_options(ctx, "deploy serve-update")?;
    let stdin = std::io::stdin().lock();
    let stdout = std::io::stdout().lock();
    match releases::serve_update(&ctx.prefix, &opts, stdin, stdout)? {
        Some(rep) => {
            for w in &rep.warnings {
                ctx.note(format!("deploy: warning: {w}"));
            }
            notify_supervisor(ctx, &rep);
            Ok(Exit::Ok)
        }
        None => Ok(Exit::Ok),
    }
}
