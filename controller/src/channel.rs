//! Shared-memory publish/subscribe channels.
//!
//! One file per channel, `<shm_dir>/<name without its leading />.v<LAYOUT_VERSION>`
//! (so `/imu/raw` is `<shm_dir>/imu/raw.v3`), mode 0660 and an optional
//! group. The file holds, in order:
//!
//! ```text
//! header page (4096 B)   magic, layout version, geometry, creator, the
//!                        queue index (next message to publish; its low 32
//!                        bits are the futex word), the waiter count
//! publisher table        per publisher: owner (pid + start time), scratch
//!                        slot, the ring entry being swapped out, counters
//! subscriber table       per subscriber: owner, how many waits it has armed
//! ring                   queue_len entries: (queue index tag, slot id)
//! slots                  queue_len + publishers slots of slot_bytes each:
//!                        64-byte slot header then the payload
//! ```
//!
//! # Publishing (lock-free)
//!
//! Each publisher owns one scratch slot. It writes the whole message there,
//! stamps the slot with the queue index it is aiming for, then swaps the
//! slot into the ring position of that index with one compare-and-swap of
//! the ring entry; the evicted slot becomes its new scratch. Then it
//! advances the shared queue index. Anyone who finds the ring already
//! holding the message for the current index (a publisher preempted or
//! killed between the two steps) advances the index for it ("help along"),
//! so no publisher ever waits for another.
//!
//! Ring entries pack a 40-bit tag of the queue index with a 24-bit slot id,
//! so the CAS cannot succeed against an entry of an older lap (ABA would
//! need 2^40 messages to pass while one publisher is stopped mid-publish).
//!
//! # Reading
//!
//! A reader loads the ring entry for index `i`, checks the slot's stamped
//! queue index, copies the message with relaxed atomic loads, fences and
//! checks the stamp again (a seqlock): a changed stamp means the slot was
//! recycled while it read, the message is counted lost and never delivered
//! torn. Payload copies use word-sized relaxed atomics on both sides, so the
//! races a seqlock relies on are atomic races, not data races. A reader
//! that needs only part of a message reads it in place
//! ([`Subscriber::next_in_place`]): the same checks around a body that
//! loads only the words it asks for, whose result is kept only when the
//! second check passes.
//!
//! # Untrusted contents
//!
//! Every process of the robot group may write every byte of the file, by
//! mistake or on purpose. Nothing read from it is trusted: slot ids are
//! range-checked, every loop over shared state has a bound, and a state
//! no correct writer can produce (the index going backwards, a ring entry
//! of no lap the index allows) is a [`ChannelFault`] of this channel,
//! returned as an error and counted, never a hang, a panic or an
//! out-of-bounds access. A file truncated under a process does not kill it
//! with `SIGBUS` (see [`crate::shm::Mapping`]): the channel reports
//! [`ChannelFault::Truncated`]. Files are opened without following a
//! symlink and without blocking, must be regular files, and their geometry
//! is checked from the header page before the whole file is mapped.
//!
//! # Crash recovery
//!
//! Publisher and subscriber entries are owned by `pid << 42 | start time`
//! (start time from `/proc/<pid>/stat`), so a recycled pid is not mistaken
//! for the dead owner. An entry whose owner is dead is reclaimed by the next
//! process that attaches (or by [`Channel::recover`]): a publisher killed
//! mid-swap leaves enough state (`swapping`) to decide which slot is now its
//! scratch (see [`Channel::recover_publisher`]).
#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{validate_channel_name, ChannelConfig, SLOT_HEADER_BYTES};
use crate::doorbell::{Bell, BellTable};
use crate::shm::{Mapping, ShmAtomic, ShmSafe, TypeName};
use crate::sys;
use crate::wake::{ClassWords, WakeClass, RT_LISTING};

/// Version of the file layout; part of the file name and the header.
pub const LAYOUT_VERSION: u32 = 4;
/// `RTDCHAN1` read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"RTDCHAN1");
/// Bytes of the header page.
pub const HEADER_BYTES: u64 = 4096;
/// Subscriber entries a channel gets unless told otherwise.
pub const DEFAULT_SUBSCRIBERS: u32 = 32;
/// Event loops on the doorbell backend one channel lists (see
/// [`crate::doorbell`]).
pub const BELL_ENTRIES: usize = 32;
/// Most publisher (and subscriber) entries one channel may have.
pub const MAX_ENTRIES: u32 = 4096;
/// How late a message may reach a subscriber of the other wake class
/// unless robot.yaml says otherwise (`channels[].cross_class_latency`;
/// see [`crate::wake`]): loops watching a channel with publishers of the
/// other class look at it at least every half of this.
pub const DEFAULT_CROSS_CLASS_LATENCY: Duration = Duration::from_millis(2);
/// The shortest cross-class bound a channel may have (a look every 50 us
/// would be a busy loop by another name).
pub const MIN_CROSS_CLASS_LATENCY: Duration = Duration::from_micros(100);
/// The longest (the wake check of a loop heals anything later anyway).
pub const MAX_CROSS_CLASS_LATENCY: Duration = Duration::from_secs(10);

const TAG_BITS: u32 = 40;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
const SLOT_BITS: u32 = 24;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
/// A stamp no queue index ever has.
const INVALID: u64 = u64::MAX;
/// `swapping` when the publisher is not between CAS and bookkeeping.
const NONE: u64 = u64::MAX;
const PID_SHIFT: u32 = 42;
/// Attempts one publish makes before it gives up. Each failed attempt of
/// a correct channel means another publisher placed a message meanwhile
/// (the algorithm is lock-free), so a few are normal under contention and
/// this many only happen on a corrupt channel.
const PUBLISH_ATTEMPTS: u32 = 1024;
/// Attempts [`Subscriber::latest_meta`] makes to copy the newest message.
const LATEST_ATTEMPTS: u32 = 64;
const START_MASK: u64 = (1 << PID_SHIFT) - 1;

#[inline]
fn tag(qi: u64) -> u64 {
    qi & TAG_MASK
}
#[inline]
fn pack(qi: u64, slot: u64) -> u64 {
    (tag(qi) << SLOT_BITS) | slot
}
#[inline]
fn entry_tag(e: u64) -> u64 {
    e >> SLOT_BITS
}
#[inline]
fn entry_slot(e: u64) -> u64 {
    e & SLOT_MASK
}

/// The header page. Everything is an `AtomicU64` so that any process may
/// read any field at any time without a data race.
#[repr(C)]
struct Header {
    magic: AtomicU64,
    /// `layout_version | header_bytes << 32`.
    version: AtomicU64,
    slot_bytes: AtomicU64,
    queue_len: AtomicU64,
    publishers: AtomicU64,
    subscribers: AtomicU64,
    retention_ns: AtomicU64,
    total_bytes: AtomicU64,
    creator: AtomicU64,
    /// Publisher entries reclaimed from dead owners.
    recovered: AtomicU64,
    /// Of those, the ones whose owner died between stamping and bookkeeping
    /// of a ring swap (`swapping` set).
    recovered_mid_swap: AtomicU64,
    /// How late a message may cross wake classes, nanoseconds (see
    /// [`crate::wake`]); read once, at open, and range-checked.
    cross_class_ns: AtomicU64,
    _pad0: [AtomicU64; 4],
    /// The channel name, NUL padded.
    name: [AtomicU64; 16],
    /// The next queue index to publish. Its low 32 bits are the
    /// best-effort futex word.
    next_index: AtomicU64,
    /// The real-time futex word (low 32 bits): the queue index after the
    /// last message of a real-time publisher, stored by real-time
    /// publishers only. In the index's cache line, which every publish
    /// writes anyway.
    rt_word: AtomicU64,
    _pad1: [AtomicU64; 6],
    /// Best-effort waits armed on the index word, all subscribers together.
    waiters: AtomicU64,
    _pad2: [AtomicU64; 7],
    /// Real-time waits armed on `rt_word` (a line of their own: no
    /// best-effort subscriber's arm moves it).
    rt_waiters: AtomicU64,
    _pad3: [AtomicU64; 7],
    /// Live publisher entries per wake class (best-effort, real-time): a
    /// loop looks for the other class's messages only while there are
    /// some. A hint: a wrong value costs a look or leaves a message to the
    /// wake check.
    class_publishers: [AtomicU64; 2],
    _pad4: [AtomicU64; 6],
    /// Best-effort listings in `bells`, then real-time ones (hints:
    /// publishers skip their class's listings while 0; a wrong value costs
    /// a scan or a wake the wake check heals).
    bell_count: AtomicU64,
    rt_bell_count: AtomicU64,
    _pad5: [AtomicU64; 6],
    /// The bells of event loops on the doorbell backend watching this
    /// channel ([`crate::doorbell::Bell::listing`], with
    /// [`crate::wake::RT_LISTING`] for real-time loops; 0: empty).
    bells: [AtomicU64; BELL_ENTRIES],
    /// The message type, recorded by the first process that opens the
    /// channel with one ([`Channel::bind_type`]): its layout hash (0 while
    /// none is recorded; never 0 once one is), then size, alignment and
    /// name (informational, written after the hash).
    type_hash: AtomicU64,
    type_size: AtomicU64,
    type_align: AtomicU64,
    type_name: [AtomicU64; 8],
    _pad6: [AtomicU64; 5],
}
// SAFETY: repr(C), only AtomicU64 fields and arrays of them: no padding, no
// pointers, no Drop, valid for every bit pattern.
unsafe impl ShmAtomic for Header {}

impl Header {
    /// The futex word of `class` (see [`crate::wake`]).
    #[inline]
    fn word_of(&self, class: WakeClass) -> &AtomicU64 {
        match class {
            WakeClass::BestEffort => &self.next_index,
            WakeClass::RealTime => &self.rt_word,
        }
    }
    #[inline]
    fn waiters_of(&self, class: WakeClass) -> &AtomicU64 {
        match class {
            WakeClass::BestEffort => &self.waiters,
            WakeClass::RealTime => &self.rt_waiters,
        }
    }
    #[inline]
    fn bells_of(&self, class: WakeClass) -> &AtomicU64 {
        match class {
            WakeClass::BestEffort => &self.bell_count,
            WakeClass::RealTime => &self.rt_bell_count,
        }
    }
}

#[repr(C)]
struct PubEntry {
    owner: AtomicU64,
    scratch: AtomicU64,
    /// The ring entry this publisher is swapping out, or NONE.
    swapping: AtomicU64,
    published: AtomicU64,
    errors: AtomicU64,
    /// The owner's wake class, counted in `class_publishers`: 1 + its
    /// index (0: none counted).
    class: AtomicU64,
    _pad: [AtomicU64; 2],
}
// SAFETY: as for Header.
unsafe impl ShmAtomic for PubEntry {}

#[repr(C)]
struct SubEntry {
    owner: AtomicU64,
    /// Best-effort waits this subscriber counts in `waiters`.
    armed: AtomicU64,
    /// Real-time waits it counts in `rt_waiters`.
    rt_armed: AtomicU64,
    _pad: [AtomicU64; 5],
}
// SAFETY: as for Header.
unsafe impl ShmAtomic for SubEntry {}

#[repr(C)]
struct SlotHeader {
    /// The queue index of the message in this slot, INVALID while written.
    qi: AtomicU64,
    send_time_ns: AtomicU64,
    size: AtomicU64,
    /// The publisher's pid, with its wake class in bit 63.
    pid: AtomicU64,
    _pad: [AtomicU64; 4],
}
// SAFETY: as for Header.
unsafe impl ShmAtomic for SlotHeader {}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_BYTES as usize);
// Offsets tools and tests scribble at (controller/tests/hostile.rs).
const _: () = assert!(std::mem::offset_of!(Header, next_index) == 256);
const _: () = assert!(std::mem::offset_of!(Header, rt_word) == 264);
const _: () = assert!(std::mem::offset_of!(Header, waiters) == 320);
const _: () = assert!(std::mem::offset_of!(Header, rt_waiters) == 384);
const _: () = assert!(std::mem::offset_of!(Header, class_publishers) == 448);
const _: () = assert!(std::mem::offset_of!(Header, bell_count) == 512);
const _: () = assert!(std::mem::offset_of!(Header, rt_bell_count) == 520);
const _: () = assert!(std::mem::size_of::<PubEntry>() == 64);
const _: () = assert!(std::mem::size_of::<SubEntry>() == 64);
const _: () = assert!(std::mem::size_of::<SlotHeader>() as u64 == SLOT_HEADER_BYTES);

/// The sizes of a channel file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelGeometry {
    /// Ring length, a power of two.
    pub queue_len: u64,
    /// Bytes of one slot including its 64-byte header; a multiple of 64.
    pub slot_bytes: u64,
    /// Publisher entries (each with a scratch slot).
    pub publishers: u32,
    /// Subscriber entries (each may keep waits armed).
    pub subscribers: u32,
    /// A publisher may not overwrite a message younger than this.
    pub retention: Duration,
    /// How late a message may reach a subscriber of the other wake class
    /// ([`crate::wake`]), from [`MIN_CROSS_CLASS_LATENCY`] to
    /// [`MAX_CROSS_CLASS_LATENCY`].
    pub cross_class: Duration,
}

impl ChannelGeometry {
    /// Geometry for messages of at most `max_payload` bytes in a ring of
    /// `queue_len` (rounded up to a power of two), no retention guard and
    /// [`DEFAULT_SUBSCRIBERS`] subscribers.
    pub fn new(max_payload: u64, queue_len: u64, publishers: u32) -> Self {
        ChannelGeometry {
            queue_len: queue_len.max(2).next_power_of_two(),
            slot_bytes: (SLOT_HEADER_BYTES + max_payload.max(1)).div_ceil(64) * 64,
            publishers,
            subscribers: DEFAULT_SUBSCRIBERS,
            retention: Duration::ZERO,
            cross_class: DEFAULT_CROSS_CLASS_LATENCY,
        }
    }

    /// Geometry of a `channels:` entry of robot.yaml with `publishers`
    /// publisher entries.
    pub fn from_config(cfg: &ChannelConfig, publishers: u32) -> Self {
        ChannelGeometry {
            queue_len: cfg.queue_len(),
            slot_bytes: cfg.slot_bytes(),
            publishers,
            subscribers: DEFAULT_SUBSCRIBERS,
            retention: cfg.retention.0,
            cross_class: cfg.cross_class_latency(),
        }
    }

    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    pub fn with_subscribers(mut self, subscribers: u32) -> Self {
        self.subscribers = subscribers;
        self
    }

    pub fn with_cross_class(mut self, bound: Duration) -> Self {
        self.cross_class = bound;
        self
    }

    /// The largest payload a slot holds.
    pub fn max_payload(&self) -> u64 {
        self.slot_bytes - SLOT_HEADER_BYTES
    }

    fn slots(&self) -> u64 {
        self.queue_len + self.publishers as u64
    }
    fn pub_table_offset(&self) -> u64 {
        HEADER_BYTES
    }
    fn sub_table_offset(&self) -> u64 {
        self.pub_table_offset() + 64 * self.publishers as u64
    }
    fn ring_offset(&self) -> u64 {
        self.sub_table_offset() + 64 * self.subscribers as u64
    }
    fn slots_offset(&self) -> u64 {
        (self.ring_offset() + 8 * self.queue_len).div_ceil(64) * 64
    }

    /// Bytes of the channel file.
    pub fn total_bytes(&self) -> u64 {
        self.slots_offset() + self.slots() * self.slot_bytes
    }

    /// Why this geometry cannot be laid out, if it cannot.
    pub fn check(&self) -> Result<(), ChannelGeometryError> {
        if !self.queue_len.is_power_of_two() || self.queue_len < 2 || self.queue_len > 1 << 20 {
            return Err(ChannelGeometryError::QueueLength {
                queue_len: self.queue_len,
            });
        }
        if self.slot_bytes % 64 != 0
            || self.slot_bytes < SLOT_HEADER_BYTES + 8
            || self.slot_bytes > (16 << 20) + SLOT_HEADER_BYTES
        {
            return Err(ChannelGeometryError::SlotSize {
                slot_bytes: self.slot_bytes,
            });
        }
        if self.publishers == 0 || self.publishers > MAX_ENTRIES {
            return Err(ChannelGeometryError::Publishers {
                publishers: self.publishers,
            });
        }
        if self.subscribers > MAX_ENTRIES {
            return Err(ChannelGeometryError::Subscribers {
                subscribers: self.subscribers,
            });
        }
        if self.slots() > SLOT_MASK {
            return Err(ChannelGeometryError::Slots {
                slots: self.slots(),
            });
        }
        if self.total_bytes() > 1 << 32 {
            return Err(ChannelGeometryError::TooLarge {
                bytes: self.total_bytes(),
            });
        }
        if !(MIN_CROSS_CLASS_LATENCY..=MAX_CROSS_CLASS_LATENCY).contains(&self.cross_class) {
            return Err(ChannelGeometryError::CrossClass {
                bound: self.cross_class,
            });
        }
        Ok(())
    }
}

/// Why a channel geometry cannot be laid out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelGeometryError {
    #[error("queue length {queue_len} is not a power of two from 2 to 1048576")]
    QueueLength { queue_len: u64 },
    #[error("slot size {slot_bytes} is not a multiple of 64 from 72 to 16MiB+64")]
    SlotSize { slot_bytes: u64 },
    #[error("{publishers} publishers (expected 1 to {MAX_ENTRIES})")]
    Publishers { publishers: u32 },
    #[error("{subscribers} subscribers (expected at most {MAX_ENTRIES})")]
    Subscribers { subscribers: u32 },
    #[error("{slots} slots (at most {SLOT_MASK})")]
    Slots { slots: u64 },
    #[error("channel of {bytes} bytes is larger than 4GiB")]
    TooLarge { bytes: u64 },
    #[error("cross-class latency {bound:?} is outside {MIN_CROSS_CLASS_LATENCY:?} to {MAX_CROSS_CLASS_LATENCY:?}")]
    CrossClass { bound: Duration },
    /// A file's header records a total size its own geometry does not give.
    #[error("header total size {header} does not match its geometry ({computed})")]
    TotalSize { header: u64, computed: u64 },
}

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

/// Attaching a publisher or subscriber failed.
#[derive(Debug, thiserror::Error)]
pub enum ChannelAttachError {
    #[error("channel {path}: all {count} {what} entries are held by live processes")]
    Full {
        path: PathBuf,
        what: &'static str,
        count: u32,
    },
    #[error("cannot read own start time from {path}")]
    Proc { path: PathBuf },
    #[error("channel {path}: all {BELL_ENTRIES} doorbell listings belong to live event loops")]
    BellsFull { path: PathBuf },
    #[error("channel {path} rings the doorbells of {channel_table}, this loop's bell is in {bell_table}: a loop on the doorbell backend watches channels of one directory")]
    BellElsewhere {
        path: PathBuf,
        channel_table: PathBuf,
        bell_table: PathBuf,
    },
    #[error("channel {path}: doorbell table")]
    Bells {
        path: PathBuf,
        #[source]
        source: crate::doorbell::BellError,
    },
    #[error("channel {path}: {fault}")]
    Fault { path: PathBuf, fault: ChannelFault },
    #[error("channel {path} carries {recorded}; this process opened it as {wanted}")]
    WrongType {
        path: PathBuf,
        recorded: String,
        wanted: String,
    },
    #[error("channel {path} carries messages of at most {max} bytes; {wanted} needs {size}")]
    TooSmall {
        path: PathBuf,
        max: u64,
        wanted: String,
        size: usize,
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

/// A state of a channel's shared memory that no correct writer produces,
/// found while publishing or reading. Small and `Copy`: it is returned on
/// the real-time path. The channel stays usable where it can: a reader
/// resynchronises to the current index, a publisher tries again on its
/// next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChannelFault {
    #[error("the channel file was truncated under this process (its mapping now reads zeroes; reopen the channel once it is recreated)")]
    Truncated,
    #[error("the queue index went back from {from} to {to} (corrupt shared memory)")]
    IndexWentBack { from: u64, to: u64 },
    #[error("ring entry for index {index} holds tag {found:#x}, which no lap allows (corrupt shared memory)")]
    RingInconsistent { index: u64, found: u64 },
    #[error(
        "slot id {slot} is out of range (the channel has {slots} slots; corrupt shared memory)"
    )]
    BadSlot { slot: u64, slots: u64 },
    #[error("gave up after {attempts} attempts without a consistent view (corrupt shared memory, or overwritten faster than it can be read)")]
    GaveUp { attempts: u32 },
}

/// A publish was refused. Small and `Copy`: it is returned on the
/// real-time path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    #[error("message of {len} bytes is larger than the channel's {max}")]
    TooLarge { len: usize, max: u64 },
    #[error("publishing index {index} would overwrite a message {age_ns}ns old, younger than the retention {retention_ns}ns")]
    WouldOverwrite {
        index: u64,
        age_ns: u64,
        retention_ns: u64,
    },
    #[error("{0}")]
    Fault(ChannelFault),
}

/// What [`Channel::check_slot_ownership`] found out of place (test
/// instrumentation).
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SlotOwnershipError {
    #[error("ring position {position} holds slot {slot} of {slots}")]
    RingSlot {
        position: u64,
        slot: u64,
        slots: u64,
    },
    #[error("publisher entry {entry} is mid-swap")]
    MidSwap { entry: u32 },
    #[error("publisher entry {entry} holds scratch slot {slot} of {slots}")]
    ScratchSlot { entry: u32, slot: u64, slots: u64 },
    #[error("slot {slot} is held {times} times")]
    HeldTimes { slot: u64, times: u32 },
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

/// What [`Channel::recover`] reclaimed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub publishers: u32,
    pub subscribers: u32,
    /// Whether the queue index had to be advanced for a dead publisher.
    pub helped_along: bool,
    /// Doorbell listings of loops that are gone, removed.
    pub bells_unlisted: u64,
}

struct Inner {
    map: Mapping,
    geom: ChannelGeometry,
    path: PathBuf,
    /// The directory the channel's name is under (its doorbell table).
    shm_dir: PathBuf,
    name: String,
    mask: u64,
    // Byte offsets, validated at open.
    pubs: usize,
    subs: usize,
    ring: usize,
    slots: usize,
}

/// An open channel file. Cheap to clone; publishers and subscribers keep
/// it mapped.
#[derive(Clone)]
pub struct Channel {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("name", &self.inner.name)
            .field("path", &self.inner.path)
            .field("geometry", &self.inner.geom)
            .finish()
    }
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

fn owner_word(pid: u32, start: u64) -> u64 {
    ((pid as u64) << PID_SHIFT) | (start & START_MASK)
}

/// Whether the process an owner word names is still alive.
pub(crate) fn owner_alive(proc_root: &Path, owner: u64) -> bool {
    let pid = (owner >> PID_SHIFT) as u32;
    match sys::process_start_time(proc_root, pid) {
        Some(start) => start & START_MASK == owner & START_MASK,
        None => false,
    }
}

pub(crate) fn my_owner_word(proc_root: &Path) -> Result<u64, ChannelAttachError> {
    let pid = sys::getpid();
    let start =
        sys::process_start_time(proc_root, pid).ok_or_else(|| ChannelAttachError::Proc {
            path: proc_root.join(pid.to_string()).join("stat"),
        })?;
    Ok(owner_word(pid, start))
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

    /// [`Channel::create`] with the geometry of a robot.yaml channel.
    pub fn create_from_config(
        shm_dir: &Path,
        cfg: &ChannelConfig,
        publishers: u32,
        gid: Option<u32>,
        proc_root: &Path,
    ) -> Result<(Channel, CreateOutcome), ChannelCreateError> {
        Channel::create(
            shm_dir,
            &cfg.name,
            &ChannelGeometry::from_config(cfg, publishers),
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
        };
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
                slots: geom.slots_offset() as usize,
                map,
                geom,
                path,
                name,
            }),
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }
    pub fn path(&self) -> &Path {
        &self.inner.path
    }
    pub fn geometry(&self) -> ChannelGeometry {
        self.inner.geom
    }

    /// Prefetches, for writing, the first `bytes` of slot `slot`'s payload
    /// (see [`Publisher::warm_next`]), 4 KiB at a time until `stop` says
    /// so; a slot id out of range is clamped.
    pub(crate) fn warm_for_write(&self, slot: u64, bytes: usize, stop: &dyn Fn() -> bool) {
        let words = self.inner.payload(slot);
        for chunk in words[..bytes.div_ceil(8).min(words.len())].chunks(512) {
            if stop() {
                return;
            }
            warm_for_write(chunk);
        }
    }

    /// The next queue index to be published (= messages published so far).
    pub fn next_index(&self) -> u64 {
        // Acquire: a reader that sees index n also sees the ring entries of
        // the messages before n (they were CASed in before the index moved).
        self.inner.header().next_index.load(Ordering::Acquire)
    }

    /// The futex word subscribers of `class` wait on, in the mapping: the
    /// low 32 bits of the queue index, or of `rt_word`.
    pub(crate) fn futex_word(&self, class: WakeClass) -> *const u32 {
        sys::low_word_ptr(self.inner.header().word_of(class))
    }

    /// Live publishers of `class` (a count in shared memory: a hint; see
    /// [`crate::wake`]). SeqCst: a publisher counts itself before its first
    /// message.
    pub fn publishers_of_class(&self, class: WakeClass) -> u64 {
        self.inner.header().class_publishers[class.index()].load(Ordering::SeqCst)
    }

    /// Whether the file was truncated under this process (see
    /// [`ChannelFault::Truncated`]).
    pub fn is_truncated(&self) -> bool {
        self.inner.map.is_broken()
    }

    /// Touches every page of the mapping so that a truncation is noticed
    /// now; `false` when the file was truncated. For callers about to hand
    /// the futex word to the kernel, which answers `EFAULT` rather than
    /// raising `SIGBUS` (see [`crate::shm::Mapping::probe`]).
    pub fn probe_mapping(&self) -> bool {
        self.inner.map.probe()
    }

    /// `FUTEX_WAKE` of every best-effort waiter of this channel, as a
    /// best-effort publisher's wake does (for tools, and for the timing
    /// check's hammer on that word). There is no such call for the
    /// real-time word: only real-time publishers wake it.
    pub fn wake_best_effort_waiters(&self) -> io::Result<usize> {
        sys::futex_wake_all(&self.inner.header().next_index)
    }

    /// Waits armed on this channel by subscribers of `class`.
    pub fn waiters(&self, class: WakeClass) -> u64 {
        self.inner.header().waiters_of(class).load(Ordering::SeqCst)
    }

    /// Doorbell listings of loops of `class` (see [`crate::doorbell`]).
    pub fn bell_listings(&self, class: WakeClass) -> u64 {
        self.inner.header().bells_of(class).load(Ordering::SeqCst)
    }

    /// The directory whose doorbell table this channel's publishers ring.
    pub fn shm_dir(&self) -> &Path {
        &self.inner.shm_dir
    }

    /// Lists `bell`, the bell of a loop of wake class `class`, in this
    /// channel so that its publishers of that class ring it: clears the
    /// listings of loops that are gone (dead, or their bell claimed
    /// again), then takes an empty one. Bounded: two passes over the fixed
    /// listings. The caller
    /// looks at the index after this and before sleeping (see
    /// [`crate::doorbell`]).
    pub(crate) fn list_bell(
        &self,
        bell: &Bell,
        class: WakeClass,
        proc_root: &Path,
    ) -> Result<BellListing, ChannelAttachError> {
        let inner = &self.inner;
        let mine = crate::doorbell::table_path(&inner.shm_dir);
        if bell.table().path() != mine {
            return Err(ChannelAttachError::BellElsewhere {
                path: inner.path.clone(),
                channel_table: mine,
                bell_table: bell.table().path().into(),
            });
        }
        let h = inner.header();
        // The listings of dead loops first (a loop killed before it
        // unlisted): their publishers would ring them on every message.
        self.unlist_stale(bell.table(), proc_root);
        let listing = match class {
            WakeClass::RealTime => bell.listing() | RT_LISTING,
            WakeClass::BestEffort => bell.listing(),
        };
        for (slot, l) in h.bells.iter().enumerate() {
            if l.compare_exchange(0, listing, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                h.bells_of(class).fetch_add(1, Ordering::SeqCst);
                return Ok(BellListing {
                    ch: self.clone(),
                    slot,
                    listing,
                    class,
                });
            }
        }
        Err(ChannelAttachError::BellsFull {
            path: inner.path.clone(),
        })
    }

    /// Clears the listings of loops that are gone (their bell free, owned
    /// by a dead process, or claimed again), so that publishers stop
    /// ringing them; returns how many. Bounded by the fixed listings.
    fn unlist_stale(&self, table: &BellTable, proc_root: &Path) -> u64 {
        let h = self.inner.header();
        let mut n = 0;
        for l in &h.bells {
            let old = l.load(Ordering::SeqCst);
            if old != 0
                && table.is_stale(old, proc_root)
                && l.compare_exchange(old, 0, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                let class = if old & RT_LISTING != 0 {
                    WakeClass::RealTime
                } else {
                    WakeClass::BestEffort
                };
                h.bells_of(class).fetch_sub(1, Ordering::SeqCst);
                n += 1;
            }
        }
        n
    }

    /// Publisher entries reclaimed from dead owners since creation.
    pub fn recovered_count(&self) -> u64 {
        self.inner.header().recovered.load(Ordering::Relaxed)
    }

    /// Test instrumentation: checks, at a quiescent moment, that every slot
    /// is in exactly one place (the ring or one publisher's scratch) and
    /// that no publisher entry is mid-swap.
    #[cfg(feature = "fault-injection")]
    pub fn check_slot_ownership(&self) -> Result<(), SlotOwnershipError> {
        let inner = &self.inner;
        let mut seen = vec![0u32; inner.geom.slots() as usize];
        let slots = inner.geom.slots();
        for p in 0..inner.geom.queue_len {
            let e = inner.ring_entry(p).load(Ordering::SeqCst);
            let s = entry_slot(e);
            if s >= slots {
                return Err(SlotOwnershipError::RingSlot {
                    position: p,
                    slot: s,
                    slots,
                });
            }
            seen[s as usize] += 1;
        }
        for i in 0..inner.geom.publishers {
            let pe = inner.pub_entry(i);
            if pe.swapping.load(Ordering::SeqCst) != NONE {
                return Err(SlotOwnershipError::MidSwap { entry: i });
            }
            let s = pe.scratch.load(Ordering::SeqCst);
            if s >= slots {
                return Err(SlotOwnershipError::ScratchSlot {
                    entry: i,
                    slot: s,
                    slots,
                });
            }
            seen[s as usize] += 1;
        }
        match seen.iter().position(|&n| n != 1) {
            None => Ok(()),
            Some(slot) => Err(SlotOwnershipError::HeldTimes {
                slot: slot as u64,
                times: seen[slot],
            }),
        }
    }

    /// Reclaimed publisher entries whose owner died mid-swap.
    pub fn recovered_mid_swap_count(&self) -> u64 {
        self.inner
            .header()
            .recovered_mid_swap
            .load(Ordering::Relaxed)
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

    /// Attaches a best-effort publisher: claims a free publisher entry, or
    /// reclaims one whose owner died. `proc_root` is normally `/proc`.
    pub fn publisher(&self, proc_root: &Path) -> Result<Publisher, ChannelAttachError> {
        self.publisher_as(WakeClass::BestEffort, proc_root)
    }

    /// Attaches a publisher of wake class `class` (see [`crate::wake`]):
    /// it wakes only subscribers of that class.
    pub fn publisher_as(
        &self,
        class: WakeClass,
        proc_root: &Path,
    ) -> Result<Publisher, ChannelAttachError> {
        let me = my_owner_word(proc_root)?;
        let inner = &self.inner;
        for i in 0..inner.geom.publishers {
            // SeqCst: ownership transfer; also orders our later reads of the
            // entry's scratch after the previous owner's Release of it.
            if inner
                .pub_entry(i)
                .owner
                .compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                return self.make_publisher(i, class);
            }
        }
        for i in 0..inner.geom.publishers {
            let o = inner.pub_entry(i).owner.load(Ordering::SeqCst);
            if o != 0
                && o != me
                && !owner_alive(proc_root, o)
                && inner
                    .pub_entry(i)
                    .owner
                    .compare_exchange(o, me, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                self.recover_publisher(i);
                return self.make_publisher(i, class);
            }
        }
        Err(ChannelAttachError::Full {
            path: inner.path.clone(),
            what: "publisher",
            count: inner.geom.publishers,
        })
    }

    fn make_publisher(
        &self,
        entry: u32,
        class: WakeClass,
    ) -> Result<Publisher, ChannelAttachError> {
        let scratch = self.inner.pub_entry(entry).scratch.load(Ordering::SeqCst);
        let slots = self.inner.geom.slots();
        if scratch >= slots || self.inner.map.is_broken() {
            // Give the entry back: it is as unusable to the next one, who
            // gets the same error, as it is to us.
            self.inner
                .pub_entry(entry)
                .owner
                .store(0, Ordering::Release);
            let fault = if self.inner.map.is_broken() {
                ChannelFault::Truncated
            } else {
                ChannelFault::BadSlot {
                    slot: scratch,
                    slots,
                }
            };
            return Err(ChannelAttachError::Fault {
                path: self.inner.path.clone(),
                fault,
            });
        }
        // Counted before the first message, so that a loop of the other
        // class that looks at the count after this sees a publisher to
        // look for (SeqCst: see `Channel::publishers_of_class`).
        let pe = self.inner.pub_entry(entry);
        pe.class.store(1 + class.index() as u64, Ordering::SeqCst);
        self.inner.header().class_publishers[class.index()].fetch_add(1, Ordering::SeqCst);
        Ok(Publisher {
            ch: self.clone(),
            entry,
            class,
            scratch,
            pid_word: sys::getpid() as u64 | class.pid_bit(),
            wakes: 0,
            published: 0,
            errors: 0,
            bells: BellTable::open(&self.inner.shm_dir, None, false).ok(),
            staging: Vec::new(),
            to_warm: 0,
        })
    }

    /// Attaches a best-effort subscriber that may wait on the channel,
    /// starting at the next message to be published.
    pub fn subscriber(&self, proc_root: &Path) -> Result<Subscriber, ChannelAttachError> {
        self.subscriber_as(WakeClass::BestEffort, proc_root)
    }

    /// Attaches a subscriber of wake class `class` (see [`crate::wake`]):
    /// its waits are woken by publishers of that class only.
    pub fn subscriber_as(
        &self,
        class: WakeClass,
        proc_root: &Path,
    ) -> Result<Subscriber, ChannelAttachError> {
        let me = my_owner_word(proc_root)?;
        let inner = &self.inner;
        let mut claimed = None;
        for i in 0..inner.geom.subscribers {
            if inner
                .sub_entry(i)
                .owner
                .compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                claimed = Some(i);
                break;
            }
        }
        if claimed.is_none() {
            for i in 0..inner.geom.subscribers {
                let o = inner.sub_entry(i).owner.load(Ordering::SeqCst);
                if o != 0
                    && o != me
                    && !owner_alive(proc_root, o)
                    && inner
                        .sub_entry(i)
                        .owner
                        .compare_exchange(o, me, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                {
                    self.recover_subscriber(i);
                    claimed = Some(i);
                    break;
                }
            }
        }
        match claimed {
            Some(i) => {
                let mut sub = self.make_reader(Some(i));
                sub.class = class;
                Ok(sub)
            }
            None => Err(ChannelAttachError::Full {
                path: inner.path.clone(),
                what: "subscriber",
                count: inner.geom.subscribers,
            }),
        }
    }

    /// A reader that never waits (a fetcher): needs no subscriber entry.
    /// It starts at the newest message already published, so its first
    /// [`Subscriber::latest`] or [`Subscriber::next_message`] returns that one.
    pub fn reader(&self) -> Subscriber {
        let mut r = self.make_reader(None);
        r.next = r.next.saturating_sub(1);
        r
    }

    /// A reader that never waits, starting at queue index `index` (at most
    /// the next index): from 0, it reads every message the channel still
    /// holds and counts the older ones as lost, as a recorder that must
    /// account for every message does.
    pub fn reader_at(&self, index: u64) -> Subscriber {
        let mut r = self.make_reader(None);
        r.next = r.next.min(index);
        r
    }

    fn make_reader(&self, entry: Option<u32>) -> Subscriber {
        let words = (self.inner.geom.max_payload() / 8) as usize;
        // Register this thread's hazard entry now, not on the first read.
        hazard::touch();
        Subscriber {
            ch: self.clone(),
            entry,
            class: WakeClass::BestEffort,
            next: self.next_index(),
            wait_val: 0,
            buf: vec![0u64; words],
            lost: 0,
            armed: 0,
            faults: 0,
        }
    }

    /// Reclaims the entries of dead publishers and subscribers and helps
    /// the queue index along past a message a dead publisher placed but
    /// did not announce. Safe to call at any time, from any process.
    pub fn recover(&self, proc_root: &Path) -> RecoveryReport {
        let inner = &self.inner;
        let mut rep = RecoveryReport::default();
        let me = match my_owner_word(proc_root) {
            Ok(m) => m,
            Err(_) => return rep,
        };
        for i in 0..inner.geom.publishers {
            let e = inner.pub_entry(i);
            let o = e.owner.load(Ordering::SeqCst);
            if o != 0
                && !owner_alive(proc_root, o)
                && e.owner
                    .compare_exchange(o, me, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                self.recover_publisher(i);
                // Release: the entry's repaired scratch/swapping are visible
                // to whoever claims the entry next (their CAS is SeqCst).
                e.owner.store(0, Ordering::Release);
                rep.publishers += 1;
            }
        }
        for i in 0..inner.geom.subscribers {
            let e = inner.sub_entry(i);
            let o = e.owner.load(Ordering::SeqCst);
            if o != 0
                && !owner_alive(proc_root, o)
                && e.owner
                    .compare_exchange(o, me, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                self.recover_subscriber(i);
                e.owner.store(0, Ordering::Release);
                rep.subscribers += 1;
            }
        }
        rep.helped_along = self.help_along();
        if let Ok(table) = BellTable::open(&inner.shm_dir, None, false) {
            rep.bells_unlisted = self.unlist_stale(&table, proc_root);
        }
        rep
    }

    /// Advances the queue index past messages already in the ring.
    fn help_along(&self) -> bool {
        let inner = &self.inner;
        let h = inner.header();
        let mut helped = false;
        // At most one lap: a correct ring has at most one placed but
        // unannounced message per publisher; more is corruption.
        for _ in 0..=inner.geom.queue_len {
            let qi = h.next_index.load(Ordering::SeqCst);
            let e = inner.ring_entry(qi).load(Ordering::SeqCst);
            if entry_tag(e) != tag(qi) {
                break;
            }
            if h.next_index
                .compare_exchange(qi, qi.wrapping_add(1), Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                helped = true;
            }
        }
        if helped {
            let _ = sys::futex_wake_all(&self.inner.header().next_index);
        }
        helped
    }

    /// Repairs publisher entry `i`, whose owner died, so that its scratch
    /// slot is one no one else uses. The caller owns the entry.
    ///
    /// The dead publisher may have stopped anywhere in [`Publisher::publish`]:
    /// - `swapping == NONE`: its scratch is its own; nothing to do.
    /// - `swapping == e` (set just before its ring CAS for index `qi`,
    ///   after stamping its scratch `s` with `qi`): the CAS either
    ///   happened or never will. It happened iff the message `qi` is in
    ///   `s`. Evidence that it happened, at least one of which holds at any
    ///   moment if it did: the ring entry at `qi` is `(qi, s)`; or some
    ///   publisher W evicting it holds `swapping == (qi, s)` (set before
    ///   its CAS, cleared only after it re-stamped `s` INVALID); or `s` no
    ///   longer carries the stamp `qi`. If it did not happen, `s` is frozen
    ///   with stamp `qi`, never in the ring and never in anyone's
    ///   `swapping`. Reading the stamp first and last closes the window in
    ///   which `s` moves between the ring and W's `swapping`.
    fn recover_publisher(&self, i: u32) {
        let inner = &self.inner;
        let e = inner.pub_entry(i);
        // The dead owner's class count (a scribbled class word is ignored).
        if let c @ 1..=2 = e.class.swap(0, Ordering::SeqCst) {
            inner.header().class_publishers[c as usize - 1].fetch_sub(1, Ordering::SeqCst);
        }
        let sw = e.swapping.load(Ordering::SeqCst);
        if sw != NONE {
            inner
                .header()
                .recovered_mid_swap
                .fetch_add(1, Ordering::Relaxed); // a statistic
            let s = e.scratch.load(Ordering::SeqCst);
            let x = entry_slot(sw);
            let qtag = (entry_tag(sw) + inner.geom.queue_len) & TAG_MASK;
            let mine = (qtag << SLOT_BITS) | s;
            let stamp_moved = || tag(inner.slot(s).qi.load(Ordering::SeqCst)) != qtag;
            let mut happened = stamp_moved();
            if !happened {
                let pos = qtag & inner.mask;
                happened = inner.ring_entry(pos).load(Ordering::SeqCst) == mine
                    || (0..inner.geom.publishers).any(|j| {
                        j != i && inner.pub_entry(j).swapping.load(Ordering::SeqCst) == mine
                    })
                    || stamp_moved();
            }
            if happened {
                inner.slot(x).qi.store(INVALID, Ordering::SeqCst);
                e.scratch.store(x, Ordering::SeqCst);
            }
            e.swapping.store(NONE, Ordering::SeqCst);
        }
        inner.header().recovered.fetch_add(1, Ordering::Relaxed); // a statistic
        self.help_along();
    }

    fn recover_subscriber(&self, i: u32) {
        let h = self.inner.header();
        let e = self.inner.sub_entry(i);
        // The subscriber adds to `waiters` before its own `armed` and takes
        // from `armed` first, so `armed` never exceeds its share of
        // `waiters`: subtracting it cannot hide a live waiter. The same
        // for `rt_armed` and `rt_waiters`.
        for (armed, waiters) in [(&e.armed, &h.waiters), (&e.rt_armed, &h.rt_waiters)] {
            let n = armed.swap(0, Ordering::SeqCst);
            if n > 0 {
                waiters.fetch_sub(n, Ordering::SeqCst);
            }
        }
    }
}

impl Inner {
    #[inline]
    fn header(&self) -> &Header {
        // SAFETY: offset 0 holds the header (checked at open: the file is
        // at least HEADER_BYTES and the base is page aligned); Header is
        // ShmSafe and all its fields are atomics.
        unsafe { &*(self.map.base() as *const Header) }
    }
    #[inline]
    fn pub_entry(&self, i: u32) -> &PubEntry {
        assert!(i < self.geom.publishers);
        // SAFETY: i < publishers, and the table of `publishers` 64-byte
        // entries at `pubs` lies inside the mapping (geometry checked
        // against the file size at open); 64-byte aligned.
        unsafe { &*(self.map.base().add(self.pubs + 64 * i as usize) as *const PubEntry) }
    }
    #[inline]
    fn sub_entry(&self, i: u32) -> &SubEntry {
        assert!(i < self.geom.subscribers);
        // SAFETY: as for pub_entry, for the subscriber table.
        unsafe { &*(self.map.base().add(self.subs + 64 * i as usize) as *const SubEntry) }
    }
    #[inline]
    fn ring_entry(&self, qi: u64) -> &AtomicU64 {
        let pos = (qi & self.mask) as usize;
        // SAFETY: pos < queue_len; the ring of queue_len u64s at `ring`
        // (8-aligned) lies inside the mapping (checked at open).
        unsafe { &*(self.map.base().add(self.ring + 8 * pos) as *const AtomicU64) }
    }
    #[inline]
    fn slot(&self, id: u64) -> &SlotHeader {
        // A slot id comes from shared memory another process wrote: clamp
        // it rather than trust it (a corrupt id then yields a lost message,
        // never an out-of-bounds access).
        let id = id.min(self.geom.slots() - 1) as usize;
        // SAFETY: id < slots; the slot array lies inside the mapping and
        // every slot is 64-byte aligned (slot_bytes is a multiple of 64).
        unsafe {
            &*(self
                .map
                .base()
                .add(self.slots + id * self.geom.slot_bytes as usize)
                as *const SlotHeader)
        }
    }
    /// The payload words of a slot.
    #[inline]
    fn payload(&self, id: u64) -> &[AtomicU64] {
        let id = id.min(self.geom.slots() - 1) as usize;
        let words = (self.geom.max_payload() / 8) as usize;
        // SAFETY: the payload of slot `id` (after its 64-byte header) lies
        // inside the mapping, is 8-aligned, and holds `words` u64s;
        // AtomicU64 has the layout of u64 and every bit pattern is valid.
        unsafe {
            std::slice::from_raw_parts(
                self.map.base().add(
                    self.slots + id * self.geom.slot_bytes as usize + SLOT_HEADER_BYTES as usize,
                ) as *const AtomicU64,
                words,
            )
        }
    }
}

/// Information about a published message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    pub index: u64,
    pub send_time_ns: u64,
    /// Whether a futex wake syscall was made.
    pub woke: bool,
}

/// Where [`Publisher::publish_stopping_after`] stops (test instrumentation
/// for the crash-recovery paths).
#[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishStep {
    /// Payload written and stamped with the target index.
    Stamped,
    /// `swapping` recorded, ring CAS not yet done.
    SwappingRecorded,
    /// Ring CAS done.
    Swapped,
    /// Evicted slot's stamp invalidated.
    EvictedInvalidated,
    /// New scratch recorded, `swapping` not yet cleared.
    ScratchRecorded,
    /// `swapping` cleared, the queue index not yet advanced.
    RecordCleared,
}

/// A publisher on a channel: owns one publisher entry (released on drop).
pub struct Publisher {
    ch: Channel,
    entry: u32,
    class: WakeClass,
    scratch: u64,
    /// The pid and class stamped into each message's slot.
    pid_word: u64,
    wakes: u64,
    published: u64,
    errors: u64,
    /// The doorbell table of the channel's directory, to ring loops on the
    /// doorbell backend; `None` when it could not be opened or created
    /// (those loops then run on their wake check).
    bells: Option<Arc<BellTable>>,
    /// Where a loan writes when an in-process reader still copies the
    /// scratch slot (see `hazard`); sized by [`Publisher::reserve_loans`].
    staging: Vec<u64>,
    /// Bytes of the last message, to warm of the next scratch slot; 0 once
    /// warmed (see [`Publisher::warm_next`]).
    to_warm: usize,
}

/// A bell listed in a channel ([`Channel::list_bell`]); unlisted on drop.
#[derive(Debug)]
pub(crate) struct BellListing {
    ch: Channel,
    slot: usize,
    listing: u64,
    class: WakeClass,
}

impl Drop for BellListing {
    fn drop(&mut self) {
        let h = self.ch.inner.header();
        if h.bells[self.slot]
            .compare_exchange(self.listing, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            h.bells_of(self.class).fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// What [`Publisher::publish_inner`] publishes.
#[derive(Clone, Copy)]
enum Payload<'a> {
    /// Bytes to copy into the scratch slot.
    Copy(&'a [u8]),
    /// This many bytes already written in place by a loan.
    InPlace(usize),
}

/// A message of type `T` being written in place in a publisher's scratch
/// slot ([`Publisher::loan`]); [`Loan::send`] publishes it, dropping it
/// publishes nothing.
pub struct Loan<'a, T: ShmSafe> {
    publisher: &'a mut Publisher,
    /// Into the slot, or into the staging buffer.
    ptr: *mut T,
    in_place: bool,
}

impl<T: ShmSafe> std::ops::Deref for Loan<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: `ptr` points at a T-sized, 8-aligned region (the scratch
        // slot's payload, at least size_of::<T>() bytes as checked by
        // `loan`, or the staging buffer) that only this loan accesses in
        // this process (see `hazard`), and any bit pattern is a valid T.
        unsafe { &*self.ptr }
    }
}

impl<T: ShmSafe> std::ops::DerefMut for Loan<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as for `deref`; the loan borrows the publisher mutably,
        // so there is one `&mut` at a time.
        unsafe { &mut *self.ptr }
    }
}

impl<'a, T: ShmSafe> Loan<'a, T> {
    /// Whether the message is written in place (no copy on send), or
    /// staged because a reader of this process was still copying the slot.
    pub fn in_place(&self) -> bool {
        self.in_place
    }

    /// Publishes the message (see [`Publisher::publish`]).
    pub fn send(self) -> Result<Published, PublishError> {
        self.publish().0
    }

    /// [`Loan::send`], and what the publisher has to warm after it, taken
    /// from it (see [`Publisher::warm_next`]): for the event loop, which
    /// warms its senders' slots before it sleeps.
    pub(crate) fn send_then(self) -> (Result<Published, PublishError>, Option<(u64, usize)>) {
        let (r, publisher) = self.publish();
        (r, publisher.take_warm())
    }

    /// Publishes the message, handing the publisher back.
    fn publish(self) -> (Result<Published, PublishError>, &'a mut Publisher) {
        let size = std::mem::size_of::<T>();
        let Loan {
            publisher,
            in_place,
            ..
        } = self;
        let r = if in_place {
            publisher.publish_inner(Payload::InPlace(size), None)
        } else {
            publisher.publish_staged(size)
        };
        (r, publisher)
    }
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("channel", &self.ch.name())
            .field("entry", &self.entry)
            .finish()
    }
}

impl Publisher {
    pub fn channel(&self) -> &Channel {
        &self.ch
    }
    /// Whose words this publisher wakes (see [`crate::wake`]).
    pub fn class(&self) -> WakeClass {
        self.class
    }
    /// Whether this publisher rings loops on the doorbell backend (it
    /// could open its directory's doorbell table).
    pub fn rings_doorbells(&self) -> bool {
        self.bells.is_some()
    }
    /// Futex wake syscalls this publisher made.
    pub fn wake_syscalls(&self) -> u64 {
        self.wakes
    }
    pub fn published(&self) -> u64 {
        self.published
    }
    pub fn errors(&self) -> u64 {
        self.errors
    }
    /// The largest payload this channel carries.
    pub fn max_payload(&self) -> usize {
        self.ch.inner.geom.max_payload() as usize
    }

    /// Publishes a typed value.
    pub fn publish_value<T: ShmSafe>(&mut self, v: &T) -> Result<Published, PublishError> {
        self.publish(crate::shm::as_bytes(v))
    }

    /// Publishes `payload`: lock-free, allocation-free, and a futex wake
    /// syscall only when some subscriber has a wait armed.
    pub fn publish(&mut self, payload: &[u8]) -> Result<Published, PublishError> {
        self.publish_inner(Payload::Copy(payload), None)
    }

    /// Sizes the staging buffer a loan of `T` falls back to, so that no
    /// loan allocates (call it when setting up, off the real-time path).
    pub fn reserve_loans<T: ShmSafe>(&mut self) {
        let words = std::mem::size_of::<T>().div_ceil(8);
        if self.staging.len() < words {
            self.staging = vec![0u64; words];
        }
    }

    /// Brings the slot the next message will be written into (the one the
    /// last publish evicted from the ring: it held the message `queue_len`
    /// back and is long out of this core's caches) into this core's cache,
    /// as many bytes as the last message had: a publisher with time to
    /// spare before its next message (about to sleep) calls it, so that
    /// the next publish writes into cache rather than waiting on each line.
    /// Once per publish; the event loop does it for its senders before it
    /// sleeps. Not worth it back to back: the prefetches wait on memory as
    /// the writes would (64 KiB publishes here: 2.4 us each, 3.8 with a
    /// warm between them).
    pub fn warm_next(&mut self) {
        if self.to_warm != 0 {
            self.ch
                .warm_for_write(self.scratch, self.to_warm, &|| false);
            self.to_warm = 0;
        }
    }

    /// The slot and bytes [`Publisher::warm_next`] would warm, taken (so
    /// that a later call warms nothing until the next publish).
    pub(crate) fn take_warm(&mut self) -> Option<(u64, usize)> {
        let bytes = std::mem::take(&mut self.to_warm);
        (bytes != 0).then_some((self.scratch, bytes))
    }

    /// Lends the scratch slot for writing one `T` in place: no copy on
    /// send. When a thread of this process may still be copying the slot
    /// (a slow reader of the message that last left it), the loan writes
    /// into a staging buffer instead and send copies it (see `hazard`,
    /// and [`Loan::in_place`]). Fails when `T` does not fit the channel.
    ///
    /// The loan's contents start as whatever the slot held (any bit
    /// pattern is a valid `T`): write every field.
    pub fn loan<T: ShmSafe>(&mut self) -> Result<Loan<'_, T>, PublishError> {
        const {
            assert!(
                std::mem::align_of::<T>() <= 8,
                "loaned types are at most 8-aligned"
            )
        };
        let inner = &*self.ch.inner;
        let size = std::mem::size_of::<T>();
        let max = inner.geom.max_payload();
        if size as u64 > max {
            return Err(PublishError::TooLarge { len: size, max });
        }
        let s = self.scratch;
        let sh = inner.slot(s);
        // SeqCst, then the scan (SeqCst): see `hazard`.
        sh.qi.store(INVALID, Ordering::SeqCst);
        let slot_addr = sh as *const SlotHeader as usize;
        if !hazard::in_use(slot_addr) {
            let ptr = inner.payload(s).as_ptr() as *mut T;
            return Ok(Loan {
                publisher: self,
                ptr,
                in_place: true,
            });
        }
        self.reserve_loans::<T>();
        let ptr = self.staging.as_mut_ptr() as *mut T;
        Ok(Loan {
            publisher: self,
            ptr,
            in_place: false,
        })
    }

    /// Publishes the first `size` bytes of the staging buffer.
    fn publish_staged(&mut self, size: usize) -> Result<Published, PublishError> {
        // The buffer is this publisher's own: take it out for the call
        // (no allocation: an empty Vec takes its place).
        let staging = std::mem::take(&mut self.staging);
        // SAFETY: the buffer holds staging.len() * 8 >= size initialised
        // bytes (zeroed at reservation, then written through the loan).
        let bytes = unsafe { std::slice::from_raw_parts(staging.as_ptr() as *const u8, size) };
        let r = self.publish_inner(Payload::Copy(bytes), None);
        self.staging = staging;
        r
    }

    /// Test instrumentation: publishes like [`Publisher::publish`] but
    /// stops dead after `step`, as a publisher killed there would, and
    /// returns `Ok(None)` when it stopped.
    #[cfg(feature = "fault-injection")]
    pub fn publish_stopping_after(
        &mut self,
        payload: &[u8],
        step: PublishStep,
    ) -> Result<Option<Published>, PublishError> {
        let before = self.published;
        let r = self.publish_inner(Payload::Copy(payload), Some(step))?;
        Ok((self.published > before).then_some(r))
    }

    /// Test instrumentation: leaves this publisher's entry owned by a
    /// process that does not exist (`pid`, start time 1), as a killed
    /// publisher leaves it, without running any cleanup.
    #[cfg(feature = "fault-injection")]
    pub fn abandon_as_dead(self, pid: u32) {
        self.ch
            .inner
            .pub_entry(self.entry)
            .owner
            .store(owner_word(pid, 1), Ordering::SeqCst);
        std::mem::forget(self);
    }

    /// Counts a fault of the channel as an error of this publisher.
    #[cold]
    fn fault(&mut self, fault: ChannelFault) -> PublishError {
        self.errors += 1;
        self.ch
            .inner
            .pub_entry(self.entry)
            .errors
            .fetch_add(1, Ordering::Relaxed); // a statistic
        PublishError::Fault(fault)
    }

    /// Publishes, then writes the send marker when the supervisor traces
    /// this process (see [`crate::miss_trace`]; one load otherwise).
    #[inline(always)]
    fn publish_inner(
        &mut self,
        payload: Payload,
        stop: Option<PublishStep>,
    ) -> Result<Published, PublishError> {
        let r = self.publish_steps(payload, stop);
        if let Ok(p) = &r {
            crate::miss_trace::sent(p.index, p.send_time_ns);
        }
        r
    }

    #[inline(always)]
    fn publish_steps(
        &mut self,
        payload: Payload,
        stop: Option<PublishStep>,
    ) -> Result<Published, PublishError> {
        let stopped = |at: PublishStep| stop == Some(at);
        let inner = &*self.ch.inner;
        let max = inner.geom.max_payload();
        let len = match payload {
            Payload::Copy(p) => p.len(),
            Payload::InPlace(n) => n,
        };
        if len as u64 > max {
            self.errors += 1;
            inner
                .pub_entry(self.entry)
                .errors
                .fetch_add(1, Ordering::Relaxed); // a statistic
            return Err(PublishError::TooLarge { len, max });
        }
        let s = self.scratch;
        let sh = inner.slot(s);
        if let Payload::Copy(payload) = payload {
            // Seqlock write side: invalidate the stamp, then a Release
            // fence, then the data. A reader that sees any of the new data
            // and then fences (Acquire) sees the INVALID stamp (or later),
            // so it never accepts a slot we are rewriting. (A loan did the
            // same before handing out the slot.)
            sh.qi.store(INVALID, Ordering::Relaxed);
            fence(Ordering::Release);
            let words = inner.payload(s);
            let mut chunks = payload.chunks_exact(8);
            let mut w = 0;
            for c in &mut chunks {
                // Relaxed: ordered before the stamp by its Release store below.
                words[w].store(u64::from_ne_bytes(c.try_into().unwrap()), Ordering::Relaxed);
                w += 1;
            }
            let rest = chunks.remainder();
            if !rest.is_empty() {
                let mut b = [0u8; 8];
                b[..rest.len()].copy_from_slice(rest);
                words[w].store(u64::from_ne_bytes(b), Ordering::Relaxed);
            }
        }
        sh.size.store(len as u64, Ordering::Relaxed);
        sh.pid.store(self.pid_word, Ordering::Relaxed);
        let msg_len = len;
        let h = inner.header();
        let pe = inner.pub_entry(self.entry);
        let len = inner.geom.queue_len;
        let retention = h.retention_ns.load(Ordering::Relaxed);
        let mut attempts = 0;
        loop {
            attempts += 1;
            if attempts > PUBLISH_ATTEMPTS {
                return Err(self.fault(ChannelFault::GaveUp {
                    attempts: PUBLISH_ATTEMPTS,
                }));
            }
            if inner.map.is_broken() {
                return Err(self.fault(ChannelFault::Truncated));
            }
            // SeqCst load of the index: it is compared with ring entries
            // that other publishers CAS with SeqCst.
            let qi = h.next_index.load(Ordering::SeqCst);
            let slot_ref = inner.ring_entry(qi);
            let e = slot_ref.load(Ordering::SeqCst);
            if entry_tag(e) == tag(qi) {
                // The message for qi is placed but the index not advanced
                // (its publisher is preempted or dead): help it along.
                let _ = h.next_index.compare_exchange(
                    qi,
                    qi.wrapping_add(1),
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
                continue;
            }
            if entry_tag(e) != tag(qi.wrapping_sub(len)) {
                // Our qi was stale (the index moved on and the entry holds
                // a later lap): reload. If the index has not moved, no
                // correct publisher wrote this entry.
                if h.next_index.load(Ordering::SeqCst) == qi {
                    return Err(self.fault(ChannelFault::RingInconsistent {
                        index: qi,
                        found: entry_tag(e),
                    }));
                }
                continue;
            }
            let x = entry_slot(e);
            if x >= inner.geom.slots() || x == s {
                return Err(self.fault(ChannelFault::BadSlot {
                    slot: x,
                    slots: inner.geom.slots(),
                }));
            }
            let now = sys::monotonic_ns();
            if retention > 0 && qi >= len {
                let xs = inner.slot(x);
                let q1 = xs.qi.load(Ordering::Acquire);
                let t = xs.send_time_ns.load(Ordering::Relaxed);
                fence(Ordering::Acquire);
                let q2 = xs.qi.load(Ordering::Relaxed);
                if q1 != q2 {
                    continue; // evicted meanwhile by another publisher
                }
                if q1 == qi.wrapping_sub(len) && now.saturating_sub(t) < retention {
                    self.errors += 1;
                    pe.errors.fetch_add(1, Ordering::Relaxed); // a statistic
                    return Err(PublishError::WouldOverwrite {
                        index: qi,
                        age_ns: now.saturating_sub(t),
                        retention_ns: retention,
                    });
                }
            }
            sh.send_time_ns.store(now, Ordering::Relaxed);
            // Release: the payload, size, pid and time above are visible to
            // any reader whose Acquire load sees this stamp.
            sh.qi.store(qi, Ordering::Release);
            if stopped(PublishStep::Stamped) {
                return Ok(Published {
                    index: qi,
                    send_time_ns: now,
                    woke: false,
                });
            }
            // Recovery record. Release is enough for it and for the three
            // bookkeeping stores after the CAS: the CAS is a release
            // operation, so whoever observes its result with an Acquire
            // load (the recovery code loads SeqCst) also sees `swapping`;
            // and whoever sees `swapping == NONE` (Acquire) sees the
            // INVALID stamp and the new scratch stored before it. A dead
            // publisher's stores are all visible once the kernel has
            // reaped it (its exit is a full barrier), which is when the
            // recovery code runs.
            pe.swapping.store(e, Ordering::Release);
            if stopped(PublishStep::SwappingRecorded) {
                return Ok(Published {
                    index: qi,
                    send_time_ns: now,
                    woke: false,
                });
            }
            if slot_ref
                .compare_exchange(e, pack(qi, s), Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                pe.swapping.store(NONE, Ordering::Release);
                continue;
            }
            if stopped(PublishStep::Swapped) {
                return Ok(Published {
                    index: qi,
                    send_time_ns: now,
                    woke: false,
                });
            }
            // The evicted slot is ours now: invalidate its stamp so readers
            // of the old message notice, record it, clear the record.
            inner.slot(x).qi.store(INVALID, Ordering::Release);
            if stopped(PublishStep::EvictedInvalidated) {
                return Ok(Published {
                    index: qi,
                    send_time_ns: now,
                    woke: false,
                });
            }
            pe.scratch.store(x, Ordering::Release);
            if stopped(PublishStep::ScratchRecorded) {
                return Ok(Published {
                    index: qi,
                    send_time_ns: now,
                    woke: false,
                });
            }
            pe.swapping.store(NONE, Ordering::Release);
            self.scratch = x;
            if stopped(PublishStep::RecordCleared) {
                return Ok(Published {
                    index: qi,
                    send_time_ns: now,
                    woke: false,
                });
            }
            let _ = h.next_index.compare_exchange(
                qi,
                qi.wrapping_add(1),
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
            let wakes = wake(self.class, self.bells.as_deref(), h, qi.wrapping_add(1));
            self.wakes += wakes;
            let woke = wakes != 0;
            if inner.map.is_broken() {
                // Written into the zero pages that replaced the file.
                return Err(self.fault(ChannelFault::Truncated));
            }
            self.to_warm = msg_len;
            self.published += 1;
            // A statistic with one writer (the entry's owner): a plain
            // store, no read-modify-write.
            pe.published.store(self.published, Ordering::Relaxed);
            return Ok(Published {
                index: qi,
                send_time_ns: now,
                woke,
            });
        }
    }
}

/// Wakes the subscribers of `class` that sleep, after the message before
/// index `next` was placed and the index advanced; returns the wake
/// syscalls made. Only that class's words and bells are touched (see
/// [`crate::wake`]).
///
/// Skipping the wake without losing one (store-buffer pattern, all
/// four accesses SeqCst so they sit in one total order):
///
/// ```text
/// subscriber: waiters += 1 ; [load rt_word] ; load index ; arm wait(word)
/// publisher:  index += 1   ; [store rt_word] ; load waiters ; wake if > 0
/// ```
///
/// If we read waiters == 0, our index CAS precedes the subscriber's
/// increment, so its index load (later) sees our message and it does
/// not sleep. If the subscriber read the old index, its increment
/// precedes our load, we see waiters > 0 and wake; a wait not yet
/// queued in the kernel then finds the word changed and returns
/// -EAGAIN. For the best-effort word (the index itself) that change is
/// our CAS. For `rt_word` it is our store: each real-time publish
/// stores the index after its own message, a value no store before
/// wrote (indexes are published once), and the kernel's `FUTEX_WAKE`
/// orders the store before its look for waiters. The Release store and
/// the subscriber's Acquire load of `rt_word` make a subscriber that
/// sees our store see our index too, so it does not sleep on it.
#[inline(always)]
fn wake(class: WakeClass, bells: Option<&BellTable>, h: &Header, next: u64) -> u64 {
    let mut wakes = 0;
    let (count, rt) = match class {
        WakeClass::BestEffort => {
            if h.waiters.load(Ordering::SeqCst) != 0 {
                let _ = sys::futex_wake_all(&h.next_index);
                wakes += 1;
            }
            (&h.bell_count, 0)
        }
        WakeClass::RealTime => {
            h.rt_word.store(next, Ordering::Release);
            if h.rt_waiters.load(Ordering::SeqCst) != 0 {
                let _ = sys::futex_wake_all(&h.rt_word);
                wakes += 1;
            }
            (&h.rt_bell_count, RT_LISTING)
        }
    };
    // Loops on the doorbell backend: ring each listed bell of this
    // class whose loop sleeps (the ordering argument is in
    // `crate::doorbell`). Bounded by the fixed number of listings.
    if count.load(Ordering::SeqCst) != 0 {
        if let Some(table) = bells {
            for listing in &h.bells {
                let l = listing.load(Ordering::SeqCst);
                if l != 0 && l & RT_LISTING == rt && table.ring(l) {
                    wakes += 1;
                }
            }
        }
    }
    wakes
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let inner = &self.ch.inner;
        let pe = inner.pub_entry(self.entry);
        // Uncounted only if the entry still says we counted ourselves (a
        // scribbled word leaves the count high: a needless look, no loss).
        if pe.class.swap(0, Ordering::SeqCst) == 1 + self.class.index() as u64 {
            inner.header().class_publishers[self.class.index()].fetch_sub(1, Ordering::SeqCst);
        }
        // Release: our last scratch/swapping stores are visible to the next
        // owner, whose claim CAS is SeqCst.
        pe.owner.store(0, Ordering::Release);
    }
}

/// A message read from a channel; borrows the subscriber's buffer.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    pub index: u64,
    pub send_time_ns: u64,
    pub sender_pid: u32,
    /// The wake class of its publisher.
    pub sender_class: WakeClass,
    /// Messages skipped (overwritten before they were read) just before
    /// this one.
    pub lost_before: u64,
    pub data: &'a [u8],
}

impl<'a> Message<'a> {
    /// The payload as a typed value (a copy), when its size matches.
    pub fn value<T: ShmSafe>(&self) -> Option<T> {
        crate::shm::from_bytes(self.data)
    }

    /// The payload viewed as a `T` in place (no copy: it is the reader's
    /// own copy of the message), when its size matches and it is aligned
    /// for `T` (a subscriber's buffer is 8-aligned).
    pub fn get<T: ShmSafe>(&self) -> Option<&'a T> {
        let p = self.data.as_ptr();
        if self.data.len() != std::mem::size_of::<T>()
            || (p as usize) % std::mem::align_of::<T>() != 0
        {
            return None;
        }
        // SAFETY: size and alignment checked; the bytes are initialised
        // (a subscriber's own buffer) and any bit pattern is a valid T
        // (ShmSafe); the reference borrows the buffer for 'a.
        Some(unsafe { &*(p as *const T) })
    }

    /// The send time as a [`crate::Monotonic`] instant.
    pub fn send_time(&self) -> crate::Monotonic {
        crate::Monotonic::from_nanos(self.send_time_ns)
    }
}

/// Where and what a message read into a subscriber's buffer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageMeta {
    pub index: u64,
    pub send_time_ns: u64,
    pub sender_pid: u32,
    /// The wake class of its publisher.
    pub sender_class: WakeClass,
    pub lost_before: u64,
    pub size: usize,
}

/// Outcome of one read attempt; `value` is what the body made of the
/// payload (nothing for a copy into the subscriber's buffer).
enum ReadOne<R = ()> {
    Ok {
        time: u64,
        pid: u64,
        size: usize,
        value: R,
    },
    Gone,
    Truncated,
}

/// A message read in place, in its slot of the shared mapping: no copy of
/// the payload is made, each word is read (a relaxed atomic load) when
/// asked for. What a body computes from it is kept only if the slot still
/// held the message after the body ran (the seqlock check); otherwise the
/// message counts as lost. So a body computes and returns, and acts on
/// nothing it read: see [`Subscriber::next_in_place`].
pub struct SlotView<'a> {
    words: &'a [AtomicU64],
    size: usize,
}

impl SlotView<'_> {
    /// The message's size in bytes.
    pub fn len(&self) -> usize {
        self.size
    }

    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Word `i` of the message (its bytes `8i..8i + 8`, in native byte
    /// order, the bytes past the end of a message whose size is not a
    /// multiple of 8 included), `None` past the end.
    #[inline]
    pub fn word(&self, i: usize) -> Option<u64> {
        self.words.get(i).map(|w| w.load(Ordering::Relaxed))
    }

    /// Copies the words from word `first` on into `dst`, as many as fit
    /// and the message has; returns how many.
    pub fn copy_words(&self, first: usize, dst: &mut [u64]) -> usize {
        let src = self.words.get(first..).unwrap_or(&[]);
        let n = src.len().min(dst.len());
        for (d, s) in dst[..n].iter_mut().zip(src) {
            *d = s.load(Ordering::Relaxed);
        }
        n
    }
}

/// What reading a staged message in place came to (the event loop's;
/// [`Subscriber::next_in_place`] moves on to the next message instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InPlace<R> {
    /// The slot held the message from before the body ran to after it.
    Read(R),
    /// Recycled by a publisher before or while it was read (counted lost).
    Overwritten,
    /// The channel file was truncated under the reader.
    Truncated,
}

/// Asks the CPU to bring `words` into this core's cache for writing
/// (aarch64 `prfm pstl1keep`; on x86_64 `_MM_HINT_ET0`, which is
/// `prefetcht0` unless built for CPUs with `prefetchw`, measured no
/// different here: 64 KiB ping-pong 9.4 against 9.6 us), one request per
/// 64-byte line. A hint: nothing is read or written, the CPU may drop it,
/// and a reader of those words is not disturbed beyond a cache miss.
#[inline]
fn warm_for_write(words: &[AtomicU64]) {
    for line in words.chunks(8) {
        let p = line.as_ptr();
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch does not access memory and cannot fault; `p`
        // points into the mapping anyway. SSE is part of x86_64.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_ET0 }>(p.cast());
        }
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above: PRFM does not access memory and cannot fault.
        unsafe {
            core::arch::asm!(
                "prfm pstl1keep, [{0}]",
                in(reg) p,
                options(nostack, preserves_flags, readonly)
            );
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let _ = p;
    }
}

/// Reads message `i` from its slot: `body` gets the slot's payload words
/// and the message's size (at most `cap` bytes), between the two checks of
/// the slot's stamp (a seqlock), and its value counts only when both
/// checks pass.
fn read_slot<R>(
    inner: &Inner,
    i: u64,
    cap: usize,
    body: impl FnOnce(&[AtomicU64], usize) -> R,
) -> ReadOne<R> {
    let e = inner.ring_entry(i).load(Ordering::Acquire);
    if entry_tag(e) != tag(i) {
        return ReadOne::Gone;
    }
    let x = entry_slot(e);
    let sh = inner.slot(x);
    // Announce the slot before looking at its stamp (see `hazard`): a
    // loan of this slot in this process either sees the announcement
    // or has made the stamp INVALID before our SeqCst load below.
    let _reading = hazard::Reading::announce(sh as *const SlotHeader as usize);
    // Seqlock read side: the stamp load (SeqCst, so also Acquire)
    // pairs with the publisher's Release store of it (data visible);
    // after the body's loads an Acquire fence, then the stamp again: if
    // any word it read came from a later rewrite, the fence makes that
    // writer's INVALID store visible to this second load.
    if sh.qi.load(Ordering::SeqCst) != i {
        return ReadOne::Gone;
    }
    let time = sh.send_time_ns.load(Ordering::Relaxed);
    let pid = sh.pid.load(Ordering::Relaxed);
    let words = inner.payload(x);
    let size = (sh.size.load(Ordering::Relaxed) as usize)
        .min(cap)
        .min(words.len() * 8);
    let value = body(words, size);
    fence(Ordering::Acquire);
    if sh.qi.load(Ordering::Relaxed) != i {
        return ReadOne::Gone;
    }
    if inner.map.is_broken() {
        // What was read came from the zero pages that replaced the file.
        return ReadOne::Truncated;
    }
    ReadOne::Ok {
        time,
        pid,
        size,
        value,
    }
}

/// [`read_slot`] with `body` given a [`SlotView`] of the message.
fn read_view<R>(inner: &Inner, i: u64, body: impl FnOnce(&SlotView) -> R) -> ReadOne<R> {
    read_slot(inner, i, usize::MAX, |words, size| {
        body(&SlotView {
            words: &words[..size.div_ceil(8)],
            size,
        })
    })
}

/// A subscriber (or, without an entry, a fetcher) on a channel.
pub struct Subscriber {
    ch: Channel,
    entry: Option<u32>,
    /// Whose word its waits arm on (see [`crate::wake`]).
    class: WakeClass,
    next: u64,
    /// A real-time subscriber's value of `rt_word` when it began its wait.
    wait_val: u32,
    buf: Vec<u64>,
    lost: u64,
    armed: u64,
    faults: u64,
}

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("channel", &self.ch.name())
            .field("next", &self.next)
            .finish()
    }
}

impl Subscriber {
    pub fn channel(&self) -> &Channel {
        &self.ch
    }
    /// The next queue index this subscriber will read.
    pub fn next_index(&self) -> u64 {
        self.next
    }
    /// Messages lost (overwritten before read) so far.
    pub fn lost(&self) -> u64 {
        self.lost
    }
    /// Faults of the channel this subscriber met (see [`ChannelFault`]).
    pub fn faults(&self) -> u64 {
        self.faults
    }
    /// Skips everything published so far.
    pub fn skip_to_end(&mut self) {
        self.next = self.ch.next_index();
    }
    /// Whether messages are waiting to be read.
    pub fn has_new(&self) -> bool {
        self.ch.next_index() > self.next
    }

    /// [`Subscriber::has_new`] with a SeqCst load, for the doorbell
    /// backend's ordering argument (see [`crate::doorbell`]).
    pub(crate) fn has_new_seqcst(&self) -> bool {
        self.ch.inner.header().next_index.load(Ordering::SeqCst) > self.next
    }

    /// Reads message `i` into this subscriber's buffer.
    fn read_at(&mut self, i: u64) -> ReadOne {
        let cap = self.buf.len() * 8;
        let buf = &mut self.buf;
        read_slot(&self.ch.inner, i, cap, |words, size| {
            let n = size.div_ceil(8);
            for (d, s) in buf[..n].iter_mut().zip(&words[..n]) {
                *d = s.load(Ordering::Relaxed);
            }
        })
    }

    /// Counts `fault` and returns it.
    #[cold]
    fn fault(&mut self, fault: ChannelFault) -> ChannelFault {
        self.faults += 1;
        fault
    }

    /// The queue index now, or the fault when it went backwards (then this
    /// subscriber follows it, so that its waits arm on the word as it is).
    #[inline]
    fn head(&mut self) -> Result<u64, ChannelFault> {
        let head = self.ch.next_index();
        // After the load: a truncation it ran into has replaced the
        // mapping by the time it returns.
        if self.ch.inner.map.is_broken() {
            return Err(self.fault(ChannelFault::Truncated));
        }
        // `next` may be one past the newest message (a fetcher that read it).
        if head < self.next {
            let from = self.next;
            self.next = head;
            return Err(self.fault(ChannelFault::IndexWentBack { from, to: head }));
        }
        Ok(head)
    }

    /// Reads the next unread message in order into this subscriber's
    /// buffer and returns its metadata, or `None` when there is none.
    /// Messages overwritten before they were read are counted in
    /// [`MessageMeta::lost_before`] and [`Subscriber::lost`].
    ///
    /// Bounded: at most two laps of the ring are tried per call; a channel
    /// on which none of them can be read is a [`ChannelFault::GaveUp`] and
    /// the subscriber moves to the current index (counting what it skipped
    /// as lost).
    pub fn next_meta(&mut self) -> Result<Option<MessageMeta>, ChannelFault> {
        Ok(self.next_by(Self::read_at)?.map(|(meta, ())| meta))
    }

    /// The next unread message in order, read in place: `body` gets a view
    /// of it in its slot and what it returns comes back with the message's
    /// metadata, or `None` when there is no message. No copy is made: a
    /// body that reads a few words of a large message reads only those.
    ///
    /// A message recycled by a publisher while `body` ran is not returned:
    /// it counts as lost and the next one is tried, so `body` may run more
    /// than once in a call, on different messages. It must compute and
    /// return, not act on what it read (send, write, count): only what
    /// comes back has passed the check. Bounded like
    /// [`Subscriber::next_meta`].
    pub fn next_in_place<R>(
        &mut self,
        mut body: impl FnMut(&SlotView) -> R,
    ) -> Result<Option<(MessageMeta, R)>, ChannelFault> {
        self.next_by(|s: &mut Self, i| read_view(&s.ch.inner, i, &mut body))
    }

    /// The metadata of the next unread message, its payload left in its
    /// slot for [`Subscriber::read_in_place_at`] (the event loop stages
    /// messages this way to order them by send time before reading).
    pub(crate) fn next_peek(&mut self) -> Result<Option<MessageMeta>, ChannelFault> {
        Ok(self
            .next_by(|s: &mut Self, i| read_slot(&s.ch.inner, i, usize::MAX, |_, _| ()))?
            .map(|(meta, ())| meta))
    }

    /// Reads the message `meta` describes (from [`Subscriber::next_peek`])
    /// in place, as [`Subscriber::next_in_place`] does; a message recycled
    /// since is [`InPlace::Overwritten`] and counted lost.
    pub(crate) fn read_in_place_at<R>(
        &mut self,
        meta: &MessageMeta,
        body: impl FnOnce(&SlotView) -> R,
    ) -> InPlace<R> {
        match read_view(&self.ch.inner, meta.index, body) {
            ReadOne::Ok { value, .. } => InPlace::Read(value),
            ReadOne::Gone => {
                self.lost = self.lost.saturating_add(1);
                InPlace::Overwritten
            }
            ReadOne::Truncated => {
                self.fault(ChannelFault::Truncated);
                InPlace::Truncated
            }
        }
    }

    /// [`Subscriber::next_meta`]'s loop, each message read by `read`.
    fn next_by<R>(
        &mut self,
        mut read: impl FnMut(&mut Self, u64) -> ReadOne<R>,
    ) -> Result<Option<(MessageMeta, R)>, ChannelFault> {
        let len = self.ch.inner.geom.queue_len;
        let max_attempts = (2 * len + 16).min(u32::MAX as u64) as u32;
        let mut lost = 0u64;
        let mut attempts = 0;
        loop {
            let head = match self.head() {
                Ok(h) => h,
                Err(f) => {
                    self.lost = self.lost.saturating_add(lost);
                    return Err(f);
                }
            };
            if self.next >= head {
                self.lost = self.lost.saturating_add(lost);
                return Ok(None);
            }
            attempts += 1;
            if attempts > max_attempts {
                lost = lost.saturating_add(head - self.next);
                self.next = head;
                self.lost = self.lost.saturating_add(lost);
                return Err(self.fault(ChannelFault::GaveUp {
                    attempts: max_attempts,
                }));
            }
            if head - self.next > len {
                lost = lost.saturating_add(head - len - self.next);
                self.next = head - len;
            }
            let i = self.next;
            self.next += 1;
            match read(self, i) {
                ReadOne::Ok {
                    time,
                    pid,
                    size,
                    value,
                } => {
                    self.lost = self.lost.saturating_add(lost);
                    let meta = MessageMeta {
                        index: i,
                        send_time_ns: time,
                        sender_pid: pid as u32,
                        sender_class: WakeClass::of_pid_word(pid),
                        lost_before: lost,
                        size,
                    };
                    return Ok(Some((meta, value)));
                }
                ReadOne::Gone => lost = lost.saturating_add(1),
                ReadOne::Truncated => {
                    self.lost = self.lost.saturating_add(lost);
                    return Err(self.fault(ChannelFault::Truncated));
                }
            }
        }
    }

    /// The message last read by [`Subscriber::next_meta`] or
    /// [`Subscriber::latest_meta`], described by `meta`.
    pub(crate) fn staged(&self, meta: &MessageMeta) -> Message<'_> {
        let size = meta.size.min(self.buf.len() * 8);
        // SAFETY: `buf` holds buf.len() * 8 initialised bytes and `size` is
        // clamped to that; u8 has no alignment requirement.
        let data = unsafe { std::slice::from_raw_parts(self.buf.as_ptr() as *const u8, size) };
        Message {
            index: meta.index,
            send_time_ns: meta.send_time_ns,
            sender_pid: meta.sender_pid,
            sender_class: meta.sender_class,
            lost_before: meta.lost_before,
            data,
        }
    }

    /// The next unread message in order, or `None` when there is none.
    /// Messages overwritten before they were read are counted in
    /// [`Message::lost_before`] and [`Subscriber::lost`].
    pub fn next_message(&mut self) -> Result<Option<Message<'_>>, ChannelFault> {
        Ok(self.next_meta()?.map(|meta| self.staged(&meta)))
    }

    /// Reads the newest message, skipping (not counting as lost) anything
    /// older; `None` when nothing new was published since the last read.
    /// Bounded like [`Subscriber::next_meta`].
    pub fn latest_meta(&mut self) -> Result<Option<MessageMeta>, ChannelFault> {
        for _ in 0..LATEST_ATTEMPTS {
            let head = self.head()?;
            if head == 0 || self.next >= head {
                return Ok(None);
            }
            let i = head - 1;
            match self.read_at(i) {
                ReadOne::Ok {
                    time, pid, size, ..
                } => {
                    self.next = head;
                    return Ok(Some(MessageMeta {
                        index: i,
                        send_time_ns: time,
                        sender_pid: pid as u32,
                        sender_class: WakeClass::of_pid_word(pid),
                        lost_before: 0,
                        size,
                    }));
                }
                ReadOne::Gone => {}
                ReadOne::Truncated => return Err(self.fault(ChannelFault::Truncated)),
            }
        }
        self.next = self.ch.next_index().max(self.next);
        Err(self.fault(ChannelFault::GaveUp {
            attempts: LATEST_ATTEMPTS,
        }))
    }

    /// The newest message (see [`Subscriber::latest_meta`]).
    pub fn latest(&mut self) -> Result<Option<Message<'_>>, ChannelFault> {
        Ok(self.latest_meta()?.map(|meta| self.staged(&meta)))
    }

    /// Whose word this subscriber's waits arm on (see [`crate::wake`]).
    pub fn class(&self) -> WakeClass {
        self.class
    }

    /// The value to arm a futex wait with, after [`Subscriber::begin_wait`]:
    /// the low 32 bits of the next index this subscriber expects
    /// (best-effort), or of `rt_word` as it was when the wait began
    /// (real-time).
    pub(crate) fn wait_value(&self) -> u32 {
        match self.class {
            WakeClass::BestEffort => self.next as u32,
            WakeClass::RealTime => self.wait_val,
        }
    }

    /// The entry's count of this subscriber's armed waits, for recovery.
    fn armed_entry(&self) -> Option<&AtomicU64> {
        let e = self.ch.inner.sub_entry(self.entry?);
        Some(match self.class {
            WakeClass::BestEffort => &e.armed,
            WakeClass::RealTime => &e.rt_armed,
        })
    }

    /// Counts a wait as armed (call before submitting it), so publishers
    /// of this subscriber's class wake. Returns `false` (nothing counted)
    /// when new data is already there and the wait need not be armed.
    ///
    /// Ordering: the SeqCst increment of the class's waiter count comes
    /// before the (Acquire) load of `rt_word` and the SeqCst load of the
    /// index (see [`wake`]): a publisher either sees our count or we see
    /// its message.
    pub(crate) fn begin_wait(&mut self) -> bool {
        let inner = &*self.ch.inner;
        if inner.map.is_broken() {
            return false; // the next read reports the truncation
        }
        let h = inner.header();
        h.waiters_of(self.class).fetch_add(1, Ordering::SeqCst);
        if let Some(armed) = self.armed_entry() {
            armed.fetch_add(1, Ordering::SeqCst);
        }
        self.armed += 1;
        if self.class == WakeClass::RealTime {
            // Acquire: pairs with the publisher's Release store, so a
            // value that is new is followed by the index it announces.
            self.wait_val = h.rt_word.load(Ordering::Acquire) as u32;
        }
        // The broken flag after the loads: a truncation they ran into
        // has been noticed by then (the next read reports it).
        if h.next_index.load(Ordering::SeqCst) != self.next || inner.map.is_broken() {
            self.end_wait();
            return false;
        }
        true
    }

    /// Counts an armed wait as finished (its completion arrived).
    pub(crate) fn end_wait(&mut self) {
        if self.armed == 0 {
            return;
        }
        self.armed -= 1;
        if let Some(armed) = self.armed_entry() {
            armed.fetch_sub(1, Ordering::SeqCst);
        }
        self.ch
            .inner
            .header()
            .waiters_of(self.class)
            .fetch_sub(1, Ordering::SeqCst);
    }

    /// Blocks (plain `FUTEX_WAIT` on this subscriber's class's word) until
    /// a message of its class is there or the timeout passes. For simple
    /// programs and tests; event loops arm their own waits.
    pub fn wait(&mut self, timeout: Option<Duration>) {
        if self.begin_wait() {
            let _ = sys::futex_wait(
                self.ch.inner.header().word_of(self.class),
                self.wait_value(),
                timeout.map(|d| d.as_nanos() as u64),
            );
            self.end_wait();
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        while self.armed > 0 {
            self.end_wait();
        }
        if let Some(i) = self.entry {
            self.ch.inner.sub_entry(i).owner.store(0, Ordering::Release);
        }
    }
}

/// Opens the file read-only to check its mode (tests and `deploy verify`).
pub fn file_mode(path: &Path) -> io::Result<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.mode() & 0o7777, m.gid()))
}

/// Slots being copied by readers of this process.
///
/// A loan ([`Publisher::loan`]) hands out a plain `&mut` to the publisher's
/// scratch slot, so that a message is written in place once instead of
/// being built elsewhere and copied. The slot is the publisher's alone
/// (in no ring position, its entry held), but a reader *of this process*
/// that took the slot from the ring before it was evicted may still be
/// copying it; its atomic loads against our plain stores would be a data
/// race. So each reading thread announces the slot it copies here before
/// it checks the slot's stamp, and clears it after its last load; a loan
/// first makes the stamp INVALID, then scans the announcements, both
/// SeqCst (the store-buffer pattern: either the loan sees the reader, or
/// the reader sees INVALID and copies nothing). A loan that finds its slot
/// announced writes into a staging buffer instead, copied on send.
///
/// Readers in other processes are outside this process's memory model:
/// their copies are validated by the seqlock and discarded when torn, and
/// what they store into the slot (a hostile peer) only changes the bytes
/// of a value that is valid for every bit pattern.
mod hazard {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// Reading threads one process may have at once with loans still
    /// zero-copy (more make every loan of the process stage).
    const ENTRIES: usize = 256;
    static READING: [AtomicUsize; ENTRIES] = [const { AtomicUsize::new(0) }; ENTRIES];
    static CLAIMED: [AtomicBool; ENTRIES] = [const { AtomicBool::new(false) }; ENTRIES];
    /// A reading thread found no free entry (or no thread-local storage):
    /// loans can no longer know every reader, so they all stage.
    static OVERFLOW: AtomicBool = AtomicBool::new(false);

    struct Entry(Cell<Option<usize>>);

    impl Entry {
        fn claim() -> Entry {
            for (i, c) in CLAIMED.iter().enumerate() {
                // SeqCst: a claim among threads.
                if c.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    return Entry(Cell::new(Some(i)));
                }
            }
            OVERFLOW.store(true, Ordering::SeqCst);
            Entry(Cell::new(None))
        }
    }

    impl Drop for Entry {
        fn drop(&mut self) {
            if let Some(i) = self.0.take() {
                READING[i].store(0, Ordering::SeqCst);
                CLAIMED[i].store(false, Ordering::SeqCst);
            }
        }
    }

    thread_local! {
        static ENTRY: Entry = Entry::claim();
    }

    /// Registers the calling thread (once per thread).
    pub(super) fn touch() {
        if ENTRY.try_with(|_| ()).is_err() {
            OVERFLOW.store(true, Ordering::SeqCst);
        }
    }

    /// The announcement of one copy; cleared on drop.
    pub(super) struct Reading(Option<usize>);

    impl Reading {
        #[inline]
        pub(super) fn announce(slot: usize) -> Reading {
            let i = ENTRY.try_with(|e| e.0.get()).ok().flatten();
            match i {
                // SeqCst: ordered before the reader's SeqCst stamp load.
                Some(i) => READING[i].store(slot, Ordering::SeqCst),
                None => OVERFLOW.store(true, Ordering::SeqCst),
            }
            Reading(i)
        }
    }

    impl Drop for Reading {
        #[inline]
        fn drop(&mut self) {
            if let Some(i) = self.0 {
                // Release: after the reader's last load of the slot.
                READING[i].store(0, Ordering::Release);
            }
        }
    }

    /// Whether a thread of this process may be copying `slot` (call after
    /// making its stamp INVALID with a SeqCst store).
    pub(super) fn in_use(slot: usize) -> bool {
        OVERFLOW.load(Ordering::SeqCst) || READING.iter().any(|r| r.load(Ordering::SeqCst) == slot)
    }
}

#[cfg(test)]
mod loan_tests {
    use super::*;

    #[test]
    fn the_slot_to_warm_is_the_next_scratch_for_the_last_messages_bytes_once() {
        let dir = tempfile::tempdir().unwrap();
        let g = ChannelGeometry::new(4096, 4, 1);
        let proc_root = Path::new("/proc");
        let (ch, _) = Channel::create(dir.path(), "/w", &g, None, proc_root).unwrap();
        let mut p = ch.publisher(proc_root).unwrap();
        let mut sub = ch.subscriber(proc_root).unwrap();
        assert_eq!(p.take_warm(), None, "nothing published yet");
        p.publish(&[1u8; 1000]).unwrap();
        // The publish swapped its scratch into the ring; the new scratch
        // is what the next message is written into.
        let next = p.scratch;
        assert_eq!(p.take_warm(), Some((next, 1000)));
        assert_eq!(p.take_warm(), None, "taken once");
        p.publish(&[2u8; 24]).unwrap();
        p.warm_next();
        assert_eq!(p.take_warm(), None, "warm_next warms once per publish");
        // Warming writes nothing: both messages read back whole, and the
        // next one goes into the warmed slot.
        let mut loan = p.loan::<[u64; 3]>().unwrap();
        *loan = [3; 3];
        loan.send().unwrap();
        let sizes: Vec<(usize, u8)> = std::iter::from_fn(|| {
            let m = sub.next_message().unwrap()?;
            Some((m.data.len(), m.data[0]))
        })
        .collect();
        assert_eq!(sizes, vec![(1000, 1), (24, 2), (24, 3)]);
    }

    #[test]
    fn a_loan_stages_while_a_reader_of_this_process_copies_its_slot() {
        let dir = tempfile::tempdir().unwrap();
        let g = ChannelGeometry::new(64, 4, 1);
        let proc_root = Path::new("/proc");
        let (ch, _) = Channel::create(dir.path(), "/l", &g, None, proc_root).unwrap();
        let mut p = ch.publisher(proc_root).unwrap();
        let mut sub = ch.subscriber(proc_root).unwrap();
        p.reserve_loans::<[u64; 8]>();
        // A reader (another thread here) is still copying the slot that is
        // now the publisher's scratch.
        let slot = ch.inner.slot(p.scratch) as *const SlotHeader as usize;
        let reading = std::thread::spawn(move || {
            let r = hazard::Reading::announce(slot);
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(r);
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut loan = p.loan::<[u64; 8]>().unwrap();
        assert!(!loan.in_place(), "the loan wrote into a slot being copied");
        *loan = [7; 8];
        loan.send().unwrap();
        reading.join().unwrap();
        assert_eq!(
            sub.next_message().unwrap().unwrap().value::<[u64; 8]>(),
            Some([7; 8])
        );
        // With the reader gone, the next loan is in place.
        let mut loan = p.loan::<[u64; 8]>().unwrap();
        assert!(loan.in_place());
        *loan = [9; 8];
        loan.send().unwrap();
        assert_eq!(
            sub.next_message().unwrap().unwrap().value::<[u64; 8]>(),
            Some([9; 8])
        );
    }
}
