//! The content-addressed store on the robot: `store/<sha256>`, each blob
//! written under a temporary name, fsync'd, checked and renamed into place,
//! so a name in the store always means exactly that content.
//!
//! `store/.staging-<pid>/` holds the blobs of a bundle being installed until
//! the whole bundle has verified; `store/.partial/<sha256>` holds blobs
//! received over the wire so far (their length is the resume offset).
//!
//! `.partial` is bounded: a partial blob never grows past the size its
//! signed manifest gives (decompression stops there and the file is
//! discarded); a receiver holds an flock(2) on its file, and every partial
//! no receiver holds is removed when it is not a blob of the manifest
//! being received, is longer than that blob, or is past the newest
//! [`MAX_PARTIALS`] ([`Store::trim_partials`]); [`Store::gc`] removes every
//! partial no receiver holds.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};

use super::hash::{sha256_file, Sha256Hex, Sha256Writer};
use super::read::WINDOW_LOG_MAX;

/// The most partial blobs kept: a cut connection leaves one, so this is
/// room for a few interrupted senders.
pub const MAX_PARTIALS: usize = 8;

/// Why the store could not do something.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {}: {err}", path.display())]
    Io { path: PathBuf, err: io::Error },
    #[error("received blob {sha} hashes to {got} ({len} bytes, expected {size}); discarded")]
    Mismatch {
        sha: String,
        got: String,
        len: u64,
        size: u64,
    },
    #[error("received blob {sha} decompresses to more than the {size} bytes its manifest gives; discarded")]
    TooLarge { sha: String, size: u64 },
    #[error("received blob {sha} is not a valid zstd stream ({err}); discarded")]
    BadStream { sha: String, err: io::Error },
    #[error("resume offset {offset} for blob {sha} is past the {have} bytes received")]
    Offset { sha: String, offset: u64, have: u64 },
    #[error("blob {sha} is being received by another update right now")]
    Busy { sha: String },
}

fn ioe(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |err| StoreError::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// Takes the receiver's lock on a partial file without waiting; `false`
/// when another receiver holds it.
fn try_lock(f: &File) -> io::Result<bool> {
    match flock(f, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// fsyncs a directory, so the names in it (renames, links) are durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A content-addressed blob store rooted at a directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    pub fn new(dir: impl Into<PathBuf>) -> Store {
        Store { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn blob_path(&self, sha: &Sha256Hex) -> PathBuf {
        self.dir.join(sha.as_str())
    }

    pub fn has(&self, sha: &Sha256Hex) -> bool {
        fs::symlink_metadata(self.blob_path(sha)).is_ok_and(|m| m.file_type().is_file())
    }

    fn partial_dir(&self) -> PathBuf {
        self.dir.join(".partial")
    }

    fn partial_path(&self, sha: &Sha256Hex) -> PathBuf {
        self.partial_dir().join(sha.as_str())
    }

    /// Bytes of `sha` received so far over the wire (0 if none).
    pub fn partial_len(&self, sha: &Sha256Hex) -> u64 {
        fs::metadata(self.partial_path(sha))
            .map(|m| m.len())
            .unwrap_or(0)
    }

    /// What a resume of `sha` (`size` bytes) can start from: the length of
    /// its partial file and the sha256 of those bytes, or `None` when
    /// there is none. A partial longer than `size` cannot be a start of
    /// the blob and is removed.
    pub fn partial_prefix(
        &self,
        sha: &Sha256Hex,
        size: u64,
    ) -> Result<Option<(u64, Sha256Hex)>, StoreError> {
        let path = self.partial_path(sha);
        let mut f = match crate::error::open_regular(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ioe(&path)(e)),
        };
        let len = f.metadata().map_err(ioe(&path))?.len();
        if len > size {
            fs::remove_file(&path).map_err(ioe(&path))?;
            return Ok(None);
        }
        if len == 0 {
            return Ok(None);
        }
        let mut h = Sha256Writer::new(io::sink());
        let got = io::copy(&mut (&mut f).take(len), &mut h).map_err(ioe(&path))?;
        let (prefix, _) = h.finish();
        Ok((got == len).then_some((len, prefix)))
    }

    /// Bounds `.partial` before a transfer: removes every partial file no
    /// receiver holds that is not a blob of `blobs` (sha256 to size), is
    /// longer than its size, or is past the newest [`MAX_PARTIALS`].
    /// Returns how many were removed.
    pub fn trim_partials(&self, blobs: &BTreeMap<Sha256Hex, u64>) -> Result<usize, StoreError> {
        self.collect_partials(|sha, len| {
            sha.and_then(|s| blobs.get(s))
                .is_some_and(|&size| len <= size)
        })
    }

    /// Removes the partial files no receiver holds for which `keep(sha,
    /// len)` is false, then the oldest kept ones past [`MAX_PARTIALS`].
    fn collect_partials(
        &self,
        keep: impl Fn(Option<&Sha256Hex>, u64) -> bool,
    ) -> Result<usize, StoreError> {
        let dir = self.partial_dir();
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(ioe(&dir)(e)),
        };
        let mut kept = Vec::new();
        let mut removed = 0;
        for e in rd {
            let e = e.map_err(ioe(&dir))?;
            let path = e.path();
            let sha = Sha256Hex::parse(&e.file_name().to_string_lossy());
            let md = fs::symlink_metadata(&path).map_err(ioe(&path))?;
            if !md.file_type().is_file() {
                remove_any(&path)?;
                removed += 1;
                continue;
            }
            let f = crate::error::open_regular(&path).map_err(ioe(&path))?;
            if !try_lock(&f).map_err(ioe(&path))? {
                continue; // a receiver is writing it
            }
            if keep(sha.as_ref(), md.len()) {
                kept.push((md.mtime(), md.mtime_nsec(), path, f));
            } else {
                fs::remove_file(&path).map_err(ioe(&path))?;
                removed += 1;
            }
        }
        kept.sort_by_key(|k| std::cmp::Reverse((k.0, k.1)));
        for (_, _, path, _f) in kept.into_iter().skip(MAX_PARTIALS) {
            fs::remove_file(&path).map_err(ioe(&path))?;
            removed += 1;
        }
        if removed > 0 {
            sync_dir(&dir).map_err(ioe(&dir))?;
        }
        Ok(removed)
    }

    /// Starts staging a bundle's blobs; they enter the store only on
    /// [`Staging::commit`], and vanish if the staging is dropped.
    pub fn staging(&self) -> Result<Staging, StoreError> {
        fs::create_dir_all(&self.dir).map_err(ioe(&self.dir))?;
        let dir = self.dir.join(format!(".staging-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).map_err(ioe(&dir))?;
        Ok(Staging {
            store: self.clone(),
            dir,
            staged: Vec::new(),
            committed: false,
        })
    }

    /// Removes staging directories left by installs that were killed.
    /// Call with the update lock held.
    pub fn remove_stale_staging(&self) {
        if let Ok(rd) = fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(".staging-") {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
    }

    /// Opens the partial blob `sha` (`size` bytes once complete) to
    /// continue at `offset` (at most what was received before; anything
    /// past it is dropped), and locks it against other receivers and
    /// [`gc`](Store::gc).
    pub fn receive(&self, sha: &Sha256Hex, offset: u64, size: u64) -> Result<Receiver, StoreError> {
        let pdir = self.partial_dir();
        fs::create_dir_all(&pdir).map_err(ioe(&pdir))?;
        let path = self.partial_path(sha);
        let mut f = self.open_locked(sha, &path)?;
        let have = f.metadata().map_err(ioe(&path))?.len();
        if offset > have || offset > size {
            return Err(StoreError::Offset {
                sha: sha.to_string(),
                offset,
                have,
            });
        }
        f.set_len(offset).map_err(ioe(&path))?;
        f.seek(SeekFrom::Start(offset)).map_err(ioe(&path))?;
        let out = Capped {
            inner: BufWriter::with_capacity(1 << 20, f),
            left: size - offset,
            over: false,
        };
        let mut dec = zstd::stream::write::Decoder::new(out).map_err(ioe(&path))?;
        dec.window_log_max(WINDOW_LOG_MAX).map_err(ioe(&path))?;
        Ok(Receiver {
            store: self.clone(),
            sha: sha.clone(),
            size,
            path,
            dec: Some(dec),
        })
    }

    /// Opens (creating) and locks `path`; a file removed by a collector
    /// between the open and the lock is opened again.
    fn open_locked(&self, sha: &Sha256Hex, path: &Path) -> Result<File, StoreError> {
        for _ in 0..3 {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(ioe(path))?;
            if !try_lock(&f).map_err(ioe(path))? {
                return Err(StoreError::Busy {
                    sha: sha.to_string(),
                });
            }
            let same = match fs::symlink_metadata(path) {
                Ok(m) => {
                    let fm = f.metadata().map_err(ioe(path))?;
                    m.ino() == fm.ino() && m.dev() == fm.dev()
                }
                Err(_) => false,
            };
            if same {
                return Ok(f);
            }
        }
        Err(StoreError::Busy {
            sha: sha.to_string(),
        })
    }

    /// Every blob name in the store.
    pub fn list(&self) -> Vec<Sha256Hex> {
        let mut v: Vec<Sha256Hex> = fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| Sha256Hex::parse(&e.file_name().to_string_lossy()))
            .collect();
        v.sort();
        v
    }

    /// Removes every blob not in `keep`, and every partial blob no
    /// receiver is writing (a partial only serves the retry of a cut
    /// transfer; one left behind is sent again whole). Returns (blobs
    /// removed, bytes freed); partials count in neither.
    pub fn gc(&self, keep: &BTreeSet<Sha256Hex>) -> Result<(usize, u64), StoreError> {
        self.collect_partials(|_, _| false)?;
        let mut n = 0;
        let mut bytes = 0;
        for sha in self.list() {
            if !keep.contains(&sha) {
                let p = self.blob_path(&sha);
                bytes += fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
                fs::remove_file(&p).map_err(ioe(&p))?;
                n += 1;
            }
        }
        if n > 0 {
            sync_dir(&self.dir).map_err(ioe(&self.dir))?;
        }
        Ok((n, bytes))
    }

    /// Moves a verified file into the store as `sha` with `mode`.
    fn adopt(&self, from: &Path, sha: &Sha256Hex, mode: u32) -> Result<(), StoreError> {
        let to = self.blob_path(sha);
        if self.has(sha) {
            fs::remove_file(from).map_err(ioe(from))?;
            return Ok(());
        }
        fs::set_permissions(from, fs::Permissions::from_mode(mode)).map_err(ioe(from))?;
        fs::rename(from, &to).map_err(ioe(&to))
    }
}

/// Blobs of one bundle, waiting for the bundle to verify.
pub struct Staging {
    store: Store,
    dir: PathBuf,
    staged: Vec<(Sha256Hex, u32)>,
    committed: bool,
}

impl Staging {
    /// Copies `data` (blob `sha`, stored with `mode`) into the staging
    /// directory and fsyncs it; a blob the store already has is not copied.
    pub fn write(&mut self, sha: &Sha256Hex, mode: u32, data: &mut dyn Read) -> io::Result<()> {
        if self.store.has(sha) {
            return Ok(());
        }
        let path = self.dir.join(sha.as_str());
        let mut f = BufWriter::with_capacity(1 << 20, File::create(&path)?);
        io::copy(data, &mut f)?;
        let f = f.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        self.staged.push((sha.clone(), mode));
        Ok(())
    }

    /// How many blobs were new to the store.
    pub fn len(&self) -> usize {
        self.staged.len()
    }

    pub fn is_empty(&self) -> bool {
        self.staged.is_empty()
    }

    /// Moves every staged blob into the store (call only once the whole
    /// bundle verified) and fsyncs the store directory.
    pub fn commit(mut self) -> Result<(), StoreError> {
        for (sha, mode) in std::mem::take(&mut self.staged) {
            self.store.adopt(&self.dir.join(sha.as_str()), &sha, mode)?;
        }
        sync_dir(self.store.dir()).map_err(ioe(self.store.dir()))?;
        self.committed = true;
        let _ = fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// One blob arriving zstd-compressed over the wire, written to its partial
/// file as it decompresses, never past its manifest size.
pub struct Receiver {
    store: Store,
    sha: Sha256Hex,
    size: u64,
    path: PathBuf,
    /// `None` once the partial file was discarded.
    dec: Option<zstd::stream::write::Decoder<'static, Capped<BufWriter<File>>>>,
}

/// A writer that refuses to go past `left` bytes.
struct Capped<W> {
    inner: W,
    left: u64,
    over: bool,
}

impl<W: Write> Write for Capped<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.len() as u64 > self.left {
            self.over = true;
            return Err(io::Error::other("more than the manifest size"));
        }
        let n = self.inner.write(buf)?;
        self.left -= n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl Receiver {
    /// Feeds compressed bytes. Output past the manifest size, or a stream
    /// zstd refuses, discards the partial file: the next transfer of this
    /// blob starts over.
    pub fn write_compressed(&mut self, data: &[u8]) -> Result<(), StoreError> {
        let Some(dec) = self.dec.as_mut() else {
            return Err(self.discarded());
        };
        let Err(err) = dec.write_all(data) else {
            return Ok(());
        };
        let over = dec.get_ref().over;
        self.discard();
        Err(if over {
            self.discarded()
        } else if err.raw_os_error().is_some() {
            StoreError::Io {
                path: self.path.clone(),
                err,
            }
        } else {
            // zstd's own errors carry no OS error code.
            StoreError::BadStream {
                sha: self.sha.to_string(),
                err,
            }
        })
    }

    fn discarded(&self) -> StoreError {
        StoreError::TooLarge {
            sha: self.sha.to_string(),
            size: self.size,
        }
    }

    /// Drops the decoder (and with it the file and its lock) and removes
    /// the partial file.
    fn discard(&mut self) {
        self.dec = None;
        let _ = fs::remove_file(&self.path);
    }

    fn take_file(&mut self) -> Result<File, StoreError> {
        let Some(mut dec) = self.dec.take() else {
            return Err(self.discarded());
        };
        let flushed = dec.flush();
        let over = dec.get_ref().over;
        let capped = dec.into_inner();
        if over {
            let _ = fs::remove_file(&self.path);
            return Err(self.discarded());
        }
        flushed.map_err(ioe(&self.path))?;
        capped.inner.into_inner().map_err(|e| StoreError::Io {
            path: self.path.clone(),
            err: e.into_error(),
        })
    }

    /// Keeps what arrived so far (flushed and fsync'd) for a later resume.
    pub fn suspend(mut self) -> Result<u64, StoreError> {
        let f = self.take_file()?;
        f.sync_all().map_err(ioe(&self.path))?;
        Ok(f.metadata().map_err(ioe(&self.path))?.len())
    }

    /// The blob is complete: checks its size and sha256 and moves it into
    /// the store with `mode`; a mismatch discards the partial file.
    pub fn finish(mut self, mode: u32) -> Result<(), StoreError> {
        let f = self.take_file()?;
        f.sync_all().map_err(ioe(&self.path))?;
        // The lock is held (by `f`) until the blob is in the store.
        let (got, len) = sha256_file(&self.path).map_err(ioe(&self.path))?;
        if got != self.sha || len != self.size {
            let _ = fs::remove_file(&self.path);
            return Err(StoreError::Mismatch {
                sha: self.sha.to_string(),
                got: got.to_string(),
                len,
                size: self.size,
            });
        }
        self.store.adopt(&self.path, &self.sha, mode)?;
        drop(f);
        sync_dir(self.store.dir()).map_err(ioe(self.store.dir()))
    }
}

fn remove_any(path: &Path) -> Result<(), StoreError> {
    let r = if fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    r.map_err(ioe(path))
}
