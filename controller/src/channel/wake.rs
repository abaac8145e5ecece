//! The waking: what a publisher does after its message is placed and the
//! index advanced, and the subscriber's side of the same protocol (arming
//! a wait). Which words and bells each class touches is
//! [`crate::wake`]'s rule: a publisher wakes its own class only, a
//! subscriber arms its own class's word only. The listings of loops on the
//! doorbell backend ([`crate::doorbell`]) in the channel header live here
//! too.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::doorbell::{Bell, BellTable};
use crate::sys;
use crate::wake::{WakeClass, RT_LISTING};

use super::layout::Header;
use super::owner::ChannelAttachError;
use super::read::Subscriber;
use super::Channel;

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
pub(super) fn wake(class: WakeClass, bells: Option<&BellTable>, h: &Header, next: u64) -> u64 {
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

impl Channel {
    /// The futex word subscribers of `class` wait on, in the mapping: the
    /// low 32 bits of the queue index, or of `rt_word`.
    pub(crate) fn futex_word(&self, class: WakeClass) -> *const u32 {
        sys::low_word_ptr(self.inner.header().word_of(class))
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
    pub(super) fn unlist_stale(&self, table: &BellTable, proc_root: &Path) -> u64 {
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
}

impl Subscriber {
    /// [`Subscriber::has_new`] with a SeqCst load, for the doorbell
    /// backend's ordering argument (see [`crate::doorbell`]).
    pub(crate) fn has_new_seqcst(&self) -> bool {
        self.ch.inner.header().next_index.load(Ordering::SeqCst) > self.next
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
