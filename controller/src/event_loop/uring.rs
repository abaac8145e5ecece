//! The io_uring wait loop: one `IORING_OP_FUTEX_WAIT` kept armed per
//! watched channel on its class's futex word, re-armed after every wake;
//! a completion of `-EAGAIN` means the word moved between our load and
//! the kernel's check: more data, never an error. The ring is set up with
//! `SINGLE_ISSUER | DEFER_TASKRUN`: completions run in this thread when it
//! waits, so no other task posts to its completion ring.
#![allow(unsafe_code)]

use std::io;

use io_uring::{opcode, types, IoUring};

use crate::sys;

use super::backend::build_ring;
use super::wait::{Sleep, Wait};
use super::{Backend, EventLoopRunError};

// user_data: kind in the top byte, the watcher's index in the low 24
// bits. The ring holds futex waits only: timers are the wait's own
// timeout (see `UringWait::sleep`).
const KIND_SHIFT: u32 = 56;
const KIND_WATCH: u64 = 1 << KIND_SHIFT;
const INDEX_MASK: u64 = (1 << 24) - 1;
/// `FUTEX_BITSET_MATCH_ANY`.
const MATCH_ANY: u64 = 0xffff_ffff;

pub(super) struct UringWait {
    /// Built when the loop first runs (sized for its watchers and timers).
    ring: Option<IoUring>,
    /// The kernel takes absolute wait timeouts (6.12+); cleared at the
    /// first refusal.
    abs_timer: bool,
}

impl Default for UringWait {
    fn default() -> Self {
        UringWait {
            ring: None,
            abs_timer: true,
        }
    }
}

impl UringWait {
    fn push(&mut self, sqe: &io_uring::squeue::Entry) -> Result<(), EventLoopRunError> {
        let ring = self.ring.as_mut().expect("ring built in prepare");
        loop {
            // SAFETY: the only SQEs are futex waits whose pointer is a
            // futex word inside a channel mapping that the watcher's
            // Subscriber keeps mapped for the loop's lifetime; the kernel
            // takes the futex key when the SQE is submitted. Watchers are
            // never removed, and the ring is dropped before them (the
            // loop's field order: its wait loop first), so the word
            // outlives every submission.
            if unsafe { ring.submission().push(sqe) }.is_ok() {
                return Ok(());
            }
            ring.submit().map_err(EventLoopRunError::Enter)?;
        }
    }
}

impl Wait for UringWait {
    fn backend(&self) -> Backend {
        Backend::IoUringFutex
    }

    fn prepare(&mut self, s: &mut Sleep) -> Result<(), EventLoopRunError> {
        if self.ring.is_none() {
            let entries = (2 * (s.watchers.len() + s.timers.len()) + 8).next_power_of_two() as u32;
            let ring = build_ring(entries).map_err(EventLoopRunError::Enter)?;
            self.ring = Some(ring);
        }
        Ok(())
    }

    fn arm(&mut self, s: &mut Sleep, i: usize) -> Result<(), EventLoopRunError> {
        let w = &mut s.watchers[i];
        if !w.begin_wait() {
            return Ok(());
        }
        let word = w.sub.channel().futex_word(s.class);
        let val = w.sub.wait_value() as u64;
        if let Some(h) = s.before_arm.as_mut() {
            h();
        }
        let sqe = opcode::FutexWait::new(word, val, MATCH_ANY, sys::FUTEX2_SIZE_U32)
            .build()
            .user_data(KIND_WATCH | i as u64);
        self.push(&sqe)
    }

    /// Submits what is queued and waits for a completion, until the
    /// deadline at the latest. The deadline is the wait's own timeout
    /// (`IORING_ENTER_EXT_ARG`, absolute with `IORING_ENTER_ABS_TIMER`
    /// from Linux 6.12, relative before): no timeout request sits in the
    /// ring, so no timer expiry adds task_work to it (see [`crate::wake`]).
    /// A relative timeout measured from just before the call ends a little
    /// after the deadline, never before it.
    fn sleep(&mut self, s: &mut Sleep, deadline: Option<u64>) -> Result<(), EventLoopRunError> {
        let ring = self.ring.as_mut().expect("ring built in prepare");
        let r = match deadline {
            None => ring.submit_and_wait(1),
            Some(d) => {
                let mut r = None;
                if self.abs_timer {
                    let ts = types::Timespec::new()
                        .sec(d / 1_000_000_000)
                        .nsec((d % 1_000_000_000) as u32);
                    let args = types::SubmitArgs::new().timespec(&ts);
                    match ring.submitter().submit_with_args_and_flags(
                        1,
                        &args,
                        io_uring::EnterFlags::ABS_TIMER,
                    ) {
                        // A kernel before 6.12: relative timeouts from now on.
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.abs_timer = false,
                        other => r = Some(other),
                    }
                }
                match r {
                    Some(r) => r,
                    None => {
                        let rel = d.saturating_sub(sys::monotonic_ns());
                        let ts = types::Timespec::new()
                            .sec(rel / 1_000_000_000)
                            .nsec((rel % 1_000_000_000) as u32);
                        let args = types::SubmitArgs::new().timespec(&ts);
                        ring.submitter().submit_with_args(1, &args)
                    }
                }
            }
        };
        match r {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::ETIME)
                ) => {}
            Err(e) => return Err(EventLoopRunError::Enter(e)),
        }
        *s.slept_until_ns = sys::monotonic_ns();
        for cqe in ring.completion() {
            let ud = cqe.user_data();
            let res = cqe.result();
            let idx = (ud & INDEX_MASK) as usize;
            // Only futex waits are ever submitted; anything else is not ours.
            if ud & (0xff << KIND_SHIFT) != KIND_WATCH || idx >= s.watchers.len() {
                continue;
            }
            let w = &mut s.watchers[idx];
            w.armed = false;
            w.sub.end_wait();
            w.ready = true;
            w.woken = true;
            if res == -libc::EAGAIN {
                w.stats.eagain += 1;
            } else if res == -libc::EFAULT && w.fail_if_truncated() {
                // Counted; the rest of the loop runs on.
            } else if res < 0 && res != -libc::EINTR && res != -libc::ECANCELED {
                return Err(EventLoopRunError::Wait {
                    channel: w.name.clone(),
                    errno: io::Error::from_raw_os_error(-res),
                });
            }
        }
        s.timers.expire(sys::monotonic_ns());
        Ok(())
    }
}
