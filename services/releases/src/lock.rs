//! The update lock: one installer (or a holder that must not be
//! disturbed, such as a controller while the robot moves) at a time.
//!
//! The file protocol, for holders in other crates: open (create, mode
//! 0644) `<prefix>/run/rtdeploy/update.lock`, take `flock(LOCK_EX)` on it,
//! then truncate it and write `pid=<pid> name=<process name>\n`; to
//! release, truncate it to 0 bytes, then close (or just exit: the kernel
//! drops the lock). An installer that cannot take the lock within
//! `update.lock_timeout` refuses and quotes the file's contents.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::layout::Layout;

/// Why the update lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum UpdateLockError {
    #[error("update lock {}: {err}", path.display())]
    Io { path: PathBuf, err: io::Error },
    #[error("update lock {} is held by {holder}; waited {waited:?}", path.display())]
    Busy {
        path: PathBuf,
        holder: String,
        waited: Duration,
    },
}

/// The update lock, held until dropped.
#[derive(Debug)]
pub struct UpdateLock {
    file: File,
    path: PathBuf,
}

impl UpdateLock {
    /// Takes `<prefix>/run/rtdeploy/update.lock`, waiting up to `timeout`,
    /// and records `holder` (a process name) and our pid in it.
    pub fn acquire(
        prefix: &Path,
        holder: &str,
        timeout: Duration,
    ) -> Result<UpdateLock, UpdateLockError> {
        let start = Instant::now();
        loop {
            if let Some(l) = Self::try_acquire(prefix, holder)? {
                return Ok(l);
            }
            if start.elapsed() >= timeout {
                let path = Layout::new(prefix).lock();
                let text = crate::error::read_regular(&path, 4096)
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                return Err(UpdateLockError::Busy {
                    path,
                    holder: describe_holder(&text),
                    waited: timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(50).min(timeout));
        }
    }

    /// Takes the lock if nobody holds it.
    pub fn try_acquire(prefix: &Path, holder: &str) -> Result<Option<UpdateLock>, UpdateLockError> {
        let path = Layout::new(prefix).lock();
        let err = |err| UpdateLockError::Io {
            path: path.clone(),
            err,
        };
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(err)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&path)
            .map_err(err)?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
            Err(e) => return Err(err(e.into())),
        }
        let name: String = holder
            .chars()
            .filter(|c| !c.is_control())
            .take(64)
            .collect();
        file.set_len(0).map_err(err)?;
        file.rewind().map_err(err)?;
        file.write_all(format!("pid={} name={name}\n", std::process::id()).as_bytes())
            .map_err(err)?;
        Ok(Some(UpdateLock { file, path }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for UpdateLock {
    fn drop(&mut self) {
        // Clear the holder before the lock goes (on close).
        let _ = self.file.set_len(0);
    }
}

fn describe_holder(text: &str) -> String {
    let mut pid = None;
    let mut name = None;
    for w in text.split_whitespace() {
        if let Some(p) = w.strip_prefix("pid=") {
            pid = Some(p);
        } else if let Some(n) = w.strip_prefix("name=") {
            name = Some(n);
        }
    }
    match (pid, name) {
        (Some(p), Some(n)) => format!("pid {p} ({n})"),
        (Some(p), None) => format!("pid {p}"),
        _ => "a process that did not say who it is".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_holder_is_named() {
        assert_eq!(describe_holder("pid=12 name=imu_ctl\n"), "pid 12 (imu_ctl)");
        assert_eq!(describe_holder(""), "a process that did not say who it is");
    }
}
