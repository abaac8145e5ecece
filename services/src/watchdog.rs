//! The board's hardware watchdog (robot.yaml `watchdog:`), owned by the
//! supervisor.
//!
//! The supervisor opens the device at start, sets its timeout and feeds it
//! from its event loop at a quarter of the timeout the driver took. It
//! never writes the magic close character while it runs, so a supervisor
//! that stops turning (frozen, SIGSTOP, stuck in the kernel, its process
//! killed) leaves the watchdog running unfed and the board resets. Only an
//! orderly stop releases it ([`Watchdog::release`]: `V`, then close),
//! which stops it unless the driver was loaded with `nowayout`; a restart
//! of the supervisor (`deploy supervise` executing itself anew) closes the
//! descriptor without `V`, so the watchdog runs on and the new start opens
//! it again.
//!
//! The kernel's interface, `Documentation/watchdog/watchdog-api.rst`:
//! `WDIOC_GETSUPPORT` (identity, options), `WDIOC_SETTIMEOUT` (seconds; the
//! driver answers with what it set), `WDIOC_GETTIMEOUT`, `WDIOC_KEEPALIVE`;
//! opening the device starts the watchdog; writing `V` before close stops
//! it when the driver has `WDIOF_MAGICCLOSE` and not `nowayout`.
//!
//! A device that is missing, is not a watchdog, or refuses the timeout
//! does not stop the supervisor: [`Watchdog::open`] says why, the start-up
//! step shows it, and the status keeps it for as long as the supervisor
//! runs.

#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The shortest timeout robot.yaml may ask for: the supervisor's loop
/// turns at least once a second and feeds at a quarter of the timeout.
pub const MIN_TIMEOUT_S: u64 = 4;
/// The longest: an hour (drivers cap lower: i6300esb 2046 s, the Tegra
/// timer's watchdog 255 s).
pub const MAX_TIMEOUT_S: u64 = 3600;

// linux/watchdog.h, with the generic ioctl encoding (x86_64 and arm64):
// _IOR('W', nr, T) = 2 << 30 | size_of::<T>() << 16 | 'W' << 8 | nr.
const fn ior(nr: u32, size: u32) -> u32 {
    (2 << 30) | (size << 16) | ((b'W' as u32) << 8) | nr
}
const fn iowr(nr: u32, size: u32) -> u32 {
    (3 << 30) | (size << 16) | ((b'W' as u32) << 8) | nr
}
const WDIOC_GETSUPPORT: u32 = ior(0, std::mem::size_of::<WatchdogInfo>() as u32);
const WDIOC_KEEPALIVE: u32 = ior(5, 4);
const WDIOC_SETTIMEOUT: u32 = iowr(6, 4);
const WDIOC_GETTIMEOUT: u32 = ior(7, 4);
const WDIOF_SETTIMEOUT: u32 = 0x0080;
const WDIOF_MAGICCLOSE: u32 = 0x0100;

/// `struct watchdog_info`.
#[repr(C)]
#[derive(Default)]
struct WatchdogInfo {
    options: u32,
    firmware_version: u32,
    identity: [u8; 32],
}

/// The watchdog as the status shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WatchdogStatus {
    /// The device robot.yaml names.
    pub device: String,
    /// `armed` (open and fed), `refused` (open and fed, but at another
    /// timeout than asked), `missing` (not there, or not a watchdog: the
    /// board does not reset), `skipped` (not opened: a robot under a
    /// prefix on this machine's own /dev).
    pub state: String,
    /// The driver's identity (`i6300ESB timer`, `Tegra WDT`), when it
    /// answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The timeout robot.yaml asks for, in seconds.
    pub asked_s: u64,
    /// The timeout in force, in seconds, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
    /// How often the supervisor feeds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feed_every_s: Option<f64>,
    /// Feeds since the supervisor started.
    pub fed: u64,
    /// Seconds since the last feed, when it was fed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fed_s_ago: Option<f64>,
    /// Why it is not `armed`, or the last feed that failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl WatchdogStatus {
    /// One line for `deploy status`.
    pub fn describe(&self) -> String {
        let mut s = format!("{} {}", self.device, self.state);
        if let Some(id) = &self.identity {
            s.push_str(&format!(" ({id})"));
        }
        if let Some(t) = self.timeout_s {
            s.push_str(&format!(", timeout {t}s"));
            if t != self.asked_s {
                s.push_str(&format!(" (asked {}s)", self.asked_s));
            }
        }
        if let Some(e) = self.feed_every_s {
            s.push_str(&format!(", fed every {e:.1}s"));
        }
        if let Some(a) = self.last_fed_s_ago {
            s.push_str(&format!(", last {a:.1}s ago"));
        }
        if !self.detail.is_empty() {
            s.push_str(&format!(": {}", self.detail));
        }
        s
    }
}

/// What the supervisor holds: an open watchdog, or why there is none.
pub enum Held {
    Open(Watchdog),
    Missing(WatchdogStatus),
}

impl Held {
    /// Opens `path` (robot.yaml's `device`, `shown` as written) and sets
    /// `timeout`; never fails: a device that cannot be used is kept as the
    /// reason.
    pub fn open(path: &Path, shown: &str, timeout: Duration, now: Instant) -> Held {
        match Watchdog::open(path, shown, timeout, now) {
            Ok(w) => Held::Open(w),
            Err(e) => Held::Missing(WatchdogStatus {
                device: shown.to_string(),
                state: "missing".into(),
                asked_s: timeout.as_secs(),
                detail: format!("{e}; the board does not reset if the supervisor stops"),
                ..Default::default()
            }),
        }
    }

    /// robot.yaml's watchdog, not opened, and why.
    pub fn skipped(shown: &str, timeout: Duration, why: &str) -> Held {
        Held::Missing(WatchdogStatus {
            device: shown.to_string(),
            state: "skipped".into(),
            asked_s: timeout.as_secs(),
            detail: why.to_string(),
            ..Default::default()
        })
    }

    pub fn status(&self, now: Instant) -> WatchdogStatus {
        match self {
            Held::Open(w) => w.status(now),
            Held::Missing(s) => s.clone(),
        }
    }

    /// When it must be fed next (none without one).
    pub fn next_feed(&self) -> Option<Instant> {
        match self {
            Held::Open(w) => Some(w.next_feed),
            Held::Missing(_) => None,
        }
    }

    /// Feeds it when due; a feed that fails is said once, the first time.
    pub fn feed_if_due(&mut self, now: Instant) -> Option<String> {
        match self {
            Held::Open(w) => w.feed_if_due(now),
            Held::Missing(_) => None,
        }
    }

    /// The start-up step.
    pub fn step(&self, now: Instant) -> crate::status::StepStatus {
        let s = self.status(now);
        crate::status::StepStatus {
            step: "watchdog".into(),
            result: match s.state.as_str() {
                "armed" => "ok",
                "skipped" => "skipped",
                _ => "failed",
            }
            .into(),
            detail: s.describe(),
        }
    }
}

/// Why a device cannot be the watchdog.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{0}: not there ({1})")]
    Absent(String, std::io::Error),
    #[error("{0}: not a character device")]
    NotADevice(String),
    #[error("{0}: cannot open it ({1})")]
    Open(String, std::io::Error),
    #[error("{0}: not a watchdog (WDIOC_GETSUPPORT: {1})")]
    NotAWatchdog(String, std::io::Error),
}

/// An open, running watchdog.
pub struct Watchdog {
    fd: OwnedFd,
    device: String,
    identity: String,
    magic_close: bool,
    asked: Duration,
    /// What the driver took (none: it did not say).
    timeout: Option<Duration>,
    feed_every: Duration,
    next_feed: Instant,
    last_fed: Option<Instant>,
    fed: u64,
    /// Why the timeout in force is not the one asked, or the first feed
    /// that failed.
    detail: String,
    said_feed_error: bool,
}

impl Watchdog {
    /// Opens the device (which starts it), sets the timeout and feeds it
    /// once.
    pub fn open(
        path: &Path,
        shown: &str,
        timeout: Duration,
        now: Instant,
    ) -> Result<Watchdog, OpenError> {
        let name = shown.to_string();
        // A character device only: a regular file or FIFO named by
        // mistake is neither written nor waited on.
        let meta = std::fs::metadata(path).map_err(|e| OpenError::Absent(name.clone(), e))?;
        if !meta.file_type().is_char_device() {
            return Err(OpenError::NotADevice(name));
        }
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(|e| OpenError::Open(name.clone(), e))?;
        let fd: OwnedFd = file.into();
        if !rustix::fs::fstat(&fd)
            .map(|st| {
                rustix::fs::FileType::from_raw_mode(st.st_mode)
                    == rustix::fs::FileType::CharacterDevice
            })
            .unwrap_or(false)
        {
            return Err(OpenError::NotADevice(name));
        }
        let mut info = WatchdogInfo::default();
        ioctl(
            &fd,
            WDIOC_GETSUPPORT,
            &mut info as *mut WatchdogInfo as *mut libc::c_void,
        )
        .map_err(|e| OpenError::NotAWatchdog(name.clone(), e))?;
        let identity = identity(&info.identity);
        let asked_s = timeout.as_secs().clamp(MIN_TIMEOUT_S, MAX_TIMEOUT_S);
        let mut detail = String::new();
        let mut took: Option<u64> = None;
        if info.options & WDIOF_SETTIMEOUT != 0 {
            let mut t = asked_s as libc::c_int;
            match ioctl(
                &fd,
                WDIOC_SETTIMEOUT,
                &mut t as *mut libc::c_int as *mut libc::c_void,
            ) {
                Ok(()) if t > 0 => took = Some(t as u64),
                Ok(()) => detail = format!("the driver answered timeout {t}s"),
                Err(e) => detail = format!("the driver refused timeout {asked_s}s ({e})"),
            }
        } else {
            detail = "the driver cannot change its timeout".into();
        }
        if took.is_none() {
            let mut t: libc::c_int = 0;
            if ioctl(
                &fd,
                WDIOC_GETTIMEOUT,
                &mut t as *mut libc::c_int as *mut libc::c_void,
            )
            .is_ok()
                && t > 0
            {
                took = Some(t as u64);
            }
        }
        if let Some(t) = took {
            if t != asked_s && detail.is_empty() {
                detail = format!("the driver set {t}s for the {asked_s}s asked");
            }
        }
        let timeout = took.map(Duration::from_secs);
        let mut w = Watchdog {
            fd,
            device: name,
            identity,
            magic_close: info.options & WDIOF_MAGICCLOSE != 0,
            asked: Duration::from_secs(asked_s),
            feed_every: feed_every(timeout),
            timeout,
            next_feed: now,
            last_fed: None,
            fed: 0,
            detail,
            said_feed_error: false,
        };
        if let Some(e) = w.feed(now) {
            w.detail = e;
        }
        Ok(w)
    }

    fn feed(&mut self, now: Instant) -> Option<String> {
        self.next_feed = now + self.feed_every;
        let mut dummy: libc::c_int = 0;
        match ioctl(
            &self.fd,
            WDIOC_KEEPALIVE,
            &mut dummy as *mut libc::c_int as *mut libc::c_void,
        ) {
            Ok(()) => {
                self.fed += 1;
                self.last_fed = Some(now);
                None
            }
            Err(e) => {
                let e = format!("feeding failed ({e})");
                if self.detail.is_empty() {
                    self.detail = e.clone();
                }
                (!std::mem::replace(&mut self.said_feed_error, true)).then_some(e)
            }
        }
    }

    /// Feeds it when due; returns a first failure to say.
    pub fn feed_if_due(&mut self, now: Instant) -> Option<String> {
        if now >= self.next_feed {
            self.feed(now)
                .map(|e| format!("watchdog {}: {e}", self.device))
        } else {
            None
        }
    }

    pub fn status(&self, now: Instant) -> WatchdogStatus {
        let asked_s = self.asked.as_secs();
        let timeout_s = self.timeout.map(|t| t.as_secs());
        WatchdogStatus {
            device: self.device.clone(),
            state: if timeout_s == Some(asked_s) {
                "armed"
            } else {
                "refused"
            }
            .into(),
            identity: (!self.identity.is_empty()).then(|| self.identity.clone()),
            asked_s,
            timeout_s,
            feed_every_s: Some(self.feed_every.as_secs_f64()),
            fed: self.fed,
            last_fed_s_ago: self
                .last_fed
                .map(|t| now.saturating_duration_since(t).as_secs_f64()),
            detail: self.detail.clone(),
        }
    }

    /// An orderly stop: the magic close character, so that a driver
    /// without `nowayout` stops counting. Says what it did.
    pub fn release(self) -> String {
        if !self.magic_close {
            return format!(
                "watchdog {}: closed; its driver has no magic close, so it keeps counting and the board resets unless it is fed",
                self.device
            );
        }
        match rustix::io::write(&self.fd, b"V") {
            Ok(_) => format!(
                "watchdog {}: released (it stops, unless its driver was loaded with nowayout)",
                self.device
            ),
            Err(e) => format!(
                "watchdog {}: the magic close failed ({e}); it keeps counting",
                self.device
            ),
        }
    }
}

/// A quarter of the timeout, between half a second and 15 s; every
/// second when the driver did not say its timeout.
fn feed_every(timeout: Option<Duration>) -> Duration {
    match timeout {
        Some(t) => (t / 4).clamp(Duration::from_millis(500), Duration::from_secs(15)),
        None => Duration::from_secs(1),
    }
}

/// The driver's identity: printable ASCII up to the first NUL.
fn identity(raw: &[u8]) -> String {
    raw.iter()
        .take_while(|&&b| b != 0)
        .map(|&b| {
            if (0x20..0x7f).contains(&b) {
                b as char
            } else {
                '?'
            }
        })
        .collect::<String>()
        .trim()
        .to_string()
}

fn ioctl(fd: &OwnedFd, request: u32, arg: *mut libc::c_void) -> std::io::Result<()> {
    // SAFETY: `fd` is open; every request used here reads or writes at
    // most the object `arg` points to, which the caller sized for it.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg) };
    if rc == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Where robot.yaml's device is under the `/dev` the supervisor was
/// given (tests give another).
pub fn device_path(dev_root: &Path, device: &str) -> PathBuf {
    match device.strip_prefix("/dev/") {
        Some(rest) => dev_root.join(rest),
        None => PathBuf::from(device),
    }
}

/// The watchdog behind robot.yaml's `device` as the kernel shows it in
/// sysfs (`/sys/class/watchdog/<name>/`, `CONFIG_WATCHDOG_SYSFS`:
/// `identity`, `state`, `timeout`, `nowayout`), for the boot history:
/// asked before the supervisor opens it, `active` means something started
/// it before (the firmware, the boot loader, the initramfs's early open)
/// or holds it (systemd's `RuntimeWatchdogSec`), so a hang before the
/// supervisor resets the board; `inactive` means nothing did. `sys_root`
/// is `/sys` (tests give another). Every file is read bounded and
/// shown as printable text only: a strange kernel's answer is quoted,
/// never trusted.
pub fn at_boot(sys_root: &Path, device: &str) -> String {
    let base = device.rsplit('/').next().unwrap_or(device);
    let name = match base {
        "watchdog" => "watchdog0".to_string(),
        b if b.strip_prefix("watchdog").is_some_and(|n| {
            !n.is_empty() && n.len() <= 3 && n.bytes().all(|c| c.is_ascii_digit())
        }) =>
        {
            b.to_string()
        }
        _ => return format!("{device}: not a watchdog name sysfs lists (watchdog, watchdogN)"),
    };
    let dir = sys_root.join("class/watchdog").join(&name);
    let read = |f: &str| {
        units::bounded::Bound::pseudo(256)
            .read_lossy(&dir.join(f))
            .ok()
            .map(|t| identity(t.trim().as_bytes()))
            .filter(|t| !t.is_empty())
    };
    let Some(state) = read("state") else {
        return format!(
            "{device}: {} unreadable (no such watchdog, or a kernel without CONFIG_WATCHDOG_SYSFS)",
            dir.join("state").display()
        );
    };
    let mut s = device.to_string();
    if let Some(id) = read("identity") {
        s.push_str(&format!(" ({id})"));
    }
    s.push_str(&format!(": {state}"));
    if let Some(t) = read("timeout").and_then(|t| t.parse::<u32>().ok()) {
        s.push_str(&format!(", timeout {t}s"));
    }
    if read("nowayout").as_deref() == Some("1") {
        s.push_str(", nowayout");
    }
    match state.as_str() {
        "active" => s.push_str(
            ": running before the supervisor took it (a hang before it resets the board)",
        ),
        "inactive" => s.push_str(
            ": nothing ran it before the supervisor (a hang before it would not reset the board)",
        ),
        _ => {}
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_view_reads_sysfs_bounded_and_says_what_it_means() {
        let sys = tempfile::tempdir().unwrap();
        let d = sys.path().join("class/watchdog/watchdog0");
        std::fs::create_dir_all(&d).unwrap();
        for (f, v) in [
            ("identity", "i6300ESB timer\n"),
            ("state", "active\n"),
            ("timeout", "120\n"),
            ("nowayout", "1\n"),
        ] {
            std::fs::write(d.join(f), v).unwrap();
        }
        assert_eq!(
            at_boot(sys.path(), "/dev/watchdog"),
            "/dev/watchdog (i6300ESB timer): active, timeout 120s, nowayout: running before the supervisor took it (a hang before it resets the board)"
        );
        std::fs::write(d.join("state"), "inactive\n").unwrap();
        std::fs::write(d.join("timeout"), "garbage\n").unwrap();
        std::fs::write(d.join("identity"), b"\x1b[31mred\xff").unwrap();
        std::fs::remove_file(d.join("nowayout")).unwrap();
        assert_eq!(
            at_boot(sys.path(), "/dev/watchdog0"),
            "/dev/watchdog0 (?[31mred???): inactive: nothing ran it before the supervisor (a hang before it would not reset the board)"
        );
        // A huge answer is no sysfs attribute's: unreadable.
        std::fs::write(d.join("state"), "a".repeat(10_000)).unwrap();
        assert!(
            at_boot(sys.path(), "/dev/watchdog").contains("unreadable"),
            "{}",
            at_boot(sys.path(), "/dev/watchdog")
        );
        assert!(at_boot(sys.path(), "/dev/watchdog1").contains("unreadable"));
        assert!(at_boot(sys.path(), "/dev/tegra-wdt").contains("not a watchdog name"));
        assert!(at_boot(sys.path(), "/dev/watchdog99999").contains("not a watchdog name"));
    }

    #[test]
    fn the_ioctl_numbers_are_the_kernels() {
        // linux/watchdog.h on x86_64 and arm64.
        assert_eq!(WDIOC_GETSUPPORT, 0x8028_5700);
        assert_eq!(WDIOC_KEEPALIVE, 0x8004_5705);
        assert_eq!(WDIOC_SETTIMEOUT, 0xc004_5706);
        assert_eq!(WDIOC_GETTIMEOUT, 0x8004_5707);
    }

    #[test]
    fn it_is_fed_at_a_quarter_of_the_timeout_within_bounds() {
        let s = Duration::from_secs;
        assert_eq!(feed_every(Some(s(60))), s(15));
        assert_eq!(feed_every(Some(s(20))), s(5));
        assert_eq!(feed_every(Some(s(1))), Duration::from_millis(500));
        assert_eq!(feed_every(Some(s(255))), s(15));
        assert_eq!(feed_every(None), s(1));
    }

    #[test]
    fn identities_stop_at_nul_and_show_only_printable_bytes() {
        let mut raw = [0u8; 32];
        raw[..14].copy_from_slice(b"i6300ESB timer");
        assert_eq!(identity(&raw), "i6300ESB timer");
        assert_eq!(identity(&[b'a', 0x1b, b'[', 0xff, 0]), "a?[?");
        assert_eq!(identity(&[b'x'; 32]), "x".repeat(32));
    }

    #[test]
    fn a_device_that_is_not_a_watchdog_is_refused_and_kept_as_the_reason() {
        let now = Instant::now();
        let dir = std::env::temp_dir().join(format!("rtdeploy-wd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("watchdog");
        std::fs::write(&file, b"").unwrap();
        for (path, shown, want) in [
            (dir.join("absent"), "/dev/absent", "not there"),
            (file.clone(), "/dev/watchdog", "not a character device"),
            (PathBuf::from("/dev/null"), "/dev/null", "not a watchdog"),
        ] {
            let h = Held::open(&path, shown, Duration::from_secs(30), now);
            let st = h.status(now);
            assert_eq!(st.state, "missing", "{shown}");
            assert!(st.detail.contains(want), "{shown}: {}", st.detail);
            assert!(st.detail.contains("does not reset"), "{}", st.detail);
            assert_eq!(h.next_feed(), None);
            let step = h.step(now);
            assert_eq!(
                (step.step.as_str(), step.result.as_str()),
                ("watchdog", "failed")
            );
            assert!(
                step.detail.starts_with(&format!("{shown} missing")),
                "{}",
                step.detail
            );
        }
        // The regular file was not written.
        assert_eq!(std::fs::read(&file).unwrap(), b"");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_fifo_named_as_the_device_is_refused_without_waiting_for_a_reader() {
        let dir = std::env::temp_dir().join(format!("rtdeploy-wd-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("watchdog");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let h = Held::open(
            &fifo,
            "/dev/watchdog",
            Duration::from_secs(30),
            Instant::now(),
        );
        assert!(
            h.status(Instant::now())
                .detail
                .contains("not a character device"),
            "{}",
            h.status(Instant::now()).detail
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_status_line_says_what_is_in_force_and_what_was_asked() {
        let st = WatchdogStatus {
            device: "/dev/watchdog".into(),
            state: "refused".into(),
            identity: Some("Tegra WDT".into()),
            asked_s: 300,
            timeout_s: Some(255),
            feed_every_s: Some(15.0),
            fed: 3,
            last_fed_s_ago: Some(2.0),
            detail: "the driver refused timeout 300s (Invalid argument)".into(),
        };
        assert_eq!(
            st.describe(),
            "/dev/watchdog refused (Tegra WDT), timeout 255s (asked 300s), fed every 15.0s, last 2.0s ago: the driver refused timeout 300s (Invalid argument)"
        );
    }
}
