//! `deploy releases`, `deploy rollback`, `deploy commit`, `deploy reboot`:
//! the releases on this robot and the trial state.
//!
//! `releases` lists every release (newest first) and which is current,
//! previous, in trial, committed. `rollback` ends a trial by going back,
//! or swaps current and previous when none is in trial. `commit` marks the
//! release in trial good (the supervisor does this by itself after
//! `update.health_window`; this is for robots without one). `reboot`
//! reboots the robot when a release asked for it. Exit: 0 done, 2 error
//! (`reboot`: 1 when nothing asked for a reboot).

use anyhow::Context;
use clap::Args;
use services::release::{self, ReleaseState};

use crate::ctx::{Ctx, Exit};

#[derive(Debug, Args)]
pub struct ReleasesArgs {}

#[derive(Debug, Args)]
pub struct RollbackArgs {}

#[derive(Debug, Args)]
pub struct CommitArgs {}

#[derive(Debug, Args)]
pub struct RebootArgs {}

pub fn run_releases(ctx: &Ctx, _args: ReleasesArgs) -> anyhow::Result<Exit> {
    let info = release::list(&ctx.prefix).context("list releases")?;
    if ctx.json {
        ctx.print_json(&info)?;
        return Ok(Exit::Ok);
    }
    let mut out = String::new();
    match &info.state {
        Some(ReleaseState::Trial {
            release,
            previous,
            since,
            ..
        }) => {
            out += &format!(
                "state: trial of {release} since unix time {since} (rolls back to {previous})\n"
            )
        }
        Some(ReleaseState::Committed { release }) => {
            out += &format!("state: committed {release}\n")
        }
        None => out += "state: none (no release installed by rtdeploy)\n",
    }
    out += &format!(
        "{:<32} {:<12} {:>6} {:>12}  flags\n",
        "RELEASE", "VERSION", "FILES", "BYTES"
    );
    for r in &info.releases {
        let flags: Vec<&str> = [
            (r.current, "current"),
            (r.previous, "previous"),
            (r.trial, "trial"),
            (r.committed, "committed"),
        ]
        .into_iter()
        .filter_map(|(on, s)| on.then_some(s))
        .collect();
        out += &format!(
            "{:<32} {:<12} {:>6} {:>12}  {}\n",
            r.name,
            r.version.as_deref().unwrap_or("?"),
            r.files,
            r.bytes,
            flags.join(",")
        );
    }
    crate::ctx::write_stdout(&out)?;
    Ok(Exit::Ok)
}

pub fn run_rollback(ctx: &Ctx, _args: RollbackArgs) -> anyhow::Result<Exit> {
    let lock_timeout = super::load_robot(ctx)
        .map(|l| l.robot.update.lock_timeout.0)
        .unwrap_or(std::time::Duration::from_secs(60));
    let _lock = release::UpdateLock::acquire(&ctx.prefix, "deploy rollback", lock_timeout)?;
    let rb = release::rollback(&ctx.prefix).context("rollback")?;
    if ctx.json {
        ctx.print_json(&rb)?;
    } else {
        crate::ctx::write_stdout(&format!(
            "rolled back{}: {} -> {} (committed)\n",
            if rb.trial { " the trial" } else { "" },
            rb.from,
            rb.to
        ))?;
        if rb.reboot {
            crate::ctx::write_stdout(&format!(
                "  extlinux.conf boots the previous label again: reboot to run {}'s kernel command line (/{})\n",
                rb.to,
                release::system::REBOOT_MARKER
            ))?;
        }
    }
    Ok(Exit::Ok)
}

pub fn run_commit(ctx: &Ctx, _args: CommitArgs) -> anyhow::Result<Exit> {
    let loaded = super::load_robot(ctx)?;
    let _lock = release::UpdateLock::acquire(
        &ctx.prefix,
        "deploy commit",
        loaded.robot.update.lock_timeout.0,
    )?;
    let r = release::commit(&ctx.prefix, loaded.robot.update.keep).context("commit")?;
    release::prune(&ctx.prefix, loaded.robot.update.keep).context("prune")?;
    if ctx.json {
        ctx.print_json(&serde_json::json!({ "committed": r }))?;
    } else {
        crate::ctx::write_stdout(&format!("committed {r}\n"))?;
    }
    Ok(Exit::Ok)
}

/// The longest reboot reason read: the file is ours, but in /run where
/// anyone with root may write anything.
const REASON_MAX: u64 = 4096;

/// `deploy reboot`: reboots this robot when a release asked for it
/// (`run/rtdeploy/reboot-required`, written by a system update's install or
/// its rollback): `systemctl --no-block reboot` under systemd, `reboot`
/// elsewhere. Refused under a `--prefix` other than `/`: that tree is not
/// the running system. Exit 1 when nothing asked for a reboot.
pub fn run_reboot(ctx: &Ctx, _args: RebootArgs) -> anyhow::Result<Exit> {
    use std::io::Read;
    let marker = release::system::reboot_marker(&ctx.prefix);
    let why = match units::bounded::Bound::regular(REASON_MAX)
        .open(&marker)
        .map_err(|e| e.into_io())
    {
        Ok(f) => {
            // Its first REASON_MAX bytes: a longer reason is cut, not a
            // reason to refuse the reboot it asks for.
            let b = units::bounded::read_at_most(&mut f.take(REASON_MAX), &marker, REASON_MAX)
                .map_err(|e| e.into_io())
                .with_context(|| format!("read {}", marker.display()))?;
            String::from_utf8_lossy(&b).trim().to_string()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if ctx.json {
                ctx.print_json(&serde_json::json!({ "rebooting": false, "why": null }))?;
            } else {
                crate::ctx::write_stdout(&format!(
                    "no reboot asked for (no /{}): not rebooting\n",
                    release::system::REBOOT_MARKER
                ))?;
            }
            return Ok(Exit::Failed);
        }
        Err(e) => return Err(e).with_context(|| format!("read {}", marker.display())),
    };
    if ctx.prefix != std::path::Path::new("/") {
        anyhow::bail!(
            "the robot under --prefix {} is not this running system, so it is not rebooted here: reboot the machine that boots it ({why})",
            ctx.prefix.display()
        );
    }
    let systemd = std::path::Path::new("/run/systemd/system").is_dir();
    let argv: &[&str] = if systemd {
        &["systemctl", "--no-block", "reboot"]
    } else {
        &["reboot"]
    };
    if ctx.json {
        ctx.print_json(&serde_json::json!({ "rebooting": true, "why": why, "command": argv }))?;
    } else {
        crate::ctx::write_stdout(&format!("rebooting ({}): {why}\n", argv.join(" ")))?;
    }
    let st = std::process::Command::new(argv[0])
        .args(&argv[1..])
        .status()
        .with_context(|| format!("run {}", argv[0]))?;
    if !st.success() {
        anyhow::bail!("`{}` failed ({st})", argv.join(" "));
    }
    Ok(Exit::Ok)
}
