//! The loop's backends and the probe that picks one: what the kernel
//! offers (io_uring futex waits, `futex_waitv`, or only plain futexes),
//! and the test instrumentation that makes a kernel look older.
#![allow(unsafe_code)]

use std::io;

use io_uring::{opcode, IoUring};
use serde::Serialize;

use crate::sys;

/// How the loop sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Backend {
    /// `IORING_OP_FUTEX_WAIT` kept armed per channel (Linux 6.7+).
    #[serde(rename = "io_uring-futex")]
    IoUringFutex,
    /// One `futex_waitv` call per sleep (Linux 5.16+).
    #[serde(rename = "futex_waitv")]
    FutexWaitv,
    /// One `FUTEX_WAIT_BITSET` on the loop's own bell per sleep (any
    /// kernel; see [`crate::doorbell`]).
    #[serde(rename = "doorbell")]
    Doorbell,
    /// No sleep at all: a simulation's loop runs when its driver gives it
    /// a turn, at the driver's virtual time ([`crate::sim`]). Never
    /// probed or picked; only a loop made on a virtual clock has it.
    #[serde(rename = "simulated")]
    Simulated,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::IoUringFutex => "io_uring-futex",
            Backend::FutexWaitv => "futex_waitv",
            Backend::Doorbell => "doorbell",
            Backend::Simulated => "simulated",
        }
    }

    /// Every backend of a real loop, best first (the order the probe picks
    /// in); [`Backend::Simulated`] is not one.
    pub const ALL: [Backend; 3] = [
        Backend::IoUringFutex,
        Backend::FutexWaitv,
        Backend::Doorbell,
    ];

    /// The backend of a real loop a name (as [`Backend::name`] spells it)
    /// stands for: one a loop can be told to use.
    pub fn from_name(name: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.name() == name)
    }

    /// The code a timing report carries for it (0: unknown).
    pub fn code(self) -> u64 {
        match self {
            Backend::IoUringFutex => 1,
            Backend::FutexWaitv => 2,
            Backend::Doorbell => 3,
            Backend::Simulated => 4,
        }
    }

    /// The backend a timing report's code stands for.
    pub fn from_code(code: u64) -> Option<Backend> {
        Backend::ALL
            .into_iter()
            .chain([Backend::Simulated])
            .find(|b| b.code() == code)
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the kernel offers.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    pub kernel: String,
    /// A ring with SINGLE_ISSUER | DEFER_TASKRUN that supports
    /// IORING_OP_FUTEX_WAIT.
    pub io_uring_futex: bool,
    /// Why not, when not.
    pub io_uring_problem: Option<String>,
    pub futex_waitv: bool,
    /// The doorbell backend (plain futex waits: every kernel has them).
    pub doorbell: bool,
    /// The backend a loop would use.
    pub backend: Option<Backend>,
}

impl ProbeReport {
    /// Whether `b` is available.
    pub fn has(&self, b: Backend) -> bool {
        match b {
            Backend::IoUringFutex => self.io_uring_futex,
            Backend::FutexWaitv => self.futex_waitv,
            Backend::Doorbell => self.doorbell,
            Backend::Simulated => false,
        }
    }
}

/// Test instrumentation: makes [`probe`] report io_uring futex waits
/// and/or `futex_waitv` missing, as a 5.10 or 5.15 kernel would (with
/// io_uring itself still there, which a seccomp profile cannot show).
#[cfg(feature = "fault-injection")]
pub fn hide_backends_from_probe(io_uring_futex: bool, futex_waitv: bool) {
    HIDE_IO_URING_FUTEX.store(io_uring_futex, std::sync::atomic::Ordering::SeqCst);
    HIDE_FUTEX_WAITV.store(futex_waitv, std::sync::atomic::Ordering::SeqCst);
}

#[cfg(feature = "fault-injection")]
static HIDE_IO_URING_FUTEX: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
#[cfg(feature = "fault-injection")]
static HIDE_FUTEX_WAITV: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Test instrumentation: the kernel profile ([`units::env::TEST_KERNEL_PROFILE`])
/// asks for, applied to the whole process once, at the first probe:
/// `jetpack6` (a 5.15 kernel: io_uring without futex waits, reported
/// missing by the probe, and `futex_waitv` answering ENOSYS through
/// seccomp) or `no-io_uring` (io_uring and `futex_waitv` answering ENOSYS,
/// as with `kernel.io_uring_disabled` or a container's profile). Test
/// binaries re-run themselves under each to run their suites on the
/// doorbell backend.
#[cfg(feature = "fault-injection")]
fn apply_test_kernel_profile() {
    use crate::seccomp::{Deniable, DenyFilter};
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(profile) = std::env::var(units::env::TEST_KERNEL_PROFILE) else {
            return;
        };
        let deny: &[Deniable] = match profile.as_str() {
            "jetpack6" => {
                hide_backends_from_probe(true, false);
                &[Deniable::FutexWaitv]
            }
            "no-io_uring" => &[Deniable::IoUring, Deniable::FutexWaitv],
            other => panic!("unknown {} {other:?}", units::env::TEST_KERNEL_PROFILE),
        };
        DenyFilter::new(deny)
            .install(true)
            .expect("installing the test kernel profile's seccomp filter");
    });
}

fn hidden(b: Backend) -> bool {
    #[cfg(feature = "fault-injection")]
    {
        use std::sync::atomic::Ordering::SeqCst;
        match b {
            Backend::IoUringFutex => HIDE_IO_URING_FUTEX.load(SeqCst),
            Backend::FutexWaitv => HIDE_FUTEX_WAITV.load(SeqCst),
            Backend::Doorbell | Backend::Simulated => false,
        }
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        let _ = b;
        false
    }
}

pub(super) fn build_ring(entries: u32) -> io::Result<IoUring> {
    IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(entries)
}

/// Probes the kernel for the loop's backends.
pub fn probe() -> ProbeReport {
    #[cfg(feature = "fault-injection")]
    apply_test_kernel_profile();
    let kernel = sys::kernel_release();
    let (io_uring_futex, io_uring_problem) = match build_ring(8) {
        Err(e) => (
            false,
            Some(format!(
                "io_uring setup with SINGLE_ISSUER | DEFER_TASKRUN failed: {e}"
            )),
        ),
        Ok(ring) => {
            let mut p = io_uring::Probe::new();
            match ring.submitter().register_probe(&mut p) {
                Err(e) => (false, Some(format!("io_uring opcode probe failed: {e}"))),
                Ok(()) if p.is_supported(opcode::FutexWait::CODE) => (true, None),
                Ok(()) => (
                    false,
                    Some("io_uring has no IORING_OP_FUTEX_WAIT (needs Linux 6.7+)".into()),
                ),
            }
        }
    };
    let (io_uring_futex, io_uring_problem) = if io_uring_futex && hidden(Backend::IoUringFutex) {
        (
            false,
            Some("io_uring has no IORING_OP_FUTEX_WAIT (hidden from the probe for a test)".into()),
        )
    } else {
        (io_uring_futex, io_uring_problem)
    };
    let futex_waitv = sys::has_futex_waitv() && !hidden(Backend::FutexWaitv);
    let mut p = ProbeReport {
        kernel,
        io_uring_futex,
        io_uring_problem,
        futex_waitv,
        doorbell: true,
        backend: None,
    };
    p.backend = Backend::ALL.into_iter().find(|&b| p.has(b));
    p
}
