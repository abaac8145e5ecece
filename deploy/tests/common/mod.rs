//! Shared by the tests that run a supervisor with the example controllers
//! (`controller/examples`: talker and listener on one channel).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use services::control::{self, Request};
use services::status::SupervisorStatus;

pub const DEPLOY: &str = env!("CARGO_BIN_EXE_deploy");

/// The example controllers cargo built beside this test's `deploy`
/// (`cargo test --workspace` builds them; `cargo build -p controller
/// --examples` does too), or why not.
pub fn examples() -> Result<(PathBuf, PathBuf), String> {
    let dir = Path::new(DEPLOY)
        .parent()
        .expect("deploy is in a directory")
        .join("examples");
    let (t, l) = (dir.join("talker"), dir.join("listener"));
    if t.is_file() && l.is_file() {
        Ok((t, l))
    } else {
        Err(format!(
            "the example controllers are not built in {} (`cargo test --workspace` builds them; alone: cargo build -p controller --examples)",
            dir.display()
        ))
    }
}

/// A prefix whose robot.yaml runs talker (1 kHz on `/demo/ping`, its
/// timer's wakeup budget 50ms) and listener (its wakeup budget 1us: a
/// budget no machine meets, so every report is a miss), `extra` appended.
/// Fails the test when the example controllers are not built.
pub fn robot_with_examples(extra: &str) -> tempfile::TempDir {
    let (talker, listener) = examples().unwrap_or_else(|why| panic!("{why}"));
    let dir = tempfile::Builder::new()
        .prefix("rtdeploy-ex-")
        .tempdir()
        .unwrap();
    std::fs::create_dir_all(dir.path().join("etc/rtdeploy")).unwrap();
    let yaml = [
        "robot:\n  name: exbot\nboard:\n  model: generic\n  cpus: 2\n".to_string(),
        "cpus:\n  housekeeping: 0\n  isolated: 1\nboot_check:\n  enabled: false\n".into(),
        "channels:\n  - name: /demo/ping\n    max_size: 64\n    rate: 1000\n    retention: 100ms\n"
            .into(),
        "processes:\n".into(),
        format!("  - name: talker\n    exec: {}\n", talker.display()),
        "    args: [--channel, /demo/ping, --period-us, \"1000\", --every, \"100000\"]\n".into(),
        "    publishes: [/demo/ping]\n    budgets: {wakeup: 50ms}\n".into(),
        format!("  - name: listener\n    exec: {}\n", listener.display()),
        "    args: [--channel, /demo/ping, --every, \"100000\"]\n".into(),
        "    subscribes: [/demo/ping]\n    budgets: {wakeup: 1us}\n    after: [talker]\n".into(),
        extra.to_string(),
    ]
    .concat();
    std::fs::write(dir.path().join("etc/rtdeploy/robot.yaml"), yaml).unwrap();
    dir
}

/// Kills the supervisor when a test ends before it stopped it.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

pub fn supervise(prefix: &Path) -> Guard {
    Command::new(DEPLOY)
        .args([
            "-q",
            "--prefix",
            prefix.to_str().unwrap(),
            "supervise",
            "--skip-cpu-plan",
        ])
        .stdout(Stdio::null())
        .spawn()
        .map(Guard)
        .unwrap()
}

/// Waits (watchdog 30 s) until the supervisor answers and `f` holds.
pub fn wait_status(
    prefix: &Path,
    what: &str,
    f: impl Fn(&SupervisorStatus) -> bool,
) -> SupervisorStatus {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let s = control::request(&control::socket_path(prefix), &Request::Status)
            .ok()
            .and_then(|r| r.status);
        if let Some(s) = s {
            if f(&s) {
                return s;
            }
            assert!(
                Instant::now() < until,
                "timed out waiting for {what}: {s:#?}"
            );
        } else {
            assert!(
                Instant::now() < until,
                "timed out waiting for the supervisor ({what})"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Both examples reporting, `n` reports of the listener read.
pub fn wait_reports(prefix: &Path, n: u64) -> SupervisorStatus {
    wait_status(prefix, "talker and listener reporting", |s| {
        s.processes
            .iter()
            .all(|p| p.timing.as_ref().is_some_and(|t| t.reports >= n))
    })
}

/// A thread named `planted-spin` at SCHED_FIFO `priority` on `cpu`,
/// spinning `busy` of every `every` until [`Spinner::finish`] or drop: a
/// planted interferer on a CPU the check measures.
pub struct Spinner {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Spinner {
    pub fn start(cpu: usize, priority: i32, busy: Duration, every: Duration) -> Spinner {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("planted-spin".into())
            .spawn(move || {
                let cpus =
                    units::cpu::CpuSet::from_indices([cpu]).map_err(|e| format!("pin: {e}"))?;
                units::sched::set_affinity(0, &cpus)
                    .map_err(|e| format!("pin: {}", units::error::Chain(&e)))?;
                let fifo =
                    units::sched::SchedAttr::new(units::sched::Policy::Fifo, priority as u32);
                units::sched::set_attr(0, &fifo)
                    .map_err(|e| format!("fifo: {}", units::error::Chain(&e)))?;
                // Relaxed: a stop request.
                while !s.load(Ordering::Relaxed) {
                    let end = Instant::now() + busy;
                    while Instant::now() < end {
                        std::hint::spin_loop();
                    }
                    std::thread::sleep(every - busy);
                }
                Ok(())
            })
            .unwrap();
        Spinner {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the thread; whether it could run at SCHED_FIFO on its CPU.
    pub fn finish(mut self) -> Result<(), String> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<(), String> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => t.join().unwrap(),
            None => Ok(()),
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

/// Makes the robot under `prefix` trust the release key whose public half
/// is the file `pubkey` (as `etc/rtdeploy/keys/build.pub`).
pub fn trust_key(prefix: &Path, pubkey: &Path) {
    std::fs::create_dir_all(prefix.join("etc/rtdeploy/keys")).unwrap();
    std::fs::copy(pubkey, prefix.join("etc/rtdeploy/keys/build.pub")).unwrap();
}

/// A copy of this build's `deploy` in a directory every user may enter,
/// for the tests that run it as another user (the clone may be out of
/// that user's reach, under /root): the check's workers are the copy too,
/// since deploy starts them from its own path.
pub fn deploy_anyone_may_run() -> (tempfile::TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("rtdeploy-bin-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.path().join("deploy");
    std::fs::copy(DEPLOY, &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, exe)
}
