//! Runs one case of this test binary in a child process and checks what
//! it cost: its peak resident set size, read from wait4(2), and that it
//! returned at all (a watchdog kills it at a deadline). A case that is
//! bounded in memory and time passes; one that reads a 1 GiB name whole,
//! or loops, fails the test that ran it.
#![allow(unsafe_code)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Names the case a child process is started for.
const CASE_ENV: &str = units::env::BOUNDED_CASE;

/// The peak RSS a hostile input may cost: far under the gigabytes the
/// inputs announce, far over what the bounded readers need (a few MiB
/// plus the test binary).
pub const RSS_LIMIT_MIB: u64 = 200;
/// The watchdog: a case still running after this long is killed and
/// fails. Bounded cases take well under a second.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// In the test named `test` (its full path, as `cargo test` prints it):
/// runs `case` in a child process of this test binary and asserts that
/// it passed, returned within [`DEADLINE`] and peaked under
/// [`RSS_LIMIT_MIB`]. In that child, runs `case` itself.
pub fn bounded(test: &str, case: impl FnOnce()) {
    if std::env::var(CASE_ENV).as_deref() == Ok(test) {
        case();
        return;
    }
    let out = tempfile::NamedTempFile::new().unwrap();
    let exe = std::env::current_exe().unwrap();
    // Reaped by wait4 below, which std's `Child` does not know about.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(&exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CASE_ENV, test)
        .stdin(Stdio::null())
        .stdout(out.reopen().unwrap())
        .stderr(out.reopen().unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let (status, rss_kib, killed) = wait_with_watchdog(pid);
    let log = std::fs::read_to_string(out.path()).unwrap_or_default();
    assert!(
        !killed,
        "{test}: still running after {DEADLINE:?}, killed\n{log}"
    );
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{test}: the child failed (wait status {status:#x})\n{log}"
    );
    // `--exact` with a wrong name runs nothing and passes: make sure the
    // case ran.
    assert!(
        log.contains("1 passed"),
        "{test}: the child did not run the case\n{log}"
    );
    let rss_mib = rss_kib / 1024;
    eprintln!("{test}: peak RSS {rss_mib} MiB");
    assert!(
        rss_mib < RSS_LIMIT_MIB,
        "{test}: peak RSS {rss_mib} MiB (limit {RSS_LIMIT_MIB} MiB)\n{log}"
    );
}

/// Reaps `pid`, killing it at [`DEADLINE`]: (wait status, peak RSS in
/// KiB, whether the watchdog killed it).
fn wait_with_watchdog(pid: libc::pid_t) -> (i32, u64, bool) {
    let start = Instant::now();
    let mut killed = false;
    loop {
        let mut status = 0;
        // SAFETY: all-zero bytes are a valid `rusage` (plain integers).
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `pid` is our own unreaped child (so the number is not
        // reused before this call reaps it); `status` and `ru` are valid
        // for writes for the call.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid {
            // ru_maxrss is in KiB on Linux.
            return (status, ru.ru_maxrss as u64, killed);
        }
        assert!(r == 0, "wait4({pid}): {}", std::io::Error::last_os_error());
        if !killed && start.elapsed() > DEADLINE {
            // SAFETY: kill(2) with a pid we have not reaped: it names our
            // child, not a reused number.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
