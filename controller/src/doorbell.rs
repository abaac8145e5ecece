//! Doorbells: the wake backend for kernels with neither io_uring futex
//! waits (Linux 6.7+) nor `futex_waitv` (5.16+), such as the 5.10 and 5.15
//! kernels of JetPack 5 and 6, and for systems where io_uring is switched
//! off (`kernel.io_uring_disabled`, seccomp profiles).
//!
//! Each event loop on this backend owns one *bell*: a 64-byte slot in a
//! table file every process of the robot maps (`<shm_dir>/.doorbells.v1`,
//! a header page and [`BELLS`] slots). The loop sleeps in one plain
//! `FUTEX_WAIT_BITSET` on its bell's word, with its next timer deadline as
//! the absolute timeout. Every channel it watches lists its bell in the
//! channel header (up to [`crate::channel::BELL_ENTRIES`] loops per
//! channel); a publisher that finds a listed bell asleep rings it.
//!
//! The bell word (the low 32 bits of an `AtomicU64`): bit 0 is `SLEEPING`,
//! set and cleared by the owning loop only; publishers add 2 (a ring
//! count), so both never lose each other's update.
//!
//! ```text
//! loop:       key = word |= SLEEPING ; load every watched index ; FUTEX_WAIT(word, key)
//! publisher:  index += 1 ; load bell word ; if SLEEPING { word += 2 ; FUTEX_WAKE(word) }
//! ```
//!
//! - Lost wakeups: all four accesses are SeqCst, so they sit in one total
//!   order. If the publisher's load does not see `SLEEPING`, it precedes
//!   the loop's `|=`, so its index store precedes the loop's index load,
//!   and the loop sees the message and does not sleep. If it sees
//!   `SLEEPING`, its `+= 2` changes the word: a loop not yet inside the
//!   kernel gets `EAGAIN`, a sleeping one gets the wake. A registration
//!   made after a publisher looked is followed by the loop's own look at
//!   the index before its first sleep, by the same argument.
//! - Lock-free publish, no wake syscall when nobody sleeps: a publisher
//!   makes the syscall only for a bell whose loop is asleep; with no bell
//!   listed it reads one header word. Nothing a publisher does waits for
//!   another process.
//! - A publisher killed at any step harms no one: before its `+= 2` it
//!   changed nothing of the bell; after it, the loop either was not asleep
//!   (its wait returns `EAGAIN`) or sleeps on until another publisher
//!   rings or its wake check passes ([`crate::event_loop::LoopOptions::wake_check`],
//!   counted as healed). Every publisher that sees `SLEEPING` rings
//!   itself, so none waits for the ring of a preempted one (the flaw of a
//!   "first one clears the flag and wakes" protocol, which lets a
//!   preempted lower-priority publisher hold the wake back with no lock to
//!   boost it). A loop that dies leaves its bell and its listings; the
//!   next claim or listing reclaims them (owner pid and start time, as for
//!   channel entries), and until then a publisher's ring of them wakes no
//!   one.
//! - Corrupt memory: a listing whose slot is out of range is skipped, a
//!   scribbled word costs at most a spurious wake or a wake healed by the
//!   wake check; every loop over the table or the listings is bounded by
//!   their fixed sizes.
//!
//! Priority inversion on PREEMPT_RT (the problem of the background letter:
//! a futex wake takes the futex hash bucket lock, an rt_mutex on
//! PREEMPT_RT, and priority inheritance lifts a preempted lower-priority
//! holder only to the blocked waker's priority, which loses to threaded
//! interrupts above it). A channel's own futex word is one bucket shared by
//! every subscriber re-arming its wait and every publisher waking it, of
//! every priority. A bell's word is one bucket shared only by its own loop
//! and the publishers that ring that loop, and a ring happens only while
//! the loop sleeps: a lower-priority subscriber of the same channel no
//! longer takes the real-time subscriber's bucket lock. What it does not
//! solve: a lower-priority publisher ringing the same real-time loop still
//! takes that bucket lock in `FUTEX_WAKE`, and if it is preempted there by
//! an interrupt thread above the real-time publisher's priority, that
//! publisher's wake waits for it; shared futex buckets are global, so an
//! unrelated futex hashing to the same bucket can do the same; and the
//! wake itself is a plain `try_to_wake_up`, no faster than the others.
//! Keep lower-priority publishers off the channels a real-time loop
//! watches when that matters.
#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::channel::owner::{my_owner_word, owner_alive};
use crate::shm::{Mapping, ShmAtomic};
use crate::sys;

/// The table's file name under the shm directory (a name no channel file
/// can have: channel names do not start with a dot).
pub const TABLE_FILE: &str = ".doorbells.v1";
/// Bells in one table: loops on this backend at once, per shm directory.
pub const BELLS: u32 = 1024;
/// `RTDBELL1` read as a little-endian u64.
const MAGIC: u64 = u64::from_le_bytes(*b"RTDBELL1");
const VERSION: u64 = 1;
const HEADER_BYTES: usize = 4096;
const SLOT_BYTES: usize = 64;
/// Bytes of the table file.
pub const TABLE_BYTES: usize = HEADER_BYTES + SLOT_BYTES * BELLS as usize;

/// Bit 0 of a bell word: its loop is about to sleep or sleeps.
const SLEEPING: u64 = 1;
/// What a ring adds to a bell word (above `SLEEPING`).
const RING: u64 = 2;

#[repr(C)]
struct TableHeader {
    magic: AtomicU64,
    version: AtomicU64,
    bells: AtomicU64,
    _pad: [AtomicU64; 5],
}
// SAFETY: repr(C), only AtomicU64 fields and arrays of them: no padding, no
// pointers, no Drop, valid for every bit pattern.
unsafe impl ShmAtomic for TableHeader {}

#[repr(C)]
struct BellSlot {
    /// The futex word (low 32 bits): `SLEEPING` | ring count.
    word: AtomicU64,
    /// Owner pid and start time (0: free), as for channel entries.
    owner: AtomicU64,
    /// Incremented by each claim; listings carry its low 32 bits.
    generation: AtomicU64,
    _pad: [AtomicU64; 5],
}
// SAFETY: as for TableHeader.
unsafe impl ShmAtomic for BellSlot {}

impl BellSlot {
    /// Whether `listing` names this slot's current claim (its generation,
    /// the listing's high 32 bits), not an earlier one.
    fn claimed_by(&self, listing: u64) -> bool {
        // SeqCst: see `BellTable::ring`.
        self.generation.load(Ordering::SeqCst) as u32 == (listing >> 32) as u32
    }
}

const _: () = assert!(std::mem::size_of::<TableHeader>() <= HEADER_BYTES);
const _: () = assert!(std::mem::size_of::<BellSlot>() == SLOT_BYTES);

/// A doorbell table could not be used.
#[derive(Debug, thiserror::Error)]
pub enum BellError {
    #[error("cannot open or create the doorbell table {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("doorbell table {path} is damaged: {reason}")]
    Damaged { path: PathBuf, reason: String },
    #[error("all {BELLS} bells of {path} belong to live event loops")]
    Full { path: PathBuf },
    #[error("cannot read this process's start time under {proc_root}")]
    Proc { proc_root: PathBuf },
}

/// A mapped doorbell table. One per directory per process (see
/// [`BellTable::open`]).
pub struct BellTable {
    map: Mapping,
    path: PathBuf,
}

impl std::fmt::Debug for BellTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BellTable")
            .field("path", &self.path)
            .finish()
    }
}

/// The tables this process has mapped, by path (looked up when a channel
/// gets a publisher or a loop claims a bell: never on the real-time path).
static TABLES: Mutex<Vec<(PathBuf, Weak<BellTable>)>> = Mutex::new(Vec::new());

/// The table file under `shm_dir`.
pub fn table_path(shm_dir: &Path) -> PathBuf {
    shm_dir.join(TABLE_FILE)
}

impl BellTable {
    /// The table of `shm_dir`, created (mode 0660, group `gid` when given)
    /// when missing. With `replace_damaged` (the supervisor, creating the
    /// robot's channels before any controller runs) a damaged table is
    /// replaced; otherwise it is an error.
    pub fn open(
        shm_dir: &Path,
        gid: Option<u32>,
        replace_damaged: bool,
    ) -> Result<Arc<BellTable>, BellError> {
        let path = table_path(shm_dir);
        let mut tables = TABLES.lock().unwrap_or_else(|p| p.into_inner());
        tables.retain(|(_, w)| w.strong_count() > 0);
        if !replace_damaged {
            if let Some(t) = tables
                .iter()
                .find(|(p, _)| *p == path)
                .and_then(|(_, w)| w.upgrade())
            {
                return Ok(t);
            }
        }
        let table = match Self::open_file(&path) {
            Ok(t) => t,
            Err(BellError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                Self::create(&path, gid, false)?
            }
            Err(BellError::Damaged { .. }) if replace_damaged => Self::create(&path, gid, true)?,
            Err(e) => return Err(e),
        };
        let table = Arc::new(table);
        tables.retain(|(p, _)| *p != path);
        tables.push((path, Arc::downgrade(&table)));
        Ok(table)
    }

    fn open_file(path: &Path) -> Result<BellTable, BellError> {
        let io_err = |source| BellError::Io {
            path: path.into(),
            source,
        };
        let damaged = |reason: String| BellError::Damaged {
            path: path.into(),
            reason,
        };
        // As for channel files: no symlink, no blocking open of a FIFO.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        if !meta.file_type().is_file() {
            return Err(damaged("not a regular file".into()));
        }
        if meta.len() != TABLE_BYTES as u64 {
            return Err(damaged(format!(
                "{} bytes, expected {TABLE_BYTES}",
                meta.len()
            )));
        }
        // SAFETY: the table is touched only through ShmAtomic types.
        let map = unsafe { Mapping::map(&file, TABLE_BYTES) }.map_err(io_err)?;
        let h: &TableHeader = map.at(0);
        let magic = h.magic.load(Ordering::Acquire);
        let version = h.version.load(Ordering::Acquire);
        let bells = h.bells.load(Ordering::Acquire);
        if map.is_broken() {
            return Err(damaged("truncated while being opened".into()));
        }
        if magic != MAGIC {
            return Err(damaged(format!("bad magic {magic:#018x}")));
        }
        if version != VERSION || bells != BELLS as u64 {
            return Err(damaged(format!(
                "version {version} with {bells} bells, this runtime reads version {VERSION} with {BELLS}"
            )));
        }
        Ok(BellTable {
            map,
            path: path.into(),
        })
    }

    /// Writes a new table under a temporary name and links it into place
    /// (`replace`: renames it over a damaged one). A creator that loses
    /// the race opens the winner's.
    fn create(path: &Path, gid: Option<u32>, replace: bool) -> Result<BellTable, BellError> {
        let io_err = |source| BellError::Io {
            path: path.into(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io_err)?;
        }
        let tmp = path.with_extension(format!("v1.tmp.{}", sys::getpid()));
        let _ = std::fs::remove_file(&tmp);
        let result = (|| {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o660)
                .custom_flags(libc::O_CLOEXEC)
                .open(&tmp)?;
            file.set_permissions(std::fs::Permissions::from_mode(0o660))?;
            if let Some(g) = gid {
                std::os::unix::fs::fchown(&file, None, Some(g))?;
            }
            file.set_len(TABLE_BYTES as u64)?;
            // SAFETY: as in `open_file`; the file is not yet visible.
            let map = unsafe { Mapping::map(&file, TABLE_BYTES) }?;
            let h: &TableHeader = map.at(0);
            h.version.store(VERSION, Ordering::Relaxed);
            h.bells.store(BELLS as u64, Ordering::Relaxed);
            // The magic last: nobody sees a half-built header.
            h.magic.store(MAGIC, Ordering::Release);
            drop(map);
            if replace {
                std::fs::rename(&tmp, path)
            } else {
                std::fs::hard_link(&tmp, path)
            }
        })();
        let _ = std::fs::remove_file(&tmp);
        match result {
            Ok(()) => Self::open_file(path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Self::open_file(path),
            Err(e) => Err(io_err(e)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn slot(&self, i: u32) -> &BellSlot {
        debug_assert!(i < BELLS);
        self.map.at(HEADER_BYTES + SLOT_BYTES * i as usize)
    }

    /// Rings the bell a channel lists as `listing` if its loop sleeps;
    /// `true` when that took a wake syscall. Publish path: no allocation,
    /// no lock, two loads, one add and one `FUTEX_WAKE` at most.
    ///
    /// A listing of an earlier claim of the slot (its loop killed before
    /// it unlisted, the slot claimed again since) is not rung: without
    /// this check a real-time publisher would ring, through a real-time
    /// loop's stale listing, the bell of a best-effort loop that took the
    /// slot (or the other way round), and the two classes would meet on
    /// one futex word. A claim between the generation load and the ring
    /// costs its new owner at most one spurious wake; the next listing of
    /// any loop on the channel clears the stale one.
    #[inline]
    pub(crate) fn ring(&self, listing: u64) -> bool {
        let Some(i) = listing_slot(listing) else {
            return false; // a scribbled listing: nothing to ring
        };
        let slot = self.slot(i);
        // SeqCst: a claim's generation increment precedes its owner's
        // first sleep, so a listing of the current claim always passes.
        if !slot.claimed_by(listing) {
            return false;
        }
        let word = &slot.word;
        // SeqCst load, then RMW: see the module docs.
        if word.load(Ordering::SeqCst) & SLEEPING == 0 {
            return false;
        }
        if word.fetch_add(RING, Ordering::SeqCst) & SLEEPING == 0 {
            return false; // it woke meanwhile
        }
        let _ = sys::futex_wake_all(word);
        true
    }

    /// Whether `listing` names no live loop's bell any more (its slot is
    /// free, owned by a dead process, or claimed again since).
    pub(crate) fn is_stale(&self, listing: u64, proc_root: &Path) -> bool {
        let Some(i) = listing_slot(listing) else {
            return true;
        };
        let s = self.slot(i);
        let owner = s.owner.load(Ordering::SeqCst);
        owner == 0 || !s.claimed_by(listing) || !owner_alive(proc_root, owner)
    }
}

/// The slot a listing names, if it is in range (the class bit,
/// [`crate::wake::RT_LISTING`], aside).
fn listing_slot(listing: u64) -> Option<u32> {
    let i = ((listing & !crate::wake::RT_LISTING) as u32).checked_sub(1)?;
    (i < BELLS).then_some(i)
}

/// A loop's own bell: claimed for the loop's lifetime, freed on drop.
pub struct Bell {
    table: Arc<BellTable>,
    index: u32,
    generation: u32,
}

impl std::fmt::Debug for Bell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bell")
            .field("table", &self.table.path)
            .field("index", &self.index)
            .finish()
    }
}

impl Bell {
    /// Claims a free bell of `table`, or one whose owner is dead
    /// (`proc_root`, normally `/proc`). Bounded: one pass over the table.
    pub fn claim(table: Arc<BellTable>, proc_root: &Path) -> Result<Bell, BellError> {
        let me = my_owner_word(proc_root).map_err(|_| BellError::Proc {
            proc_root: proc_root.into(),
        })?;
        for i in 0..BELLS {
            let s = table.slot(i);
            let owner = s.owner.load(Ordering::SeqCst);
            let free = owner == 0 || !owner_alive(proc_root, owner);
            if free
                && s.owner
                    .compare_exchange(owner, me, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                let generation = s.generation.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
                s.word.store(0, Ordering::SeqCst);
                return Ok(Bell {
                    index: i,
                    generation: generation as u32,
                    table,
                });
            }
        }
        Err(BellError::Full {
            path: table.path.clone(),
        })
    }

    pub fn table(&self) -> &Arc<BellTable> {
        &self.table
    }

    /// What a channel lists for this bell: slot + 1 in the low 32 bits
    /// (0 is an empty listing), the claim's generation above.
    pub fn listing(&self) -> u64 {
        (self.index as u64 + 1) | (self.generation as u64) << 32
    }

    fn word(&self) -> &AtomicU64 {
        &self.table.slot(self.index).word
    }

    /// Announces that the loop is about to sleep; returns the value to
    /// sleep on. The caller then looks at every watched index (SeqCst) and
    /// either [`Bell::sleep`]s or [`Bell::wake_up`]s.
    pub fn prepare_sleep(&self) -> u32 {
        (self.word().fetch_or(SLEEPING, Ordering::SeqCst) | SLEEPING) as u32
    }

    /// Sleeps while the word holds `key`, until rung or the absolute
    /// `CLOCK_MONOTONIC` deadline.
    pub fn sleep(&self, key: u32, deadline_ns: Option<u64>) -> io::Result<sys::WaitResult> {
        sys::futex_wait_until(self.word(), key, deadline_ns)
    }

    /// The loop is awake: publishers stop ringing. Returns the word as it
    /// was (its low 32 bits): unlike the key [`Bell::prepare_sleep`] gave,
    /// when a publisher rang meanwhile.
    pub fn wake_up(&self) -> u32 {
        self.word().fetch_and(!SLEEPING, Ordering::SeqCst) as u32
    }
}

impl Drop for Bell {
    fn drop(&mut self) {
        let s = self.table.slot(self.index);
        s.word.store(0, Ordering::SeqCst);
        // Release: the next owner's claim CAS is SeqCst.
        s.owner.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{Channel, ChannelAttachError, ChannelGeometry};
    use std::time::Duration;

    const PROC: &str = "/proc";

    fn channel(dir: &Path, name: &str) -> Channel {
        let g = ChannelGeometry::new(8, 16, 2);
        Channel::create(dir, name, &g, None, Path::new(PROC))
            .unwrap()
            .0
    }

    fn bell(dir: &Path) -> Bell {
        Bell::claim(BellTable::open(dir, None, false).unwrap(), Path::new(PROC)).unwrap()
    }

    #[test]
    fn a_listed_loop_costs_publishers_a_syscall_only_while_it_sleeps() {
        let dir = tempfile::tempdir().unwrap();
        let ch = channel(dir.path(), "/b");
        let b = bell(dir.path());
        let _l = ch
            .list_bell(&b, crate::WakeClass::BestEffort, Path::new(PROC))
            .unwrap();
        assert_eq!(ch.bell_listings(crate::WakeClass::BestEffort), 1);
        let mut p = ch.publisher(Path::new(PROC)).unwrap();
        assert!(p.rings_doorbells());
        // Awake: nothing to ring.
        for i in 0..100u64 {
            assert!(!p.publish_value(&i).unwrap().woke);
        }
        assert_eq!(p.wake_syscalls(), 0);
        // About to sleep: the first publish rings and moves the word, so
        // the sleep returns at once instead of missing the message.
        let key = b.prepare_sleep();
        assert!(p.publish_value(&7u64).unwrap().woke);
        assert_eq!(p.wake_syscalls(), 1);
        assert_eq!(
            b.sleep(key, Some(sys::monotonic_ns() + 5_000_000_000))
                .unwrap(),
            sys::WaitResult::Again
        );
        b.wake_up();
        assert!(!p.publish_value(&8u64).unwrap().woke);
    }

    #[test]
    fn a_sleeping_loop_is_rung_awake_by_another_thread() {
        let dir = tempfile::tempdir().unwrap();
        let ch = channel(dir.path(), "/s");
        let b = bell(dir.path());
        let _l = ch
            .list_bell(&b, crate::WakeClass::BestEffort, Path::new(PROC))
            .unwrap();
        let ch2 = ch.clone();
        let t = std::thread::spawn(move || {
            let mut p = ch2.publisher(Path::new(PROC)).unwrap();
            // Until the loop sleeps and the ring wakes it.
            for i in 0..5000u64 {
                std::thread::sleep(Duration::from_millis(1));
                if p.publish_value(&i).unwrap().woke {
                    return true;
                }
            }
            false
        });
        let key = b.prepare_sleep();
        let r = b
            .sleep(key, Some(sys::monotonic_ns() + 10_000_000_000))
            .unwrap();
        b.wake_up();
        assert!(t.join().unwrap(), "no publish rang the bell");
        assert!(
            matches!(r, sys::WaitResult::Woken | sys::WaitResult::Again),
            "{r:?}"
        );
    }

    #[test]
    fn listings_of_dead_loops_are_reclaimed_and_live_ones_fill_up() {
        let dir = tempfile::tempdir().unwrap();
        let ch = channel(dir.path(), "/f");
        // Loops that died: their listings stay, their bells are free; the
        // next loop to list clears them, so only the last one is left.
        for _ in 0..crate::channel::BELL_ENTRIES {
            let b = bell(dir.path());
            std::mem::forget(
                ch.list_bell(&b, crate::WakeClass::BestEffort, Path::new(PROC))
                    .unwrap(),
            );
        }
        assert_eq!(ch.bell_listings(crate::WakeClass::BestEffort), 1);
        // And recovery clears that one too.
        assert_eq!(ch.recover(Path::new(PROC)).bells_unlisted, 1);
        assert_eq!(ch.bell_listings(crate::WakeClass::BestEffort), 0);
        let mut live = Vec::new();
        let mut listings = Vec::new();
        for _ in 0..crate::channel::BELL_ENTRIES {
            let b = bell(dir.path());
            listings.push(
                ch.list_bell(&b, crate::WakeClass::BestEffort, Path::new(PROC))
                    .unwrap(),
            );
            live.push(b);
        }
        let extra = bell(dir.path());
        match ch.list_bell(&extra, crate::WakeClass::BestEffort, Path::new(PROC)) {
            Err(e @ ChannelAttachError::BellsFull { .. }) => {
                assert!(e.to_string().contains("doorbell listings"), "{e}")
            }
            Err(e) => panic!("expected BellsFull, got {e}"),
            Ok(_) => panic!("a 33rd live listing was accepted"),
        }
        drop(listings);
        assert_eq!(ch.bell_listings(crate::WakeClass::BestEffort), 0);
    }

    #[test]
    fn a_damaged_table_is_refused_by_loops_and_replaced_by_channel_creation() {
        let dir = tempfile::tempdir().unwrap();
        let path = table_path(dir.path());
        std::fs::write(&path, vec![0xa5u8; TABLE_BYTES]).unwrap();
        let e = BellTable::open(dir.path(), None, false).unwrap_err();
        assert!(
            matches!(e, BellError::Damaged { .. }) && e.to_string().contains("bad magic"),
            "{e}"
        );
        std::fs::write(&path, b"short").unwrap();
        let e = BellTable::open(dir.path(), None, false).unwrap_err();
        assert!(e.to_string().contains("5 bytes"), "{e}");
        // The supervisor's channel creation replaces it.
        let ch = channel(dir.path(), "/d");
        assert!(ch.publisher(Path::new(PROC)).unwrap().rings_doorbells());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), TABLE_BYTES as u64);
    }

    #[test]
    fn a_bell_rings_only_channels_of_its_own_directory() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let ch = channel(b.path(), "/x/y");
        assert_eq!(ch.shm_dir(), b.path());
        let bell = bell(a.path());
        let e = ch
            .list_bell(&bell, crate::WakeClass::BestEffort, Path::new(PROC))
            .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(&a.path().display().to_string())
                && msg.contains(&b.path().display().to_string()),
            "{msg}"
        );
    }

    #[test]
    fn a_stale_listing_never_rings_the_loop_that_took_its_slot() {
        let dir = tempfile::tempdir().unwrap();
        let ch = channel(dir.path(), "/s");
        // A real-time loop killed before it unlisted: its listing stays,
        // its slot is free.
        let dead = bell(dir.path());
        let slot = dead.index;
        std::mem::forget(
            ch.list_bell(&dead, crate::WakeClass::RealTime, Path::new(PROC))
                .unwrap(),
        );
        drop(dead);
        assert_eq!(ch.bell_listings(crate::WakeClass::RealTime), 1);
        // A best-effort loop takes the slot, unlisted here, and sleeps.
        let taker = bell(dir.path());
        assert_eq!(taker.index, slot, "the freed slot is claimed again");
        let key = taker.prepare_sleep();
        // A real-time publisher finds the stale real-time listing: it
        // must not touch the best-effort loop's word.
        let mut p = ch
            .publisher_as(crate::WakeClass::RealTime, Path::new(PROC))
            .unwrap();
        for i in 0..10u64 {
            assert!(!p.publish_value(&i).unwrap().woke);
        }
        assert_eq!(p.wake_syscalls(), 0);
        assert_eq!(taker.wake_up(), key, "the word was not rung");
        // The listing of the current claim still rings.
        let l = ch
            .list_bell(&taker, crate::WakeClass::RealTime, Path::new(PROC))
            .unwrap();
        assert_eq!(
            ch.bell_listings(crate::WakeClass::RealTime),
            1,
            "stale one cleared"
        );
        let key = taker.prepare_sleep();
        assert!(p.publish_value(&11u64).unwrap().woke);
        assert_ne!(taker.wake_up(), key);
        drop(l);
    }

    #[test]
    fn a_scribbled_listing_rings_no_one() {
        let dir = tempfile::tempdir().unwrap();
        let t = BellTable::open(dir.path(), None, false).unwrap();
        for l in [0u64, BELLS as u64 + 1, u64::MAX, 1 << 40] {
            assert!(!t.ring(l));
        }
        assert!(t.is_stale(u64::MAX, Path::new(PROC)));
    }
}
