//! The bare futex calls on a shared word: `FUTEX_WAKE` and `FUTEX_WAIT`
//! on the low 32 bits of a shared `AtomicU64`, with nothing around them.
//! The runtime's channels and doorbells wake through them, and the check's
//! comparisons and the peers benchmark's floor measure against them.
//!
//! See [futex(2)](https://man7.org/linux/man-pages/man2/futex.2.html).
#![allow(unsafe_code)]

use std::io;
use std::sync::atomic::AtomicU64;

/// The address of the low 32 bits of `word`: the futex word. Rust code
/// only ever accesses `word` as an `AtomicU64`; the kernel's 32-bit futex
/// access to its low half is outside the Rust memory model.
#[inline]
pub fn low_word_ptr(word: &AtomicU64) -> *const u32 {
    let base = word.as_ptr() as *const u32;
    if cfg!(target_endian = "big") {
        base.wrapping_add(1)
    } else {
        base
    }
}

/// A nanosecond count (a relative timeout, or an absolute
/// `CLOCK_MONOTONIC` time) as a timespec.
#[inline]
pub fn timespec_of(ns: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    }
}

/// `FUTEX_WAKE` (shared: waiters may be other processes) of every waiter
/// on the low word of `word`; how many were woken.
#[inline]
pub fn wake_all(word: &AtomicU64) -> io::Result<usize> {
    let w = low_word_ptr(word);
    // SAFETY: FUTEX_WAKE only uses the address as a key (the kernel reads
    // no memory through it); `w` points into `word`, alive for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            w,
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// `FUTEX_WAIT` (shared) on the low word of `word` while it holds
/// `expected`, for at most `timeout_ns` when given. `Ok(())` on a wake, a
/// changed word (`EAGAIN`), a signal or the timeout: the caller looks at
/// the word again in every case.
pub fn wait(word: &AtomicU64, expected: u32, timeout_ns: Option<u64>) -> io::Result<()> {
    wait_op(word, libc::FUTEX_WAIT, expected, timeout_ns, 0).map(|_| ())
}

/// What a wait on one futex word ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitResult {
    /// Woken by `FUTEX_WAKE` (or spuriously: the caller re-checks).
    Woken,
    /// The word did not hold the expected value when the kernel looked.
    Again,
    /// The timeout or deadline passed.
    TimedOut,
    /// A signal interrupted the wait.
    Interrupted,
}

/// `FUTEX_WAIT_BITSET` (shared: the word lives in a shared mapping) on the
/// low word of `word` while it holds `expected`, until the absolute
/// `CLOCK_MONOTONIC` deadline `deadline_ns` (none: until woken). Every
/// kernel since 2.6.25 has it.
pub fn wait_until(
    word: &AtomicU64,
    expected: u32,
    deadline_ns: Option<u64>,
) -> io::Result<WaitResult> {
    wait_op(
        word,
        libc::FUTEX_WAIT_BITSET,
        expected,
        deadline_ns,
        u32::MAX,
    )
}

/// One futex wait (`op`: `FUTEX_WAIT` with a relative timeout, or
/// `FUTEX_WAIT_BITSET` with an absolute one) on the low word of `word`.
fn wait_op(
    word: &AtomicU64,
    op: i32,
    expected: u32,
    time_ns: Option<u64>,
    bitset: u32,
) -> io::Result<WaitResult> {
    let ts = time_ns.map(timespec_of);
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: the kernel reads the 32-bit word at `low_word_ptr(word)`,
    // inside `word`, alive for the call and 4-byte aligned, and the
    // timespec `tsp` points to (or null), which outlives the call; the
    // bitset is passed by value (ignored by FUTEX_WAIT); it writes nothing.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            low_word_ptr(word),
            op,
            expected,
            tsp,
            std::ptr::null::<u32>(),
            bitset,
        )
    };
    if r >= 0 {
        return Ok(WaitResult::Woken);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) => Ok(WaitResult::Again),
        Some(libc::ETIMEDOUT) => Ok(WaitResult::TimedOut),
        Some(libc::EINTR) => Ok(WaitResult::Interrupted),
        _ => Err(e),
    }
}
