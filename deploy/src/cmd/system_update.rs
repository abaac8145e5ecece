//! The system part of a release, planned for `deploy install` (and the
//! Mender module and `deploy update`'s robot end, which install through the
//! same options): a release whose robot.yaml changes the kernel command
//! line or the CPU plan (isolated CPUs, a process's CPUs, IRQs, sysctls,
//! power) is a system update. Its trial spans a reboot
//! ([`releases::system`]): on an extlinux board the new command line goes
//! into `/boot/extlinux/extlinux.conf` under a new label made `DEFAULT`
//! (the previous `DEFAULT` kept as fallback, labels of older system
//! updates pruned: [`rootfs::extlinux::add_system_entry`]).

use std::path::Path;

use cpusets::board::BootLoader;
use releases::system::BootEntry;
use releases::{PlanSystem, SystemUpdate};

use crate::ctx::Ctx;
use services::robot::Robot;

/// extlinux.conf, relative to the prefix.
pub const EXTLINUX: &str = "boot/extlinux/extlinux.conf";

/// What differs between two robot.yaml's system parts, one line each.
pub fn changes(old: &Robot, new: &Robot) -> Vec<String> {
    let mut out = Vec::new();
    let line = |r: &Robot| {
        cpusets::cmdline::render(&cpusets::cmdline::plan(&r.cpus, &r.kernel, &r.all_cpus()))
    };
    let (a, b) = (line(old), line(new));
    if a != b {
        let outside = new
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
    if old.cpus.isolated != new.cpus.isolated {
        out.push(format!(
            "isolated CPUs {} -> {}",
            old.cpus.isolated, new.cpus.isolated
        ));
    }
    for p in &new.processes {
        let now = new.process_cpus(p);
        match old.processes.iter().find(|o| o.name == p.name) {
            Some(o) if old.process_cpus(o) != now => out.push(format!(
                "process {}: CPUs {} -> {now}",
                p.name,
                old.process_cpus(o)
            )),
            _ => {}
        }
    }
    let differs =
        |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") != format!("{b:?}");
    if out.is_empty() && differs(&old.cpus, &new.cpus) {
        out.push("cpus: section changed".into());
    }
    for (name, changed) in [
        ("irqs", differs(&old.irqs, &new.irqs)),
        ("sysctl", differs(&old.sysctl, &new.sysctl)),
        ("power", differs(&old.power, &new.power)),
    ] {
        if changed {
            out.push(format!("{name}: section changed"));
        }
    }
    out
}

/// The planner `deploy install` hands the installer: this robot's
/// robot.yaml (`old`) against each new release's.
pub fn planner(ctx: &Ctx, old: Robot) -> Box<PlanSystem> {
    let prefix = ctx.prefix.clone();
    let boot_id = ctx.sys("/proc/sys/kernel/random/boot_id");
    Box::new(move |release: &str, yaml: &str| {
        let new = services::robot::load_str(Path::new("robot.yaml"), yaml.to_string())
            .map_err(|e| format!("its robot.yaml does not load: {e}"))?
            .robot;
        plan(&prefix, &boot_id, &old, &new, release)
    })
}

fn plan(
    prefix: &Path,
    boot_id: &Path,
    old: &Robot,
    new: &Robot,
    release: &str,
) -> Result<Option<SystemUpdate>, String> {
    let changes = changes(old, new);
    if changes.is_empty() {
        return Ok(None);
    }
    let tokens = |r: &Robot| cpusets::cmdline::plan(&r.cpus, &r.kernel, &r.all_cpus());
    let (old_t, new_t) = (tokens(old), tokens(new));
    let boot_entry = match new.board.board().map(|b| b.boot) {
        Some(BootLoader::Extlinux) if old_t != new_t => {
            let path = prefix.join(EXTLINUX);
            // Bounded (units::bounded): a file over the boot loader's
            // sizes is refused here, before it could reach state.json.
            let text = units::bounded::Bound::regular(releases::system::MAX_BOOT_FILE)
                .read_text(&path)
                .map_err(|e| {
                    format!(
                        "the board boots through extlinux.conf and {} cannot be read: {}",
                        path.display(),
                        e.into_io()
                    )
                })?;
            let e = rootfs::extlinux::add_system_entry(&text, release, &old_t, &new_t).map_err(
                |p| {
                    format!(
                        "{} cannot take its boot entry: {}",
                        path.display(),
                        p.join("; ")
                    )
                },
            )?;
            Some(BootEntry {
                path: EXTLINUX.into(),
                label: e.label,
                previous_label: e.previous_label,
                text: e.text,
                previous_text: text,
            })
        }
        _ => None,
    };
    let install_boot = units::bounded::Bound::pseudo(64)
        .read_lossy(boot_id)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("{} cannot be read: {}", boot_id.display(), e.into_io()))?;
    let names = |t: &[cpusets::cmdline::Token]| t.iter().map(|t| t.token.clone()).collect();
    Ok(Some(SystemUpdate {
        changes,
        tokens: names(&new_t),
        previous_tokens: names(&old_t),
        boot_entry,
        install_boot,
        boots: 0,
        judged_boot: None,
    }))
}
