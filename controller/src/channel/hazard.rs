//! Slots being copied by readers of this process.
//!
//! A loan ([`Publisher::loan`]) hands out a plain `&mut` to the publisher's
//! scratch slot, so that a message is written in place once instead of
//! being built elsewhere and copied. The slot is the publisher's alone
//! (in no ring position, its entry held), but a reader *of this process*
//! that took the slot from the ring before it was evicted may still be
//! copying it; its atomic loads against our plain stores would be a data
//! race. So each reading thread announces the slot it copies here before
//! it checks the slot's stamp, and clears it after its last load; a loan
//! first makes the stamp INVALID, then scans the announcements, both
//! SeqCst (the store-buffer pattern: either the loan sees the reader, or
//! the reader sees INVALID and copies nothing). A loan that finds its slot
//! announced writes into a staging buffer instead, copied on send.
//!
//! Readers in other processes are outside this process's memory model:
//! their copies are validated by the seqlock and discarded when torn, and
//! what they store into the slot (a hostile peer) only changes the bytes
//! of a value that is valid for every bit pattern.

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
