//! Reading a file from outside the process: bounded in what is held,
//! never blocking, never trusting what stat(2) says of its size.
//!
//! Every reader of a file in rtdeploy goes through this module: the
//! robot's own files (`robot.yaml`, `state.json`, the boot-check history,
//! process logs, key files, markers, extlinux.conf), the user's files
//! (MCAP logs, saved traces, bundles, hosts files) and the kernel's pseudo
//! files under `--sysroot` (`/proc`, `/sys`). What it guarantees:
//!
//! - a file is opened with `O_NONBLOCK` (and `O_CLOEXEC`, which std sets):
//!   opening a FIFO returns at once instead of waiting for a writer;
//! - what is opened is checked with fstat(2) before a byte is read: where a
//!   regular file is expected ([`Bound::regular`]) anything else (a FIFO,
//!   a device, a socket, a directory) is refused as
//!   [`FileReadError::NotRegular`]; the kernel's pseudo files
//!   ([`Bound::pseudo`]) are regular files whose size is a lie (procfs says
//!   0, sysfs 4096) or character devices (`/dev/cpu_dma_latency`), and are
//!   read as such, a FIFO, a socket, a block device or a directory refused;
//! - a regular file is opened with `O_NOFOLLOW` unless the caller says
//!   links are expected ([`Bound::following_links`]: `robot.yaml` is a link
//!   into the current release, a file named on the command line may be
//!   one); a pseudo file follows links (`/proc/mounts` is one);
//! - st_size is never used to size anything: at most `limit` bytes are
//!   read, the buffer grows as bytes arrive, and a file that holds more is
//!   [`FileReadError::TooLarge`] (or, for [`Bound::read_tail`], its newest
//!   `limit` bytes are kept);
//! - a device that would block answers `EAGAIN` to a non-blocking read,
//!   which is an error here, never a wait.
//!
//! Streaming readers (MCAP logs, bundles) open through [`Bound::open`] and
//! read through [`Limited`], which bounds the total they take; they bound
//! each record themselves.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// What kind of file a path turned out to be, when it was not what the
/// reader expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
    Directory,
    Symlink,
    Other,
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileKind::Fifo => "a FIFO",
            FileKind::Socket => "a socket",
            FileKind::CharDevice => "a character device",
            FileKind::BlockDevice => "a block device",
            FileKind::Directory => "a directory",
            FileKind::Symlink => "a symbolic link",
            FileKind::Other => "not a file of a known kind",
        })
    }
}

/// Why a file could not be read within its bounds. Each variant names the
/// path; the underlying error, where there is one, is in the message and
/// not a `source()`, so a chain prints it once.
#[derive(Debug, thiserror::Error)]
pub enum FileReadError {
    #[error("cannot open {}: {err}", path.display())]
    Open { path: PathBuf, err: io::Error },
    #[error("{} is {kind}, not a regular file", path.display())]
    NotRegular { path: PathBuf, kind: FileKind },
    #[error("{} holds more than {limit} bytes, the most read from it", path.display())]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("cannot read {}: {err}", path.display())]
    Read { path: PathBuf, err: io::Error },
    #[error("{} is not UTF-8 text (byte {at} is not)", path.display())]
    NotText { path: PathBuf, at: usize },
}

impl FileReadError {
    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            FileReadError::Open { path, .. }
            | FileReadError::NotRegular { path, .. }
            | FileReadError::TooLarge { path, .. }
            | FileReadError::Read { path, .. }
            | FileReadError::NotText { path, .. } => path,
        }
    }

    /// The file (or a directory on its path) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, FileReadError::Open { err, .. } if err.kind() == io::ErrorKind::NotFound)
    }

    /// The error without its path, as an `io::Error` (the open or read
    /// error itself where there is one): for callers whose own error
    /// already names the path.
    pub fn into_io(self) -> io::Error {
        match self {
            FileReadError::Open { err, .. } | FileReadError::Read { err, .. } => err,
            FileReadError::NotRegular { kind, .. } => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{kind}, not a regular file"),
            ),
            FileReadError::TooLarge { limit, .. } => io::Error::new(
                io::ErrorKind::InvalidData,
                format!("holds more than {limit} bytes, the most read from it"),
            ),
            FileReadError::NotText { at, .. } => io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not UTF-8 text (byte {at} is not)"),
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Regular,
    Pseudo,
}

/// How a file is read: what it must be, the most read of it, and whether
/// a symbolic link is followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    limit: u64,
    expect: Expect,
    follow: bool,
}

/// The newest part of a file ([`Bound::read_tail`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tail {
    pub bytes: Vec<u8>,
    /// Bytes of the file before `bytes` that were not read.
    pub skipped: u64,
}

impl Bound {
    /// A regular file, at most `limit` bytes, not through a symbolic link.
    pub const fn regular(limit: u64) -> Bound {
        Bound {
            limit,
            expect: Expect::Regular,
            follow: false,
        }
    }

    /// A kernel pseudo file (procfs, sysfs, a character device such as
    /// `/dev/cpu_dma_latency`), at most `limit` bytes, through links.
    pub const fn pseudo(limit: u64) -> Bound {
        Bound {
            limit,
            expect: Expect::Pseudo,
            follow: true,
        }
    }

    /// The same, following a symbolic link at the end of the path (a
    /// regular file is still required at its end).
    pub const fn following_links(self) -> Bound {
        Bound {
            follow: true,
            ..self
        }
    }

    /// The most this bound reads.
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// Opens `path` for reading without blocking and checks what it is.
    /// The file stays non-blocking (a regular file ignores it; a device
    /// answers `EAGAIN` instead of waiting).
    pub fn open(&self, path: &Path) -> Result<File, FileReadError> {
        let mut flags = libc::O_NONBLOCK;
        if !self.follow {
            flags |= libc::O_NOFOLLOW;
        }
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(path)
            .map_err(|err| {
                if !self.follow && err.raw_os_error() == Some(libc::ELOOP) && is_symlink(path) {
                    FileReadError::NotRegular {
                        path: path.to_path_buf(),
                        kind: FileKind::Symlink,
                    }
                } else {
                    FileReadError::Open {
                        path: path.to_path_buf(),
                        err,
                    }
                }
            })?;
        let t = file
            .metadata()
            .map_err(|err| FileReadError::Open {
                path: path.to_path_buf(),
                err,
            })?
            .file_type();
        let kind = if t.is_file() {
            None
        } else if t.is_char_device() {
            Some(FileKind::CharDevice)
        } else if t.is_fifo() {
            Some(FileKind::Fifo)
        } else if t.is_socket() {
            Some(FileKind::Socket)
        } else if t.is_block_device() {
            Some(FileKind::BlockDevice)
        } else if t.is_dir() {
            Some(FileKind::Directory)
        } else {
            Some(FileKind::Other)
        };
        match (kind, self.expect) {
            (None, _) | (Some(FileKind::CharDevice), Expect::Pseudo) => Ok(file),
            (Some(kind), _) => Err(FileReadError::NotRegular {
                path: path.to_path_buf(),
                kind,
            }),
        }
    }

    /// The whole file, at most [`limit`](Bound::limit) bytes: more is
    /// [`FileReadError::TooLarge`].
    pub fn read(&self, path: &Path) -> Result<Vec<u8>, FileReadError> {
        let mut f = self.open(path)?;
        read_at_most(&mut f, path, self.limit)
    }

    /// [`read`](Bound::read), `None` when the file does not exist.
    pub fn read_opt(&self, path: &Path) -> Result<Option<Vec<u8>>, FileReadError> {
        match self.read(path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`read`](Bound::read) as UTF-8 text; other bytes are
    /// [`FileReadError::NotText`].
    pub fn read_text(&self, path: &Path) -> Result<String, FileReadError> {
        let b = self.read(path)?;
        String::from_utf8(b).map_err(|e| FileReadError::NotText {
            path: path.to_path_buf(),
            at: e.utf8_error().valid_up_to(),
        })
    }

    /// [`read_text`](Bound::read_text), `None` when the file does not exist.
    pub fn read_text_opt(&self, path: &Path) -> Result<Option<String>, FileReadError> {
        match self.read_text(path) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`read`](Bound::read) as text, bytes that are not UTF-8 replaced
    /// (the kernel's text: a process name may hold any byte).
    pub fn read_lossy(&self, path: &Path) -> Result<String, FileReadError> {
        let b = self.read(path)?;
        Ok(match String::from_utf8(b) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// The newest [`limit`](Bound::limit) bytes of a regular file (a log,
    /// a history): the file's size is used only to seek, and no more than
    /// the limit is read whatever it says. A pseudo file is read from its
    /// start, its newest bytes kept.
    pub fn read_tail(&self, path: &Path) -> Result<Tail, FileReadError> {
        let mut f = self.open(path)?;
        let rerr = |err| FileReadError::Read {
            path: path.to_path_buf(),
            err,
        };
        let len = f.metadata().map_err(rerr)?.len();
        let skipped = if self.expect == Expect::Regular && len > self.limit {
            let at = len - self.limit;
            f.seek(SeekFrom::Start(at)).map_err(rerr)?;
            at
        } else {
            0
        };
        let mut bytes = Vec::new();
        let mut skipped = skipped;
        let mut chunk = vec![0u8; CHUNK];
        loop {
            let n = match f.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(rerr(e)),
            };
            bytes.extend_from_slice(&chunk[..n]);
            let keep = usize::try_from(self.limit).unwrap_or(usize::MAX);
            if bytes.len() > keep {
                let over = bytes.len() - keep;
                bytes.drain(..over);
                skipped += over as u64;
            }
            // A file that keeps growing (or a device) is read for at most
            // twice the limit past the seek.
            if skipped > len.saturating_add(self.limit) {
                break;
            }
        }
        Ok(Tail { bytes, skipped })
    }
}

/// Bytes read at a time.
const CHUNK: usize = 64 * 1024;

fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// Reads `r` (the file at `path`) to its end, at most `limit` bytes: more
/// is [`FileReadError::TooLarge`]. The buffer grows as bytes arrive, never
/// past `limit` and a chunk.
pub fn read_at_most(r: &mut impl Read, path: &Path, limit: u64) -> Result<Vec<u8>, FileReadError> {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = match r.read(&mut chunk) {
            Ok(0) => return Ok(buf),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => {
                return Err(FileReadError::Read {
                    path: path.to_path_buf(),
                    err,
                })
            }
        };
        if buf.len() as u64 + n as u64 > limit {
            return Err(FileReadError::TooLarge {
                path: path.to_path_buf(),
                limit,
            });
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A reader that takes at most `limit` bytes from `inner` and then fails
/// (unlike [`Read::take`], which ends quietly): a stream that goes on
/// past what its reader allows is an error, not a shorter file.
#[derive(Debug)]
pub struct Limited<R> {
    inner: R,
    left: u64,
    limit: u64,
}

impl<R: Read> Limited<R> {
    pub fn new(inner: R, limit: u64) -> Limited<R> {
        Limited {
            inner,
            left: limit,
            limit,
        }
    }

    /// Bytes read so far.
    pub fn consumed(&self) -> u64 {
        self.limit - self.left
    }

    pub fn into_inner(self) -> R {
        self.inner
    }
}

impl<R: Read> Read for Limited<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            // One byte more tells a stream that ends here from one that
            // goes on.
            let mut one = [0u8; 1];
            return match self.inner.read(&mut one)? {
                0 => Ok(0),
                _ => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("more than {} bytes", self.limit),
                )),
            };
        }
        let want = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[allow(unsafe_code)]
    fn mkfifo(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path for the call.
        let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(r, 0, "mkfifo {}", io::Error::last_os_error());
    }

    #[test]
    fn a_regular_file_is_read_within_its_limit() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        assert_eq!(Bound::regular(10).read(&p).unwrap(), b"0123456789");
        let e = Bound::regular(9).read(&p).unwrap_err();
        assert!(matches!(e, FileReadError::TooLarge { limit: 9, .. }), "{e}");
        assert_eq!(
            e.to_string(),
            format!(
                "{} holds more than 9 bytes, the most read from it",
                p.display()
            )
        );
        assert!(Bound::regular(9)
            .read_opt(&d.path().join("none"))
            .unwrap()
            .is_none());
        let e = Bound::regular(9).read(&d.path().join("none")).unwrap_err();
        assert!(e.is_not_found());
        assert!(e.to_string().ends_with("(os error 2)"), "{e}");
        assert!(std::error::Error::source(&e).is_none());
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("fifo");
        mkfifo(&p);
        for b in [
            Bound::regular(64),
            Bound::regular(64).following_links(),
            Bound::pseudo(64),
        ] {
            let e = b.read(&p).unwrap_err();
            assert!(
                matches!(
                    e,
                    FileReadError::NotRegular {
                        kind: FileKind::Fifo,
                        ..
                    }
                ),
                "{e}"
            );
            assert_eq!(
                e.to_string(),
                format!("{} is a FIFO, not a regular file", p.display())
            );
        }
    }

    #[test]
    fn devices_directories_and_links_are_refused_where_a_regular_file_is_expected() {
        let zero = Path::new("/dev/zero");
        let e = Bound::regular(1 << 20).read(zero).unwrap_err();
        assert!(
            matches!(
                e,
                FileReadError::NotRegular {
                    kind: FileKind::CharDevice,
                    ..
                }
            ),
            "{e}"
        );
        // Read as a pseudo file, a device that never ends is cut at the
        // limit, not followed.
        let e = Bound::pseudo(1 << 20).read(zero).unwrap_err();
        assert!(
            matches!(e, FileReadError::TooLarge { limit, .. } if limit == 1 << 20),
            "{e}"
        );
        let d = tempfile::tempdir().unwrap();
        let e = Bound::pseudo(64).read(d.path()).unwrap_err();
        assert!(
            matches!(
                e,
                FileReadError::NotRegular {
                    kind: FileKind::Directory,
                    ..
                }
            ),
            "{e}"
        );
        let target = d.path().join("target");
        std::fs::write(&target, b"x").unwrap();
        let link = d.path().join("link");
        symlink(&target, &link).unwrap();
        let e = Bound::regular(64).read(&link).unwrap_err();
        assert!(
            matches!(
                e,
                FileReadError::NotRegular {
                    kind: FileKind::Symlink,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(
            Bound::regular(64).following_links().read(&link).unwrap(),
            b"x"
        );
    }

    #[test]
    fn pseudo_files_are_read_whatever_their_size_says() {
        // procfs says 0 bytes for /proc/self/status, which holds hundreds.
        let p = Path::new("/proc/self/status");
        assert_eq!(std::fs::metadata(p).unwrap().len(), 0);
        let t = Bound::pseudo(64 << 10).read_lossy(p).unwrap();
        assert!(t.contains("VmRSS"), "{t}");
        let e = Bound::pseudo(16).read(p).unwrap_err();
        assert!(
            matches!(e, FileReadError::TooLarge { limit: 16, .. }),
            "{e}"
        );
    }

    #[test]
    fn text_must_be_utf8() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"ab\xffc").unwrap();
        let e = Bound::regular(64).read_text(&p).unwrap_err();
        assert!(matches!(e, FileReadError::NotText { at: 2, .. }), "{e}");
        assert_eq!(Bound::regular(64).read_lossy(&p).unwrap(), "ab\u{fffd}c");
    }

    #[test]
    fn the_tail_keeps_the_newest_bytes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        let t = Bound::regular(4).read_tail(&p).unwrap();
        assert_eq!(
            t,
            Tail {
                bytes: b"6789".to_vec(),
                skipped: 6
            }
        );
        let t = Bound::regular(64).read_tail(&p).unwrap();
        assert_eq!((t.bytes.len(), t.skipped), (10, 0));
        // A device read as a pseudo file keeps its newest bytes and stops.
        let t = Bound::pseudo(1000)
            .read_tail(Path::new("/dev/zero"))
            .unwrap();
        assert_eq!(t.bytes.len(), 1000);
    }

    #[test]
    fn limited_fails_past_its_limit_and_ends_at_it() {
        let mut r = Limited::new(&b"0123456789"[..], 10);
        let mut v = Vec::new();
        r.read_to_end(&mut v).unwrap();
        assert_eq!(v.len(), 10);
        let mut r = Limited::new(&b"0123456789"[..], 9);
        let mut v = Vec::new();
        let e = r.read_to_end(&mut v).unwrap_err();
        assert_eq!(e.to_string(), "more than 9 bytes");
        assert_eq!(r.consumed(), 9);
    }

    #[test]
    fn errors_lose_their_path_only_when_asked() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("fifo");
        mkfifo(&p);
        let e = Bound::regular(1).read(&p).unwrap_err();
        assert_eq!(e.path(), p);
        assert_eq!(e.into_io().to_string(), "a FIFO, not a regular file");
    }
}
