//! `keep: unread`: the publisher writes its next message into the slot of
//! the newest one once every subscriber has read it.
//!
//! A channel that keeps its newest `queue_len` messages (`keep: newest`)
//! writes each message into the slot the oldest one leaves: messages
//! cycle through every slot of the ring and the publisher's scratch, so a
//! publish and its reads touch `(queue_len + 1) x max_size` bytes in turn.
//! For a camera frame of a few MiB that is more than a core's caches hold:
//! every publish writes memory that left them, and every read reads it
//! back. A channel whose messages are only of use to its subscribers can
//! instead give back the newest message's slot as soon as they all have
//! read it: the next message is written where the last one was, which is
//! still in the writer's and the readers' caches.
//!
//! # The protocol
//!
//! Each subscriber entry has `read_to`: the queue index up to which its
//! owner has read (every message before it read, skipped or counted
//! lost), stored (Release) after the read it ends, by the owner only. A
//! message read in place counts once `read`'s view has been checked; a
//! held one once the hold is taken (the hold itself then keeps the slot,
//! see `super::hold`).
//!
//! Before a publisher writes its next message (each publish, each loan),
//! it looks at the newest message `n = next_index - 1`: its ring entry
//! `e = (n, y)` stamped `n` in slot `y`. When every live subscriber
//! entry's `read_to` is past `n`, it **reclaims** `y`: it makes its own
//! scratch slot `s` INVALID, records `reclaiming = e`, swaps `(n, s)`
//! into the ring position with one compare-and-swap, then records `y` as
//! its scratch and clears `reclaiming`. Its message is then written into
//! `y` as into any scratch slot, and published into the next ring
//! position as always; `s`, stamped INVALID, stands in the ring for the
//! message `n` that was read, until a later publish evicts it.
//!
//! Why no reader sees a torn or wrong message: a reader that loaded `e`
//! before the swap reads `y` under the seqlock (its stamp goes INVALID
//! before the new message is written) or holds it (the publisher looks at
//! the hold records after its swap and trades a held `y` away, as for any
//! scratch: the store-buffer argument of `super::hold` applies to this
//! CAS as to an eviction). A reader that loads the entry after the swap
//! finds `s`, whose stamp is not `n`: the message is gone, as an evicted
//! one is. Every slot stays in exactly one place (the swap trades two).
//!
//! Why it needs one publisher entry: between the swap and the publish,
//! `y` is the publisher's scratch while a second publisher could evict
//! `(n, s)` and write `s`; that is fine, but a second publisher could
//! equally be reclaiming the same `y`. With one entry (the geometry
//! refuses `unread` otherwise) only that publisher ever moves a slot, so
//! a publisher killed mid-reclaim is repaired from `reclaiming` alone:
//! the ring position no longer holding `e` means its swap happened and
//! `y` is its scratch ([`Channel::recover_reclaim`]).
//!
//! # What it promises, and to whom
//!
//! Subscribers (entries, the event loop's watchers) lose nothing they
//! would not lose under `keep: newest` with the same `queue_len`: a
//! message is reclaimed only once all of them have read it. Fetchers and
//! recorders have no entry: they may find the newest message gone once
//! the subscribers have read it, and count it lost. A subscriber entry
//! whose owner died keeps its `read_to` until it is reclaimed: the
//! publisher then reuses nothing and messages cycle as under `newest`.
//!
//! Hostile memory: a scribbled `read_to` makes the publisher reuse too
//! early (the subscriber so scribbled counts the message lost) or never
//! (the channel works as `newest`); the look is bounded by the geometry's
//! subscriber entries, read once at open, and never waits.

use std::sync::atomic::Ordering;

use super::layout::{entry_slot, entry_tag, pack, tag, Keep, INVALID, NONE};
use super::publish::Publisher;
use super::read::Subscriber;
use super::Channel;

impl Publisher {
    /// Takes the newest message's slot back as the scratch when every
    /// subscriber has read it (see the module's text). Nothing on a
    /// channel that keeps its newest messages. Allocation-free, a bounded
    /// look at the subscriber entries and at most one CAS.
    #[inline]
    pub(super) fn reclaim_newest(&mut self) {
        let inner = &*self.ch.inner;
        // An `unread` geometry has one publisher entry: refused otherwise
        // at create and at open (`ChannelGeometry::check`).
        if inner.geom.keep != Keep::Unread {
            return;
        }
        // SeqCst: compared with ring entries CASed with SeqCst.
        let next = inner.header().next_index.load(Ordering::SeqCst);
        let Some(n) = next.checked_sub(1) else {
            return;
        };
        let ring = inner.ring_entry(n);
        let e = ring.load(Ordering::SeqCst);
        let y = entry_slot(e);
        let s = self.scratch;
        if entry_tag(e) != tag(n) || y >= inner.geom.slots() || y == s {
            return;
        }
        if inner.slot(y).qi.load(Ordering::Acquire) != n {
            return; // already reclaimed, or scribbled
        }
        // Acquire (SeqCst): every read of `y` a subscriber made before it
        // stored `read_to` (Release) happens before our writes to it.
        for k in 0..inner.geom.subscribers {
            let se = inner.sub_entry(k);
            if se.owner.load(Ordering::SeqCst) != 0 && se.read_to.load(Ordering::SeqCst) < next {
                return;
            }
        }
        let pe = inner.pub_entry(self.entry);
        // `s` stands in the ring for the message read: its stamp must not
        // say `n` (it is INVALID or an older message's until now).
        inner.slot(s).qi.store(INVALID, Ordering::SeqCst);
        pe.reclaiming.store(e, Ordering::SeqCst);
        if ring
            .compare_exchange(e, pack(n, s), Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            pe.scratch.store(y, Ordering::SeqCst);
            self.scratch = y;
            self.reclaimed += 1;
        }
        pe.reclaiming.store(NONE, Ordering::SeqCst);
    }

    /// Messages written into the slot of the one before (see the module's
    /// text).
    pub fn reclaimed(&self) -> u64 {
        self.reclaimed
    }
}

impl Subscriber {
    /// Records that everything before queue index `upto` has been read
    /// (see the module's text): on `keep: unread` channels, for
    /// subscribers with an entry, and only forward.
    #[inline]
    pub(super) fn mark_read(&mut self, upto: u64) {
        let Some(i) = self.entry else { return };
        if self.ch.inner.geom.keep != Keep::Unread || upto <= self.marked {
            return;
        }
        self.marked = upto;
        // Release: after this subscriber's reads of those messages.
        self.ch
            .inner
            .sub_entry(i)
            .read_to
            .store(upto, Ordering::Release);
    }
}

impl Channel {
    /// What [`Channel::geometry`]'s keep is.
    pub fn keep(&self) -> Keep {
        self.inner.geom.keep
    }

    /// Finishes or forgets the reclaim a dead publisher of entry `i` was
    /// in (see the module's text). The caller owns the entry, the only
    /// publisher entry of an `unread` channel.
    pub(super) fn recover_reclaim(&self, i: u32) {
        let inner = &self.inner;
        let pe = inner.pub_entry(i);
        let r = pe.reclaiming.load(Ordering::SeqCst);
        if r == NONE {
            return;
        }
        let y = entry_slot(r);
        // The tag's low bits are the index's: its ring position.
        if y < inner.geom.slots() && inner.ring_entry(entry_tag(r)).load(Ordering::SeqCst) != r {
            pe.scratch.store(y, Ordering::SeqCst);
        }
        pe.reclaiming.store(NONE, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{ChannelCreateError, ChannelGeometry, ChannelGeometryError};
    use std::path::Path;
    use std::sync::Arc;

    const PROC: &str = "/proc";

    fn proc() -> &'static Path {
        Path::new(PROC)
    }

    fn unread(dir: &Path, payload: u64, depth: u64, holds: u32) -> Channel {
        let g = ChannelGeometry::new(payload, depth, 1)
            .with_holds(holds)
            .with_keep(Keep::Unread);
        Channel::create(dir, "/u", &g, None, proc()).unwrap().0
    }

    /// A message of `words` words, each the message's number.
    fn msg(n: u64, words: usize) -> Vec<u8> {
        (0..words).flat_map(|_| n.to_ne_bytes()).collect()
    }

    fn all_words_are(b: &[u8], n: u64) -> bool {
        b.chunks_exact(8)
            .all(|c| u64::from_ne_bytes(c.try_into().unwrap()) == n)
    }

    /// The slot message `i` is in (its ring entry's).
    fn slot_of(ch: &Channel, i: u64) -> u64 {
        entry_slot(ch.inner.ring_entry(i).load(Ordering::SeqCst))
    }

    #[test]
    fn a_message_every_subscriber_read_gives_its_slot_to_the_next() {
        for depth in [1u64, 2, 8] {
            let dir = tempfile::tempdir().unwrap();
            let ch = unread(dir.path(), 4096, depth, 0);
            let mut p = ch.publisher(proc()).unwrap();
            let mut a = ch.subscriber(proc()).unwrap();
            let mut b = ch.subscriber(proc()).unwrap();
            let mut slots = std::collections::BTreeSet::new();
            for n in 0..50u64 {
                if n % 2 == 0 {
                    p.publish(&msg(n, 512)).unwrap();
                } else {
                    let mut loan = p.loan_bytes(4096).unwrap();
                    loan.copy_from_slice(&msg(n, 512));
                    loan.send().unwrap();
                }
                slots.insert(slot_of(&ch, n));
                let m = a.next_message().unwrap().unwrap();
                assert!(m.index == n && all_words_are(m.data, n));
                let got = b.next_in_place(|v| v.word(0)).unwrap().unwrap();
                assert_eq!((got.0.index, got.1), (n, Some(n)));
            }
            // The first went into the publisher's scratch, every later one
            // into the slot of the one before.
            assert_eq!(slots.len(), 1, "depth {depth}: {slots:?}");
            assert_eq!(p.reclaimed(), 49);
            assert_eq!((a.lost(), b.lost()), (0, 0));
            assert_eq!(ch.geometry().working_set_bytes(), ch.geometry().slot_bytes);
            ch.check_slot_ownership().unwrap();
        }
    }

    #[test]
    fn a_subscriber_behind_keeps_every_message_as_newest_would() {
        let dir = tempfile::tempdir().unwrap();
        let ch = unread(dir.path(), 64, 4, 0);
        let mut p = ch.publisher(proc()).unwrap();
        let mut fast = ch.subscriber(proc()).unwrap();
        let mut slow = ch.subscriber(proc()).unwrap();
        for n in 0..4u64 {
            p.publish(&msg(n, 8)).unwrap();
            assert_eq!(fast.next_message().unwrap().unwrap().index, n);
        }
        assert_eq!(p.reclaimed(), 0, "the slow one read nothing");
        for n in 0..4u64 {
            let m = slow.next_message().unwrap().unwrap();
            assert!(m.index == n && all_words_are(m.data, n));
        }
        assert_eq!(slow.lost(), 0);
        // Both caught up: the next message goes into the newest one's slot.
        let newest = slot_of(&ch, 3);
        p.publish(&msg(4, 8)).unwrap();
        assert_eq!(slot_of(&ch, 4), newest);
        assert_eq!(p.reclaimed(), 1);
        ch.check_slot_ownership().unwrap();
    }

    #[test]
    fn a_fetcher_finds_a_read_message_gone_and_no_fault() {
        let dir = tempfile::tempdir().unwrap();
        let ch = unread(dir.path(), 64, 1, 0);
        let mut p = ch.publisher(proc()).unwrap();
        let mut sub = ch.subscriber(proc()).unwrap();
        p.publish(&msg(1, 8)).unwrap();
        sub.next_message().unwrap().unwrap();
        let mut fetcher = ch.reader();
        // The publisher takes the read message's slot for its next one.
        let loan = p.loan_bytes(64).unwrap();
        assert!(loan.in_place());
        assert!(fetcher.latest().unwrap().is_none(), "gone once read");
        assert_eq!(fetcher.faults(), 0);
        let mut loan = loan;
        loan.copy_from_slice(&msg(2, 8));
        loan.send().unwrap();
        let m = fetcher.latest().unwrap().unwrap();
        assert!(m.index == 1 && all_words_are(m.data, 2));
        // A channel that keeps its newest: the fetcher reads it, read or not.
        let dir2 = tempfile::tempdir().unwrap();
        let g = ChannelGeometry::new(64, 1, 1);
        let (newest, _) = Channel::create(dir2.path(), "/n", &g, None, proc()).unwrap();
        let mut p2 = newest.publisher(proc()).unwrap();
        let mut s2 = newest.subscriber(proc()).unwrap();
        p2.publish(&msg(1, 8)).unwrap();
        s2.next_message().unwrap().unwrap();
        let _loan = p2.loan_bytes(64).unwrap();
        assert_eq!(newest.reader().latest().unwrap().unwrap().index, 0);
    }

    #[test]
    fn a_held_message_is_traded_away_never_written() {
        let dir = tempfile::tempdir().unwrap();
        let ch = unread(dir.path(), 4096, 1, 1);
        let mut p = ch.publisher(proc()).unwrap();
        let mut sub = ch.subscriber(proc()).unwrap();
        assert_eq!(sub.claim_holds(1, proc()).unwrap(), 1);
        p.publish(&msg(0, 512)).unwrap();
        let held = sub.hold_next().unwrap().unwrap();
        // Read as far as reuse goes: the publisher takes the slot back and
        // trades it for the record's reserve before writing.
        for n in 1..=10u64 {
            p.publish(&msg(n, 512)).unwrap();
            assert!(
                all_words_are(held.bytes(), 0),
                "held message changed at {n}"
            );
        }
        drop(held);
        // Released: reading and publishing in turn reuses one slot again.
        let mut last = None;
        for n in 11..20u64 {
            p.publish(&msg(n, 512)).unwrap();
            let h = sub.hold_next().unwrap().unwrap();
            assert!(all_words_are(h.bytes(), h.meta().index));
            if n > 11 {
                assert_eq!(last, Some(h.bytes().as_ptr() as usize), "at {n}");
            }
            last = Some(h.bytes().as_ptr() as usize);
        }
        ch.check_slot_ownership().unwrap();
    }

    #[test]
    fn a_publisher_killed_mid_reclaim_is_repaired_whichever_side_of_the_swap() {
        for swapped in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let ch = unread(dir.path(), 64, 2, 0);
            let mut p = ch.publisher(proc()).unwrap();
            let mut sub = ch.subscriber(proc()).unwrap();
            p.publish(&msg(0, 8)).unwrap();
            sub.next_message().unwrap().unwrap();
            // Stop where a kill would: `reclaiming` recorded, the CAS done
            // or not, the scratch not yet recorded.
            let inner = &*ch.inner;
            let ring = inner.ring_entry(0);
            let e = ring.load(Ordering::SeqCst);
            let (y, s) = (entry_slot(e), p.scratch);
            inner
                .pub_entry(p.entry)
                .reclaiming
                .store(e, Ordering::SeqCst);
            if swapped {
                ring.store(pack(0, s), Ordering::SeqCst);
            }
            p.abandon_as_dead(u32::MAX - 7);
            let mut q = ch.publisher(proc()).unwrap();
            assert_eq!(q.scratch, if swapped { y } else { s });
            ch.check_slot_ownership().unwrap();
            for n in 1..6u64 {
                q.publish(&msg(n, 8)).unwrap();
                let m = sub.next_message().unwrap().unwrap();
                assert!(m.index == n && all_words_are(m.data, n));
            }
            ch.check_slot_ownership().unwrap();
        }
    }

    #[test]
    fn a_scribbled_read_to_costs_a_message_or_the_reuse_never_a_wait() {
        let dir = tempfile::tempdir().unwrap();
        let ch = unread(dir.path(), 64, 1, 0);
        let mut p = ch.publisher(proc()).unwrap();
        let mut sub = ch.subscriber(proc()).unwrap();
        let read_to = &ch.inner.sub_entry(sub.entry.unwrap()).read_to;
        // Never: the channel works as `newest`.
        for n in 0..10u64 {
            p.publish(&msg(n, 8)).unwrap();
            sub.next_message().unwrap().unwrap();
            read_to.store(0, Ordering::SeqCst);
        }
        assert_eq!(p.reclaimed(), 0);
        // Too early: the subscriber so scribbled finds its message gone,
        // counts it lost, and reads the next one whole.
        read_to.store(u64::MAX, Ordering::SeqCst);
        let before = sub.lost();
        let mut loan = p.loan_bytes(64).unwrap();
        loan.copy_from_slice(&msg(10, 8));
        loan.send().unwrap();
        let m = sub.next_message().unwrap().unwrap();
        assert!(m.index == 10 && all_words_are(m.data, 10));
        assert_eq!(sub.lost(), before, "message 9 was read; 10 is whole");
        ch.check_slot_ownership().unwrap();
    }

    #[test]
    fn readers_racing_a_reusing_publisher_never_accept_a_torn_message() {
        const WORDS: usize = 1024;
        let dir = tempfile::tempdir().unwrap();
        let ch = unread(dir.path(), 8 * WORDS as u64, 2, 2);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..3)
            .map(|kind| {
                let ch = ch.clone();
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut sub = ch.subscriber(proc()).unwrap();
                    if kind == 2 {
                        sub.claim_holds(2, proc()).unwrap();
                    }
                    let mut fetcher = ch.reader();
                    let mut checked = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        match kind {
                            0 => {
                                if let Some(m) = sub.next_message().unwrap() {
                                    assert!(all_words_are(m.data, m.index), "torn {}", m.index);
                                    checked += 1;
                                }
                            }
                            1 => {
                                if let Some(m) = fetcher.latest().unwrap() {
                                    assert!(all_words_are(m.data, m.index), "torn {}", m.index);
                                    checked += 1;
                                }
                            }
                            _ => {
                                if let Some(h) = sub.hold_next().unwrap() {
                                    for _ in 0..2 {
                                        assert!(all_words_are(h.bytes(), h.meta().index));
                                        std::thread::yield_now();
                                    }
                                    checked += 1;
                                }
                            }
                        }
                        std::thread::yield_now();
                    }
                    checked
                })
            })
            .collect();
        let mut p = ch.publisher(proc()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(600);
        let mut n = 0u64;
        while std::time::Instant::now() < deadline {
            if n % 2 == 0 {
                p.publish(&msg(n, WORDS)).unwrap();
            } else {
                let mut loan = p.loan_bytes(8 * WORDS).unwrap();
                loan.copy_from_slice(&msg(n, WORDS));
                loan.send().unwrap();
            }
            n += 1;
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
        let checked: Vec<u64> = readers.into_iter().map(|r| r.join().unwrap()).collect();
        assert!(checked.iter().all(|&c| c > 0), "{checked:?} of {n}");
        drop(p);
        ch.check_slot_ownership().unwrap();
    }

    #[test]
    fn unread_needs_one_publisher_entry_and_a_known_keep_word() {
        let dir = tempfile::tempdir().unwrap();
        let g = ChannelGeometry::new(64, 2, 2).with_keep(Keep::Unread);
        match Channel::create(dir.path(), "/two", &g, None, proc()) {
            Err(ChannelCreateError::Geometry { reason, .. }) => {
                assert!(matches!(
                    reason,
                    ChannelGeometryError::KeepUnread { publishers: 2, .. }
                ))
            }
            other => panic!("{other:?}"),
        }
        let ch = unread(dir.path(), 64, 2, 0);
        let path = ch.inner.path.clone();
        drop(ch);
        // A keep word that is neither: refused at open, said.
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            let off = std::mem::offset_of!(super::super::layout::Header, keep) as u64;
            f.write_all_at(&7u64.to_ne_bytes(), off).unwrap();
        }
        let err = Channel::open(dir.path(), "/u").unwrap_err().to_string();
        assert!(err.contains("keep word 7"), "{err}");
    }
}
