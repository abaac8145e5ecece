//! Making a process see an older kernel: a seccomp filter that answers
//! `ENOSYS` to the system calls a JetPack 5 (5.10) or JetPack 6 (5.15)
//! kernel does not have, so the runtime's probe picks the backend it would
//! pick there. The supervisor installs it between `fork` and `exec` when
//! told to (`RTDEPLOY_DENY_SYSCALLS`); tests install it on themselves.
//!
//! This is a way to test behaviour, not a security boundary: calls through
//! another ABI of the architecture (x32 on x86_64, for one) pass.
#![allow(unsafe_code)]

use std::io;

/// A group of system calls the filter can deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Deniable {
    /// `io_uring_setup`, `io_uring_enter`, `io_uring_register` (as with
    /// `kernel.io_uring_disabled=2` or a container's default profile).
    IoUring,
    /// `futex_waitv` (Linux 5.16+).
    FutexWaitv,
}

impl Deniable {
    pub const ALL: [Deniable; 2] = [Deniable::IoUring, Deniable::FutexWaitv];

    pub fn name(self) -> &'static str {
        match self {
            Deniable::IoUring => "io_uring",
            Deniable::FutexWaitv => "futex_waitv",
        }
    }

    fn numbers(self) -> &'static [u32] {
        // The same numbers on x86_64 and aarch64 (both come from the
        // shared table for system calls added since 4.x).
        match self {
            Deniable::IoUring => &[425, 426, 427],
            Deniable::FutexWaitv => &[449],
        }
    }
}

/// A list that is not a list of deniable system calls.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a system call group the filter denies (io_uring, futex_waitv)")]
pub struct UnknownDeniable(pub String);

/// Parses `io_uring,futex_waitv` (commas or spaces; empty: nothing).
pub fn parse_list(text: &str) -> Result<Vec<Deniable>, UnknownDeniable> {
    let mut out = Vec::new();
    for name in text
        .split(|c: char| c == ',' || c.is_ascii_whitespace())
        .filter(|s| !s.is_empty())
    {
        let d = Deniable::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| UnknownDeniable(name.chars().take(64).collect()))?;
        if !out.contains(&d) {
            out.push(d);
        }
    }
    Ok(out)
}

/// One classic BPF instruction (`struct sock_filter`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct SockFilter {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

/// `struct sock_fprog`.
#[repr(C)]
struct SockFprog {
    len: u16,
    filter: *const SockFilter,
}

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_RET_K: u16 = 0x06;
/// `offsetof(struct seccomp_data, nr)` and `arch`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_SET_MODE_FILTER: libc::c_ulong = 1;
const SECCOMP_FILTER_FLAG_TSYNC: libc::c_ulong = 1;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// A filter built ahead of time (allocation happens here, never in
/// [`DenyFilter::install`], which a forked child calls).
#[derive(Debug, Clone)]
pub struct DenyFilter {
    prog: Vec<SockFilter>,
    denied: Vec<Deniable>,
}

impl DenyFilter {
    pub fn new(deny: &[Deniable]) -> DenyFilter {
        let numbers: Vec<u32> = deny.iter().flat_map(|d| d.numbers()).copied().collect();
        // Jump offsets are 8 bits; the groups hold 4 calls at most.
        let n = numbers.len();
        debug_assert!(n < 200);
        let mut prog = Vec::with_capacity(n + 5);
        // Another architecture's calls (a 32-bit ABI): allowed.
        prog.push(SockFilter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: DATA_ARCH,
        });
        prog.push(SockFilter {
            code: BPF_JEQ_K,
            jt: 0,
            jf: (n + 1) as u8, // to the ALLOW
            k: AUDIT_ARCH,
        });
        prog.push(SockFilter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: DATA_NR,
        });
        for (i, nr) in numbers.iter().enumerate() {
            // Match: jump to the ENOSYS return after the remaining tests
            // and the ALLOW.
            prog.push(SockFilter {
                code: BPF_JEQ_K,
                jt: (n - i) as u8,
                jf: 0,
                k: *nr,
            });
        }
        prog.push(SockFilter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: RET_ALLOW,
        });
        prog.push(SockFilter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: RET_ERRNO | libc::ENOSYS as u32,
        });
        DenyFilter {
            prog,
            denied: deny.to_vec(),
        }
    }

    pub fn denied(&self) -> &[Deniable] {
        &self.denied
    }

    /// Installs the filter on the calling thread, or (`all_threads`) on
    /// every thread of the process. Sets `no_new_privs` first (required
    /// without CAP_SYS_ADMIN). Only async-signal-safe calls: fine between
    /// `fork` and `exec`.
    pub fn install(&self, all_threads: bool) -> io::Result<()> {
        let prog = SockFprog {
            len: self.prog.len() as u16,
            filter: self.prog.as_ptr(),
        };
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = if all_threads {
            SECCOMP_FILTER_FLAG_TSYNC
        } else {
            0
        };
        // SAFETY: `prog` points to `self.prog`, a valid array of `len`
        // instructions alive for the call (the kernel copies it).
        let r = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                SECCOMP_SET_MODE_FILTER,
                flags,
                &prog as *const SockFprog,
            )
        };
        if r != 0 {
            // With TSYNC a positive result names a thread that could not
            // be synchronised: said as EBUSY (no allocation here, this runs
            // between fork and exec).
            return Err(if r > 0 {
                io::Error::from_raw_os_error(libc::EBUSY)
            } else {
                io::Error::last_os_error()
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_unknown_names_are_refused() {
        assert_eq!(
            parse_list("io_uring, futex_waitv io_uring").unwrap(),
            vec![Deniable::IoUring, Deniable::FutexWaitv]
        );
        assert!(parse_list("").unwrap().is_empty());
        let e = parse_list("io_uring,epoll").unwrap_err().to_string();
        assert!(e.contains("`epoll`"), "{e}");
    }

    #[test]
    fn a_denied_call_answers_enosys_in_a_child_and_others_still_work() {
        // In a forked child: the filter stays with the process.
        // SAFETY: the child only makes async-signal-safe calls and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let f = DenyFilter::new(&[Deniable::IoUring, Deniable::FutexWaitv]);
            let code = match f.install(false) {
                Err(_) => 10,
                Ok(()) => {
                    // SAFETY: invalid arguments; only the error matters.
                    let r = unsafe { libc::syscall(425, 0, 0) };
                    let e = io::Error::last_os_error().raw_os_error();
                    // SAFETY: as above.
                    let w = unsafe { libc::syscall(449, 0, 0, 0, 0, 0) };
                    let ew = io::Error::last_os_error().raw_os_error();
                    if r != -1 || e != Some(libc::ENOSYS) {
                        11
                    } else if w != -1 || ew != Some(libc::ENOSYS) {
                        12
                    } else if std::process::id() == 0 {
                        13
                    } else {
                        0
                    }
                }
            };
            // SAFETY: leaves the child without running the test harness.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "{status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0);
    }
}
