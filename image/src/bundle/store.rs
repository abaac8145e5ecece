//! The content-addressed store on the robot: `store/<sha256>`, each blob
//! written under a temporary name, fsync'd, checked and renamed into place,
//! so a name in the store always means exactly that content.
//!
//! `store/.staging-<pid>/` holds the blobs of a bundle being installed until
//! the whole bundle has verified; `store/.partial/<sha256>` holds blobs
//! received over the wire so far (their length is the resume offset).

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::hash::{sha256_file, Sha256Hex};

/// Why the store could not do something.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("received blob {sha} hashes to {got} ({len} bytes, expected {size}); discarded, it will be sent again")]
    Mismatch {
        sha: String,
        got: String,
        len: u64,
        size: u64,
    },
    #[error("resume offset {offset} for blob {sha} is past the {have} bytes received")]
    Offset { sha: String, offset: u64, have: u64 },
}

fn ioe(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
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

    /// Opens the partial blob `sha` to continue at `offset` (at most what
    /// was received before; anything past it is dropped).
    pub fn receive(&self, sha: &Sha256Hex, offset: u64) -> Result<Receiver, StoreError> {
        let pdir = self.partial_dir();
        fs::create_dir_all(&pdir).map_err(ioe(&pdir))?;
        let path = self.partial_path(sha);
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(ioe(&path))?;
        let have = f.metadata().map_err(ioe(&path))?.len();
        if offset > have {
            return Err(StoreError::Offset {
                sha: sha.to_string(),
                offset,
                have,
            });
        }
        f.set_len(offset).map_err(ioe(&path))?;
        f.seek(SeekFrom::Start(offset)).map_err(ioe(&path))?;
        let dec = zstd::stream::write::Decoder::new(BufWriter::with_capacity(1 << 20, f))
            .map_err(ioe(&path))?;
        Ok(Receiver {
            store: self.clone(),
            sha: sha.clone(),
            path,
            dec,
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

    /// Removes every blob not in `keep`, and partial blobs not in
    /// `keep_partial`. Returns (blobs removed, bytes freed).
    pub fn gc(&self, keep: &BTreeSet<Sha256Hex>) -> Result<(usize, u64), StoreError> {
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
/// file as it decompresses.
pub struct Receiver {
    store: Store,
    sha: Sha256Hex,
    path: PathBuf,
    dec: zstd::stream::write::Decoder<'static, BufWriter<File>>,
}

impl Receiver {
    /// Feeds compressed bytes.
    pub fn write_compressed(&mut self, data: &[u8]) -> Result<(), StoreError> {
        self.dec.write_all(data).map_err(ioe(&self.path))
    }

    /// Keeps what arrived so far (flushed and fsync'd) for a later resume.
    pub fn suspend(mut self) -> Result<u64, StoreError> {
        let _ = self.dec.flush();
        let w = self.dec.into_inner();
        let f = w.into_inner().map_err(|e| StoreError::Io {
            path: self.path.clone(),
            source: e.into_error(),
        })?;
        f.sync_all().map_err(ioe(&self.path))?;
        Ok(f.metadata().map_err(ioe(&self.path))?.len())
    }

    /// The blob is complete: checks its size and sha256 and moves it into
    /// the store with `mode`; a mismatch discards the partial file.
    pub fn finish(mut self, size: u64, mode: u32) -> Result<(), StoreError> {
        self.dec.flush().map_err(ioe(&self.path))?;
        let f = self
            .dec
            .into_inner()
            .into_inner()
            .map_err(|e| StoreError::Io {
                path: self.path.clone(),
                source: e.into_error(),
            })?;
        f.sync_all().map_err(ioe(&self.path))?;
        drop(f);
        let (got, len) = sha256_file(&self.path).map_err(ioe(&self.path))?;
        if got != self.sha || len != size {
            let _ = fs::remove_file(&self.path);
            return Err(StoreError::Mismatch {
                sha: self.sha.to_string(),
                got: got.to_string(),
                len,
                size,
            });
        }
        self.store.adopt(&self.path, &self.sha, mode)?;
        sync_dir(self.store.dir()).map_err(ioe(self.store.dir()))
    }
}
