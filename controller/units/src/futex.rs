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
    let ts = timeout_ns.map(|ns| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: the kernel reads the 32-bit word at `low_word_ptr(word)`,
    // inside `word` and alive for the call, and the timespec `tsp` points
    // to (or null); it writes nothing.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            low_word_ptr(word),
            libc::FUTEX_WAIT,
            expected,
            tsp,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) | Some(libc::ETIMEDOUT) => Ok(()),
            _ => Err(e),
        }
    } else {
        Ok(())
    }
}
