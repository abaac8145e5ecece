//! Thin wrappers over the few syscalls the runtime issues directly: the
//! monotonic clock, futex wait/wake, `futex_waitv`, and reading a process's
//! start time from `/proc` (root given by the caller).
//!
//! Everything here is allocation-free except the `/proc` reader, which runs
//! only when a publisher or subscriber attaches or a channel is recovered.
#![allow(unsafe_code)]

use std::io;
use std::path::Path;

/// `CLOCK_MONOTONIC` now, in nanoseconds. Goes through the vDSO: no syscall.
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always
    // exists on Linux, so the call cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A nanosecond count as a timespec.
pub use units::futex::timespec_of;

/// The address of the low 32 bits of a 64-bit queue index: the futex word
/// (Rust code only ever accesses the index as an `AtomicU64`).
pub use units::futex::low_word_ptr;

/// `FUTEX_WAKE` (shared, not private: the word lives in a shared mapping
/// and waiters are other processes) of every waiter on the low word of
/// `index`. Returns how many were woken.
pub use units::futex::wake_all as futex_wake_all;

/// `FUTEX_WAIT` on the low word of `index` while it holds `expected`, with
/// an optional relative timeout. `Ok(())` on wake or `EAGAIN`/`EINTR`/timeout
/// (the caller re-checks the word in every case).
pub use units::futex::wait as futex_wait;

/// `FUTEX_WAIT_BITSET` (shared) until an absolute `CLOCK_MONOTONIC`
/// deadline, and what it ended with.
pub use units::futex::{wait_until as futex_wait_until, WaitResult};

/// `futex2` flag: the word is 32 bits.
pub const FUTEX2_SIZE_U32: u32 = 0x02;

/// One entry of `futex_waitv(2)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FutexWaitv {
    pub val: u64,
    pub uaddr: u64,
    pub flags: u32,
    pub reserved: u32,
}

/// `futex_waitv(2)` system call number (the same on every 64-bit
/// architecture the project targets).
pub const SYS_FUTEX_WAITV: libc::c_long = 449;

/// What `futex_waitv` returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitvResult {
    /// The futex at this index was woken.
    Woken(usize),
    /// A word did not hold its expected value: more data.
    Again,
    /// The absolute deadline passed.
    TimedOut,
    /// A signal interrupted the wait.
    Interrupted,
}

/// `futex_waitv` on `waiters` with an absolute `CLOCK_MONOTONIC` deadline.
pub fn futex_waitv(waiters: &[FutexWaitv], deadline_ns: Option<u64>) -> io::Result<WaitvResult> {
    let ts = deadline_ns.map(timespec_of);
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `waiters` is a valid array of `futex_waitv` structs (repr(C),
    // layout per the uapi header) whose addresses point into live mappings;
    // `tsp` is null or a timespec that outlives the call.
    let r = unsafe {
        libc::syscall(
            SYS_FUTEX_WAITV,
            waiters.as_ptr(),
            waiters.len() as libc::c_uint,
            0u32,
            tsp,
            libc::CLOCK_MONOTONIC,
        )
    };
    if r >= 0 {
        return Ok(WaitvResult::Woken(r as usize));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) => Ok(WaitvResult::Again),
        Some(libc::ETIMEDOUT) => Ok(WaitvResult::TimedOut),
        Some(libc::EINTR) => Ok(WaitvResult::Interrupted),
        _ => Err(e),
    }
}

/// Whether the kernel has `futex_waitv` (5.16+): an empty call is refused
/// with `EINVAL` when it exists and `ENOSYS` when it does not.
pub fn has_futex_waitv() -> bool {
    // SAFETY: a null array with a zero count is never dereferenced.
    let r = unsafe {
        libc::syscall(
            SYS_FUTEX_WAITV,
            std::ptr::null::<FutexWaitv>(),
            0u32,
            0u32,
            std::ptr::null::<libc::timespec>(),
            libc::CLOCK_MONOTONIC,
        )
    };
    !(r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS))
}

/// The running kernel's release string (`uname -r`).
pub fn kernel_release() -> String {
    // SAFETY: utsname is plain old data; zeroed is a valid value.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return "unknown".into();
    }
    let bytes: Vec<u8> = u
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Takes descriptor `fd` of this process as the link to a simulation's
/// coordinator, after checking that it is open and a `SOCK_SEQPACKET`
/// socket (a number in the environment is not proof of either), and marks
/// it close-on-exec so that the controller's own children do not hold it.
/// The caller takes it once per process (see `EventLoop::new`).
pub fn adopt_seqpacket(fd: i32) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let mut ty: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `ty` and `len` are valid for writes of the sizes given;
    // getsockopt on a number that is no open socket fails (EBADF,
    // ENOTSOCK) and touches nothing else.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut ty as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if ty != libc::SOCK_SEQPACKET {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("descriptor {fd} is a socket of type {ty}, not SOCK_SEQPACKET"),
        ));
    }
    // SAFETY: `fd` is open (getsockopt succeeded) and was handed to this
    // process to own; the caller adopts it once per process, so nothing
    // else closes it.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    // SAFETY: F_SETFD on an open descriptor the caller owns.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned)
}

/// Sends one packet on a connected `SOCK_SEQPACKET` socket (no SIGPIPE
/// when the peer is gone: EPIPE instead), retrying on EINTR.
pub fn packet_send(fd: &std::os::fd::OwnedFd, buf: &[u8]) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: `buf` is valid for reads of its length; `fd` is open (owned).
        let r = unsafe {
            libc::send(
                fd.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one packet from a `SOCK_SEQPACKET` socket into `buf` (a
/// longer packet is cut to `buf`'s length), retrying on EINTR; 0 when the
/// peer has closed it.
pub fn packet_recv(fd: &std::os::fd::OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: `buf` is valid for writes of its length; `fd` is open.
        let r = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// CPU time the calling thread has used, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is valid for writes; CLOCK_THREAD_CPUTIME_ID exists on
    // every Linux this runs on (a failure leaves it 0).
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// The calling process's id.
#[inline]
pub fn getpid() -> u32 {
    std::process::id()
}

/// Start time (field 22 of `<proc_root>/<pid>/stat`, in clock ticks since
/// boot) of process `pid`, or `None` when the process does not exist.
pub fn process_start_time(proc_root: &Path, pid: u32) -> Option<u64> {
    // units::bounded: a stat line is a few hundred bytes; a FIFO or a
    // device in a fake /proc is refused, not waited on or read to its end.
    let text = units::bounded::Bound::pseudo(64 << 10)
        .read_lossy(&proc_root.join(pid.to_string()).join("stat"))
        .ok()?;
    // The command name (field 2) is in parentheses and may hold spaces or
    // parentheses: parse from the last `)`.
    let rest = &text[text.rfind(')')? + 1..];
    // rest starts with " <state> ..." = field 3; starttime is field 22.
    rest.split_ascii_whitespace().nth(22 - 3)?.parse().ok()
}
