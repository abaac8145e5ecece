//! Switching releases: a new release begins in trial, is committed when
//! healthy or rolled back, and a trial the supervisor finds at its start
//! (a crash, a power cut) is rolled back. The health verdict that decides
//! between commit and rollback is the supervisor's; this module only
//! moves the links and the state.

use std::fs;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::bundle::MANIFEST_NAME;
use crate::error::ReleaseError;
use crate::fault::fault_point;
use crate::layout::Layout;
use crate::lock::UpdateLock;
use crate::prune::prune;
use crate::state::{
    describe_state, link_target, read_state, switch_link, unix_now, write_state, ReleaseState,
};

/// Switches `current` to `release` (which must be complete in
/// `releases/`) in trial: `state.json` says trial first, then `previous`
/// and `current` move by rename. Returns the new state, or `None` when
/// `release` already is current. The first release on a robot (nothing to
/// go back to) is committed at once.
pub fn begin_trial(prefix: &Path, release: &str) -> Result<Option<ReleaseState>, ReleaseError> {
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
    Ok(Some(state))
}

/// Marks the release in trial as good, then prunes to `keep` releases
/// (unless the update lock is held: then the next install prunes).
pub fn commit(prefix: &Path, keep: u32) -> Result<String, ReleaseError> {
    match read_state(prefix)? {
        Some(ReleaseState::Trial { release, .. }) => {
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
            ..
        }) => {
            if !layout.release(&previous).join(MANIFEST_NAME).is_file() {
                return Err(ReleaseError::NoPrevious {
                    why: format!("release {previous} is gone"),
                });
            }
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
            Ok(Rollback {
                from: release,
                to: previous,
                trial: true,
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
    /// `current` did not match the committed release and was put back.
    pub repaired: bool,
    /// Leftover temporary directories removed.
    pub cleaned: Vec<String>,
}

/// Run once at supervisor start, before any process starts: a trial found
/// here was interrupted, so it is rolled back; `current` is put back to the
/// committed release if they disagree; leftovers of killed installs go.
/// Waits up to 5 s for the update lock (an install still running).
pub fn recover_at_start(prefix: &Path) -> Result<Recovery, ReleaseError> {
    let layout = Layout::new(prefix);
    let _lock = UpdateLock::acquire(prefix, "recover", Duration::from_secs(5))?;
    let mut out = Recovery {
        current: None,
        rolled_back: None,
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
        Some(ReleaseState::Trial { .. }) => out.rolled_back = Some(rollback(prefix)?),
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
    out.current = link_target(&layout.current());
    Ok(out)
}
