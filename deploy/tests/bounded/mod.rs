//! Runs the real `deploy` binary on hostile input under a memory limit it
//! must stay within, and a watchdog: a case that reads what it should
//! bound runs out of address space and fails (an allocation failure
//! aborts it, or the error says so), a case that waits on a FIFO or loops
//! is killed at the deadline and fails. The limit is RLIMIT_AS, set in the
//! child between fork and exec, so it is the child's own whatever this
//! test process holds (wait4's peak RSS would carry this process's).
//!
//! Each test also runs the same command on a trivial input under the same
//! limit ([`Limited::baseline_ok`]), so a limit too low for `deploy` to
//! run at all cannot pass a case by accident.

#![allow(dead_code, unsafe_code)]

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The address space a bounded case may use: `deploy` runs a small case in
/// under 32 MiB of address space (debug build, one malloc arena), the
/// unbounded reads these cases provoke took 250 MiB to 5.7 GiB.
pub const AS_LIMIT: u64 = 192 << 20;

/// The watchdog: a bounded case takes well under a second; one that
/// waits on a FIFO never returns.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// How a limited run ended.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: String,
    /// The watchdog killed it.
    pub killed: bool,
}

impl Run {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Exited by itself with `code`; says what happened otherwise.
    pub fn assert_exit(&self, code: i32) {
        assert!(
            !self.killed,
            "still running after {DEADLINE:?}: killed\nstderr: {}",
            self.cut_stderr()
        );
        assert_eq!(
            (self.code, self.signal),
            (Some(code), None),
            "stderr: {}",
            self.cut_stderr()
        );
    }

    /// Exit 2 with `needle` in stderr (the clear error).
    pub fn assert_refused(&self, needle: &str) {
        self.assert_exit(2);
        assert!(
            self.stderr.contains(needle),
            "wanted `{needle}` in stderr, got: {}",
            self.cut_stderr()
        );
    }

    fn cut_stderr(&self) -> &str {
        let mut end = self.stderr.len().min(4000);
        while !self.stderr.is_char_boundary(end) {
            end -= 1;
        }
        &self.stderr[..end]
    }
}

/// Runs `deploy args` with RLIMIT_AS at `limit` bytes and the watchdog.
/// Output goes to files (a pipe nobody reads would stall it); stdout is
/// kept up to 64 MiB, stderr up to 1 MiB.
pub fn deploy_limited(args: &[&str], limit: u64) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut c = Command::new(env!("CARGO_BIN_EXE_deploy"));
    c.args(args)
        .env_remove(units::env::CONFIG)
        .env("MALLOC_ARENA_MAX", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    let rlim = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: setrlimit(2) is async-signal-safe, and `rlim` was made
    // before the fork; nothing else runs between fork and exec.
    unsafe {
        c.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_AS, &rlim) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let mut child = c.spawn().expect("run deploy");
    let start = Instant::now();
    let mut killed = false;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            killed = true;
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let mut stdout = Vec::new();
    std::fs::File::open(&out)
        .unwrap()
        .take(64 << 20)
        .read_to_end(&mut stdout)
        .unwrap();
    let mut stderr = Vec::new();
    std::fs::File::open(&err)
        .unwrap()
        .take(1 << 20)
        .read_to_end(&mut stderr)
        .unwrap();
    Run {
        code: status.code(),
        signal: status.signal(),
        stdout,
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        killed,
    }
}

/// [`deploy_limited`] at [`AS_LIMIT`].
pub fn deploy(args: &[&str]) -> Run {
    deploy_limited(args, AS_LIMIT)
}

/// Makes a FIFO at `path`.
pub fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(r, 0, "mkfifo: {}", std::io::Error::last_os_error());
}
