//! Switching releases: a new release begins in trial, is committed when
//! healthy or rolled back, and a trial the supervisor finds at its start
//! (a crash, a power cut) is rolled back. The health verdict that decides
//! between commit and rollback is the supervisor's; this module only
//! moves the links and the state.

use std::fs;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::boot_attempts::{self, BootLoaderSaw};
use crate::bundle::MANIFEST_NAME;
use crate::error::ReleaseError;
use crate::fault::fault_point;
use crate::layout::Layout;
use crate::lock::UpdateLock;
use crate::prune::prune;
use crate::state::{
    describe_state, link_target, read_state, switch_link, unix_now, write_state, ReleaseState,
};
use crate::system::{
    ask_reboot, clear_reboot, remove_stale_boot_file, take_restart, write_boot_file, Boot,
    SystemUpdate, MAX_TRIAL_BOOTS, RESTART_MARKER,
};

/// Switches `current` to `release` (which must be complete in
/// `releases/`) in trial: `state.json` says trial first, then `previous`
/// and `current` move by rename. Returns the new state, or `None` when
/// `release` already is current. The first release on a robot (nothing to
/// go back to) is committed at once.
pub fn begin_trial(prefix: &Path, release: &str) -> Result<Option<ReleaseState>, ReleaseError> {
    begin_system_trial(prefix, release, None)
}

/// [`begin_trial`] for a release that may change the system: with
/// `system`, the trial records it, and once `current` names the new
/// release the boot loader's file is replaced and a reboot asked for
/// ([`crate::system`]). The first release on a robot ignores `system`
/// (it is committed; the image it came with booted its line).
pub fn begin_system_trial(
    prefix: &Path,
    release: &str,
    system: Option<SystemUpdate>,
) -> Result<Option<ReleaseState>, ReleaseError> {
    let layout = Layout::new(prefix);
    let dir = layout.release(release);
    if !dir.join(MANIFEST_NAME).is_file() {
        return Err(ReleaseError::Incomplete {
            path: dir,
            why: "no manifest.json".into(),
        });
    }
    if let Some(ReleaseState::Trial { release: r, .. }) = read_state(prefix)? {
        return Err(ReleaseError::TrialInProgress { release: r });
    }
    let cur = link_target(&layout.current());
    if cur.as_deref() == Some(release) {
        return Ok(None);
    }
    let state = match &cur {
        Some(c) if layout.release(c).is_dir() => ReleaseState::Trial {
            release: release.to_string(),
            since: unix_now(),
            previous: c.clone(),
            previous_link: link_target(&layout.previous()),
            system: system.clone().map(Box::new),
        },
        _ => ReleaseState::Committed {
            release: release.to_string(),
        },
    };
    write_state(prefix, &state)?;
    fault_point("state-trial");
    if let Some(c) = &cur {
        switch_link(&layout.previous(), c)?;
    }
    fault_point("previous-switched");
    switch_link(&layout.current(), release)?;
    fault_point("current-switched");
    if let ReleaseState::Trial {
        system: Some(sys), ..
    } = &state
    {
        if let (Some(e), Some(a)) = (&sys.boot_entry, &sys.boot_attempts) {
            // The count is armed before extlinux.conf names the new label
            // DEFAULT: a cut in between leaves a count of a label the
            // boot loader does not find (it boots DEFAULT, the previous
            // one), never a new DEFAULT that nothing counts.
            boot_attempts::write_state(
                &prefix.join(&a.dir),
                Some((&e.label, &e.previous_label, a.limit)),
            )
            .inspect_err(|_| {
                let _ = rollback(prefix);
            })?;
            fault_point("attempts-armed");
        }
        if let Some(e) = &sys.boot_entry {
            write_boot_file(
                prefix,
                &e.path,
                &e.text,
                Some(("boot-staged", "boot-written")),
            )
            .inspect_err(|_| {
                // Nothing boots the new line: the trial is undone at once
                // (the next start would do it after a reboot).
                remove_stale_boot_file(prefix, &e.path);
                let _ = rollback(prefix);
            })?;
        }
        ask_reboot(
            prefix,
            &format!(
                "release {release} changes the system ({}): reboot to run it",
                sys.changes.join("; ")
            ),
        )?;
    }
    Ok(Some(state))
}

/// Marks the release in trial as good, then prunes to `keep` releases
/// (unless the update lock is held: then the next install prunes).
pub fn commit(prefix: &Path, keep: u32) -> Result<String, ReleaseError> {
    match read_state(prefix)? {
        Some(ReleaseState::Trial {
            release,
            system: Some(sys),
            ..
        }) if sys.judged_boot.is_none() => Err(ReleaseError::RebootPending { release }),
        Some(ReleaseState::Trial {
            release, system, ..
        }) => {
            // The boot loader stops counting before the release is
            // committed: committed first, a cut could leave a count that
            // falls back from a committed release's label.
            if let Some(a) = system.as_ref().and_then(|s| s.boot_attempts.as_ref()) {
                boot_attempts::write_state(&prefix.join(&a.dir), None)?;
            }
            write_state(
                prefix,
                &ReleaseState::Committed {
                    release: release.clone(),
                },
            )?;
            // Pruning waits for a moment without an install (or a holder)
            // working on the store; a caller holding the lock prunes itself.
            if let Ok(Some(_lock)) = UpdateLock::try_acquire(prefix, "commit") {
                prune(prefix, keep)?;
            }
            Ok(release)
        }
        other => Err(ReleaseError::NotInTrial {
            state: describe_state(&other),
        }),
    }
}

/// What a rollback did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rollback {
    /// The release that was current.
    pub from: String,
    /// The release that is current now (committed).
    pub to: String,
    /// Whether it ended a trial (else it was a manual rollback of a
    /// committed release).
    pub trial: bool,
    /// A system update was undone after the robot booted its command line:
    /// the boot loader's file is back, and a reboot is needed to run the
    /// previous plan (`run/rtdeploy/reboot-required` says so).
    pub reboot: bool,
}

/// Goes back: from a trial, to the release before it (and `previous` as it
/// was before the install); from a committed release, to `previous` (the
/// two swap). The result is committed.
pub fn rollback(prefix: &Path) -> Result<Rollback, ReleaseError> {
    let layout = Layout::new(prefix);
    match read_state(prefix)? {
        Some(ReleaseState::Trial {
            release,
            previous,
            previous_link,
            system,
            ..
        }) => {
            if !layout.release(&previous).join(MANIFEST_NAME).is_file() {
                return Err(ReleaseError::NoPrevious {
                    why: format!("release {previous} is gone"),
                });
            }
            // The boot loader's file first, while the state still says
            // trial: a crash after it runs this again.
            if let Some(e) = system.as_ref().and_then(|s| s.boot_entry.as_ref()) {
                remove_stale_boot_file(prefix, &e.path);
                write_boot_file(prefix, &e.path, &e.previous_text, None)?;
            }
            // Then the count: extlinux.conf no longer has the new label, so
            // a count left behind (the boot partition not mounted, a cut)
            // names a label the boot loader does not find, and it boots
            // the restored DEFAULT. The next system update writes over it.
            if let Some(a) = system.as_ref().and_then(|s| s.boot_attempts.as_ref()) {
                let _ = boot_attempts::write_state(&prefix.join(&a.dir), None);
            }
            let reboot = system.as_ref().is_some_and(|s| s.judged_boot.is_some());
            // current first: a crash here leaves state `trial`, and the next
            // recovery runs this again.
            switch_link(&layout.current(), &previous)?;
            match previous_link.filter(|p| layout.release(p).is_dir()) {
                Some(p) => switch_link(&layout.previous(), &p)?,
                None => {
                    let _ = fs::remove_file(layout.previous());
                }
            }
            write_state(
                prefix,
                &ReleaseState::Committed {
                    release: previous.clone(),
                },
            )?;
            if reboot {
                ask_reboot(
                    prefix,
                    &format!("release {release} was rolled back to {previous}: reboot to run its kernel command line and CPU plan"),
                )?;
            } else if system.is_some() {
                clear_reboot(prefix);
            }
            Ok(Rollback {
                from: release,
                to: previous,
                trial: true,
                reboot,
            })
        }
        _ => {
            let cur = link_target(&layout.current()).ok_or_else(|| ReleaseError::NoPrevious {
                why: "no current release".into(),
            })?;
            let prev = link_target(&layout.previous())
                .filter(|p| p != &cur && layout.release(p).join(MANIFEST_NAME).is_file())
                .ok_or_else(|| ReleaseError::NoPrevious {
                    why: format!("{} names no other release", layout.previous().display()),
                })?;
            write_state(
                prefix,
                &ReleaseState::Committed {
                    release: prev.clone(),
                },
            )?;
            switch_link(&layout.current(), &prev)?;
            switch_link(&layout.previous(), &cur)?;
            Ok(Rollback {
                from: cur,
                to: prev,
                trial: false,
                reboot: false,
            })
        }
    }
}

/// What [`recover_at_start`] found and did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recovery {
    /// The release `current` names now.
    pub current: Option<String>,
    /// A trial was interrupted (crash, power cut) and rolled back.
    pub rolled_back: Option<Rollback>,
    /// Why the trial was rolled back, when it was a system update's (its
    /// trial spans a reboot, so being found is not reason enough).
    pub reason: Option<String>,
    /// A system update's trial the robot rebooted into, with the new
    /// command line running: kept, to be judged once the CPU plan applied.
    pub system_trial: Option<String>,
    /// A trial the supervisor stopped to start again with its robot.yaml
    /// ([`crate::system::ask_restart`], in this boot): kept, to be judged.
    pub restarted_trial: Option<String>,
    /// A system update's trial counted by the boot loader: what it did
    /// (the attempt, or the fallback).
    pub boot_loader: Option<BootLoaderSaw>,
    /// `current` did not match the committed release and was put back.
    pub repaired: bool,
    /// Leftover temporary directories removed.
    pub cleaned: Vec<String>,
}

/// [`recover_at_boot`] reading the running kernel from `/proc`.
pub fn recover_at_start(prefix: &Path) -> Result<Recovery, ReleaseError> {
    recover_at_boot(prefix, Path::new("/proc"))
}

/// Run once at supervisor start, before any process starts and before the
/// CPU plan applies: a trial found here was interrupted, so it is rolled
/// back (unless the supervisor itself stopped to start again with the
/// trial's robot.yaml, [`crate::system::ask_restart`], in this boot);
/// `current` is put back to the committed release if they disagree;
/// leftovers of killed installs go. Waits up to 5 s for the update lock
/// (an install still running).
///
/// A system update's trial ([`crate::system`]) is kept when this is the
/// first start after the reboot it asked for and the running kernel
/// (`proc_root`: its boot id and command line) has every token of the new
/// line; its boot counter is written before this returns. Otherwise
/// (no reboot yet, a second start, the old line booted) it is rolled back,
/// its boot loader's file restored, and a reboot asked for when the
/// running kernel lacks the previous line.
pub fn recover_at_boot(prefix: &Path, proc_root: &Path) -> Result<Recovery, ReleaseError> {
    let layout = Layout::new(prefix);
    let _lock = UpdateLock::acquire(prefix, "recover", Duration::from_secs(5))?;
    let mut out = Recovery {
        current: None,
        rolled_back: None,
        reason: None,
        system_trial: None,
        restarted_trial: None,
        boot_loader: None,
        repaired: false,
        cleaned: Vec::new(),
    };
    for e in fs::read_dir(layout.releases())
        .into_iter()
        .flatten()
        .flatten()
    {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with(".tmp-") && fs::remove_dir_all(e.path()).is_ok() {
            out.cleaned.push(n);
        }
    }
    layout.store().remove_stale_staging();
    match read_state(prefix)? {
        Some(ReleaseState::Trial {
            release,
            since,
            previous,
            previous_link,
            system: Some(mut sys),
        }) => {
            if let Some(e) = &sys.boot_entry {
                remove_stale_boot_file(prefix, &e.path);
            }
            let boot = Boot::read(proc_root);
            // What the boot loader counted, read once per boot (a second
            // start in the same boot keeps what the first read).
            let first_start = !boot.id.is_empty()
                && boot.id != sys.install_boot
                && sys.judged_boot.as_deref() != Some(boot.id.as_str());
            if let (Some(e), Some(a), true) = (&sys.boot_entry, &sys.boot_attempts, first_start) {
                sys.boot_loader =
                    Some(BootLoaderSaw::read(&prefix.join(&a.dir), &e.label, a.limit));
            }
            let fell_back = match &sys.boot_loader {
                Some(saw) if saw.fell_back => Some(saw.describe()),
                _ => None,
            };
            let why = if boot.id.is_empty() || boot.id == sys.install_boot {
                Some(
                    "the supervisor started again before the reboot the system update needs"
                        .to_string(),
                )
            } else if sys.boots >= MAX_TRIAL_BOOTS {
                Some(format!(
                    "start {} of the system update's trial without a verdict (a reset, a power cut or a crash during the trial; the boot counter allows {MAX_TRIAL_BOOTS})",
                    sys.boots + 1
                ))
            } else if let (Some(t), Some(fell)) = (boot.missing(&sys.tokens), &fell_back) {
                Some(format!(
                    "{fell}: the kernel runs without `{t}` of the new command line (a boot that hangs before the supervisor starts: a wrong root=, a kernel or driver that does not come up, a panic)"
                ))
            } else {
                boot.missing(&sys.tokens).map(|t| {
                    format!(
                        "the kernel booted without `{t}` of the new command line{}",
                        match &sys.boot_entry {
                            Some(e) => format!(" (label {} was not booted)", e.label),
                            None =>
                                " (the boot loader gives the command line: change it there)".into(),
                        }
                    )
                })
            };
            out.boot_loader = sys.boot_loader.clone();
            sys.boots += 1;
            match why {
                None => {
                    // Counted before anything else runs in this boot: a
                    // reset from here on is the next start's business.
                    sys.judged_boot = Some(boot.id.clone());
                    write_state(
                        prefix,
                        &ReleaseState::Trial {
                            release: release.clone(),
                            since,
                            previous,
                            previous_link,
                            system: Some(sys),
                        },
                    )?;
                    clear_reboot(prefix);
                    out.system_trial = Some(release);
                }
                Some(why) => {
                    let mut rb = rollback(prefix)?;
                    rb.reboot = boot.missing(&sys.previous_tokens).is_some();
                    if rb.reboot {
                        ask_reboot(prefix, &format!("release {} was rolled back to {}: reboot to run its kernel command line", rb.from, rb.to))?;
                    } else {
                        clear_reboot(prefix);
                    }
                    out.rolled_back = Some(rb);
                    out.reason = Some(why);
                }
            }
        }
        Some(ReleaseState::Trial { release, .. }) => {
            if take_restart(prefix, &release, &Boot::read(proc_root).id) {
                out.restarted_trial = Some(release);
            } else {
                out.rolled_back = Some(rollback(prefix)?);
            }
        }
        Some(ReleaseState::Committed { release }) => {
            if link_target(&layout.current()).as_deref() != Some(release.as_str())
                && layout.release(&release).join(MANIFEST_NAME).is_file()
            {
                switch_link(&layout.current(), &release)?;
                out.repaired = true;
            }
        }
        None => {
            if let Some(c) = link_target(&layout.current()) {
                write_state(prefix, &ReleaseState::Committed { release: c })?;
            }
        }
    }
    // A restart marker serves the start right after it, or none.
    let _ = fs::remove_file(prefix.join(RESTART_MARKER));
    out.current = link_target(&layout.current());
    Ok(out)
}
