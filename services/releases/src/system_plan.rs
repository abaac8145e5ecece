//! The system part of a release, planned for the installer (`deploy
//! install`, the Mender module and `deploy update`'s robot end, which
//! install through the same options): a release whose robot.yaml changes the kernel command
//! line or the CPU plan (isolated CPUs, a process's CPUs, IRQs, sysctls,
//! power) is a system update. Its trial spans a reboot
//! ([`crate::system`]): on an extlinux board the new command line goes
//! into `/boot/extlinux/extlinux.conf` under a new label made `DEFAULT`
//! (the previous `DEFAULT` kept as fallback, labels of older system
//! updates pruned: the image builder's `rootfs::extlinux::add_system_entry`,
//! given as an [`AddBootEntry`], since the image builder is above this
//! crate).

use std::path::Path;

use cpusets::board::BootLoader;
use cpusets::cmdline::Token;
use units::cpu::CpuSet;

use crate::boot_attempts::BootAttempts;
use crate::system::{BootEntry, SystemUpdate};

/// extlinux.conf, relative to the prefix.
pub const EXTLINUX: &str = "boot/extlinux/extlinux.conf";

/// A robot.yaml's system part: what a system update changes.
#[derive(Debug, Clone, Copy)]
pub struct SystemPart<'a> {
    /// The sections the CPU plan reads (board, cpus, kernel, irqs,
    /// sysctl, power).
    pub isolation: cpusets::plan::Isolation<'a>,
    /// Every CPU of the board.
    pub all_cpus: &'a CpuSet,
    /// Each process's name and the CPUs it runs on, in robot.yaml's order.
    pub processes: &'a [(String, CpuSet)],
    /// `update.boot_attempts`: the boot partition's mount point (absolute)
    /// and the limit ([`crate::boot_attempts`]).
    pub boot_attempts: Option<(&'a str, u8)>,
}

impl SystemPart<'_> {
    fn tokens(&self) -> Vec<Token> {
        cpusets::cmdline::plan(self.isolation.cpus, self.isolation.kernel, self.all_cpus)
    }
}

/// The new boot entry in extlinux.conf's `text` for `release`, from the
/// old command line's tokens to the new one's: the new text, its label and
/// the label that was `DEFAULT`; `Err`: why the file cannot take it.
pub type AddBootEntry =
    dyn Fn(&str, &str, &[Token], &[Token]) -> Result<(String, String, String), Vec<String>>;

/// Why a system update could not be planned.
#[derive(Debug, thiserror::Error)]
pub enum SystemPlanError {
    #[error("the board boots through extlinux.conf and {} cannot be read: {err}", path.display())]
    ReadBootFile {
        path: std::path::PathBuf,
        err: std::io::Error,
    },
    #[error("{} cannot take its boot entry: {}", path.display(), problems.join("; "))]
    BootEntry {
        path: std::path::PathBuf,
        problems: Vec<String>,
    },
    #[error("{} cannot be read: {err}", path.display())]
    ReadBootId {
        path: std::path::PathBuf,
        err: std::io::Error,
    },
}

/// What differs between two robot.yaml's system parts, one line each.
pub fn changes(old: &SystemPart, new: &SystemPart) -> Vec<String> {
    let mut out = Vec::new();
    let line = |r: &SystemPart| cpusets::cmdline::render(&r.tokens());
    let (a, b) = (line(old), line(new));
    if a != b {
        let outside = new
            .isolation
            .board
            .board()
            .is_none_or(|b| b.boot != BootLoader::Extlinux);
        out.push(format!(
            "kernel command line `{a}` -> `{b}`{}",
            if outside {
                " (this board's boot loader gives it: set it there before the reboot, or the trial is rolled back)"
            } else {
                ""
            }
        ));
    }
    if old.isolation.cpus.isolated != new.isolation.cpus.isolated {
        out.push(format!(
            "isolated CPUs {} -> {}",
            old.isolation.cpus.isolated, new.isolation.cpus.isolated
        ));
    }
    for (name, now) in new.processes {
        match old.processes.iter().find(|(o, _)| o == name) {
            Some((_, was)) if was != now => {
                out.push(format!("process {name}: CPUs {was} -> {now}"))
            }
            _ => {}
        }
    }
    let differs =
        |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") != format!("{b:?}");
    if out.is_empty() && differs(old.isolation.cpus, new.isolation.cpus) {
        out.push("cpus: section changed".into());
    }
    for (name, changed) in [
        ("irqs", differs(old.isolation.irqs, new.isolation.irqs)),
        (
            "sysctl",
            differs(old.isolation.sysctl, new.isolation.sysctl),
        ),
        ("power", differs(old.isolation.power, new.isolation.power)),
    ] {
        if changed {
            out.push(format!("{name}: section changed"));
        }
    }
    out
}

/// The system update of `release` (`None`: it changes no system part),
/// from this robot's system part (`old`) to the release's (`new`); on an
/// extlinux board with a new command line, its boot entry is made from
/// `<prefix>/boot/extlinux/extlinux.conf` by `add_entry`. `boot_id` is the
/// kernel's boot id file (the boot the install runs in).
pub fn plan(
    prefix: &Path,
    boot_id: &Path,
    old: &SystemPart,
    new: &SystemPart,
    release: &str,
    add_entry: &AddBootEntry,
) -> Result<Option<SystemUpdate>, SystemPlanError> {
    let changes = changes(old, new);
    if changes.is_empty() {
        return Ok(None);
    }
    let (old_t, new_t) = (old.tokens(), new.tokens());
    let boot_entry = match new.isolation.board.board().map(|b| b.boot) {
        Some(BootLoader::Extlinux) if old_t != new_t => {
            let path = prefix.join(EXTLINUX);
            // Bounded (units::bounded): a file over the boot loader's
            // sizes is refused here, before it could reach state.json.
            let text = units::bounded::Bound::regular(crate::system::MAX_BOOT_FILE)
                .read_text(&path)
                .map_err(|e| SystemPlanError::ReadBootFile {
                    path: path.clone(),
                    err: e.into_io(),
                })?;
            let (entry_text, label, previous_label) = add_entry(&text, release, &old_t, &new_t)
                .map_err(|problems| SystemPlanError::BootEntry {
                    path: path.clone(),
                    problems,
                })?;
            Some(BootEntry {
                path: EXTLINUX.into(),
                label,
                previous_label,
                text: entry_text,
                previous_text: text,
            })
        }
        _ => None,
    };
    let install_boot = units::bounded::Bound::pseudo(64)
        .read_lossy(boot_id)
        .map(|s| s.trim().to_string())
        .map_err(|e| SystemPlanError::ReadBootId {
            path: boot_id.to_path_buf(),
            err: e.into_io(),
        })?;
    let names = |t: &[Token]| t.iter().map(|t| t.token.clone()).collect();
    // Counted by the boot loader only when there is a new label to count
    // (the new robot.yaml says how).
    let boot_attempts = match (&boot_entry, new.boot_attempts) {
        (Some(_), Some((dir, limit))) => Some(BootAttempts {
            dir: dir.trim_start_matches('/').to_string(),
            limit,
        }),
        _ => None,
    };
    Ok(Some(SystemUpdate {
        changes,
        tokens: names(&new_t),
        previous_tokens: names(&old_t),
        boot_entry,
        boot_attempts,
        boot_loader: None,
        install_boot,
        boots: 0,
        judged_boot: None,
    }))
}
