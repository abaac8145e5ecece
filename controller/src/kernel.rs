//! What a kernel version offers the runtime and the CPU plan, known before
//! the board boots: `robot.yaml` may name the kernel the board ships
//! (`kernel.version`, or the L4T release that implies it), and `deploy
//! plan` and `config check` reason from it with these thresholds.
//!
//! On a running system the event loop's probe ([`crate::event_loop::probe`])
//! decides, not the version: io_uring may be switched off
//! (`kernel.io_uring_disabled`) or filtered by seccomp on a kernel new
//! enough to have it, and a vendor kernel may carry a backport. The version
//! says what the kernel *can* do; the probe says what this process *may*.

use std::fmt;

use crate::event_loop::Backend;

/// A kernel's `major.minor.patch`, from what `uname -r` prints
/// (`5.15.148-tegra`, `6.12.6+deb13-rt-amd64`) or what a user writes
/// (`5.15`, `6.1.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KernelVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

/// The longest text [`KernelVersion::parse`] looks at; a release string
/// is at most 64 bytes (`struct utsname`).
const MAX_TEXT: usize = 64;

/// Why a text is not a kernel version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelVersionError {
    #[error(
        "`{text}` is not a kernel version (expected like `5.15`, `6.1.0` or `5.15.148-tegra`)"
    )]
    NotAVersion { text: String },
    #[error("a kernel version is at most {MAX_TEXT} characters (got {len})")]
    TooLong { len: usize },
}

impl KernelVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> KernelVersion {
        KernelVersion {
            major,
            minor,
            patch,
        }
    }

    /// Parses `major.minor[.patch]`, followed by nothing or by a local
    /// version starting with `-`, `+` or `~` (`-tegra`, `+deb13-rt-amd64`).
    pub fn parse(text: &str) -> Result<KernelVersion, KernelVersionError> {
        if text.len() > MAX_TEXT {
            return Err(KernelVersionError::TooLong { len: text.len() });
        }
        let t = text.trim();
        let bad = || KernelVersionError::NotAVersion { text: t.into() };
        let end = t.find(['-', '+', '~']).unwrap_or(t.len());
        let (numbers, local) = t.split_at(end);
        if end == 0 || (!local.is_empty() && local.len() == 1) {
            return Err(bad());
        }
        let mut parts = numbers.split('.');
        let mut next = |required: bool| -> Result<u32, KernelVersionError> {
            match parts.next() {
                Some(p)
                    if !p.is_empty() && p.len() <= 6 && p.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    p.parse().map_err(|_| bad())
                }
                None if !required => Ok(0),
                _ => Err(bad()),
            }
        };
        let major = next(true)?;
        let minor = next(true)?;
        let patch = next(false)?;
        if parts.next().is_some() || major == 0 {
            return Err(bad());
        }
        Ok(KernelVersion::new(major, minor, patch))
    }

    /// The running kernel's version, when `uname -r` parses.
    pub fn running() -> Option<KernelVersion> {
        KernelVersion::parse(&crate::sys::kernel_release()).ok()
    }

    /// Whether this is `major.minor` or later.
    pub fn at_least(self, (major, minor): (u32, u32)) -> bool {
        (self.major, self.minor) >= (major, minor)
    }

    /// What this version offers.
    pub fn capabilities(self) -> Capabilities {
        Capabilities {
            io_uring_futex: self.at_least(needs::IO_URING_FUTEX),
            futex_waitv: self.at_least(needs::FUTEX_WAITV),
            isolated_partition: self.at_least(needs::ISOLATED_PARTITION),
            cpus_exclusive: self.at_least(needs::CPUS_EXCLUSIVE),
        }
    }

    /// The backend the event loop picks on this kernel when io_uring is
    /// neither switched off nor filtered (the probe's order: the best
    /// the kernel has).
    pub fn expected_backend(self) -> Backend {
        let c = self.capabilities();
        if c.io_uring_futex {
            Backend::IoUringFutex
        } else if c.futex_waitv {
            Backend::FutexWaitv
        } else {
            Backend::Doorbell
        }
    }
}

impl fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The first mainline release (`major`, `minor`) with each feature.
pub mod needs {
    /// `IORING_OP_FUTEX_WAIT`: the `io_uring-futex` backend.
    pub const IO_URING_FUTEX: (u32, u32) = (6, 7);
    /// `futex_waitv(2)`: the `futex_waitv` backend.
    pub const FUTEX_WAITV: (u32, u32) = (5, 16);
    /// `cpuset.cpus.partition = isolated` (cgroup v2).
    pub const ISOLATED_PARTITION: (u32, u32) = (6, 1);
    /// `cpuset.cpus.exclusive`: a partition below the top level, as
    /// `rtdeploy/rt` is.
    pub const CPUS_EXCLUSIVE: (u32, u32) = (6, 7);

    /// `major.minor`, for messages.
    pub fn show((major, minor): (u32, u32)) -> String {
        format!("{major}.{minor}")
    }
}

/// What a kernel version offers (see [`needs`] for each threshold).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Capabilities {
    pub io_uring_futex: bool,
    pub futex_waitv: bool,
    pub isolated_partition: bool,
    pub cpus_exclusive: bool,
}

/// What a kernel offers, as `deploy verify` and the check's host facts
/// report it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KernelFacts {
    /// `probe`: this process asked the running kernel (io_uring switched
    /// off or filtered shows); `version`: read off the release of a kernel
    /// that is not the one running here (a captured tree), or `unknown`
    /// when that release does not parse.
    pub found_by: &'static str,
    pub io_uring_futex: bool,
    /// Why no io_uring futex wait, when the probe found none.
    pub io_uring_problem: Option<String>,
    pub futex_waitv: bool,
    /// The backend an event loop picks (none when unknown).
    pub wake_backend: Option<&'static str>,
    /// `cpuset.cpus.partition = isolated` (by version).
    pub isolated_partition: bool,
    /// Nested partitions with `cpuset.cpus.exclusive` (by version).
    pub cpus_exclusive: bool,
}

impl KernelFacts {
    /// The facts of the kernel whose `uname -r` is `release`: probed when
    /// `live` (it is the kernel this process runs on), else by version.
    pub fn of(release: &str, live: bool) -> KernelFacts {
        let version = KernelVersion::parse(release).ok();
        let caps = version.map(KernelVersion::capabilities);
        let mut f = KernelFacts {
            found_by: if version.is_some() {
                "version"
            } else {
                "unknown"
            },
            io_uring_futex: caps.is_some_and(|c| c.io_uring_futex),
            io_uring_problem: None,
            futex_waitv: caps.is_some_and(|c| c.futex_waitv),
            wake_backend: version.map(|v| v.expected_backend().name()),
            isolated_partition: caps.is_some_and(|c| c.isolated_partition),
            cpus_exclusive: caps.is_some_and(|c| c.cpus_exclusive),
        };
        if live {
            let p = crate::event_loop::probe();
            f.found_by = "probe";
            f.io_uring_futex = p.io_uring_futex;
            f.io_uring_problem = p.io_uring_problem;
            f.futex_waitv = p.futex_waitv;
            f.wake_backend = p.backend.map(Backend::name);
        }
        f
    }

    /// One line: `wake backend doorbell (io_uring futex: no (...), futex_waitv: no); partitions: isolated no, nested no`.
    pub fn summary(&self) -> String {
        let yes = |b: bool| if b { "yes" } else { "no" };
        let why = match (&self.io_uring_problem, self.io_uring_futex) {
            (Some(p), false) => format!(" ({p})"),
            _ => String::new(),
        };
        format!(
            "wake backend {} (io_uring futex wait: {}{why}; futex_waitv: {}); cgroup partitions: isolated {}, nested {}; by {}",
            self.wake_backend.unwrap_or("unknown"),
            yes(self.io_uring_futex),
            yes(self.futex_waitv),
            yes(self.isolated_partition),
            yes(self.cpus_exclusive),
            self.found_by
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_as_uname_prints_them_and_as_users_write_them() {
        for (text, want) in [
            ("5.15", (5, 15, 0)),
            ("5.10.216-tegra", (5, 10, 216)),
            ("5.15.148-tegra", (5, 15, 148)),
            ("6.12.6+deb13-rt-amd64", (6, 12, 6)),
            ("6.18.0", (6, 18, 0)),
            (" 6.1 ", (6, 1, 0)),
            ("5.10.0-32-rt-amd64", (5, 10, 0)),
        ] {
            let v = KernelVersion::parse(text).unwrap();
            assert_eq!((v.major, v.minor, v.patch), want, "{text}");
        }
        for bad in [
            "",
            "5",
            "5.",
            ".15",
            "5.15.1.2",
            "v5.15",
            "5.x",
            "0.9",
            "5.15-",
            "-rt",
            "99999999.1",
        ] {
            assert!(KernelVersion::parse(bad).is_err(), "{bad:?} parsed");
        }
        let long = "5.".repeat(100);
        assert_eq!(
            KernelVersion::parse(&long).unwrap_err(),
            KernelVersionError::TooLong { len: 200 }
        );
    }

    #[test]
    fn jetpack_kernels_get_the_doorbell_and_mainline_the_io_uring_futex() {
        let v = |s| KernelVersion::parse(s).unwrap();
        assert_eq!(v("5.10.216-tegra").expected_backend(), Backend::Doorbell);
        assert_eq!(v("5.15.148-tegra").expected_backend(), Backend::Doorbell);
        assert_eq!(v("5.16").expected_backend(), Backend::FutexWaitv);
        assert_eq!(v("6.6.70").expected_backend(), Backend::FutexWaitv);
        assert_eq!(v("6.7").expected_backend(), Backend::IoUringFutex);
        assert_eq!(v("6.12.6").expected_backend(), Backend::IoUringFutex);
        let c = v("6.1.0").capabilities();
        assert!(c.isolated_partition && !c.cpus_exclusive && !c.io_uring_futex && c.futex_waitv);
        let c = v("6.0.19").capabilities();
        assert!(!c.isolated_partition);
    }

    #[test]
    fn facts_of_a_captured_kernel_come_from_its_version() {
        let f = KernelFacts::of("5.15.148-tegra", false);
        assert_eq!(f.found_by, "version");
        assert_eq!(f.wake_backend, Some("doorbell"));
        assert!(!f.io_uring_futex && !f.futex_waitv && !f.isolated_partition);
        assert!(
            f.summary()
                .starts_with("wake backend doorbell (io_uring futex wait: no; futex_waitv: no)"),
            "{}",
            f.summary()
        );
        let f = KernelFacts::of("not a kernel", false);
        assert_eq!((f.found_by, f.wake_backend), ("unknown", None));
        // The running kernel is probed: what the probe picks is what a
        // loop here would run on.
        let f = KernelFacts::of(&crate::sys::kernel_release(), true);
        assert_eq!(f.found_by, "probe");
        assert_eq!(
            f.wake_backend,
            crate::event_loop::probe().backend.map(Backend::name)
        );
    }
}
