//! The queue algorithm's read side: subscribers and fetchers.
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
//! Every loop here is bounded: a channel on which nothing can be read is a
//! [`ChannelFault`], and the reader resynchronises to the index as it is.
#![allow(unsafe_code)]

use std::sync::atomic::{fence, AtomicU64, Ordering};

use crate::shm::ShmSafe;
use crate::wake::{ClassWords, WakeClass};

use super::hazard;
use super::layout::{entry_slot, entry_tag, tag, SlotHeader};
use super::{Channel, ChannelFault, Inner};

/// Attempts [`Subscriber::latest_meta`] makes to copy the newest message.
const LATEST_ATTEMPTS: u32 = 64;

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
pub(super) enum ReadOne<R = ()> {
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
    pub(super) ch: Channel,
    pub(super) entry: Option<u32>,
    /// Whose word its waits arm on (see [`crate::wake`]).
    pub(super) class: WakeClass,
    pub(super) next: u64,
    /// A real-time subscriber's value of `rt_word` when it began its wait.
    pub(super) wait_val: u32,
    pub(super) buf: Vec<u64>,
    pub(super) lost: u64,
    pub(super) armed: u64,
    pub(super) faults: u64,
    /// The hold records this subscriber claimed (see `super::hold`).
    pub(super) holds: Option<std::sync::Arc<super::hold::HoldSet>>,
    /// How far it last stored that it has read, in its entry (a
    /// subscriber of a `keep: unread` channel; see `super::reuse`).
    pub(super) marked: u64,
}

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("channel", &self.ch.name())
            .field("next", &self.next)
            .finish()
    }
}

impl Channel {
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

    pub(super) fn make_reader(&self, entry: Option<u32>) -> Subscriber {
        let words = (self.inner.geom.max_payload() / 8) as usize;
        // Register this thread's hazard entry now, not on the first read.
        hazard::touch();
        let next = self.next_index();
        if let (super::Keep::Unread, Some(i)) = (self.inner.geom.keep, entry) {
            // Release: as every later store of it (see `super::reuse`).
            self.inner
                .sub_entry(i)
                .read_to
                .store(next, Ordering::Release);
        }
        Subscriber {
            ch: self.clone(),
            entry,
            class: WakeClass::BestEffort,
            next,
            wait_val: 0,
            buf: vec![0u64; words],
            lost: 0,
            armed: 0,
            faults: 0,
            holds: None,
            marked: next,
        }
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
        self.mark_read(self.next);
    }
    /// Whether messages are waiting to be read.
    pub fn has_new(&self) -> bool {
        self.ch.next_index() > self.next
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
        let r = self.next_by(Self::read_at);
        self.mark_read(self.next);
        Ok(r?.map(|(meta, ())| meta))
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
        let r = self.next_by(|s: &mut Self, i| read_view(&s.ch.inner, i, &mut body));
        self.mark_read(self.next);
        r
    }

    /// The metadata of the next unread message, its payload left in its
    /// slot for [`Subscriber::read_in_place_at`] (the event loop stages
    /// messages this way to order them by send time before reading). Not
    /// read yet: on a `keep: unread` channel the message counts as read
    /// once that read (or hold) is done.
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
        let r = read_view(&self.ch.inner, meta.index, body);
        self.mark_read(meta.index.saturating_add(1));
        match r {
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
    pub(super) fn next_by<R>(
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
                    self.mark_read(head);
                    return Ok(Some(MessageMeta {
                        index: i,
                        send_time_ns: time,
                        sender_pid: pid as u32,
                        sender_class: WakeClass::of_pid_word(pid),
                        lost_before: 0,
                        size,
                    }));
                }
                ReadOne::Gone => {
                    // On a `keep: unread` channel the newest message goes
                    // once every subscriber has read it (see
                    // `super::reuse`): with the index where it was, there
                    // is nothing newer to return.
                    if self.ch.inner.geom.keep == super::Keep::Unread
                        && self.ch.next_index() == head
                    {
                        self.next = head;
                        self.mark_read(head);
                        return Ok(None);
                    }
                }
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
}
