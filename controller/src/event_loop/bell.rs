//! The doorbell wait loop (any kernel; the real-time loops' on every
//! kernel, see [`crate::wake`]): the loop sleeps in one
//! `FUTEX_WAIT_BITSET` on its own bell, listed in every channel it
//! watches, which those channels' publishers of its class ring (see
//! [`crate::doorbell`]). Each sleep announces itself on the bell, then
//! looks at every watched index, then sleeps: a publisher either sees the
//! announcement and rings, or the loop sees its message.

use crate::doorbell::{Bell, BellTable};
use crate::sys;

use super::wait::{arm_watcher, Sleep, Wait};
use super::{sleep_until_ns, Backend, EventLoopRunError};

#[derive(Default)]
pub(super) struct BellWait {
    /// The loop's bell, claimed when it first runs with a watcher.
    bell: Option<Bell>,
}

impl Wait for BellWait {
    fn backend(&self) -> Backend {
        Backend::Doorbell
    }

    /// Claims the loop's bell (in the doorbell table of the first watched
    /// channel's directory) and lists it in every watched channel not yet
    /// listing it. Each sleep then looks at the indexes after announcing
    /// itself, which covers messages published before a listing was seen.
    fn prepare(&mut self, s: &mut Sleep) -> Result<(), EventLoopRunError> {
        let Some(first) = s.watchers.iter().find(|w| w.failed.is_none()) else {
            return Ok(());
        };
        if self.bell.is_none() {
            let table = BellTable::open(first.sub.channel().shm_dir(), None, false)
                .map_err(EventLoopRunError::Doorbell)?;
            let bell = Bell::claim(table, s.proc_root).map_err(EventLoopRunError::Doorbell)?;
            self.bell = Some(bell);
        }
        let bell = self.bell.as_ref().expect("claimed above");
        for w in s.watchers.iter_mut() {
            if w.listing.is_some() || w.failed.is_some() {
                continue;
            }
            let listing = w
                .sub
                .channel()
                .list_bell(bell, s.class, s.proc_root)
                .map_err(|source| EventLoopRunError::Listing {
                    channel: w.name.clone(),
                    source,
                })?;
            w.listing = Some(listing);
        }
        Ok(())
    }

    fn arm(&mut self, s: &mut Sleep, i: usize) -> Result<(), EventLoopRunError> {
        // Waits on the loop's bell; the index is looked at in `sleep`,
        // after the bell says the loop sleeps.
        let w = &mut s.watchers[i];
        w.armed = true;
        w.woken = false;
        Ok(())
    }

    /// Announces the sleep on the bell, looks at every watched index,
    /// sleeps on the bell until rung or the deadline.
    fn sleep(&mut self, s: &mut Sleep, deadline: Option<u64>) -> Result<(), EventLoopRunError> {
        for i in 0..s.watchers.len() {
            arm_watcher(self, s, i)?;
        }
        let Some(bell) = self.bell.as_ref() else {
            // Nothing watched: timers only.
            if let Some(d) = deadline {
                sleep_until_ns(d);
            }
            s.timers.expire(sys::monotonic_ns());
            return Ok(());
        };
        // SeqCst RMW on the bell, then SeqCst loads of the indexes.
        let key = bell.prepare_sleep();
        let mut ready = false;
        for w in s.watchers.iter_mut() {
            if w.armed && w.sub.has_new_seqcst() {
                // Found before sleeping: no ring was due.
                w.armed = false;
                w.ready = true;
                w.woken = true;
                ready = true;
            }
        }
        let result = if ready {
            None
        } else {
            if let Some(h) = s.before_arm.as_mut() {
                h();
            }
            Some(bell.sleep(key, deadline).map_err(EventLoopRunError::Bell)?)
        };
        // A ring moves the word (publishers add to it), so a sleep that
        // timed out as a ring came still counts as rung.
        let rung = bell.wake_up() != key;
        if result.is_some() {
            *s.slept_until_ns = sys::monotonic_ns();
        }
        let woken = match result {
            Some(sys::WaitResult::TimedOut) => rung,
            _ => true,
        };
        for w in s.watchers.iter_mut() {
            if !w.armed {
                continue;
            }
            w.woken = woken;
            if w.sub.has_new() {
                w.armed = false;
                w.ready = true;
                if result == Some(sys::WaitResult::Again) {
                    w.stats.eagain += 1;
                }
            } else if w.sub.channel().is_truncated() {
                w.fail_if_truncated();
            }
        }
        s.timers.expire(sys::monotonic_ns());
        Ok(())
    }
}
