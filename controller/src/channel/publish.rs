//! The queue algorithm's write side: lock-free publishing.
//!
//! Each publisher owns one scratch slot. It writes the whole message there,
//! stamps the slot with the queue index it is aiming for, then swaps the
//! slot into the ring position of that index with one compare-and-swap of
//! the ring entry; the evicted slot becomes its new scratch. Then it
//! advances the shared queue index, and then takes the waking step
//! ([`super::wake`]). Anyone who finds the ring already holding the message
//! for the current index (a publisher preempted or killed between the two
//! steps) advances the index for it ("help along"), so no publisher ever
//! waits for another.
//!
//! Test instrumentation stops a publish dead after any of its steps through
//! one hook ([`super::fault`]), compiled out without the `fault-injection`
//! feature.
#![allow(unsafe_code)]

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crate::doorbell::BellTable;
use crate::shm::ShmSafe;
use crate::sys;
use crate::time::Clock;
use crate::wake::{ClassWords, WakeClass};

use super::fault::{stop_after, Stop};
use super::hazard;
use super::layout::{entry_slot, entry_tag, pack, tag, SlotHeader, INVALID, NONE};
use super::{Channel, ChannelFault};

/// Attempts one publish makes before it gives up. Each failed attempt of
/// a correct channel means another publisher placed a message meanwhile
/// (the algorithm is lock-free), so a few are normal under contention and
/// this many only happen on a corrupt channel.
const PUBLISH_ATTEMPTS: u32 = 1024;

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
#[cfg(feature = "fault-injection")]
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
    pub(super) ch: Channel,
    pub(super) entry: u32,
    pub(super) class: WakeClass,
    pub(super) scratch: u64,
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
    /// Held while the publisher lives: its [`PublisherTap`]s know it.
    live: Arc<()>,
    /// Where send times come from: `CLOCK_MONOTONIC`, or a simulation's
    /// virtual clock (see [`Publisher::set_clock`]).
    clock: Clock,
    /// Messages written into the newest one's slot (see `super::reuse`).
    pub(super) reclaimed: u64,
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

impl<T: ShmSafe> Loan<'_, T> {
    /// Whether the message is written in place (no copy on send), or
    /// staged because a reader of this process was still copying the slot.
    pub fn in_place(&self) -> bool {
        self.in_place
    }

    /// Publishes the message (see [`Publisher::publish`]).
    pub fn send(self) -> Result<Published, PublishError> {
        let size = std::mem::size_of::<T>();
        let Loan {
            publisher,
            in_place,
            ..
        } = self;
        if in_place {
            publisher.publish_inner(Payload::InPlace(size), Stop::NEVER)
        } else {
            publisher.publish_staged(size)
        }
    }
}

/// A message of a size decided at run time being written in place in a
/// publisher's scratch slot ([`Publisher::loan_bytes`]): a `&mut [u8]`.
/// [`ByteLoan::send`] publishes it; dropping it publishes nothing.
pub struct ByteLoan<'a> {
    publisher: &'a mut Publisher,
    /// Into the slot (64-byte aligned), or into the staging buffer.
    ptr: *mut u8,
    len: usize,
    in_place: bool,
}

impl std::ops::Deref for ByteLoan<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points at `len` bytes (the scratch slot's payload,
        // at least `len` bytes as checked by `lend`, or the staging
        // buffer, sized to `len`) that only this loan accesses in this
        // process (see `hazard` and `hold`).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for ByteLoan<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`; the loan borrows the publisher mutably,
        // so there is one `&mut` at a time.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl ByteLoan<'_> {
    /// Whether the bytes are written in place (see [`Loan::in_place`]).
    pub fn in_place(&self) -> bool {
        self.in_place
    }

    /// Publishes the message (see [`Publisher::publish`]).
    pub fn send(self) -> Result<Published, PublishError> {
        let ByteLoan {
            publisher,
            len,
            in_place,
            ..
        } = self;
        if in_place {
            publisher.publish_inner(Payload::InPlace(len), Stop::NEVER)
        } else {
            publisher.publish_staged(len)
        }
    }
}

/// A loan of a publisher's scratch slot held apart from a borrow of the
/// publisher ([`Publisher::loan_raw`]): for the C interface, whose callers
/// take a loan in one call and send it in another. The pointer is valid
/// for `len` bytes until the publisher is next used or dropped; sending
/// it ([`Publisher::send_raw`]) or letting it go (dropping it publishes
/// nothing) is the publisher's owner's business, as with [`ByteLoan`].
#[derive(Debug)]
pub struct RawLoan {
    ptr: *mut u8,
    len: usize,
    in_place: bool,
}

impl RawLoan {
    /// Where to write the message: `len` bytes, 8-byte aligned (64 in the
    /// slot).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// See [`Loan::in_place`].
    pub fn in_place(&self) -> bool {
        self.in_place
    }
}

/// What a publisher counted, read from its entry in the channel file (its
/// `published` and `errors`, which every publish writes there anyway):
/// an event loop reports its senders through taps, so that the counts are
/// the channel layer's own and a publish does nothing for the report.
///
/// Exact while the publisher lives; once it is dropped, its entry keeps
/// its last counts until the entry is claimed again (a claim resets
/// them), so a tap that looks before that reads them as final.
pub(crate) struct PublisherTap {
    ch: Channel,
    entry: u32,
    live: Weak<()>,
}

/// What a [`PublisherTap`] read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PublisherCounts {
    pub(crate) published: u64,
    pub(crate) errors: u64,
}

/// A [`PublisherTap`]'s reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tapped {
    /// The publisher lives.
    Live(PublisherCounts),
    /// The publisher was dropped: its last counts.
    Final(PublisherCounts),
    /// The publisher was dropped and its entry claimed again.
    Gone,
}

impl PublisherTap {
    /// The publisher's counts now.
    pub(crate) fn read(&self) -> Tapped {
        let pe = self.ch.inner.pub_entry(self.entry);
        let live = self.live.strong_count() > 0;
        // SeqCst: the owner word's loads are SeqCst everywhere (a claim is
        // a SeqCst CAS, a release a Release store).
        if !live && pe.owner.load(Ordering::SeqCst) != 0 {
            return Tapped::Gone;
        }
        // Relaxed: statistics, each with one writer (the entry's owner).
        let c = PublisherCounts {
            published: pe.published.load(Ordering::Relaxed),
            errors: pe.errors.load(Ordering::Relaxed),
        };
        if live {
            Tapped::Live(c)
        } else {
            Tapped::Final(c)
        }
    }

    /// Brings the publisher's next slot into this core's cache for
    /// writing, as [`Publisher::warm_next`] does: the first `bytes` of it,
    /// or as many as the message that slot last held when `bytes` is
    /// `None` (a byte publisher's: the loop does not know its sizes), until
    /// `stop` says so. Nothing once the publisher is dropped.
    pub(crate) fn warm(&self, bytes: Option<usize>, stop: &dyn Fn() -> bool) {
        if self.live.strong_count() == 0 {
            return;
        }
        let inner = &*self.ch.inner;
        if inner.geom.keep == super::Keep::Unread {
            return; // the next message goes into a slot just read
        }
        // Relaxed: a hint (a wrong slot id only warms the wrong slot; ids
        // are clamped to the file).
        let slot = inner.pub_entry(self.entry).scratch.load(Ordering::Relaxed);
        let bytes = bytes.unwrap_or_else(|| inner.slot(slot).size.load(Ordering::Relaxed) as usize);
        self.ch.warm_for_write(slot, bytes, stop);
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
    /// The publisher of entry `entry`, just claimed, whose scratch slot is
    /// `scratch` (checked in range).
    pub(super) fn new(ch: Channel, entry: u32, class: WakeClass, scratch: u64) -> Publisher {
        let bells = BellTable::open(&ch.inner.shm_dir, None, false).ok();
        Publisher {
            ch,
            entry,
            class,
            scratch,
            pid_word: sys::getpid() as u64 | class.pid_bit(),
            wakes: 0,
            published: 0,
            errors: 0,
            bells,
            staging: Vec::new(),
            to_warm: 0,
            live: Arc::new(()),
            clock: Clock::Monotonic,
            reclaimed: 0,
        }
    }

    pub fn channel(&self) -> &Channel {
        &self.ch
    }

    /// Stamps messages (and judges retention) with `clock`'s time: a
    /// simulated loop's senders publish at its virtual time, so that a
    /// simulated run holds no wall-clock time.
    pub fn set_clock(&mut self, clock: Clock) {
        self.clock = clock;
    }

    /// A tap on this publisher's counts (see [`PublisherTap`]).
    pub(crate) fn tap(&self) -> PublisherTap {
        PublisherTap {
            ch: self.ch.clone(),
            entry: self.entry,
            live: Arc::downgrade(&self.live),
        }
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
        self.publish_inner(Payload::Copy(payload), Stop::NEVER)
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
        if let Some((slot, bytes)) = self.take_warm() {
            self.ch.warm_for_write(slot, bytes, &|| false);
        }
    }

    /// The slot and bytes [`Publisher::warm_next`] would warm, taken (so
    /// that a later call warms nothing until the next publish).
    fn take_warm(&mut self) -> Option<(u64, usize)> {
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
        let size = std::mem::size_of::<T>();
        let (ptr, in_place) = self.lend(size)?;
        Ok(Loan {
            publisher: self,
            ptr: ptr as *mut T,
            in_place,
        })
    }

    /// Lends the scratch slot for a message of `len` bytes decided at run
    /// time (an image, a point cloud), written in place as a `&mut [u8]`
    /// (64-byte aligned): [`ByteLoan::send`] publishes it. As
    /// [`Publisher::loan`]: staged when a reader of this process still
    /// copies the slot (size the staging buffer at setup with
    /// [`Publisher::reserve_byte_loans`], or the staged loan allocates);
    /// the bytes start as whatever the slot held.
    pub fn loan_bytes(&mut self, len: usize) -> Result<ByteLoan<'_>, PublishError> {
        let (ptr, in_place) = self.lend(len)?;
        Ok(ByteLoan {
            publisher: self,
            ptr,
            len,
            in_place,
        })
    }

    /// [`Publisher::loan_bytes`] without the borrow: the loan is a pointer
    /// and a length, valid until this publisher is next used; publish it
    /// with [`Publisher::send_raw`] before any other call on it.
    pub fn loan_raw(&mut self, len: usize) -> Result<RawLoan, PublishError> {
        let (ptr, in_place) = self.lend(len)?;
        Ok(RawLoan { ptr, len, in_place })
    }

    /// Publishes a loan [`Publisher::loan_raw`] gave, with no call on this
    /// publisher in between (otherwise the slot or the staging buffer it
    /// names has moved on, and what is published is whatever they hold:
    /// bytes, never memory outside them).
    pub fn send_raw(&mut self, loan: RawLoan) -> Result<Published, PublishError> {
        if loan.in_place {
            self.publish_inner(Payload::InPlace(loan.len), Stop::NEVER)
        } else {
            let len = loan.len.min(self.staging.len() * 8);
            self.publish_staged(len)
        }
    }

    /// Sizes the staging buffer for byte loans of up to `len` bytes.
    pub fn reserve_byte_loans(&mut self, len: usize) {
        let words = len.div_ceil(8);
        if self.staging.len() < words {
            self.staging = vec![0u64; words];
        }
    }

    /// Readies the scratch slot for `size` bytes written in place: traded
    /// away from a hold, its stamp made INVALID, and checked against this
    /// process's readers (see `hazard`). The pointer is into the slot
    /// (`true`) or into the staging buffer (`false`).
    fn lend(&mut self, size: usize) -> Result<(*mut u8, bool), PublishError> {
        let max = self.ch.inner.geom.max_payload();
        if size as u64 > max {
            self.errors += 1;
            self.ch
                .inner
                .pub_entry(self.entry)
                .errors
                .fetch_add(1, Ordering::Relaxed); // a statistic
            return Err(PublishError::TooLarge { len: size, max });
        }
        self.reclaim_newest();
        if let Err(f) = self.free_scratch() {
            return Err(self.fault(f));
        }
        let inner = &*self.ch.inner;
        let s = self.scratch;
        let sh = inner.slot(s);
        // SeqCst, then the scan (SeqCst): see `hazard`.
        sh.qi.store(INVALID, Ordering::SeqCst);
        let slot_addr = sh as *const SlotHeader as usize;
        if !hazard::in_use(slot_addr) {
            return Ok((inner.payload(s).as_ptr() as *mut u8, true));
        }
        self.reserve_byte_loans(size);
        Ok((self.staging.as_mut_ptr() as *mut u8, false))
    }

    /// Publishes the first `size` bytes of the staging buffer.
    fn publish_staged(&mut self, size: usize) -> Result<Published, PublishError> {
        // The buffer is this publisher's own: take it out for the call
        // (no allocation: an empty Vec takes its place).
        let staging = std::mem::take(&mut self.staging);
        // SAFETY: the buffer holds staging.len() * 8 >= size initialised
        // bytes (zeroed at reservation, then written through the loan).
        let bytes = unsafe { std::slice::from_raw_parts(staging.as_ptr() as *const u8, size) };
        let r = self.publish_inner(Payload::Copy(bytes), Stop::NEVER);
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
        let r = self.publish_inner(Payload::Copy(payload), Stop::after(step))?;
        Ok((self.published > before).then_some(r))
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
    fn publish_inner(&mut self, payload: Payload, stop: Stop) -> Result<Published, PublishError> {
        let r = self.publish_steps(payload, stop);
        if let Ok(p) = &r {
            crate::miss_trace::sent(p.index, p.send_time_ns);
        }
        r
    }

    #[inline(always)]
    fn publish_steps(&mut self, payload: Payload, stop: Stop) -> Result<Published, PublishError> {
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
        if let Payload::Copy(_) = payload {
            // A loan reclaimed and traded before it handed out the slot
            // (and no hold can be taken on a slot outside the ring since).
            self.reclaim_newest();
            if let Err(f) = self.free_scratch() {
                return Err(self.fault(f));
            }
        }
        let inner = &*self.ch.inner;
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
            let now = self.clock.now_ns();
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
            stop_after!(stop, Stamped, qi, now);
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
            stop_after!(stop, SwappingRecorded, qi, now);
            if slot_ref
                .compare_exchange(e, pack(qi, s), Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                pe.swapping.store(NONE, Ordering::Release);
                continue;
            }
            stop_after!(stop, Swapped, qi, now);
            // The evicted slot is ours now: invalidate its stamp so readers
            // of the old message notice, record it, clear the record.
            inner.slot(x).qi.store(INVALID, Ordering::Release);
            stop_after!(stop, EvictedInvalidated, qi, now);
            pe.scratch.store(x, Ordering::Release);
            stop_after!(stop, ScratchRecorded, qi, now);
            pe.swapping.store(NONE, Ordering::Release);
            self.scratch = x;
            stop_after!(stop, RecordCleared, qi, now);
            let _ = h.next_index.compare_exchange(
                qi,
                qi.wrapping_add(1),
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
            let wakes = super::wake::wake(self.class, self.bells.as_deref(), h, qi.wrapping_add(1));
            self.wakes += wakes;
            let woke = wakes != 0;
            if inner.map.is_broken() {
                // Written into the zero pages that replaced the file.
                return Err(self.fault(ChannelFault::Truncated));
            }
            // The next message goes into this one's slot once it is read
            // (`keep: unread`): nothing to warm.
            if inner.geom.keep == super::Keep::Newest {
                self.to_warm = msg_len;
            }
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

impl Channel {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::ChannelGeometry;
    use std::path::Path;

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
