//! The releases on the robot: listing them, and pruning to `update.keep`
//! releases and the store blobs they use.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::bundle::{sync_dir, Manifest, MANIFEST_NAME, MAX_MANIFEST};
use crate::error::{ioe, read_regular, ReleaseError};
use crate::layout::Layout;
use crate::state::{link_target, read_state, ReleaseState};

/// One release on the robot.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReleaseInfo {
    pub name: String,
    pub version: Option<String>,
    pub files: usize,
    pub bytes: u64,
    pub current: bool,
    pub previous: bool,
    pub trial: bool,
    pub committed: bool,
}

/// Every release, newest first, with the state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReleasesInfo {
    pub current: Option<String>,
    pub previous: Option<String>,
    pub state: Option<ReleaseState>,
    pub releases: Vec<ReleaseInfo>,
}

fn release_dirs(layout: &Layout) -> Vec<(String, SystemTime)> {
    let mut v: Vec<(String, SystemTime)> = fs::read_dir(layout.releases())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| {
            let t = e
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(UNIX_EPOCH);
            (e.file_name().to_string_lossy().into_owned(), t)
        })
        .collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    v
}

/// Lists the releases: which is current, previous, on trial, committed.
pub fn list(prefix: &Path) -> Result<ReleasesInfo, ReleaseError> {
    let layout = Layout::new(prefix);
    let state = read_state(prefix)?;
    let current = link_target(&layout.current());
    let previous = link_target(&layout.previous());
    let releases = release_dirs(&layout)
        .into_iter()
        .map(|(name, _)| {
            let m = read_regular(&layout.release(&name).join(MANIFEST_NAME), MAX_MANIFEST)
                .ok()
                .and_then(|b| Manifest::parse(&b).ok());
            ReleaseInfo {
                version: m.as_ref().map(|m| m.version.clone()),
                files: m.as_ref().map_or(0, |m| m.files.len()),
                bytes: m.as_ref().map_or(0, |m| m.total_size()),
                current: current.as_deref() == Some(&name),
                previous: previous.as_deref() == Some(&name),
                trial: matches!(&state, Some(ReleaseState::Trial { release, .. }) if *release == name),
                committed: matches!(&state, Some(ReleaseState::Committed { release }) if *release == name),
                name,
            }
        })
        .collect();
    Ok(ReleasesInfo {
        current,
        previous,
        state,
        releases,
    })
}

/// Keeps the newest `keep` releases (never removing current, previous, or
/// the release a trial would go back to), then removes store blobs no kept
/// release uses. Returns (releases removed, blobs removed).
pub fn prune(prefix: &Path, keep: u32) -> Result<(Vec<String>, usize), ReleaseError> {
    let layout = Layout::new(prefix);
    let mut pinned: BTreeSet<String> = [
        link_target(&layout.current()),
        link_target(&layout.previous()),
    ]
    .into_iter()
    .flatten()
    .collect();
    if let Some(ReleaseState::Trial {
        release,
        previous,
        previous_link,
        ..
    }) = read_state(prefix)?
    {
        pinned.extend(
            [Some(release), Some(previous), previous_link]
                .into_iter()
                .flatten(),
        );
    }
    let all = release_dirs(&layout);
    let mut kept: Vec<String> = all
        .iter()
        .filter(|(n, _)| pinned.contains(n))
        .map(|(n, _)| n.clone())
        .collect();
    let mut removed = Vec::new();
    for (n, _) in &all {
        if pinned.contains(n) {
            continue;
        }
        if (kept.len() as u32) < keep.max(1) {
            kept.push(n.clone());
        } else {
            let p = layout.release(n);
            // Renamed away first so a half-removed release never looks whole.
            let doomed = layout.releases().join(format!(".tmp-rm-{n}"));
            fs::rename(&p, &doomed).map_err(ioe(&p))?;
            fs::remove_dir_all(&doomed).map_err(ioe(&doomed))?;
            removed.push(n.clone());
        }
    }
    if !removed.is_empty() {
        sync_dir(&layout.releases()).map_err(ioe(&layout.releases()))?;
    }
    let mut used = BTreeSet::new();
    for n in &kept {
        let Ok(b) = read_regular(&layout.release(n).join(MANIFEST_NAME), MAX_MANIFEST) else {
            continue;
        };
        let Ok(m) = Manifest::parse(&b) else { continue };
        used.extend(m.blobs().into_iter().map(|(s, _)| s));
    }
    let (blobs, _) = layout.store().gc(&used)?;
    Ok((removed, blobs))
}
