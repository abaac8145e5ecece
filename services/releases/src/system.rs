//! System updates: a release whose robot.yaml changes the kernel command
//! line or the CPU plan only takes effect through a reboot, so its trial
//! spans one.
//!
//! What the installer is given ([`SystemUpdate`], planned by the caller,
//! who knows robot.yaml and the boot loader) is kept in `state.json`
//! with the trial, so every later step (recovery at the next start,
//! commit, rollback) works from the same record:
//!
//! 1. install: the release is switched to in trial as usual, and then the
//!    boot loader's file is replaced (`extlinux.conf`: the new command line
//!    under a new label made `DEFAULT`, the previous `DEFAULT` label kept;
//!    temporary file, fsync, rename, fsync of the directory) and a reboot
//!    is asked for (`run/rtdeploy/reboot-required`, the install report);
//! 2. until the reboot nothing restarts: the old processes run on the old
//!    plan, and [`crate::commit`] refuses;
//! 3. the first supervisor start after the reboot ([`crate::recover_at_boot`])
//!    counts the boot, checks that the kernel runs the new command line
//!    (`/proc/cmdline` holds every planned token) and keeps the trial; the
//!    supervisor then applies the CPU plan and judges the trial only once
//!    the plan applied;
//! 4. a rollback (the supervisor's verdict, `deploy rollback`, Mender's)
//!    writes the boot loader's file back as it was before the install
//!    (the previous `DEFAULT`), goes back to the previous release, and asks
//!    for a reboot back when the running kernel booted the new line.
//!
//! Neither extlinux nor NVIDIA's L4TLauncher has a boot-once entry, so a
//! boot of the new line that never reaches a verdict is caught by a boot
//! counter kept in the trial record: the start that finds the trial already
//! judged in an earlier boot (the board was reset: a hardware watchdog
//! (systemd's `RuntimeWatchdogSec`) or a power cut during the trial) or
//! started a second time in the same boot (the supervisor crashed) rolls
//! back. A boot that hangs before the supervisor starts, every time, is
//! not caught by this counter: the watchdog resets the board into the same
//! `DEFAULT`; only the boot loader's own fallback (L4T's A/B boot chain)
//! or a person gets out of that.
//!
//! A power cut at any step of the install leaves `extlinux.conf` whole,
//! old or new (rename), and the next start puts the release back in line
//! with the command line the board booted: a trial whose line did not boot
//! is rolled back, and its file restored.

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::bundle::sync_dir;
use crate::error::{ioe, ReleaseError};
use crate::fault::fault_point;
use crate::state::write_synced;

/// Starts of the supervisor a system trial may see before its verdict: the
/// one after the reboot the update asked for. Any further start (a reset,
/// a crash) means the trial did not reach a verdict: it is rolled back.
pub const MAX_TRIAL_BOOTS: u32 = 1;

/// The largest boot loader file a system update reads, writes or keeps
/// for a rollback. L4TLauncher reads at most 10 labels
/// (`MAX_EXTLINUX_OPTIONS`) of a few lines each, the kernel takes a
/// command line of at most 2048 bytes on arm64 (`COMMAND_LINE_SIZE`):
/// the files it boots are a few KiB, and 64 KiB leaves room for comments.
pub const MAX_BOOT_FILE: u64 = 64 << 10;

/// A release that changes the system, as the installer records it with
/// the trial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemUpdate {
    /// What changed, one line each (the kernel command line, the CPUs).
    pub changes: Vec<String>,
    /// The new release's planned command line tokens: the kernel must run
    /// with every one of them before the trial is judged.
    pub tokens: Vec<String>,
    /// The previous release's: a rollback asks for a reboot back when the
    /// running kernel lacks one of them.
    pub previous_tokens: Vec<String>,
    /// The boot loader's entry, on boards that boot through extlinux.conf
    /// (`None`: the command line is given by whoever starts the kernel,
    /// and only the reboot is asked for).
    #[serde(default)]
    pub boot_entry: Option<BootEntry>,
    /// The boot loader counts the new label's boots
    /// ([`crate::boot_attempts`]): armed with the trial, cleared by its
    /// verdict.
    #[serde(default)]
    pub boot_attempts: Option<crate::boot_attempts::BootAttempts>,
    /// What the boot loader had counted when the trial's boot was judged
    /// (the attempts used, a fallback): for status and the rollback's
    /// reason.
    #[serde(default)]
    pub boot_loader: Option<crate::boot_attempts::BootLoaderSaw>,
    /// `/proc/sys/kernel/random/boot_id` of the kernel the install ran on.
    pub install_boot: String,
    /// The boot counter: supervisor starts since the install.
    #[serde(default)]
    pub boots: u32,
    /// The boot the trial is judged in (set by the first start after the
    /// reboot, once the kernel runs the new command line).
    #[serde(default)]
    pub judged_boot: Option<String>,
}

/// The boot loader file a system update replaces.
///
/// What `state.json` keeps of it is what a rollback needs: the file as it
/// was ([`previous_text`](BootEntry::previous_text), at most
/// [`MAX_BOOT_FILE`]) and the labels. The new file itself is written once,
/// by the install that planned it, and not kept: a state that held both
/// held the file twice, and every reader of the state read it twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootEntry {
    /// The file, relative to the prefix (`boot/extlinux/extlinux.conf`).
    pub path: String,
    /// The new label, `DEFAULT` in `text`.
    pub label: String,
    /// The label that was `DEFAULT` (kept in `text` as the fallback).
    pub previous_label: String,
    /// The file as the install writes it: only in the install's own
    /// memory, never in `state.json`.
    #[serde(skip)]
    pub text: String,
    /// The file as it was: written back by a rollback.
    pub previous_text: String,
}

/// Plans the system part of a release (its name, its robot.yaml text): `None`
/// when it changes neither the command line nor the CPU plan; `Err` says
/// why it cannot be installed (the boot loader's file is not one it can
/// change, say).
pub type PlanSystem = dyn Fn(&str, &str) -> Result<Option<SystemUpdate>, String>;

/// `run/rtdeploy/reboot-required`: its presence asks for a reboot, its
/// text says why (in /run: gone after the reboot).
pub fn reboot_marker(prefix: &Path) -> std::path::PathBuf {
    prefix.join(REBOOT_MARKER)
}

/// Where [`reboot_marker`] is, relative to the prefix.
pub const REBOOT_MARKER: &str = "run/rtdeploy/reboot-required";

pub(crate) fn ask_reboot(prefix: &Path, why: &str) -> Result<(), ReleaseError> {
    let path = reboot_marker(prefix);
    let dir = path.parent().expect("run/rtdeploy");
    fs::create_dir_all(dir).map_err(ioe(dir))?;
    fs::write(&path, format!("{why}\n")).map_err(ioe(&path))
}

pub(crate) fn clear_reboot(prefix: &Path) {
    let _ = fs::remove_file(reboot_marker(prefix));
}

/// `run/rtdeploy/restart-trial`: written by a supervisor that stops to
/// start again with the robot.yaml of the release in trial (its processes
/// or channels changed, which only a start sets up). It names the release
/// and the boot: the next start in the same boot takes that trial up
/// instead of rolling it back as interrupted ([`crate::recover_at_boot`]).
/// In /run: a reboot forgets it.
pub const RESTART_MARKER: &str = "run/rtdeploy/restart-trial";

/// The longest [`RESTART_MARKER`] read: two words.
const RESTART_MARKER_MAX: u64 = 512;

/// Writes [`RESTART_MARKER`] for `release` in the boot `boot_id`.
pub fn ask_restart(prefix: &Path, release: &str, boot_id: &str) -> Result<(), ReleaseError> {
    let path = prefix.join(RESTART_MARKER);
    let dir = path.parent().expect("run/rtdeploy");
    fs::create_dir_all(dir).map_err(ioe(dir))?;
    fs::write(&path, format!("{release} {boot_id}\n")).map_err(ioe(&path))
}

/// Whether [`RESTART_MARKER`] asks to take up `release`'s trial in the boot
/// `boot_id`. The marker is removed either way: it serves one start.
pub(crate) fn take_restart(prefix: &Path, release: &str, boot_id: &str) -> bool {
    let path = prefix.join(RESTART_MARKER);
    // A marker that cannot be read, or holds more than
    // [`RESTART_MARKER_MAX`] bytes (two words never do), asks for nothing.
    let read = crate::error::read_regular(&path, RESTART_MARKER_MAX);
    let _ = fs::remove_file(&path);
    let Ok(b) = read else {
        return false;
    };
    let text = String::from_utf8_lossy(&b);
    let mut w = text.split_whitespace();
    !boot_id.is_empty()
        && w.next() == Some(release)
        && w.next() == Some(boot_id)
        && w.next().is_none()
}

/// Writes `text` over the boot entry's file: a temporary file beside it,
/// fsync'd, renamed over it, the directory fsync'd. The file keeps its
/// mode. `stage`/`done` name the fault points around the rename.
pub(crate) fn write_boot_file(
    prefix: &Path,
    rel: &str,
    text: &str,
    fault: Option<(&str, &str)>,
) -> Result<(), ReleaseError> {
    use std::os::unix::fs::PermissionsExt;
    let path = prefix.join(rel);
    if crate::error::read_regular(&path, MAX_BOOT_FILE).is_ok_and(|b| b == text.as_bytes()) {
        return Ok(());
    }
    let dir = path.parent().expect("boot/extlinux");
    let name = path.file_name().expect("a file").to_string_lossy();
    let tmp = dir.join(format!(".{name}.rtdeploy-tmp"));
    let mode = fs::metadata(&path)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o644);
    write_synced(&tmp, text.as_bytes(), mode)?;
    if let Some((stage, _)) = fault {
        fault_point(stage);
    }
    fs::rename(&tmp, &path).map_err(ioe(&path))?;
    sync_dir(dir).map_err(ioe(dir))?;
    if let Some((_, done)) = fault {
        fault_point(done);
    }
    Ok(())
}

/// Removes a temporary boot file a killed install left.
pub(crate) fn remove_stale_boot_file(prefix: &Path, rel: &str) {
    let path = prefix.join(rel);
    if let (Some(dir), Some(name)) = (path.parent(), path.file_name()) {
        let _ = fs::remove_file(dir.join(format!(".{}.rtdeploy-tmp", name.to_string_lossy())));
    }
}

/// What the running kernel is: its boot id and command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boot {
    pub id: String,
    pub cmdline: String,
}

impl Boot {
    /// From `<proc>/sys/kernel/random/boot_id` and `<proc>/cmdline`
    /// (empty when unreadable: no token is then found, and a system trial
    /// is not kept).
    pub fn read(proc_root: &Path) -> Boot {
        // The kernel's command line is at most COMMAND_LINE_SIZE (2048 on
        // arm64, 4096 elsewhere); the boot id 37 bytes.
        let read = |p: &str| {
            units::bounded::Bound::pseudo(64 << 10)
                .read_lossy(&proc_root.join(p))
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        Boot {
            id: read("sys/kernel/random/boot_id"),
            cmdline: read("cmdline"),
        }
    }

    /// The first of `tokens` the command line lacks.
    pub fn missing<'a>(&self, tokens: &'a [String]) -> Option<&'a str> {
        let have: Vec<&str> = self.cmdline.split_whitespace().collect();
        tokens
            .iter()
            .find(|t| !have.contains(&t.as_str()))
            .map(|t| t.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tokens_are_named() {
        let b = Boot {
            id: "x".into(),
            cmdline: "root=/dev/sda isolcpus=managed_irq,domain,3 rcu_nocb_poll".into(),
        };
        assert_eq!(
            b.missing(&[
                "rcu_nocb_poll".into(),
                "isolcpus=managed_irq,domain,3".into()
            ]),
            None
        );
        assert_eq!(
            b.missing(&["isolcpus=managed_irq,domain,2-3".into()]),
            Some("isolcpus=managed_irq,domain,2-3")
        );
    }

    #[test]
    fn the_boot_file_is_replaced_whole_and_keeps_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let rel = "boot/extlinux/extlinux.conf";
        let p = d.path().join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, "old\n").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        write_boot_file(d.path(), rel, "new\n", None).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "new\n");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let names: Vec<_> = fs::read_dir(p.parent().unwrap()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }
}
