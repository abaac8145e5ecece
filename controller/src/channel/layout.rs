//! The channel file's layout: the shared-memory structs, their offsets and
//! the geometry that sizes them. Nothing here reads or writes a file or
//! decides anything: [`super::file`] creates and validates files of this
//! layout, the other modules reach the structs through [`super::Inner`]'s
//! accessors below, which are the only pointer arithmetic on the mapping.
//!
//! ```text
//! header page (4096 B)   magic, layout version, geometry, creator, the
//!                        queue index (next message to publish; its low 32
//!                        bits are the futex word), the waiter count
//! publisher table        per publisher: owner (pid + start time), scratch
//!                        slot, the ring entry being swapped out, counters
//! subscriber table       per subscriber: owner, how many waits it has
//!                        armed, the index up to which it has read
//! ring                   queue_len entries: (queue index tag, slot id)
//! hold records           per record: owner, the ring entry it holds, its
//!                        reserve slot (see `super::hold`)
//! slots                  queue_len + publishers + hold records slots of
//!                        slot_bytes each: 64-byte slot header then the
//!                        payload
//! ```
//!
//! Ring entries pack a 40-bit tag of the queue index with a 24-bit slot id,
//! so the CAS cannot succeed against an entry of an older lap (ABA would
//! need 2^40 messages to pass while one publisher is stopped mid-publish).
#![allow(unsafe_code)]

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::config::{ChannelConfig, MAX_CHANNEL_BYTES, MAX_MESSAGE_SIZE, SLOT_HEADER_BYTES};
use crate::shm::ShmAtomic;
use crate::wake::WakeClass;

use super::Inner;

/// Version of the file layout; part of the file name and the header.
/// 7: the type's layout hash is over its description's primitive names
/// (`crate::shm`), so a process of layout 6 (Rust's names) and one of 7
/// must not share a channel: each opens its own `<name>.v<N>` file, and a
/// file of another version under this name is refused, naming both.
pub const LAYOUT_VERSION: u32 = 7;
/// `RTDCHAN1` read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"RTDCHAN1");
/// Bytes of the header page.
pub const HEADER_BYTES: u64 = 4096;
/// Subscriber entries a channel gets unless told otherwise.
pub const DEFAULT_SUBSCRIBERS: u32 = 32;
/// Event loops on the doorbell backend one channel lists (see
/// [`crate::doorbell`]).
pub const BELL_ENTRIES: usize = 32;
/// Most publisher (and subscriber, and hold record) entries one channel
/// may have.
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

pub(super) const TAG_BITS: u32 = 40;
pub(super) const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
pub(super) const SLOT_BITS: u32 = 24;
pub(super) const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
/// A stamp no queue index ever has.
pub(super) const INVALID: u64 = u64::MAX;
/// `swapping` when the publisher is not between CAS and bookkeeping; a
/// hold record's `held` when it holds nothing.
pub(super) const NONE: u64 = u64::MAX;

#[inline]
pub(super) fn tag(qi: u64) -> u64 {
    qi & TAG_MASK
}
#[inline]
pub(super) fn pack(qi: u64, slot: u64) -> u64 {
    (tag(qi) << SLOT_BITS) | slot
}
#[inline]
pub(super) fn entry_tag(e: u64) -> u64 {
    e >> SLOT_BITS
}
#[inline]
pub(super) fn entry_slot(e: u64) -> u64 {
    e & SLOT_MASK
}

/// The header page. Everything is an `AtomicU64` so that any process may
/// read any field at any time without a data race.
#[repr(C)]
pub(super) struct Header {
    pub(super) magic: AtomicU64,
    /// `layout_version | header_bytes << 32`.
    pub(super) version: AtomicU64,
    pub(super) slot_bytes: AtomicU64,
    pub(super) queue_len: AtomicU64,
    pub(super) publishers: AtomicU64,
    pub(super) subscribers: AtomicU64,
    pub(super) retention_ns: AtomicU64,
    pub(super) total_bytes: AtomicU64,
    pub(super) creator: AtomicU64,
    /// Publisher entries reclaimed from dead owners.
    pub(super) recovered: AtomicU64,
    /// Of those, the ones whose owner died between stamping and bookkeeping
    /// of a ring swap (`swapping` set).
    pub(super) recovered_mid_swap: AtomicU64,
    /// How late a message may cross wake classes, nanoseconds (see
    /// [`crate::wake`]); read once, at open, and range-checked.
    pub(super) cross_class_ns: AtomicU64,
    /// Hold records (see `super::hold`).
    pub(super) holds: AtomicU64,
    /// What the channel keeps: [`Keep::word`] (see `super::reuse`).
    pub(super) keep: AtomicU64,
    pub(super) _pad0: [AtomicU64; 2],
    /// The channel name, NUL padded.
    pub(super) name: [AtomicU64; 16],
    /// The next queue index to publish. Its low 32 bits are the
    /// best-effort futex word.
    pub(super) next_index: AtomicU64,
    /// The real-time futex word (low 32 bits): the queue index after the
    /// last message of a real-time publisher, stored by real-time
    /// publishers only. In the index's cache line, which every publish
    /// writes anyway.
    pub(super) rt_word: AtomicU64,
    pub(super) _pad1: [AtomicU64; 6],
    /// Best-effort waits armed on the index word, all subscribers together.
    pub(super) waiters: AtomicU64,
    pub(super) _pad2: [AtomicU64; 7],
    /// Real-time waits armed on `rt_word` (a line of their own: no
    /// best-effort subscriber's arm moves it).
    pub(super) rt_waiters: AtomicU64,
    pub(super) _pad3: [AtomicU64; 7],
    /// Live publisher entries per wake class (best-effort, real-time): a
    /// loop looks for the other class's messages only while there are
    /// some. A hint: a wrong value costs a look or leaves a message to the
    /// wake check.
    pub(super) class_publishers: [AtomicU64; 2],
    pub(super) _pad4: [AtomicU64; 6],
    /// Best-effort listings in `bells`, then real-time ones (hints:
    /// publishers skip their class's listings while 0; a wrong value costs
    /// a scan or a wake the wake check heals).
    pub(super) bell_count: AtomicU64,
    pub(super) rt_bell_count: AtomicU64,
    pub(super) _pad5: [AtomicU64; 6],
    /// The bells of event loops on the doorbell backend watching this
    /// channel ([`crate::doorbell::Bell::listing`], with
    /// [`crate::wake::RT_LISTING`] for real-time loops; 0: empty).
    pub(super) bells: [AtomicU64; BELL_ENTRIES],
    /// The message type, recorded by the first process that opens the
    /// channel with one ([`Channel::bind_type`]): its layout hash (0 while
    /// none is recorded; never 0 once one is), then size, alignment and
    /// name (informational, written after the hash).
    pub(super) type_hash: AtomicU64,
    pub(super) type_size: AtomicU64,
    pub(super) type_align: AtomicU64,
    pub(super) type_name: [AtomicU64; 8],
    pub(super) _pad6: [AtomicU64; 5],
}
// SAFETY: repr(C), only AtomicU64 fields and arrays of them: no padding, no
// pointers, no Drop, valid for every bit pattern.
unsafe impl ShmAtomic for Header {}

impl Header {
    /// The futex word of `class` (see [`crate::wake`]).
    #[inline]
    pub(super) fn word_of(&self, class: WakeClass) -> &AtomicU64 {
        match class {
            WakeClass::BestEffort => &self.next_index,
            WakeClass::RealTime => &self.rt_word,
        }
    }
    #[inline]
    pub(super) fn waiters_of(&self, class: WakeClass) -> &AtomicU64 {
        match class {
            WakeClass::BestEffort => &self.waiters,
            WakeClass::RealTime => &self.rt_waiters,
        }
    }
    #[inline]
    pub(super) fn bells_of(&self, class: WakeClass) -> &AtomicU64 {
        match class {
            WakeClass::BestEffort => &self.bell_count,
            WakeClass::RealTime => &self.rt_bell_count,
        }
    }
}

#[repr(C)]
pub(super) struct PubEntry {
    pub(super) owner: AtomicU64,
    pub(super) scratch: AtomicU64,
    /// The ring entry this publisher is swapping out, or NONE.
    pub(super) swapping: AtomicU64,
    pub(super) published: AtomicU64,
    pub(super) errors: AtomicU64,
    /// The owner's wake class, counted in `class_publishers`: 1 + its
    /// index (0: none counted).
    pub(super) class: AtomicU64,
    /// The hold record whose reserve this publisher is trading its held
    /// scratch slot for, and that reserve, or NONE (see `super::hold`).
    pub(super) trading: AtomicU64,
    /// The ring entry whose slot this publisher is taking back for its
    /// next message, or NONE (see `super::reuse`).
    pub(super) reclaiming: AtomicU64,
}
// SAFETY: as for Header.
unsafe impl ShmAtomic for PubEntry {}

#[repr(C)]
pub(super) struct SubEntry {
    pub(super) owner: AtomicU64,
    /// Best-effort waits this subscriber counts in `waiters`.
    pub(super) armed: AtomicU64,
    /// Real-time waits it counts in `rt_waiters`.
    pub(super) rt_armed: AtomicU64,
    /// The queue index up to which it has read (every message before it
    /// read, skipped or lost): on a `keep: unread` channel the publisher
    /// writes the newest message's slot again once every subscriber is
    /// past it (see `super::reuse`). Written by the owner only.
    pub(super) read_to: AtomicU64,
    pub(super) _pad: [AtomicU64; 4],
}
// SAFETY: as for Header.
unsafe impl ShmAtomic for SubEntry {}

/// A hold record (see `super::hold`): owned like an entry, by the
/// subscriber's process.
#[repr(C)]
pub(super) struct HoldRecord {
    pub(super) owner: AtomicU64,
    /// The ring entry (queue index tag and slot) of the message held, or
    /// NONE. Written by the owner only.
    pub(super) held: AtomicU64,
    /// The record's reserve slot: free, or the slot it holds once a
    /// publisher has swapped that out of its hands.
    pub(super) reserve: AtomicU64,
    pub(super) _pad: [AtomicU64; 5],
}
// SAFETY: as for Header.
unsafe impl ShmAtomic for HoldRecord {}

#[repr(C)]
pub(super) struct SlotHeader {
    /// The queue index of the message in this slot, INVALID while written.
    pub(super) qi: AtomicU64,
    pub(super) send_time_ns: AtomicU64,
    pub(super) size: AtomicU64,
    /// The publisher's pid, with its wake class in bit 63.
    pub(super) pid: AtomicU64,
    pub(super) _pad: [AtomicU64; 4],
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
const _: () = assert!(std::mem::size_of::<HoldRecord>() == 64);
const _: () = assert!(std::mem::size_of::<SlotHeader>() as u64 == SLOT_HEADER_BYTES);

/// What a channel keeps readable once its subscribers have read it
/// (robot.yaml `channels[].keep`; see `super::reuse`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Keep {
    /// The newest `queue_len` messages stay readable (to fetchers, late
    /// joiners and recorders too), read or not: each publish writes the
    /// slot the oldest one leaves, so messages cycle through every slot.
    #[default]
    Newest,
    /// A message stays readable until every subscriber has read it (or
    /// `queue_len` newer ones push it out); then the publisher writes its
    /// next message into that slot again, which is still in the caches.
    /// One publisher entry only.
    Unread,
}

impl Keep {
    /// The header word.
    pub(super) fn word(self) -> u64 {
        match self {
            Keep::Newest => 0,
            Keep::Unread => 1,
        }
    }
    /// A header word read back; `None` for any other value.
    pub(super) fn from_word(w: u64) -> Option<Keep> {
        match w {
            0 => Some(Keep::Newest),
            1 => Some(Keep::Unread),
            _ => None,
        }
    }
}

impl std::fmt::Display for Keep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Keep::Newest => "newest",
            Keep::Unread => "unread",
        })
    }
}

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
    /// Hold records: messages subscribers together may hold in place at
    /// once (each with a reserve slot; see `super::hold`).
    pub holds: u32,
    /// What stays readable once read (see [`Keep`]).
    pub keep: Keep,
}

impl ChannelGeometry {
    /// Geometry for messages of at most `max_payload` bytes in a ring of
    /// `queue_len` (rounded up to a power of two), no retention guard and
    /// [`DEFAULT_SUBSCRIBERS`] subscribers.
    pub fn new(max_payload: u64, queue_len: u64, publishers: u32) -> Self {
        ChannelGeometry {
            queue_len: queue_len.max(1).next_power_of_two(),
            slot_bytes: (SLOT_HEADER_BYTES + max_payload.max(1)).div_ceil(64) * 64,
            publishers,
            subscribers: DEFAULT_SUBSCRIBERS,
            retention: Duration::ZERO,
            cross_class: DEFAULT_CROSS_CLASS_LATENCY,
            holds: 0,
            keep: Keep::Newest,
        }
    }

    /// Geometry of a `channels:` entry of robot.yaml with `publishers`
    /// publisher entries and `subscribers` subscribing processes (each
    /// gets the entry's `holds` hold records).
    pub fn from_config(cfg: &ChannelConfig, publishers: u32, subscribers: u32) -> Self {
        ChannelGeometry {
            queue_len: cfg.queue_len(),
            slot_bytes: cfg.slot_bytes(),
            publishers,
            subscribers: DEFAULT_SUBSCRIBERS,
            retention: cfg.retention().0,
            cross_class: cfg.cross_class_latency(),
            holds: cfg.hold_records(subscribers),
            keep: cfg.keep(),
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

    pub fn with_holds(mut self, holds: u32) -> Self {
        self.holds = holds;
        self
    }

    pub fn with_keep(mut self, keep: Keep) -> Self {
        self.keep = keep;
        self
    }

    /// The largest payload a slot holds.
    pub fn max_payload(&self) -> u64 {
        self.slot_bytes - SLOT_HEADER_BYTES
    }

    /// Slots of the file: one per ring position, a scratch slot per
    /// publisher, a reserve slot per hold record.
    pub fn slots(&self) -> u64 {
        self.queue_len + self.publishers as u64 + self.holds as u64
    }
    pub(super) fn pub_table_offset(&self) -> u64 {
        HEADER_BYTES
    }
    pub(super) fn sub_table_offset(&self) -> u64 {
        self.pub_table_offset() + 64 * self.publishers as u64
    }
    pub(super) fn ring_offset(&self) -> u64 {
        self.sub_table_offset() + 64 * self.subscribers as u64
    }
    pub(super) fn hold_offset(&self) -> u64 {
        (self.ring_offset() + 8 * self.queue_len).div_ceil(64) * 64
    }
    pub(super) fn slots_offset(&self) -> u64 {
        self.hold_offset() + 64 * self.holds as u64
    }

    /// Bytes of slots the messages cycle through while every subscriber
    /// keeps up: a publish writes the slot its previous one evicted from
    /// the ring, which held the message `queue_len` back, so every ring
    /// slot and every scratch slot is written in turn (reserve slots only
    /// while a hold keeps one out). What a core's caches must hold for a
    /// publish and its reads to hit them. With [`Keep::Unread`] the
    /// publisher writes the newest slot again once it is read: one slot.
    pub fn working_set_bytes(&self) -> u64 {
        match self.keep {
            Keep::Newest => (self.queue_len + self.publishers as u64) * self.slot_bytes,
            Keep::Unread => self.slot_bytes,
        }
    }

    /// Bytes of the channel file.
    pub fn total_bytes(&self) -> u64 {
        self.slots_offset() + self.slots() * self.slot_bytes
    }

    /// Why this geometry cannot be laid out, if it cannot.
    pub fn check(&self) -> Result<(), ChannelGeometryError> {
        if !self.queue_len.is_power_of_two() || self.queue_len > 1 << 20 {
            return Err(ChannelGeometryError::QueueLength {
                queue_len: self.queue_len,
            });
        }
        if self.slot_bytes % 64 != 0
            || self.slot_bytes < SLOT_HEADER_BYTES + 8
            || self.slot_bytes > MAX_MESSAGE_SIZE + SLOT_HEADER_BYTES
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
        if self.holds > MAX_ENTRIES {
            return Err(ChannelGeometryError::Holds { holds: self.holds });
        }
        if self.slots() > SLOT_MASK {
            return Err(ChannelGeometryError::Slots {
                slots: self.slots(),
            });
        }
        if self.total_bytes() > MAX_CHANNEL_BYTES {
            return Err(ChannelGeometryError::TooLarge {
                bytes: self.total_bytes(),
            });
        }
        if !(MIN_CROSS_CLASS_LATENCY..=MAX_CROSS_CLASS_LATENCY).contains(&self.cross_class) {
            return Err(ChannelGeometryError::CrossClass {
                bound: self.cross_class,
            });
        }
        if self.keep == Keep::Unread && (self.publishers != 1 || !self.retention.is_zero()) {
            return Err(ChannelGeometryError::KeepUnread {
                publishers: self.publishers,
                retention: self.retention,
            });
        }
        Ok(())
    }
}

/// Why a channel geometry cannot be laid out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelGeometryError {
    #[error("queue length {queue_len} is not a power of two from 1 to 1048576")]
    QueueLength { queue_len: u64 },
    #[error("slot size {slot_bytes} is not a multiple of 64 from 72 to 64MiB+64")]
    SlotSize { slot_bytes: u64 },
    #[error("{publishers} publishers (expected 1 to {MAX_ENTRIES})")]
    Publishers { publishers: u32 },
    #[error("{subscribers} subscribers (expected at most {MAX_ENTRIES})")]
    Subscribers { subscribers: u32 },
    #[error("{holds} hold records (expected at most {MAX_ENTRIES})")]
    Holds { holds: u32 },
    #[error("{slots} slots (at most {SLOT_MASK})")]
    Slots { slots: u64 },
    #[error("channel of {bytes} bytes is larger than 4GiB")]
    TooLarge { bytes: u64 },
    #[error("cross-class latency {bound:?} is outside {MIN_CROSS_CLASS_LATENCY:?} to {MAX_CROSS_CLASS_LATENCY:?}")]
    CrossClass { bound: Duration },
    #[error("keep unread needs one publisher entry and no retention (found {publishers} publishers, retention {retention:?})")]
    KeepUnread {
        publishers: u32,
        retention: Duration,
    },
    #[error("keep word {word} is neither 0 (newest) nor 1 (unread)")]
    KeepWord { word: u64 },
    /// A file's header records a total size its own geometry does not give.
    #[error("header total size {header} does not match its geometry ({computed})")]
    TotalSize { header: u64, computed: u64 },
}

impl Inner {
    #[inline]
    pub(super) fn header(&self) -> &Header {
        // SAFETY: offset 0 holds the header (checked at open: the file is
        // at least HEADER_BYTES and the base is page aligned); Header is
        // ShmSafe and all its fields are atomics.
        unsafe { &*(self.map.base() as *const Header) }
    }
    #[inline]
    pub(super) fn pub_entry(&self, i: u32) -> &PubEntry {
        assert!(i < self.geom.publishers);
        // SAFETY: i < publishers, and the table of `publishers` 64-byte
        // entries at `pubs` lies inside the mapping (geometry checked
        // against the file size at open); 64-byte aligned.
        unsafe { &*(self.map.base().add(self.pubs + 64 * i as usize) as *const PubEntry) }
    }
    #[inline]
    pub(super) fn sub_entry(&self, i: u32) -> &SubEntry {
        assert!(i < self.geom.subscribers);
        // SAFETY: as for pub_entry, for the subscriber table.
        unsafe { &*(self.map.base().add(self.subs + 64 * i as usize) as *const SubEntry) }
    }
    #[inline]
    pub(super) fn ring_entry(&self, qi: u64) -> &AtomicU64 {
        let pos = (qi & self.mask) as usize;
        // SAFETY: pos < queue_len; the ring of queue_len u64s at `ring`
        // (8-aligned) lies inside the mapping (checked at open).
        unsafe { &*(self.map.base().add(self.ring + 8 * pos) as *const AtomicU64) }
    }
    #[inline]
    pub(super) fn hold_record(&self, i: u32) -> &HoldRecord {
        assert!(i < self.geom.holds);
        // SAFETY: as for pub_entry, for the table of hold records.
        unsafe { &*(self.map.base().add(self.holds + 64 * i as usize) as *const HoldRecord) }
    }
    #[inline]
    pub(super) fn slot(&self, id: u64) -> &SlotHeader {
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
    pub(super) fn payload(&self, id: u64) -> &[AtomicU64] {
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
