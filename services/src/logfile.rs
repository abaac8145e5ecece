//! Size-rotated process logs: `<prefix>/var/log/rtdeploy/<name>.log`, then
//! `<name>.log.1` ... `<name>.log.<keep>`.
//!
//! A process writes into a pipe; the supervisor copies the pipe into the log
//! and rotates it, so a rotation never leaves a process writing into a
//! renamed file, and the output of a process that dies is kept up to its
//! last byte.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Why a log could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum LogWriteError {
    #[error("cannot open log {}: {err}", path.display())]
    Open { path: PathBuf, err: std::io::Error },
    #[error("cannot write log {}: {err}", path.display())]
    Write { path: PathBuf, err: std::io::Error },
    #[error("cannot rotate log {}: {err}", path.display())]
    Rotate { path: PathBuf, err: std::io::Error },
}

/// The log file of one process.
#[derive(Debug)]
pub struct RotatingLog {
    path: PathBuf,
    file: File,
    size: u64,
    max_bytes: u64,
    keep: u32,
}

/// The log path of a process under a prefix.
pub fn log_path(prefix: &Path, name: &str) -> PathBuf {
    releases::Layout::new(prefix)
        .log_dir()
        .join(format!("{name}.log"))
}

impl RotatingLog {
    /// Opens (appending) or creates the log; creates its directory.
    pub fn open(path: PathBuf, max_bytes: u64, keep: u32) -> Result<Self, LogWriteError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|err| LogWriteError::Open {
                path: dir.to_path_buf(),
                err,
            })?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|err| LogWriteError::Open {
                path: path.clone(),
                err,
            })?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(RotatingLog {
            path,
            file,
            size,
            max_bytes: max_bytes.max(1),
            keep,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `data`, rotating first when it would grow the file past
    /// `max_bytes`.
    pub fn write(&mut self, data: &[u8]) -> Result<(), LogWriteError> {
        if self.size > 0 && self.size + data.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file
            .write_all(data)
            .map_err(|err| LogWriteError::Write {
                path: self.path.clone(),
                err,
            })?;
        self.size += data.len() as u64;
        Ok(())
    }

    /// Appends one line written by the supervisor itself (`[rtdeploy] ...`).
    pub fn note(&mut self, line: &str) -> Result<(), LogWriteError> {
        self.write(format!("[rtdeploy] {line}\n").as_bytes())
    }

    fn rotated(&self, n: u32) -> PathBuf {
        let mut s = self.path.clone().into_os_string();
        s.push(format!(".{n}"));
        PathBuf::from(s)
    }

    fn rotate(&mut self) -> Result<(), LogWriteError> {
        let err = |e| LogWriteError::Rotate {
            path: self.path.clone(),
            err: e,
        };
        if self.keep == 0 {
            self.file.set_len(0).map_err(err)?;
            self.size = 0;
            return Ok(());
        }
        for n in (1..self.keep).rev() {
            let from = self.rotated(n);
            if from.exists() {
                std::fs::rename(&from, self.rotated(n + 1)).map_err(err)?;
            }
        }
        std::fs::rename(&self.path, self.rotated(1)).map_err(err)?;
        self.file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|err| LogWriteError::Open {
                path: self.path.clone(),
                err,
            })?;
        self.size = 0;
        Ok(())
    }
}

/// The most of a log [`tail`] reads: its newest 256 KiB, whatever
/// `lines` asks for (a `logs` reply is bounded: [`crate::control`]).
pub const MAX_TAIL_BYTES: u64 = 256 << 10;

/// The most lines [`tail`] gives.
pub const MAX_TAIL_LINES: usize = 10_000;

/// The last `lines` lines of a log (from the current file only), at most
/// [`MAX_TAIL_LINES`] of its newest [`MAX_TAIL_BYTES`] (a line cut by that
/// start is left out). Read once, in one pass (units::bounded): a log
/// without newlines costs what a log of lines does.
pub fn tail(path: &Path, lines: usize) -> Result<Vec<String>, LogWriteError> {
    let t = match units::bounded::Bound::regular(MAX_TAIL_BYTES).read_tail(path) {
        Ok(t) => t,
        Err(e) if e.is_not_found() => return Ok(Vec::new()),
        Err(e) => {
            return Err(LogWriteError::Open {
                path: path.to_path_buf(),
                err: e.into_io(),
            })
        }
    };
    let mut from = 0;
    if t.skipped > 0 {
        // The first line read is likely the end of one: start after it
        // (unless it is the only one).
        from = t
            .bytes
            .iter()
            .position(|&b| b == b'\n')
            .filter(|&p| p + 1 < t.bytes.len())
            .map_or(0, |p| p + 1);
    }
    let text = String::from_utf8_lossy(&t.bytes[from..]);
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines.min(MAX_TAIL_LINES));
    Ok(all[start..].iter().map(|s| s.to_string()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_by_size_and_keeps_n() {
        let dir = tempfile::tempdir().unwrap();
        let path = log_path(dir.path(), "imu");
        let mut log = RotatingLog::open(path.clone(), 100, 2).unwrap();
        for i in 0..30 {
            log.write(format!("line {i:04}\n").as_bytes()).unwrap();
        }
        let cur = std::fs::read_to_string(&path).unwrap();
        assert!(cur.len() <= 100, "{}", cur.len());
        assert!(cur.ends_with("line 0029\n"));
        let one = std::fs::read_to_string(dir.path().join("var/log/rtdeploy/imu.log.1")).unwrap();
        assert!(one.ends_with(&format!("line {:04}\n", 29 - cur.lines().count())));
        assert!(dir.path().join("var/log/rtdeploy/imu.log.2").exists());
        assert!(!dir.path().join("var/log/rtdeploy/imu.log.3").exists());
        assert_eq!(tail(&path, 2).unwrap(), vec!["line 0028", "line 0029"]);
    }

    #[test]
    fn tail_reads_only_the_newest_bytes_and_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.log");
        // 4 MiB of control bytes without a newline, then three lines.
        let mut text = vec![1u8; 4 << 20];
        text.extend_from_slice(b"\na\nb\nc\n");
        std::fs::write(&path, &text).unwrap();
        assert_eq!(tail(&path, usize::MAX).unwrap(), vec!["a", "b", "c"]);
        // A log of short lines gives at most MAX_TAIL_LINES of them.
        let lines: String = (0..50_000).map(|i| format!("{i}\n")).collect();
        std::fs::write(&path, lines).unwrap();
        let t = tail(&path, usize::MAX).unwrap();
        assert_eq!(t.len(), MAX_TAIL_LINES);
        assert_eq!(t.last().map(String::as_str), Some("49999"));
        // A log that is not a regular file is refused, not waited on.
        let e = tail(Path::new("/dev/zero"), 5).unwrap_err();
        assert!(e.to_string().contains("a character device"), "{e}");
    }

    #[test]
    fn tail_of_a_missing_log_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert!(tail(&dir.path().join("none.log"), 5).unwrap().is_empty());
    }

    #[test]
    fn an_open_error_says_its_cause_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("var"), b"").unwrap();
        let e = RotatingLog::open(log_path(dir.path(), "imu"), 100, 2).unwrap_err();
        assert!(e.to_string().ends_with("(os error 20)"), "{e}");
        assert!(std::error::Error::source(&e).is_none(), "{e}");
    }
}
