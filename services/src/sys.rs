//! The few system calls the supervisor makes that rustix does not wrap:
//! signalfd, poll on raw descriptors, mount and sched_getattr-free helpers.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Blocks `signals` for the calling thread and returns a signalfd that
/// reads them (non-blocking, close-on-exec). See signalfd(2).
pub fn signalfd(signals: &[i32]) -> std::io::Result<OwnedFd> {
    // SAFETY: sigset_t is plain data; sigemptyset initializes it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t for these calls.
    unsafe {
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
    }
    // SAFETY: `set` is initialized; the old mask is not wanted.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    // SAFETY: `set` is initialized; -1 asks for a new descriptor.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
    if fd == -1 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: signalfd returned a fresh descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads every pending signal number from a signalfd.
pub fn read_signals(fd: &OwnedFd) -> Vec<i32> {
    let mut out = Vec::new();
    loop {
        // SAFETY: signalfd_siginfo is plain data.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: `info` has room for exactly `size` bytes.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                (&mut info as *mut libc::signalfd_siginfo).cast(),
                size,
            )
        };
        if n != size as isize {
            break;
        }
        out.push(info.ssi_signo as i32);
    }
    out
}

/// One entry for [`poll`].
#[derive(Debug, Clone, Copy)]
pub struct Poll {
    pub fd: RawFd,
    pub want_write: bool,
    /// Set by [`poll`]: readable, hung up or in error.
    pub readable: bool,
    pub writable: bool,
}

impl Poll {
    pub fn read(fd: RawFd) -> Poll {
        Poll {
            fd,
            want_write: false,
            readable: false,
            writable: false,
        }
    }
}

/// poll(2) on raw descriptors; `None` waits forever. EINTR is a timeout.
pub fn poll(fds: &mut [Poll], timeout: Option<Duration>) -> std::io::Result<()> {
    let mut raw: Vec<libc::pollfd> = fds
        .iter()
        .map(|p| libc::pollfd {
            fd: p.fd,
            events: libc::POLLIN | if p.want_write { libc::POLLOUT } else { 0 },
            revents: 0,
        })
        .collect();
    let ms = match timeout {
        None => -1,
        Some(d) => {
            d.as_millis().min(i32::MAX as u128) as i32
                + i32::from(d.subsec_nanos() % 1_000_000 != 0)
        }
    };
    // SAFETY: `raw` is a valid array of `raw.len()` pollfd structs.
    let n = unsafe { libc::poll(raw.as_mut_ptr(), raw.len() as libc::nfds_t, ms) };
    if n == -1 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            return Ok(());
        }
        return Err(e);
    }
    for (p, r) in fds.iter_mut().zip(&raw) {
        p.readable =
            r.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0;
        p.writable = r.revents & (libc::POLLOUT | libc::POLLERR) != 0;
    }
    Ok(())
}

/// mount(2) with no data.
pub fn mount(
    source: &str,
    target: &std::path::Path,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let cs = |s: &[u8]| {
        CString::new(s).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    };
    let source = cs(source.as_bytes())?;
    let target = cs(target.as_os_str().as_bytes())?;
    let fstype = cs(fstype.as_bytes())?;
    let data = cs(data.as_bytes())?;
    // SAFETY: all four are valid NUL-terminated strings alive for the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// sync(2).
pub fn sync() {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
}

/// kill(-1, sig): every process the caller may signal except itself (and,
/// in a PID namespace, except its init). See kill(2).
pub fn kill_all(sig: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(-1, sig) };
}

/// SO_PEERCRED of a connected Unix socket: (pid, uid, gid). The pid is 0
/// when the peer is outside the caller's PID namespace.
pub fn peer_cred(fd: RawFd) -> std::io::Result<(i32, u32, u32)> {
    // SAFETY: ucred is plain data.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` describe a writable buffer of the right size.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((cred.pid, cred.uid, cred.gid))
}
