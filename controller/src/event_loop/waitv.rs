//! The `futex_waitv` wait loop (Linux 5.16+), for kernels without io_uring
//! futex waits: one `futex_waitv(2)` call per sleep over every watched
//! channel's futex word, with the next deadline as its timeout. Its waits
//! are one-shot per call: every idle watcher is counted as waiting again
//! before each sleep.

use crate::sys::{self, FutexWaitv, WaitvResult};

use super::wait::{arm_watcher, Sleep, Wait};
use super::{sleep_until_ns, Backend, EventLoopRunError};

#[derive(Default)]
pub(super) struct WaitvWait {
    /// The vector of the next call, and the watcher of each entry.
    waitv: Vec<FutexWaitv>,
    owner: Vec<usize>,
}

impl Wait for WaitvWait {
    fn backend(&self) -> Backend {
        Backend::FutexWaitv
    }

    fn prepare(&mut self, s: &mut Sleep) -> Result<(), EventLoopRunError> {
        self.waitv.reserve(s.watchers.len());
        self.owner.reserve(s.watchers.len());
        Ok(())
    }

    fn arm(&mut self, s: &mut Sleep, i: usize) -> Result<(), EventLoopRunError> {
        // Counted only: the wait itself is issued in `sleep`.
        s.watchers[i].begin_wait();
        Ok(())
    }

    fn sleep(&mut self, s: &mut Sleep, deadline: Option<u64>) -> Result<(), EventLoopRunError> {
        // futex_waitv waits are one-shot per call: count every idle
        // watcher as waiting again (or find its data already there).
        for i in 0..s.watchers.len() {
            arm_watcher(self, s, i)?;
        }
        if s.watchers.iter().any(|w| w.ready) {
            for w in s.watchers.iter_mut() {
                if w.armed {
                    w.armed = false;
                    w.sub.end_wait();
                }
            }
            return Ok(());
        }
        self.waitv.clear();
        self.owner.clear();
        for (i, w) in s.watchers.iter().enumerate() {
            if w.armed {
                self.waitv.push(FutexWaitv {
                    val: w.sub.wait_value() as u64,
                    uaddr: w.sub.channel().futex_word(s.class) as u64,
                    flags: sys::FUTEX2_SIZE_U32,
                    reserved: 0,
                });
                self.owner.push(i);
            }
        }
        let r = if self.waitv.is_empty() {
            if let Some(d) = deadline {
                sleep_until_ns(d);
            }
            WaitvResult::TimedOut
        } else {
            if let Some(h) = s.before_arm.as_mut() {
                h();
            }
            match sys::futex_waitv(&self.waitv, deadline) {
                Ok(r) => r,
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                    // Some watched word is past the end of its file: find
                    // it (the probe replaces that mapping) and go on.
                    let mut found = false;
                    for &i in &self.owner {
                        found |= s.watchers[i].fail_if_truncated();
                    }
                    if !found {
                        return Err(EventLoopRunError::Waitv(e));
                    }
                    WaitvResult::Again
                }
                Err(e) => return Err(EventLoopRunError::Waitv(e)),
            }
        };
        let now = sys::monotonic_ns();
        *s.slept_until_ns = now;
        for &i in &self.owner {
            let w = &mut s.watchers[i];
            if !w.armed {
                continue; // failed above
            }
            w.armed = false;
            w.sub.end_wait();
            // A timeout is no wake: what it finds is counted per message
            // as it is handled (see dispatch).
            w.woken = r != WaitvResult::TimedOut;
            if w.sub.has_new() {
                w.ready = true;
                if r == WaitvResult::Again {
                    w.stats.eagain += 1;
                }
            }
        }
        s.timers.expire(now);
        Ok(())
    }
}
