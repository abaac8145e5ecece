//! A Jetson's rootfs A/B slots as this boot found them, for `deploy
//! status`, the metrics and the boot history: which slot runs, each
//! slot's retry count and whether the firmware gave one up (L4TLauncher
//! marks a slot unbootable once its retry count is used up, and boots the
//! other: see `releases::l4t_slots` for NVIDIA's sources). Read once at
//! the supervisor's start: the firmware decides them before Linux runs.
//!
//! Nothing is read on a board without rootfs A/B (no
//! `RootfsRedundancyLevel` = 1 in efivarfs). What cannot be read (a
//! variable that is not a UINT32, an `nvbootctrl` that is missing, fails
//! or hangs: killed after [`NVBOOTCTRL_TIMEOUT`]) is said, not guessed.

use std::path::Path;
use std::time::Duration;

use releases::l4t_slots::{slot_name, Nvbootctrl, Variables};
use serde::{Deserialize, Serialize};

/// How long `nvbootctrl` may take at the supervisor's start (it delays
/// the processes' start by at most this).
pub const NVBOOTCTRL_TIMEOUT: Duration = Duration::from_secs(5);

/// One slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotState {
    pub name: char,
    pub retry_count: u32,
    /// Marked unbootable (status 0xFF): the firmware gave up on it.
    pub unbootable: bool,
}

/// The slots at this boot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootfsSlots {
    /// The slot this boot runs from, and the one the next boot starts
    /// from (absent when `nvbootctrl` could not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<char>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<char>,
    /// `RootfsRetryCountMax` (absent: the firmware's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_max: Option<u32>,
    #[serde(default)]
    pub slots: Vec<SlotState>,
    /// What could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// Whether this boot's verdict confirmed the slot it runs from
    /// (`nvbootctrl verify`); absent until the verdict (the start-up step
    /// `rootfs slot` says why not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed: Option<bool>,
}

/// Confirms the slot this boot runs from with the `nvbootctrl` at
/// `nvbootctrl` (`nvbootctrl verify`, bounded by [`NVBOOTCTRL_TIMEOUT`]):
/// what it did, or why not.
pub fn confirm(nvbootctrl: &Path) -> Result<String, String> {
    tool(nvbootctrl)
        .mark_good()
        .map(|()| "nvbootctrl verify: its retry count is back to the maximum".to_string())
}

/// `nvbootctrl` at `path`, killed after [`NVBOOTCTRL_TIMEOUT`].
fn tool(path: &Path) -> Nvbootctrl {
    Nvbootctrl {
        timeout: NVBOOTCTRL_TIMEOUT,
        ..Nvbootctrl::new(path)
    }
}

impl RootfsSlots {
    /// The slots under the efivarfs directory `efivars`, with the
    /// `nvbootctrl` at `nvbootctrl`; `None` when rootfs A/B is off.
    pub fn read(efivars: &Path, nvbootctrl: &Path) -> Option<RootfsSlots> {
        let vars = match Variables::read_efivars(efivars) {
            Ok(v) if !v.rootfs_ab => return None,
            Ok(v) => v,
            // A garbage variable under NVIDIA's GUID: A/B may be on.
            Err(e) => {
                return Some(RootfsSlots {
                    problem: Some(format!("cannot read the firmware's variables: {e}")),
                    ..RootfsSlots::default()
                })
            }
        };
        let mut out = RootfsSlots {
            retry_max: vars.retry_max,
            ..RootfsSlots::default()
        };
        match tool(nvbootctrl).slots() {
            Ok(Some(info)) => {
                out.current = Some(slot_name(info.current));
                out.active = Some(slot_name(info.active));
                out.slots = info
                    .slots
                    .iter()
                    .enumerate()
                    .map(|(i, s)| SlotState {
                        name: slot_name(i),
                        retry_count: s.retry_count,
                        unbootable: s.unbootable || vars.unbootable.get(i).copied().unwrap_or(false),
                    })
                    .collect();
            }
            Ok(None) => {
                out.problem = Some(
                    "the firmware's RootfsRedundancyLevel says rootfs A/B, nvbootctrl says it is not enabled"
                        .into(),
                )
            }
            Err(e) => out.problem = Some(e),
        }
        if out.slots.is_empty() {
            // What the variables alone say.
            out.slots = (0..2)
                .map(|i| SlotState {
                    name: slot_name(i),
                    retry_count: 0,
                    unbootable: vars.unbootable[i],
                })
                .filter(|s| s.unbootable)
                .collect();
        }
        Some(out)
    }

    /// The slots the firmware gave up on.
    pub fn given_up(&self) -> Vec<char> {
        self.slots
            .iter()
            .filter(|s| s.unbootable)
            .map(|s| s.name)
            .collect()
    }

    /// One line: the slot running, the counts, a slot given up.
    pub fn describe(&self) -> String {
        let mut out = match self.current {
            Some(c) => format!("running slot {c}"),
            None => "running slot unknown".to_string(),
        };
        if let Some(a) = self.active.filter(|a| Some(*a) != self.current) {
            out.push_str(&format!(", next boot from {a}"));
        }
        let max = self.retry_max.map_or(String::new(), |m| format!(" of {m}"));
        for s in &self.slots {
            if s.unbootable {
                out.push_str(&format!(
                    "; slot {} unbootable: the firmware gave up on it after its retries{}",
                    s.name,
                    match self.current {
                        Some(c) if c != s.name => format!(" and booted {c}"),
                        _ => String::new(),
                    }
                ));
            } else if self.current.is_some() {
                out.push_str(&format!(
                    "; slot {} retry count {}{max}",
                    s.name, s.retry_count
                ));
            }
        }
        match self.confirmed {
            Some(true) => out.push_str("; confirmed by this boot's verdict"),
            Some(false) => out.push_str("; not confirmed by this boot (see its rootfs slot step)"),
            None => {}
        }
        if let Some(p) = &self.problem {
            out.push_str(&format!(" ({p})"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const GUID: &str = releases::l4t_slots::NVIDIA_GUID;

    fn var(dir: &Path, name: &str, v: u32) {
        let mut b = 7u32.to_le_bytes().to_vec();
        b.extend_from_slice(&v.to_le_bytes());
        std::fs::write(dir.join(format!("{name}-{GUID}")), b).unwrap();
    }

    fn tool(dir: &Path, script: &str) -> std::path::PathBuf {
        let p = dir.join("nvbootctrl");
        std::fs::write(&p, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    const DUMP_B_GIVEN_UP: &str = "cat <<EOF\nCurrent rootfs slot: A\nActive rootfs slot: A\nnum_slots: 2\nslot: 0,             retry_count: 3,             status: normal\nslot: 1,             retry_count: 0,             status: unbootable\nEOF";

    #[test]
    fn a_slot_given_up_is_said_with_the_one_that_booted() {
        let d = tempfile::tempdir().unwrap();
        var(d.path(), "RootfsRedundancyLevel", 1);
        var(d.path(), "RootfsRetryCountMax", 3);
        var(d.path(), "RootfsStatusSlotA", 0);
        var(d.path(), "RootfsStatusSlotB", 0xFF);
        let s = RootfsSlots::read(d.path(), &tool(d.path(), DUMP_B_GIVEN_UP)).unwrap();
        assert_eq!((s.current, s.active), (Some('A'), Some('A')));
        assert_eq!(s.given_up(), ['B']);
        assert_eq!(
            s.describe(),
            "running slot A; slot A retry count 3 of 3; slot B unbootable: the firmware gave up on it after its retries and booted A"
        );
    }

    #[test]
    fn no_ab_reads_nothing_and_what_cannot_be_read_is_said() {
        let d = tempfile::tempdir().unwrap();
        // No variables (not a Jetson, or A/B not flashed): nothing at all,
        // nvbootctrl not even run.
        let never = tool(d.path(), "touch ran; exit 1");
        assert_eq!(RootfsSlots::read(d.path(), &never), None);
        var(d.path(), "RootfsRedundancyLevel", 0);
        assert_eq!(RootfsSlots::read(d.path(), &never), None);
        assert!(!d.path().join("ran").exists());
        // A/B on, the tool missing: the variables' own word, and why.
        var(d.path(), "RootfsRedundancyLevel", 1);
        var(d.path(), "RootfsStatusSlotA", 0xFF);
        let s = RootfsSlots::read(d.path(), &d.path().join("absent")).unwrap();
        assert_eq!(s.given_up(), ['A']);
        assert!(
            s.describe()
                .starts_with("running slot unknown; slot A unbootable"),
            "{}",
            s.describe()
        );
        assert!(s.problem.as_deref().unwrap().contains("absent"), "{s:?}");
        // A garbage status variable: said, not taken as either.
        var(d.path(), "RootfsStatusSlotA", 7);
        let s = RootfsSlots::read(d.path(), &never).unwrap();
        assert!(s.problem.as_deref().unwrap().contains("neither 0"), "{s:?}");
        // A tool that hangs is killed within the bound.
        var(d.path(), "RootfsStatusSlotA", 0);
        let t = std::time::Instant::now();
        let s = RootfsSlots::read(d.path(), &tool(d.path(), "exec sleep 60")).unwrap();
        assert!(t.elapsed() < NVBOOTCTRL_TIMEOUT + Duration::from_secs(5));
        assert!(s.problem.as_deref().unwrap().contains("killed"), "{s:?}");
    }
}
