//! `state.json` and the `current` and `previous` links: what is running
//! and whether it is committed or on trial. Every change is durable before
//! it returns: the state file is written to a temporary name, fsync'd and
//! renamed; a link is switched by renaming a fresh symlink over it; the
//! directory is fsync'd after each rename.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::bundle::sync_dir;
use crate::error::{ioe, read_regular, ReleaseError};
use crate::layout::Layout;
use crate::system::SystemUpdate;

/// `state.json`: whether `current` is committed or on trial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum ReleaseState {
    Committed {
        release: String,
    },
    Trial {
        release: String,
        /// Unix seconds when the trial began.
        since: u64,
        /// The release to go back to.
        previous: String,
        /// Where `previous` pointed before the install (restored on
        /// rollback).
        #[serde(default)]
        previous_link: Option<String>,
        /// A release that changes the kernel command line or the CPU plan:
        /// its trial spans a reboot ([`crate::system`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        system: Option<Box<SystemUpdate>>,
    },
}

impl ReleaseState {
    pub fn release(&self) -> &str {
        match self {
            ReleaseState::Committed { release } | ReleaseState::Trial { release, .. } => release,
        }
    }
}

/// The most of `state.json` read: a trial record with a system update
/// (its previous extlinux.conf at most [`crate::system::MAX_BOOT_FILE`],
/// six times as JSON at worst) is well under this.
pub const MAX_STATE_FILE: u64 = 1 << 20;

/// Reads `state.json` (`None` if there is none yet), at most
/// [`MAX_STATE_FILE`]; a FIFO or a device there is refused.
pub fn read_state(prefix: &Path) -> Result<Option<ReleaseState>, ReleaseError> {
    let path = Layout::new(prefix).state();
    match read_regular(&path, MAX_STATE_FILE) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| ReleaseError::State {
                path,
                why: e.to_string(),
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ioe(&path)(e)),
    }
}

pub(crate) fn write_state(prefix: &Path, s: &ReleaseState) -> Result<(), ReleaseError> {
    let path = Layout::new(prefix).state();
    let dir = path.parent().expect("state has a parent");
    fs::create_dir_all(dir).map_err(ioe(dir))?;
    let tmp = dir.join(format!(".state.json.tmp-{}", std::process::id()));
    let mut bytes = serde_json::to_vec_pretty(s).expect("state serializes");
    bytes.push(b'\n');
    write_synced(&tmp, &bytes, 0o644)?;
    fs::rename(&tmp, &path).map_err(ioe(&path))?;
    sync_dir(dir).map_err(ioe(dir))
}

pub(crate) fn write_synced(path: &Path, bytes: &[u8], mode: u32) -> Result<(), ReleaseError> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(ioe(path))?;
    f.write_all(bytes).map_err(ioe(path))?;
    f.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(ioe(path))?;
    f.sync_all().map_err(ioe(path))
}

/// The release a link (`current`, `previous`) names, if any.
pub fn link_target(link: &Path) -> Option<String> {
    let t = fs::read_link(link).ok()?;
    t.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// Points `link` at `releases/<release>` by renaming a fresh symlink over
/// it, then fsyncs the directory.
pub(crate) fn switch_link(link: &Path, release: &str) -> Result<(), ReleaseError> {
    let dir = link.parent().expect("links live in opt/rtdeploy");
    let name = link.file_name().expect("link has a name").to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(Layout::release_link(release), &tmp).map_err(ioe(&tmp))?;
    fs::rename(&tmp, link).map_err(ioe(link))?;
    sync_dir(dir).map_err(ioe(dir))
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub(crate) fn describe_state(s: &Option<ReleaseState>) -> String {
    match s {
        None => "no state.json".into(),
        Some(ReleaseState::Committed { release }) => format!("committed {release}"),
        Some(ReleaseState::Trial { release, .. }) => format!("trial {release}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `f` on its own thread, failed if it has not returned within 10 s
    /// (a read that waits on a FIFO would never return).
    fn within_10s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("returned within 10 s")
    }

    #[test]
    fn a_state_file_that_is_a_fifo_or_too_large_is_refused_at_once() {
        let d = tempfile::tempdir().unwrap();
        let path = Layout::new(d.path()).state();
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        mkfifo(&path);
        let prefix = d.path().to_path_buf();
        let e = within_10s(move || read_state(&prefix).unwrap_err().to_string());
        assert_eq!(e, format!("{}: a FIFO, not a regular file", path.display()));
        fs::remove_file(&path).unwrap();
        fs::write(&path, vec![b' '; MAX_STATE_FILE as usize + 1]).unwrap();
        let e = read_state(d.path()).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{}: holds more than {MAX_STATE_FILE} bytes, the most read from it",
                path.display()
            )
        );
    }

    #[allow(unsafe_code)]
    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(r, 0, "mkfifo: {}", io::Error::last_os_error());
    }
}
