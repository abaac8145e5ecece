//! What a kernel version offers the runtime, known before the board
//! boots: `robot.yaml` may name the kernel the board ships
//! (`kernel.version`, or the L4T release that implies it), and `deploy
//! plan` and `config check` reason from it with the thresholds of
//! [`units::kernel::needs`].
//!
//! On a running system the event loop's probe ([`crate::event_loop::probe`])
//! decides, not the version: io_uring may be switched off
//! (`kernel.io_uring_disabled`) or filtered by seccomp on a kernel new
//! enough to have it, and a vendor kernel may carry a backport. The version
//! says what the kernel *can* do; the probe says what this process *may*.

use units::kernel::{needs, KernelVersion};

use crate::event_loop::Backend;

/// The running kernel's release string, as `uname -r` prints it
/// (`unknown` when `uname(2)` fails).
pub fn release() -> String {
    crate::sys::kernel_release()
}

/// The running kernel's version, when `uname -r` parses.
pub fn running() -> Option<KernelVersion> {
    KernelVersion::parse(&release()).ok()
}

/// What a kernel version offers (see [`needs`] for each threshold).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Capabilities {
    pub io_uring_futex: bool,
    pub futex_waitv: bool,
    pub isolated_partition: bool,
    pub cpus_exclusive: bool,
}

impl Capabilities {
    /// What `version` offers.
    pub fn of(version: KernelVersion) -> Capabilities {
        Capabilities {
            io_uring_futex: version.at_least(needs::IO_URING_FUTEX),
            futex_waitv: version.at_least(needs::FUTEX_WAITV),
            isolated_partition: version.at_least(needs::ISOLATED_PARTITION),
            cpus_exclusive: version.at_least(needs::CPUS_EXCLUSIVE),
        }
    }
}

impl Backend {
    /// The backend the event loop picks on kernel `version` when io_uring
    /// is neither switched off nor filtered (the probe's order: the best
    /// the kernel has).
    pub fn expected_on(version: KernelVersion) -> Backend {
        let c = Capabilities::of(version);
        if c.io_uring_futex {
            Backend::IoUringFutex
        } else if c.futex_waitv {
            Backend::FutexWaitv
        } else {
            Backend::Doorbell
        }
    }
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
        let caps = version.map(Capabilities::of);
        let mut f = KernelFacts {
            found_by: if version.is_some() {
                "version"
            } else {
                "unknown"
            },
            io_uring_futex: caps.is_some_and(|c| c.io_uring_futex),
            io_uring_problem: None,
            futex_waitv: caps.is_some_and(|c| c.futex_waitv),
            wake_backend: version.map(|v| Backend::expected_on(v).name()),
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
    fn jetpack_kernels_get_the_doorbell_and_mainline_the_io_uring_futex() {
        let v = |s| KernelVersion::parse(s).unwrap();
        let expected_backend = |s| Backend::expected_on(v(s));
        assert_eq!(expected_backend("5.10.216-tegra"), Backend::Doorbell);
        assert_eq!(expected_backend("5.15.148-tegra"), Backend::Doorbell);
        assert_eq!(expected_backend("5.16"), Backend::FutexWaitv);
        assert_eq!(expected_backend("6.6.70"), Backend::FutexWaitv);
        assert_eq!(expected_backend("6.7"), Backend::IoUringFutex);
        assert_eq!(expected_backend("6.12.6"), Backend::IoUringFutex);
        let c = Capabilities::of(v("6.1.0"));
        assert!(c.isolated_partition && !c.cpus_exclusive && !c.io_uring_futex && c.futex_waitv);
        let c = Capabilities::of(v("6.0.19"));
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
