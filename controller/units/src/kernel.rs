//! Kernel versions: what `uname -r` prints (`5.15.148-tegra`,
//! `6.12.6+deb13-rt-amd64`) and what robot.yaml writes (`kernel.version:
//! 5.15`, or the L4T release that implies one), and the first mainline
//! release of each kernel feature rtdeploy reasons about ([`needs`]).
//!
//! What a version means for a crate is that crate's: the CPU plan
//! (cpusets) asks for cgroup partitions, the runtime (controller) for its
//! wake backend. Both read the thresholds here, so the two never disagree
//! about which release brought what.

use std::fmt;

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

    /// Whether this is `major.minor` or later.
    pub fn at_least(self, (major, minor): (u32, u32)) -> bool {
        (self.major, self.minor) >= (major, minor)
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
}
