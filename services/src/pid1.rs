//! What the supervisor does when it is the first process of the system (or
//! of a PID namespace): mount the kernel file systems that are missing,
//! reap every orphan, and at the end power off or reboot.

use std::path::{Path, PathBuf};

use crate::status::StepStatus;

/// One file system init mounts when it is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    pub target: &'static str,
    pub fstype: &'static str,
    pub source: &'static str,
    pub data: &'static str,
    /// A file that exists once the file system is mounted.
    pub probe: &'static str,
}

/// /proc, /sys, cgroup2, /dev (devtmpfs, when it has no /dev/null),
/// /dev/shm and /run, in mount order.
pub const MOUNTS: &[MountSpec] = &[
    MountSpec {
        target: "proc",
        fstype: "proc",
        source: "proc",
        data: "",
        probe: "proc/self/stat",
    },
    MountSpec {
        target: "sys",
        fstype: "sysfs",
        source: "sysfs",
        data: "",
        probe: "sys/kernel",
    },
    MountSpec {
        target: "sys/fs/cgroup",
        fstype: "cgroup2",
        source: "cgroup2",
        data: "",
        probe: "sys/fs/cgroup/cgroup.controllers",
    },
    MountSpec {
        target: "dev",
        fstype: "devtmpfs",
        source: "devtmpfs",
        data: "mode=0755",
        probe: "dev/null",
    },
    MountSpec {
        target: "dev/shm",
        fstype: "tmpfs",
        source: "tmpfs",
        data: "mode=1777",
        probe: "",
    },
    MountSpec {
        target: "run",
        fstype: "tmpfs",
        source: "tmpfs",
        data: "mode=0755",
        probe: "",
    },
];

/// Whether `target` (under `root`) is a mount point: its device differs
/// from its parent's.
fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(me), Some(parent)) = (std::fs::metadata(path), path.parent()) else {
        return false;
    };
    let Ok(up) = std::fs::metadata(parent) else {
        return false;
    };
    me.dev() != up.dev() || me.ino() == up.ino()
}

/// Mounts what is missing under `root` (`/` for real). Returns one step
/// per file system: `ok` (mounted now), `skipped` (already there), or
/// `failed` with the reason.
pub fn mount_missing(root: &Path) -> Vec<StepStatus> {
    let mut out = Vec::new();
    for m in MOUNTS {
        let target: PathBuf = root.join(m.target);
        let step = format!("mount {}", Path::new("/").join(m.target).display());
        let present = if m.probe.is_empty() {
            is_mount_point(&target)
        } else {
            root.join(m.probe).exists()
        };
        if present {
            out.push(StepStatus {
                step,
                result: "skipped".into(),
                detail: "already mounted".into(),
            });
            continue;
        }
        if let Err(e) = std::fs::create_dir_all(&target) {
            out.push(StepStatus {
                step,
                result: "failed".into(),
                detail: format!("cannot create {}: {e}", target.display()),
            });
            continue;
        }
        let nodev = if m.fstype == "devtmpfs" {
            0
        } else {
            libc::MS_NODEV
        };
        let flags = libc::MS_NOSUID
            | nodev
            | if m.fstype == "tmpfs" {
                0
            } else {
                libc::MS_NOEXEC
            };
        match crate::sys::mount(m.source, &target, m.fstype, flags, m.data) {
            Ok(()) => out.push(StepStatus {
                step,
                result: "ok".into(),
                detail: format!("{} mounted", m.fstype),
            }),
            Err(e) => out.push(StepStatus {
                step,
                result: "failed".into(),
                detail: format!("mount {} on {}: {e}", m.fstype, target.display()),
            }),
        }
    }
    out
}

/// What init does after its last process stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AtExit {
    /// Just exit (in a PID namespace this ends the namespace).
    #[default]
    Exit,
    PowerOff,
    Reboot,
}

/// sync, then reboot(2) as asked. Returns only on failure.
pub fn finish(at_exit: AtExit) -> std::io::Result<()> {
    use rustix::system::RebootCommand;
    let cmd = match at_exit {
        AtExit::Exit => return Ok(()),
        AtExit::PowerOff => RebootCommand::PowerOff,
        AtExit::Reboot => RebootCommand::Restart,
    };
    crate::sys::sync();
    rustix::system::reboot(cmd).map_err(Into::into)
}
