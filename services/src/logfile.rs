//! Size-rotated process logs: `<prefix>/var/log/rtdeploy/<name>.log`, then
//! `<name>.log.1` ... `<name>.log.<keep>`.
//!
//! A process writes into a pipe; the supervisor copies the pipe into the log
//! and rotates it, so a rotation never leaves a process writing into a
//! renamed file, and the output of a process that dies is kept up to its
//! last byte.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
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

/// The last `lines` lines of a log (from the current file only).
pub fn tail(path: &Path, lines: usize) -> Result<Vec<String>, LogWriteError> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => {
            return Err(LogWriteError::Open {
                path: path.to_path_buf(),
                err,
            })
        }
    };
    let err = |e| LogWriteError::Open {
        path: path.to_path_buf(),
        err: e,
    };
    let len = f.metadata().map_err(err)?.len();
    // Read backwards in blocks until enough newlines are seen.
    let mut buf: Vec<u8> = Vec::new();
    let mut pos = len;
    while pos > 0 && buf.iter().filter(|&&b| b == b'\n').count() <= lines {
        let step = pos.min(64 * 1024);
        pos -= step;
        let mut block = vec![0u8; step as usize];
        f.seek(SeekFrom::Start(pos)).map_err(err)?;
        f.read_exact(&mut block).map_err(err)?;
        block.extend_from_slice(&buf);
        buf = block;
    }
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
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
