//! Shared-memory publish/subscribe channels.
//!
//! One file per channel, `<shm_dir>/<name without its leading />.v<LAYOUT_VERSION>`
//! (so `/imu/raw` is `<shm_dir>/imu/raw.v5`), mode 0660 and an optional
//! group. The layers, each a module that opens with what it is for:
//!
//! - `layout`: the shared-memory structs, their offsets and the
//!   geometry; the only pointer arithmetic on the mapping;
//! - `file`: the file's life: create, open and validate, the mapping,
//!   the message type it records;
//! - `owner`: owner words, liveness, claiming entries and reclaiming the
//!   entries of dead processes (crash recovery);
//! - `publish`: the queue algorithm's write side (lock-free publish with
//!   help-along, loans);
//! - `read`: its read side (the seqlock read, subscribers, fetchers);
//! - `wake`: the waking step a publish ends with, and a subscriber's
//!   arming of its wait (the two halves of one ordering argument);
//! - `hazard`: the slots this process's readers copy, so that a loan never
//!   writes under them; `hold`: messages subscribers read in place for as
//!   long as they like, which no publisher recycles meanwhile; `fault`: the
//!   publish path's one test hook.
//!
//! # Untrusted contents
//!
//! Every process of the robot group may write every byte of the file, by
//! mistake or on purpose. Nothing read from it is trusted: slot ids are
//! range-checked, every loop over shared state has a bound, and a state
//! no correct writer can produce (the index going backwards, a ring entry
//! of no lap the index allows) is a [`ChannelFault`] of this channel,
//! returned as an error and counted, never a hang, a panic or an
//! out-of-bounds access.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::shm::Mapping;
use crate::wake::{ClassWords, WakeClass};

mod fault;
mod file;
mod frame;
mod hazard;
mod hold;
mod layout;
pub(crate) mod owner;
mod publish;
mod read;
mod reuse;
mod wake;

pub use crate::doorbell::BellError;
pub use file::{channel_path, file_mode, ChannelCreateError, ChannelOpenError, CreateOutcome};
pub use frame::{frame_offset, FrameLoan};
pub use hold::{Held, HoldError};
pub use layout::{
    ChannelGeometry, ChannelGeometryError, Keep, BELL_ENTRIES, DEFAULT_CROSS_CLASS_LATENCY,
    DEFAULT_SUBSCRIBERS, HEADER_BYTES, LAYOUT_VERSION, MAGIC, MAX_CROSS_CLASS_LATENCY, MAX_ENTRIES,
    MIN_CROSS_CLASS_LATENCY,
};
#[cfg(feature = "fault-injection")]
pub use owner::SlotOwnershipError;
pub use owner::{ChannelAttachError, RecoveryReport};
#[cfg(feature = "fault-injection")]
pub use publish::PublishStep;
pub use publish::{ByteLoan, Loan, PublishError, Published, Publisher, RawLoan};
pub(crate) use publish::{PublisherCounts, PublisherTap, Tapped};
pub(crate) use read::InPlace;
pub use read::{Message, MessageMeta, SlotView, Subscriber};
pub(crate) use wake::BellListing;

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
    holds: usize,
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

impl Channel {
    pub fn name(&self) -> &str {
        &self.inner.name
    }
    pub fn path(&self) -> &Path {
        &self.inner.path
    }
    pub fn geometry(&self) -> ChannelGeometry {
        self.inner.geom
    }

    /// The next queue index to be published (= messages published so far).
    pub fn next_index(&self) -> u64 {
        // Acquire: a reader that sees index n also sees the ring entries of
        // the messages before n (they were CASed in before the index moved).
        self.inner.header().next_index.load(Ordering::Acquire)
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

    /// The directory whose doorbell table this channel's publishers ring.
    pub fn shm_dir(&self) -> &Path {
        &self.inner.shm_dir
    }
}
