//! Who owns what in a channel file, and taking back what the dead owned.
//!
//! Publisher and subscriber entries are owned by `pid << 42 | start time`
//! (start time from `/proc/<pid>/stat`), so a recycled pid is not mistaken
//! for the dead owner. Attaching claims a free entry with a compare-and-swap
//! of its owner word, or one whose owner is dead; dropping the publisher or
//! subscriber gives it back. An entry whose owner is dead is reclaimed by
//! the next process that attaches (or by [`Channel::recover`]): a publisher
//! killed mid-swap leaves enough state (`swapping`) to decide which slot is
//! now its scratch (see `recover_publisher`), and a message it placed but
//! did not announce is announced for it (help along).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::doorbell::BellTable;
use crate::sys;
use crate::wake::{ClassWords, WakeClass};

use super::layout::{entry_slot, entry_tag, tag, BELL_ENTRIES, INVALID, NONE, SLOT_BITS, TAG_MASK};
use super::publish::Publisher;
use super::read::Subscriber;
use super::{Channel, ChannelFault};

const PID_SHIFT: u32 = 42;
const START_MASK: u64 = (1 << PID_SHIFT) - 1;

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
    #[error("hold record {record} holds reserve slot {slot} of {slots}")]
    ReserveSlot { record: u32, slot: u64, slots: u64 },
    #[error("publisher entry {entry} is mid-swap, mid-trade or mid-reclaim")]
    MidSwap { entry: u32 },
    #[error("publisher entry {entry} holds scratch slot {slot} of {slots}")]
    ScratchSlot { entry: u32, slot: u64, slots: u64 },
    #[error("slot {slot} is held {times} times")]
    HeldTimes { slot: u64, times: u32 },
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
    /// Hold records of dead subscribers, their holds cleared.
    pub holds: u32,
}

pub(super) fn owner_word(pid: u32, start: u64) -> u64 {
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
    /// Publisher entries reclaimed from dead owners since creation.
    pub fn recovered_count(&self) -> u64 {
        self.inner.header().recovered.load(Ordering::Relaxed)
    }

    /// Test instrumentation: checks, at a quiescent moment, that every slot
    /// is in exactly one place (the ring, one publisher's scratch or one
    /// hold record's reserve) and that no publisher entry is mid-swap or
    /// mid-trade.
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
            if pe.swapping.load(Ordering::SeqCst) != NONE
                || pe.trading.load(Ordering::SeqCst) != NONE
                || pe.reclaiming.load(Ordering::SeqCst) != NONE
            {
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
        for k in 0..inner.geom.holds {
            let s = inner.hold_record(k).reserve.load(Ordering::SeqCst);
            if s >= slots {
                return Err(SlotOwnershipError::ReserveSlot {
                    record: k,
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
        // The entry's statistics count this owner's messages from here on
        // (see `PublisherTap`). Relaxed: statistics.
        let pe = self.inner.pub_entry(entry);
        pe.published.store(0, Ordering::Relaxed);
        pe.errors.store(0, Ordering::Relaxed);
        // Counted before the first message, so that a loop of the other
        // class that looks at the count after this sees a publisher to
        // look for (SeqCst: see `Channel::publishers_of_class`).
        pe.class.store(1 + class.index() as u64, Ordering::SeqCst);
        self.inner.header().class_publishers[class.index()].fetch_add(1, Ordering::SeqCst);
        Ok(Publisher::new(self.clone(), entry, class, scratch))
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
        rep.holds = self.recover_hold_records(proc_root);
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
        self.recover_trade(i);
        self.recover_reclaim(i);
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

impl Publisher {
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
