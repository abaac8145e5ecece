//! The census's positive control: a PI futex a lower-priority holder and
//! a real-time waiter share (`FUTEX_LOCK_PI` / `FUTEX_UNLOCK_PI`).

use super::*;

pub(super) fn gettid() -> u32 {
    // SAFETY: no arguments; cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// `FUTEX_LOCK_PI` / `FUTEX_UNLOCK_PI` (shared) on the low word of `w`.
pub(super) fn futex_pi(w: &AtomicU64, op: i32) -> i64 {
    let word = crate::futex::low_word_ptr(w);
    // SAFETY: the kernel reads and writes the 32-bit word, which lives in
    // the shared control file this process maps for its whole life.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word,
            op,
            0,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    }
}

/// Takes the PI lock: the fast path claims a free word with our tid, else
/// the kernel queues us (and boosts the holder). Whether it was held:
/// the kernel was asked.
pub(super) fn pi_lock(w: &AtomicU64, tid: u32) -> bool {
    // SeqCst: a lock word shared with the kernel's PI protocol.
    if w.compare_exchange(0, tid as u64, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        futex_pi(w, libc::FUTEX_LOCK_PI);
        return true;
    }
    false
}

pub(super) fn pi_unlock(w: &AtomicU64, tid: u32) {
    if w.compare_exchange(tid as u64, 0, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        // FUTEX_WAITERS set: the kernel hands the lock on.
        futex_pi(w, libc::FUTEX_UNLOCK_PI);
    }
}

/// The positive control's holder (best-effort, on the housekeeping CPUs):
/// takes the PI lock, holds it for `hold_ns` busy, releases it, pauses as
/// long, until `rt_stop`.
pub(super) fn pi_hold(a: &Args) -> Result<(), WorkerRunError> {
    let shared = a.shared()?;
    let ctl = shared.control();
    rt_setup(ctl, a, None)?;
    let hold = a.u64("hold_ns")?.clamp(1_000, 1_000_000_000);
    let tid = gettid();
    // Relaxed: a stop request; see rt_send.
    while ctl.rt_stop.load(Ordering::Relaxed) == 0 {
        let _ = pi_lock(&ctl.pi_word, tid);
        let end = monotonic_ns() + hold;
        while monotonic_ns() < end {
            std::hint::spin_loop();
        }
        pi_unlock(&ctl.pi_word, tid);
        sleep_until(Monotonic::now() + Duration::from_nanos(hold));
    }
    Ok(())
}

/// The positive control's waiter (SCHED_FIFO on an isolated CPU): every
/// `period_ns`, locks the PI futex the holder has about half the time (so
/// the kernel boosts the holder to this priority) and unlocks it; counts
/// the locks it found held, each a boost for the census to count.
pub(super) fn rt_pi(a: &Args) -> Result<(), WorkerRunError> {
    let shared = a.shared()?;
    let ctl = shared.control();
    rt_setup(ctl, a, Some(a.u64("priority")? as u32))?;
    let period = a.u64("period_ns")?.clamp(1_000, 1_000_000_000);
    let tid = gettid();
    while ctl.rt_stop.load(Ordering::Relaxed) == 0 {
        sleep_until(Monotonic::now() + Duration::from_nanos(period));
        let held = pi_lock(&ctl.pi_word, tid);
        pi_unlock(&ctl.pi_word, tid);
        if held {
            // SeqCst: read by the engine, which ends the phase by it.
            ctl.pi_cycles.fetch_add(1, Ordering::SeqCst);
        }
    }
    Ok(())
}
