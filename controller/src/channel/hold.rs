//! Holds: a subscriber reads a message in its slot for as long as it
//! likes, and no publisher recycles that slot meanwhile.
//!
//! The seqlock read ([`super::read`]) copies a message and checks that it
//! was not recycled meanwhile; for a camera frame that copy is the whole
//! cost of receiving it. A hold instead pins the slot: no copy, no retry,
//! no torn read, and the payload is a plain `&[u8]` for as long as the
//! [`Held`] lives.
//!
//! # The protocol
//!
//! A channel has `holds` hold records (robot.yaml: `holds` per
//! subscribing process). A record is owned like an entry (the owner word
//! of the subscriber's process) and has two words besides: `held`, the
//! ring entry (queue index tag and slot id) of the message it holds, or
//! NONE, written by its owner only; and `reserve`, a slot of its own.
//! Every slot of the file is in exactly one place: a ring position, a
//! publisher's scratch, or a record's reserve.
//!
//! - **Taking a hold** on message `i` (the owner): load ring entry `e` of
//!   `i`, store `held = e` (SeqCst), load the ring entry again (SeqCst):
//!   the hold counts only if it is still `e`; otherwise `held` goes back
//!   to NONE and the message counts as lost (it was recycled while the
//!   hold was being taken).
//! - **A publisher**, before it writes into its scratch slot `s` (every
//!   publish, every loan), looks at every record's `held` (SeqCst). If a
//!   record holds `s`, the publisher trades: it swaps `s` into the
//!   record's `reserve` with a compare-and-swap and takes the old reserve
//!   as its scratch. The held slot is then the record's reserve: out of
//!   every publisher's hands until the record holds something else and a
//!   publisher trades for it.
//! - **Releasing** (dropping the [`Held`]): `held = NONE` (Release: after
//!   the holder's last read of the payload).
//!
//! Why no publisher writes a held slot: the slot `s` a publisher writes
//! left the ring by its own ring CAS (SeqCst) before the look at the
//! records (SeqCst). A hold on `s` stored after that look finds the ring
//! entry changed on its second load (both orders are SeqCst: the
//! store-buffer pattern), so it never counts. A hold stored before the
//! look is seen by it, and the publisher trades `s` away. The old reserve
//! it takes is held by no one: a hold is only ever taken on a slot in the
//! ring, and a reserve left the ring before it became one.
//!
//! Why holds never block publishers: a held slot costs its record's
//! reserve, never a publisher's wait. Each record has its own reserve, so
//! any number of holds, kept for any time, leave every publisher a slot
//! to write. A channel needs `queue_len + publishers + holds` slots.
//!
//! A publisher killed between its trade's CAS and recording its new
//! scratch leaves `trading` (the record and the reserve it took) in its
//! entry: the reserve still being the one it took means the CAS never
//! happened (a reserve taken by the CAS is in no one's hands but the dead
//! publisher's, so it cannot come back), otherwise the slot it took is
//! its scratch ([`Channel::recover_trade`]). A record whose owner died is
//! reclaimed like an entry: its `held` cleared, its reserve kept.
//!
//! # What a holder may assume
//!
//! Against honest members of the robot group: the payload does not change
//! while it is held, and it is the whole message its publisher stamped.
//! Any member can write every byte of the file, though, a held payload
//! included, and Rust's memory model does not reach into other
//! processes: a hostile member can change the bytes under a holder. The
//! holder then sees bytes that change, never memory outside the slot, and
//! typed views are of [`ShmSafe`] types, valid for every bit pattern. A
//! scribbled `held` or `reserve` costs publishers a trade, a fault
//! (a reserve out of range) or a bounded number of tries, never a wait.
#![allow(unsafe_code)]

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::shm::ShmSafe;
use crate::wake::WakeClass;

use super::layout::{entry_slot, entry_tag, tag, NONE};
use super::owner::{my_owner_word, owner_alive, ChannelAttachError};
use super::publish::Publisher;
use super::read::{InPlace, MessageMeta, ReadOne, Subscriber};
use super::{Channel, ChannelFault};

/// Packs a trade's record and reserve into `trading`.
fn trade_word(record: u32, reserve: u64) -> u64 {
    (u64::from(record) << 32) | (reserve & 0xffff_ffff)
}

/// Hold records one subscriber claimed; released (ownership given back)
/// when the subscriber and all its [`Held`] messages are gone.
pub(crate) struct HoldSet {
    ch: Channel,
    records: Vec<u32>,
}

impl Drop for HoldSet {
    fn drop(&mut self) {
        for &k in &self.records {
            let r = self.ch.inner.hold_record(k);
            // Nothing is held any more (every Held keeps the set alive).
            r.held.store(NONE, Ordering::Release);
            r.owner.store(0, Ordering::Release);
        }
    }
}

/// Why [`Subscriber::hold_next`] could not hold a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HoldError {
    #[error("this subscriber has no hold records (claim them with Subscriber::claim_holds)")]
    NoRecords,
    #[error("all {records} holds of this subscriber are in use: drop a held message first")]
    AllInUse { records: u32 },
    #[error("{0}")]
    Fault(ChannelFault),
}

impl From<ChannelFault> for HoldError {
    fn from(f: ChannelFault) -> Self {
        HoldError::Fault(f)
    }
}

/// A message held in its slot (see the module's text): its payload is
/// read where the publisher wrote it, for as long as this lives.
pub struct Held {
    set: Arc<HoldSet>,
    record: u32,
    slot: u64,
    meta: MessageMeta,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("channel", &self.set.ch.name())
            .field("meta", &self.meta)
            .finish()
    }
}

impl Held {
    pub fn meta(&self) -> &MessageMeta {
        &self.meta
    }

    /// The payload, in its slot.
    pub fn bytes(&self) -> &[u8] {
        let words = self.set.ch.inner.payload(self.slot);
        let len = self.meta.size.min(words.len() * 8);
        // SAFETY: the payload words lie inside the mapping, which `set`
        // keeps mapped for as long as this borrow; `len` is clamped to
        // them. No honest member writes the slot while it is held (see the
        // module's text), so these bytes do not change under the borrow;
        // what a hostile member can do is said there.
        unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, len) }
    }

    /// The payload as a `T` in place, when its size matches (slots are
    /// 64-byte aligned, so any `T` up to that alignment fits).
    pub fn get<T: ShmSafe>(&self) -> Option<&T> {
        let b = self.bytes();
        if b.len() != std::mem::size_of::<T>()
            || (b.as_ptr() as usize) % std::mem::align_of::<T>() != 0
        {
            return None;
        }
        // SAFETY: size and alignment checked; any bit pattern is a valid
        // T (ShmSafe); borrowed from `self` like `bytes`.
        Some(unsafe { &*(b.as_ptr() as *const T) })
    }

    /// The send time as a [`crate::Monotonic`] instant.
    pub fn send_time(&self) -> crate::Monotonic {
        crate::Monotonic::from_nanos(self.meta.send_time_ns)
    }

    /// The publisher's wake class.
    pub fn sender_class(&self) -> WakeClass {
        self.meta.sender_class
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Release: after every read of the payload through this hold; a
        // publisher that sees NONE (SeqCst load) writes after them.
        self.set
            .ch
            .inner
            .hold_record(self.record)
            .held
            .store(NONE, Ordering::Release);
    }
}

impl Channel {
    /// Hold records of this channel.
    pub fn hold_records(&self) -> u32 {
        self.inner.geom.holds
    }

    /// Claims up to `n` free hold records (or ones whose owner died).
    fn claim_hold_records(&self, n: u32, proc_root: &Path) -> Result<Vec<u32>, ChannelAttachError> {
        let me = my_owner_word(proc_root)?;
        let inner = &self.inner;
        let mut got = Vec::with_capacity(n as usize);
        for k in 0..inner.geom.holds {
            if got.len() == n as usize {
                break;
            }
            let r = inner.hold_record(k);
            // SeqCst: ownership transfer, as for entries.
            if r.owner
                .compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                r.held.store(NONE, Ordering::SeqCst);
                got.push(k);
            }
        }
        for k in 0..inner.geom.holds {
            if got.len() == n as usize {
                break;
            }
            let r = inner.hold_record(k);
            let o = r.owner.load(Ordering::SeqCst);
            if o != 0
                && o != me
                && !owner_alive(proc_root, o)
                && r.owner
                    .compare_exchange(o, me, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                r.held.store(NONE, Ordering::SeqCst);
                got.push(k);
            }
        }
        Ok(got)
    }

    /// Clears the holds of records whose owner died and gives the records
    /// back; returns how many.
    pub(super) fn recover_hold_records(&self, proc_root: &Path) -> u32 {
        let inner = &self.inner;
        let Ok(me) = my_owner_word(proc_root) else {
            return 0;
        };
        let mut n = 0;
        for k in 0..inner.geom.holds {
            let r = inner.hold_record(k);
            let o = r.owner.load(Ordering::SeqCst);
            if o != 0
                && !owner_alive(proc_root, o)
                && r.owner
                    .compare_exchange(o, me, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                r.held.store(NONE, Ordering::SeqCst);
                r.owner.store(0, Ordering::Release);
                n += 1;
            }
        }
        n
    }

    /// Finishes or undoes the trade a dead publisher of entry `i` was in
    /// (see the module's text). The caller owns the entry.
    pub(super) fn recover_trade(&self, i: u32) {
        let inner = &self.inner;
        let pe = inner.pub_entry(i);
        let t = pe.trading.load(Ordering::SeqCst);
        if t == NONE {
            return;
        }
        let (k, taken) = ((t >> 32) as u32, t & 0xffff_ffff);
        if k < inner.geom.holds
            && taken < inner.geom.slots()
            && inner.hold_record(k).reserve.load(Ordering::SeqCst) != taken
        {
            pe.scratch.store(taken, Ordering::SeqCst);
        }
        pe.trading.store(NONE, Ordering::SeqCst);
    }
}

impl Subscriber {
    /// Claims `n` hold records for this subscriber (at setup: it
    /// allocates), so that it may hold up to `n` messages at once with
    /// [`Subscriber::hold_next`]; returns how many it got (fewer when the
    /// channel's records are taken by live subscribers). Records claimed
    /// before are given back first.
    pub fn claim_holds(&mut self, n: u32, proc_root: &Path) -> Result<u32, ChannelAttachError> {
        self.holds = None;
        let records = self.ch.claim_hold_records(n, proc_root)?;
        let got = records.len() as u32;
        if got > 0 {
            self.holds = Some(Arc::new(HoldSet {
                ch: self.ch.clone(),
                records,
            }));
        }
        Ok(got)
    }

    /// Holds this subscriber may have at once.
    pub fn holds(&self) -> u32 {
        self.holds.as_ref().map_or(0, |s| s.records.len() as u32)
    }

    /// The next unread message in order, held in its slot (see the
    /// module's text): no copy is made, and the payload stays as published
    /// until the [`Held`] is dropped. `None` when there is no message.
    /// Messages recycled before they could be held count as lost, as for
    /// [`Subscriber::next_meta`], and it is bounded the same way.
    /// Allocation-free.
    pub fn hold_next(&mut self) -> Result<Option<Held>, HoldError> {
        let Some(set) = self.holds.clone() else {
            return Err(HoldError::NoRecords);
        };
        let inner = &*self.ch.inner;
        // Relaxed: our own records' words, written by this process only
        // (a hostile value makes the record look busy, or free: a hold it
        // then takes replaces the value).
        let Some(&record) = set
            .records
            .iter()
            .find(|&&k| inner.hold_record(k).held.load(Ordering::Relaxed) == NONE)
        else {
            return Err(HoldError::AllInUse {
                records: set.records.len() as u32,
            });
        };
        let got = self.next_by(|s: &mut Self, i| hold_at(&s.ch, record, i));
        // Held (or lost): read, as far as `super::reuse` is concerned; the
        // hold keeps the slot.
        self.mark_read(self.next);
        Ok(got?.map(|(meta, slot)| Held {
            set,
            record,
            slot,
            meta,
        }))
    }
}

impl Subscriber {
    /// Holds the message `meta` describes (from [`Subscriber::next_peek`];
    /// the event loop stages messages so): [`InPlace::Overwritten`] and
    /// counted lost when it was recycled since, or when no hold record of
    /// this subscriber is free.
    pub(crate) fn hold_staged(&mut self, meta: &MessageMeta) -> InPlace<Held> {
        let inner = &*self.ch.inner;
        let free = self.holds.as_ref().and_then(|set| {
            set.records
                .iter()
                .find(|&&k| inner.hold_record(k).held.load(Ordering::Relaxed) == NONE)
                .map(|&k| (set.clone(), k))
        });
        let Some((set, record)) = free else {
            self.lost = self.lost.saturating_add(1);
            return InPlace::Overwritten;
        };
        let got = hold_at(&self.ch, record, meta.index);
        self.mark_read(meta.index.saturating_add(1));
        match got {
            ReadOne::Ok { size, value, .. } => InPlace::Read(Held {
                set,
                record,
                slot: value,
                meta: MessageMeta { size, ..*meta },
            }),
            ReadOne::Gone => {
                self.lost = self.lost.saturating_add(1);
                InPlace::Overwritten
            }
            ReadOne::Truncated => {
                self.faults += 1;
                InPlace::Truncated
            }
        }
    }
}

/// Takes a hold on message `i` with `record` (see the module's text).
fn hold_at(ch: &Channel, record: u32, i: u64) -> ReadOne<u64> {
    let inner = &*ch.inner;
    let rec = inner.hold_record(record);
    let ring = inner.ring_entry(i);
    let e = ring.load(Ordering::Acquire);
    let x = entry_slot(e);
    if entry_tag(e) != tag(i) || x >= inner.geom.slots() {
        return ReadOne::Gone;
    }
    // SeqCst store, then SeqCst load: a publisher evicting `x` after this
    // load sees the hold before it writes (see the module's text).
    rec.held.store(e, Ordering::SeqCst);
    // SeqCst is also Acquire: the payload stored before the ring CAS that
    // put `e` there (a release) is visible.
    if ring.load(Ordering::SeqCst) != e {
        rec.held.store(NONE, Ordering::Release);
        return ReadOne::Gone;
    }
    let sh = inner.slot(x);
    if sh.qi.load(Ordering::Acquire) != i {
        // Evicted just now (the evicting publisher makes the stamp
        // INVALID before it looks at holds; it will trade the slot, but
        // the header no longer says whose message it is), or scribbled.
        rec.held.store(NONE, Ordering::Release);
        return ReadOne::Gone;
    }
    let time = sh.send_time_ns.load(Ordering::Relaxed);
    let pid = sh.pid.load(Ordering::Relaxed);
    let size = (sh.size.load(Ordering::Relaxed) as usize).min(inner.geom.max_payload() as usize);
    if inner.map.is_broken() {
        rec.held.store(NONE, Ordering::Release);
        return ReadOne::Truncated;
    }
    ReadOne::Ok {
        time,
        pid,
        size,
        value: x,
    }
}

impl Publisher {
    /// Makes sure no record holds the scratch slot before it is written:
    /// a held scratch is traded for the holding record's reserve (see the
    /// module's text). Nothing to do on a channel without hold records.
    /// Bounded: a correct channel trades at most once.
    #[inline]
    pub(super) fn free_scratch(&mut self) -> Result<(), ChannelFault> {
        let n = self.ch.inner.geom.holds;
        if n == 0 {
            return Ok(());
        }
        self.trade_scratch(n)
    }

    fn trade_scratch(&mut self, n: u32) -> Result<(), ChannelFault> {
        let inner = &*self.ch.inner;
        let slots = inner.geom.slots();
        let pe = inner.pub_entry(self.entry);
        for _ in 0..=n {
            let s = self.scratch;
            // SeqCst: after our ring CAS that evicted `s` (see the module's
            // text). NONE's slot bits are never a slot id.
            let Some(k) = (0..n).find(|&k| {
                let h = inner.hold_record(k).held.load(Ordering::SeqCst);
                h != NONE && entry_slot(h) == s
            }) else {
                return Ok(());
            };
            let rec = inner.hold_record(k);
            let r = rec.reserve.load(Ordering::SeqCst);
            if r >= slots || r == s {
                return Err(ChannelFault::BadSlot { slot: r, slots });
            }
            // The trade's recovery record, then the trade.
            pe.trading.store(trade_word(k, r), Ordering::SeqCst);
            if rec
                .reserve
                .compare_exchange(r, s, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                pe.scratch.store(r, Ordering::SeqCst);
                self.scratch = r;
            }
            pe.trading.store(NONE, Ordering::SeqCst);
        }
        Err(ChannelFault::GaveUp { attempts: n + 1 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::owner::owner_word;
    use crate::channel::ChannelGeometry;

    const PROC: &str = "/proc";

    fn channel(dir: &Path, payload: u64, queue_len: u64, publishers: u32, holds: u32) -> Channel {
        let g = ChannelGeometry::new(payload, queue_len, publishers).with_holds(holds);
        Channel::create(dir, "/h", &g, None, Path::new(PROC))
            .unwrap()
            .0
    }

    /// A message of `words` words, each the message's number.
    fn msg(n: u64, words: usize) -> Vec<u8> {
        (0..words).flat_map(|_| n.to_ne_bytes()).collect()
    }

    fn all_words_are(b: &[u8], n: u64) -> bool {
        b.chunks_exact(8)
            .all(|c| u64::from_ne_bytes(c.try_into().unwrap()) == n)
    }

    #[test]
    fn a_held_message_stays_whole_while_publishers_lap_the_ring() {
        let dir = tempfile::tempdir().unwrap();
        let ch = channel(dir.path(), 4096, 4, 1, 2);
        assert_eq!(ch.geometry().slots(), 4 + 1 + 2);
        let mut p = ch.publisher(Path::new(PROC)).unwrap();
        let mut sub = ch.subscriber(Path::new(PROC)).unwrap();
        assert_eq!(sub.hold_next().unwrap_err(), HoldError::NoRecords);
        assert_eq!(sub.claim_holds(2, Path::new(PROC)).unwrap(), 2);
        p.publish(&msg(7, 512)).unwrap();
        let held = sub.hold_next().unwrap().unwrap();
        assert_eq!(held.meta().index, 0);
        assert_eq!(held.bytes().len(), 4096);
        // Ten laps of the ring, each message a loan or a copy: the held
        // slot is never written.
        for n in 1..=40u64 {
            if n % 2 == 0 {
                let mut loan = p.loan::<[u64; 512]>().unwrap();
                *loan = [n; 512];
                loan.send().unwrap();
            } else {
                p.publish(&msg(n, 512)).unwrap();
            }
            assert!(
                all_words_are(held.bytes(), 7),
                "held slot written by message {n}"
            );
        }
        ch.check_slot_ownership().unwrap();
        drop(held);
        // The reader lapped meanwhile: it goes on at the oldest message
        // still there, counting the rest lost; its hold is free again.
        let next = sub.hold_next().unwrap().unwrap();
        assert_eq!(next.meta().index, 37);
        assert_eq!(next.meta().lost_before, 36);
        assert!(all_words_are(next.bytes(), 37));
        let second = sub.hold_next().unwrap().unwrap();
        assert_eq!(
            sub.hold_next().unwrap_err(),
            HoldError::AllInUse { records: 2 }
        );
        assert_eq!(second.get::<[u64; 512]>(), Some(&[38u64; 512]));
        drop((next, second));
        ch.check_slot_ownership().unwrap();
    }

    #[test]
    fn holds_kept_for_ever_never_stop_a_publisher() {
        let dir = tempfile::tempdir().unwrap();
        // Three subscribers, each holding as much as it may, never letting go.
        let ch = channel(dir.path(), 64, 2, 1, 6);
        let mut p = ch.publisher(Path::new(PROC)).unwrap();
        let mut subs: Vec<Subscriber> = (0..3)
            .map(|_| {
                let mut s = ch.subscriber(Path::new(PROC)).unwrap();
                assert_eq!(s.claim_holds(2, Path::new(PROC)).unwrap(), 2);
                s
            })
            .collect();
        let mut extra = ch.subscriber(Path::new(PROC)).unwrap();
        assert_eq!(
            extra.claim_holds(1, Path::new(PROC)).unwrap(),
            0,
            "all six taken"
        );
        let mut kept = Vec::new();
        for n in 0..1000u64 {
            p.publish(&msg(n, 8)).unwrap();
            for s in &mut subs {
                if let Ok(Some(h)) = s.hold_next() {
                    kept.push(h);
                }
            }
        }
        assert_eq!(kept.len(), 6);
        for h in &kept {
            assert!(all_words_are(h.bytes(), h.meta().index));
        }
        ch.check_slot_ownership().unwrap();
        // Records go back when their subscriber and its holds are gone.
        drop(kept);
        drop(subs.pop());
        assert_eq!(extra.claim_holds(2, Path::new(PROC)).unwrap(), 2);
    }

    #[test]
    fn a_dead_holders_records_are_reclaimed_and_their_slots_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let ch = channel(dir.path(), 64, 2, 1, 1);
        let mut p = ch.publisher(Path::new(PROC)).unwrap();
        let mut sub = ch.subscriber(Path::new(PROC)).unwrap();
        sub.claim_holds(1, Path::new(PROC)).unwrap();
        p.publish(&msg(1, 8)).unwrap();
        let held = sub.hold_next().unwrap().unwrap();
        // The holder dies holding: its record's owner is a process that
        // does not exist, and nothing of it runs again.
        let rec = ch.inner.hold_record(0);
        rec.owner
            .store(owner_word(0x3fff_fff0, 1), Ordering::SeqCst);
        std::mem::forget(held);
        std::mem::forget(sub);
        for n in 2..10 {
            p.publish(&msg(n, 8)).unwrap();
        }
        let rep = ch.recover(Path::new(PROC));
        assert_eq!(rep.holds, 1);
        assert_eq!(rec.held.load(Ordering::SeqCst), NONE);
        assert_eq!(rec.owner.load(Ordering::SeqCst), 0);
        ch.check_slot_ownership().unwrap();
        let mut again = ch.subscriber(Path::new(PROC)).unwrap();
        assert_eq!(again.claim_holds(1, Path::new(PROC)).unwrap(), 1);
    }

    #[test]
    fn a_publisher_killed_mid_trade_leaves_one_owner_per_slot() {
        for cas_done in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let ch = channel(dir.path(), 64, 2, 1, 1);
            let p = ch.publisher(Path::new(PROC)).unwrap();
            let inner = &ch.inner;
            let pe = inner.pub_entry(p.entry);
            let s = p.scratch;
            let rec = inner.hold_record(0);
            let r = rec.reserve.load(Ordering::SeqCst);
            // Killed after recording the trade, before or after its CAS.
            pe.trading.store(trade_word(0, r), Ordering::SeqCst);
            if cas_done {
                rec.reserve.store(s, Ordering::SeqCst);
            }
            p.abandon_as_dead(0x3fff_fff1);
            let rep = ch.recover(Path::new(PROC));
            assert_eq!(rep.publishers, 1);
            let scratch = pe.scratch.load(Ordering::SeqCst);
            assert_eq!(scratch, if cas_done { r } else { s });
            ch.check_slot_ownership().unwrap();
        }
    }

    #[test]
    fn scribbled_hold_records_cost_publishers_a_bounded_fault_never_a_wait() {
        let dir = tempfile::tempdir().unwrap();
        let ch = channel(dir.path(), 64, 2, 1, 4);
        let mut p = ch.publisher(Path::new(PROC)).unwrap();
        let slots = ch.geometry().slots();
        let inner = &ch.inner;
        // Every record claims to hold every slot in turn, and a reserve
        // out of range: a publish trades or fails, it never loops.
        for k in 0..4 {
            inner
                .hold_record(k)
                .held
                .store(super::super::layout::pack(0, p.scratch), Ordering::SeqCst);
        }
        inner
            .hold_record(0)
            .reserve
            .store(slots + 5, Ordering::SeqCst);
        assert!(matches!(
            p.publish(&msg(1, 8)),
            Err(crate::PublishError::Fault(ChannelFault::BadSlot { .. }))
        ));
        // Every record names the scratch and the reserves name each other's
        // slots: the trades go round and stop.
        for k in 0..4u32 {
            let rec = inner.hold_record(k);
            rec.held.store(u64::MAX - 1, Ordering::SeqCst);
            rec.reserve.store(u64::from(k) % slots, Ordering::SeqCst);
        }
        for _ in 0..100 {
            let _ = p.publish(&msg(2, 8));
        }
        // Cleared again, the channel works.
        for k in 0..4u32 {
            inner.hold_record(k).held.store(NONE, Ordering::SeqCst);
        }
        p.publish(&msg(3, 8)).unwrap();
    }

    #[test]
    fn messages_cycle_through_the_ring_and_a_scratch_slot_whatever_is_held() {
        // The working set deploy plan shows: depth + publishers slots (a
        // held one is traded for a reserve, and the reserve joins the cycle).
        for depth in [1u64, 2, 4] {
            let dir = tempfile::tempdir().unwrap();
            let ch = channel(dir.path(), 4096, depth, 1, 1);
            let mut p = ch.publisher(Path::new(PROC)).unwrap();
            let mut sub = ch.subscriber(Path::new(PROC)).unwrap();
            sub.claim_holds(1, Path::new(PROC)).unwrap();
            let mut seen = std::collections::BTreeSet::new();
            for n in 0..100u64 {
                p.publish(&msg(n, 512)).unwrap();
                let h = sub.hold_next().unwrap().unwrap();
                assert_eq!(h.meta().index, n);
                assert!(all_words_are(h.bytes(), n));
                seen.insert(h.bytes().as_ptr() as usize);
            }
            assert_eq!(seen.len() as u64, depth + 1, "depth {depth}");
            assert_eq!(
                ch.geometry().working_set_bytes(),
                (depth + 1) * ch.geometry().slot_bytes
            );
            ch.check_slot_ownership().unwrap();
        }
    }

    #[test]
    fn a_holder_racing_a_fast_publisher_never_sees_a_message_change() {
        for depth in [1, 2] {
            holder_races_publisher(depth);
        }
    }

    fn holder_races_publisher(depth: u64) {
        let dir = tempfile::tempdir().unwrap();
        const WORDS: usize = 2048; // 16 KiB
        let ch = channel(dir.path(), 8 * WORDS as u64, depth, 1, 2);
        let mut sub = ch.subscriber(Path::new(PROC)).unwrap();
        sub.claim_holds(2, Path::new(PROC)).unwrap();
        let pch = ch.clone();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let publisher = std::thread::spawn(move || {
            let mut p = pch.publisher(Path::new(PROC)).unwrap();
            let mut n = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                p.publish(&msg(n, WORDS)).unwrap();
                n += 1;
            }
            n
        });
        let (mut held_count, mut checks) = (0u64, 0u64);
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(800);
        while std::time::Instant::now() < deadline {
            let Some(h) = sub.hold_next().unwrap() else {
                std::thread::yield_now();
                continue;
            };
            held_count += 1;
            // Read it whole, let the publisher run a while, read it again.
            for _ in 0..3 {
                assert!(
                    all_words_are(h.bytes(), h.meta().index),
                    "message {} changed while held",
                    h.meta().index
                );
                checks += 1;
                std::thread::yield_now();
            }
        }
        stop.store(true, Ordering::Relaxed);
        let published = publisher.join().unwrap();
        assert!(held_count > 10, "held {held_count} of {published}");
        assert!(checks >= 3 * held_count);
        ch.check_slot_ownership().unwrap();
    }
}
