//! The channel file's life: creating it (under a temporary name, linked
//! into place complete), opening and validating it (geometry read from the
//! header page and checked before the whole file is mapped), the mapping,
//! and the message type it records.
//!
//! Files are opened without following a symlink and without blocking, must
//! be regular files, and a wrong magic, version or size is refused before
//! anything else is read. A file truncated under a process later does not
//! kill it with `SIGBUS` (see [`crate::shm::Mapping`]): the channel reports
//! [`ChannelFault::Truncated`].
#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{validate_channel_name, ChannelConfig};
use crate::doorbell::BellTable;
use crate::shm::{Mapping, ShmSafe, TypeName};
use crate::sys;

use super::layout::{
    pack, ChannelGeometry, ChannelGeometryError, Header, HoldRecord, Keep, PubEntry, SlotHeader,
    HEADER_BYTES, INVALID, LAYOUT_VERSION, MAGIC, NONE,
};
use super::owner::{owner_word, ChannelAttachError, RecoveryReport};
use super::{Channel, Inner};

/// The file of channel `name` under `shm_dir`.
pub fn channel_path(shm_dir: &Path, name: &str) -> PathBuf {
    let mut p = shm_dir.join(name.trim_start_matches('/'));
    let file = format!(
        "{}.v{LAYOUT_VERSION}",
        p.file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default()
    );
    p.set_file_name(file);
    p
}

/// Creating a channel file failed.
#[derive(Debug, thiserror::Error)]
pub enum ChannelCreateError {
    #[error(transparent)]
    InvalidName(#[from] crate::config::ChannelNameError),
    #[error("channel `{name}`: {reason}")]
    Geometry {
        name: String,
        reason: ChannelGeometryError,
    },
    #[error("cannot create channel file {path}")]
    Io { path: PathBuf, source: io::Error },
}

/// Opening an existing channel file failed.
#[derive(Debug, thiserror::Error)]
pub enum ChannelOpenError {
    #[error(transparent)]
    InvalidName(#[from] crate::config::ChannelNameError),
    #[error("channel file {path} does not exist (the supervisor creates channels at start)")]
    NotFound { path: PathBuf },
    #[error("cannot open channel file {path}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path} is {what}, not a channel file")]
    NotAFile { path: PathBuf, what: &'static str },
    #[error("{path} is not a channel file (magic {found:#018x}, expected {MAGIC:#018x})")]
    BadMagic { path: PathBuf, found: u64 },
    #[error("channel file {path} has layout version {found}, this runtime reads version {LAYOUT_VERSION} only")]
    WrongVersion { path: PathBuf, found: u64 },
    #[error("channel file {path} is {found} bytes, its header says {expected}")]
    WrongFileSize {
        path: PathBuf,
        found: u64,
        expected: u64,
    },
    #[error("channel file {path} has an invalid layout: {reason}")]
    BadGeometry {
        path: PathBuf,
        reason: ChannelGeometryError,
    },
    #[error("channel file {path} has {field} {found}, expected {expected}")]
    Mismatch {
        path: PathBuf,
        field: &'static str,
        found: u64,
        expected: u64,
    },
}

/// `` `Name` (24 bytes, align 8, layout 0x…) ``.
fn describe_type(name: &TypeName, size: u64, align: u64, hash: u64) -> String {
    let name = if name.as_bytes().is_empty() {
        "(name not yet recorded)"
    } else {
        name.as_str()
    };
    format!("`{name}` ({size} bytes, align {align}, layout {hash:#018x})")
}

/// What [`Channel::create`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOutcome {
    /// A new file.
    Created,
    /// A compatible file existed; dead owners' entries were reclaimed.
    Reused { recovered: RecoveryReport },
    /// An incompatible or damaged file was replaced (processes that still
    /// map the old one keep it until they reopen).
    Replaced { reason: String },
}

/// Removes `<file>.tmp.<pid>` files that creators which died mid-create
/// left beside `path` (their pid no longer exists under `proc_root`).
fn remove_stale_temporaries(path: &Path, proc_root: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return;
    };
    let prefix = format!("{}.tmp.", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let f = e.file_name();
        let f = f.to_string_lossy();
        if let Some(pid) = f.strip_prefix(&prefix).and_then(|p| p.parse::<u32>().ok()) {
            if sys::process_start_time(proc_root, pid).is_none() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Stores `bytes` into `words`, NUL padded, cut at the words' size.
fn store_padded(words: &[AtomicU64], bytes: &[u8], order: Ordering) {
    for (i, w) in words.iter().enumerate() {
        let mut b = [0u8; 8];
        let chunk = bytes.get(i * 8..).unwrap_or_default();
        let n = chunk.len().min(8);
        b[..n].copy_from_slice(&chunk[..n]);
        w.store(u64::from_le_bytes(b), order);
    }
}

impl Channel {
    /// Creates channel `name` under `shm_dir` (creating directories as
    /// needed), mode 0660, group `gid` when given. A compatible existing
    /// file is reused after reclaiming dead owners' entries (`proc_root`,
    /// normally `/proc`); an incompatible or damaged one is replaced.
    pub fn create(
        shm_dir: &Path,
        name: &str,
        geom: &ChannelGeometry,
        gid: Option<u32>,
        proc_root: &Path,
    ) -> Result<(Channel, CreateOutcome), ChannelCreateError> {
        validate_channel_name(name).map_err(ChannelCreateError::InvalidName)?;
        geom.check()
            .map_err(|reason| ChannelCreateError::Geometry {
                name: name.into(),
                reason,
            })?;
        let path = channel_path(shm_dir, name);
        let io_err = |source: io::Error| ChannelCreateError::Io {
            path: path.clone(),
            source,
        };
        // The directory's doorbell table, with the channel's group (the
        // supervisor creates the channels before any controller starts).
        // A damaged one is replaced: no process can be using it. A failure
        // here only costs loops on the doorbell backend their wakes: they
        // run on the wake check, and `Publisher::rings_doorbells` says so.
        let _ = BellTable::open(shm_dir, gid, true);
        let replace_reason = match Channel::open_expect(shm_dir, name, geom) {
            Ok(ch) => {
                let recovered = ch.recover(proc_root);
                return Ok((ch, CreateOutcome::Reused { recovered }));
            }
            Err(ChannelOpenError::NotFound { .. }) => None,
            Err(e) => Some(units::error::Chain(&e).to_string()),
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io_err)?;
        }
        remove_stale_temporaries(&path, proc_root);
        let tmp = path.with_extension(format!("v{LAYOUT_VERSION}.tmp.{}", sys::getpid()));
        let _ = std::fs::remove_file(&tmp);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o660)
            .open(&tmp)
            .map_err(io_err)?;
        let result = (|| {
            // The umask may have cleared group bits: set them explicitly.
            file.set_permissions(std::fs::Permissions::from_mode(0o660))?;
            if let Some(g) = gid {
                std::os::unix::fs::fchown(&file, None, Some(g))?;
            }
            file.set_len(geom.total_bytes())?;
            // SAFETY: this module touches channel memory only through
            // ShmAtomic types and atomic word copies (see the module docs).
            let map = unsafe { Mapping::map(&file, geom.total_bytes() as usize)? };
            Channel::init(&map, geom, name, proc_root);
            drop(map);
            file.sync_all()?;
            match &replace_reason {
                None => std::fs::hard_link(&tmp, &path),
                Some(_) => std::fs::rename(&tmp, &path),
            }
        })();
        let _ = std::fs::remove_file(&tmp);
        match result {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // Another creator won the race: use theirs.
                let ch = Channel::open_expect(shm_dir, name, geom).map_err(|e| {
                    ChannelCreateError::Io {
                        path: path.clone(),
                        source: io::Error::other(e),
                    }
                })?;
                let recovered = ch.recover(proc_root);
                return Ok((ch, CreateOutcome::Reused { recovered }));
            }
            Err(e) => return Err(io_err(e)),
        }
        let ch = Channel::open_expect(shm_dir, name, geom).map_err(|e| ChannelCreateError::Io {
            path: path.clone(),
            source: io::Error::other(e),
        })?;
        let outcome = match replace_reason {
            None => CreateOutcome::Created,
            Some(reason) => CreateOutcome::Replaced { reason },
        };
        Ok((ch, outcome))
    }

    /// [`Channel::create`] with the geometry of a robot.yaml channel that
    /// `publishers` processes publish and `subscribers` subscribe to.
    pub fn create_from_config(
        shm_dir: &Path,
        cfg: &ChannelConfig,
        publishers: u32,
        subscribers: u32,
        gid: Option<u32>,
        proc_root: &Path,
    ) -> Result<(Channel, CreateOutcome), ChannelCreateError> {
        Channel::create(
            shm_dir,
            &cfg.name,
            &ChannelGeometry::from_config(cfg, publishers, subscribers),
            gid,
            proc_root,
        )
    }

    fn init(map: &Mapping, geom: &ChannelGeometry, name: &str, proc_root: &Path) {
        let h: &Header = map.at(0);
        let r = Ordering::Relaxed; // single writer: the file is not yet linked
        h.version
            .store(LAYOUT_VERSION as u64 | HEADER_BYTES << 32, r);
        h.slot_bytes.store(geom.slot_bytes, r);
        h.queue_len.store(geom.queue_len, r);
        h.publishers.store(geom.publishers as u64, r);
        h.subscribers.store(geom.subscribers as u64, r);
        h.retention_ns
            .store(geom.retention.as_nanos().min(u64::MAX as u128) as u64, r);
        h.cross_class_ns
            .store(geom.cross_class.as_nanos().min(u64::MAX as u128) as u64, r);
        h.total_bytes.store(geom.total_bytes(), r);
        h.holds.store(geom.holds as u64, r);
        h.keep.store(geom.keep.word(), r);
        let pid = sys::getpid();
        h.creator.store(
            owner_word(pid, sys::process_start_time(proc_root, pid).unwrap_or(0)),
            r,
        );
        store_padded(&h.name, name.as_bytes(), r);
        h.next_index.store(0, r);
        h.rt_word.store(0, r);
        h.waiters.store(0, r);
        h.rt_waiters.store(0, r);
        let len = geom.queue_len;
        for p in 0..len {
            let e: &AtomicU64 = map.at((geom.ring_offset() + 8 * p) as usize);
            e.store(pack(p.wrapping_sub(len), p), r);
        }
        for s in 0..geom.slots() {
            let sh: &SlotHeader = map.at((geom.slots_offset() + s * geom.slot_bytes) as usize);
            sh.qi.store(INVALID, r);
        }
        for i in 0..geom.publishers as u64 {
            let pe: &PubEntry = map.at((geom.pub_table_offset() + 64 * i) as usize);
            pe.scratch.store(len + i, r);
            pe.swapping.store(NONE, r);
            pe.trading.store(NONE, r);
            pe.reclaiming.store(NONE, r);
        }
        for k in 0..geom.holds as u64 {
            let hr: &HoldRecord = map.at((geom.hold_offset() + 64 * k) as usize);
            hr.held.store(NONE, r);
            hr.reserve.store(len + geom.publishers as u64 + k, r);
        }
        // The magic goes last; the file only becomes visible under its name
        // after this and an fsync, so no reader sees a half-built header.
        h.magic.store(MAGIC, Ordering::Release);
    }

    /// Opens channel `name` under `shm_dir`, taking its geometry from the
    /// header. Wrong magic, layout version or size is refused. The whole
    /// file is mapped prefaulted (the real-time path takes no page fault).
    pub fn open(shm_dir: &Path, name: &str) -> Result<Channel, ChannelOpenError> {
        validate_channel_name(name).map_err(ChannelOpenError::InvalidName)?;
        let path = channel_path(shm_dir, name);
        Channel::open_path_with(&path, name, None, true)
    }

    /// Opens channel `name` and refuses it unless its geometry is `expect`.
    /// The geometry is checked from the header page before the file is
    /// mapped whole, so a file of the wrong size costs nothing to refuse.
    pub fn open_expect(
        shm_dir: &Path,
        name: &str,
        expect: &ChannelGeometry,
    ) -> Result<Channel, ChannelOpenError> {
        validate_channel_name(name).map_err(ChannelOpenError::InvalidName)?;
        let path = channel_path(shm_dir, name);
        Channel::open_path_with(&path, name, Some(expect), true)
    }

    /// Opens channel `name` of another process to look at now and then
    /// (the supervisor reading timing reports): geometry `expect` checked
    /// before mapping, nothing prefaulted, so neither a wrong size nor a
    /// large sparse file costs the reader memory.
    pub fn open_to_inspect(
        shm_dir: &Path,
        name: &str,
        expect: &ChannelGeometry,
    ) -> Result<Channel, ChannelOpenError> {
        validate_channel_name(name).map_err(ChannelOpenError::InvalidName)?;
        let path = channel_path(shm_dir, name);
        Channel::open_path_with(&path, name, Some(expect), false)
    }

    /// Opens a channel file by path (`name` is only for messages).
    pub fn open_path(path: &Path, name: &str) -> Result<Channel, ChannelOpenError> {
        Channel::open_path_with(path, name, None, true)
    }

    fn open_path_with(
        path: &Path,
        name: &str,
        expect: Option<&ChannelGeometry>,
        populate: bool,
    ) -> Result<Channel, ChannelOpenError> {
        // No symlink (a group member could point it at any file the
        // opener may write) and no blocking open (a FIFO in its place).
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ChannelOpenError::NotFound { path: path.into() })
            }
            Err(source) => {
                return Err(ChannelOpenError::Io {
                    path: path.into(),
                    source,
                })
            }
        };
        let io_err = |source| ChannelOpenError::Io {
            path: path.into(),
            source,
        };
        let meta = file.metadata().map_err(io_err)?;
        let ft = meta.file_type();
        if !ft.is_file() {
            let what = if ft.is_fifo() {
                "a FIFO"
            } else if ft.is_char_device() || ft.is_block_device() {
                "a device"
            } else if ft.is_socket() {
                "a socket"
            } else if ft.is_dir() {
                "a directory"
            } else {
                "a special file"
            };
            return Err(ChannelOpenError::NotAFile {
                path: path.into(),
                what,
            });
        }
        let file_len = meta.len();
        if file_len < HEADER_BYTES {
            return Err(ChannelOpenError::WrongFileSize {
                path: path.into(),
                found: file_len,
                expected: HEADER_BYTES,
            });
        }
        // SAFETY: as in `create`.
        let head = unsafe { Mapping::map_lazy(&file, HEADER_BYTES as usize) }.map_err(io_err)?;
        let h: &Header = head.at(0);
        let a = Ordering::Acquire; // pairs with the Release store of the magic in init
        let magic = h.magic.load(a);
        let version = h.version.load(a);
        let geom = ChannelGeometry {
            queue_len: h.queue_len.load(a),
            slot_bytes: h.slot_bytes.load(a),
            publishers: h.publishers.load(a).min(u32::MAX as u64) as u32,
            subscribers: h.subscribers.load(a).min(u32::MAX as u64) as u32,
            retention: Duration::from_nanos(h.retention_ns.load(a)),
            cross_class: Duration::from_nanos(h.cross_class_ns.load(a)),
            holds: h.holds.load(a).min(u32::MAX as u64) as u32,
            keep: Keep::Newest,
        };
        let keep_word = h.keep.load(a);
        let total = h.total_bytes.load(a);
        let truncated = head.is_broken();
        drop(head);
        if truncated {
            return Err(ChannelOpenError::WrongFileSize {
                path: path.into(),
                found: 0,
                expected: HEADER_BYTES,
            });
        }
        if magic != MAGIC {
            return Err(ChannelOpenError::BadMagic {
                path: path.into(),
                found: magic,
            });
        }
        if version != LAYOUT_VERSION as u64 | HEADER_BYTES << 32 {
            return Err(ChannelOpenError::WrongVersion {
                path: path.into(),
                found: version & 0xffff_ffff,
            });
        }
        let geom = ChannelGeometry {
            keep: Keep::from_word(keep_word).ok_or_else(|| ChannelOpenError::BadGeometry {
                path: path.into(),
                reason: ChannelGeometryError::KeepWord { word: keep_word },
            })?,
            ..geom
        };
        geom.check()
            .map_err(|reason| ChannelOpenError::BadGeometry {
                path: path.into(),
                reason,
            })?;
        if total != geom.total_bytes() {
            return Err(ChannelOpenError::BadGeometry {
                path: path.into(),
                reason: ChannelGeometryError::TotalSize {
                    header: total,
                    computed: geom.total_bytes(),
                },
            });
        }
        if let Some(expect) = expect {
            for (field, found, expected) in [
                ("queue length", geom.queue_len, expect.queue_len),
                ("slot size", geom.slot_bytes, expect.slot_bytes),
                (
                    "publisher entries",
                    geom.publishers as u64,
                    expect.publishers as u64,
                ),
                (
                    "subscriber entries",
                    geom.subscribers as u64,
                    expect.subscribers as u64,
                ),
                (
                    "retention (ns)",
                    geom.retention.as_nanos() as u64,
                    expect.retention.as_nanos() as u64,
                ),
                ("hold records", geom.holds as u64, expect.holds as u64),
                (
                    "keep (0 newest, 1 unread)",
                    geom.keep.word(),
                    expect.keep.word(),
                ),
                (
                    "cross-class latency (ns)",
                    geom.cross_class.as_nanos() as u64,
                    expect.cross_class.as_nanos() as u64,
                ),
            ] {
                if found != expected {
                    return Err(ChannelOpenError::Mismatch {
                        path: path.into(),
                        field,
                        found,
                        expected,
                    });
                }
            }
        }
        if file_len != total {
            return Err(ChannelOpenError::WrongFileSize {
                path: path.into(),
                found: file_len,
                expected: total,
            });
        }
        // SAFETY: as in `create`.
        let map = unsafe {
            if populate {
                Mapping::map(&file, total as usize)
            } else {
                Mapping::map_lazy(&file, total as usize)
            }
        }
        .map_err(io_err)?;
        Ok(Channel::from_map(map, geom, path.into(), name.into()))
    }

    fn from_map(map: Mapping, geom: ChannelGeometry, path: PathBuf, name: String) -> Channel {
        // `<shm_dir>/a/b.vN` for `/a/b`: up one directory per name part.
        let parts = name.trim_start_matches('/').split('/').count();
        let shm_dir = path
            .ancestors()
            .nth(parts)
            .or_else(|| path.parent())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        Channel {
            inner: Arc::new(Inner {
                shm_dir,
                mask: geom.queue_len - 1,
                pubs: geom.pub_table_offset() as usize,
                subs: geom.sub_table_offset() as usize,
                ring: geom.ring_offset() as usize,
                holds: geom.hold_offset() as usize,
                slots: geom.slots_offset() as usize,
                map,
                geom,
                path,
                name,
            }),
        }
    }

    /// Records `T` as this channel's message type, or checks it against
    /// the type recorded by the first process that bound one: a process
    /// opening a channel with another type (another name, size, alignment
    /// or field layout) is refused with both types named. Channels opened
    /// through the byte API (tools that handle any channel) bind nothing.
    pub fn bind_type<T: ShmSafe>(&self) -> Result<(), ChannelAttachError> {
        self.bind_recorded_type(
            &T::TYPE_NAME,
            std::mem::size_of::<T>() as u64,
            std::mem::align_of::<T>() as u64,
            T::LAYOUT_HASH,
        )
    }

    /// [`Channel::bind_type`] for a type known at run time by its record.
    pub fn bind_record(&self, t: &crate::shm::TypeRecord) -> Result<(), ChannelAttachError> {
        self.bind_recorded_type(&t.name, t.size, t.align, t.layout_hash)
    }

    /// [`Channel::bind_type`] for a type known by what a channel recorded
    /// of it (name, size, alignment, layout hash), as a tool that replays
    /// recorded messages knows it.
    pub fn bind_recorded_type(
        &self,
        name: &TypeName,
        size: u64,
        align: u64,
        layout_hash: u64,
    ) -> Result<(), ChannelAttachError> {
        let inner = &self.inner;
        let max = inner.geom.max_payload();
        if size > max {
            return Err(ChannelAttachError::TooSmall {
                path: inner.path.clone(),
                max,
                wanted: format!("`{name}`"),
                size: size as usize,
            });
        }
        // 0 means "none recorded".
        let want = layout_hash.max(1);
        let h = inner.header();
        // SeqCst: one recorder among processes racing to bind.
        match h
            .type_hash
            .compare_exchange(0, want, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => {
                // Informational, after the hash: a loser of the race may
                // read an empty name, never a wrong verdict.
                h.type_size.store(size, Ordering::Relaxed);
                h.type_align.store(align, Ordering::Relaxed);
                store_padded(&h.type_name, name.as_bytes(), Ordering::Release);
                Ok(())
            }
            Err(found) if found == want => Ok(()),
            Err(found) => Err(ChannelAttachError::WrongType {
                path: inner.path.clone(),
                recorded: self
                    .recorded_type()
                    .map(|(n, s, a, _)| describe_type(&n, s, a, found))
                    .unwrap_or_else(|| describe_type(&TypeName::new(""), 0, 0, found)),
                wanted: describe_type(name, size, align, want),
            }),
        }
    }

    /// The message type recorded in the header, if any: name, size,
    /// alignment, layout hash.
    pub fn recorded_type(&self) -> Option<(TypeName, u64, u64, u64)> {
        let h = self.inner.header();
        let hash = h.type_hash.load(Ordering::Acquire);
        if hash == 0 {
            return None;
        }
        let mut nb = [0u8; 64];
        for (i, w) in h.type_name.iter().enumerate() {
            nb[i * 8..i * 8 + 8].copy_from_slice(&w.load(Ordering::Acquire).to_le_bytes());
        }
        Some((
            TypeName::from_bytes(&nb),
            h.type_size.load(Ordering::Relaxed),
            h.type_align.load(Ordering::Relaxed),
            hash,
        ))
    }
}

/// Opens the file read-only to check its mode (tests and `deploy verify`).
pub fn file_mode(path: &Path) -> io::Result<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.mode() & 0o7777, m.gid()))
}
