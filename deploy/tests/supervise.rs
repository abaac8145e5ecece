//! `deploy supervise` as a real process: bad robot.yaml, SIGTERM, and the
//! supervisor as PID 1 of a fresh PID namespace.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use services::control::{self, Request};
use services::status::SupervisorStatus;

const DEPLOY: &str = env!("CARGO_BIN_EXE_deploy");

/// A prefix with a robot.yaml for a 2-CPU machine; the boot check is off.
fn prefix_with(processes: &str) -> tempfile::TempDir {
    prefix_with_boot_check(processes, "boot_check:\n  enabled: false\n")
}

fn prefix_with_boot_check(processes: &str, boot_check: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("rtdeploy-cli-")
        .tempdir()
        .unwrap();
    std::fs::create_dir_all(dir.path().join("etc/rtdeploy")).unwrap();
    let yaml = format!(
        "robot:\n  name: clibot\nboard:\n  model: generic\n  cpus: 2\ncpus:\n  housekeeping: 0\n  isolated: 1\n{boot_check}processes:\n{processes}"
    );
    std::fs::write(dir.path().join("etc/rtdeploy/robot.yaml"), yaml).unwrap();
    dir
}

fn socket(prefix: &Path) -> PathBuf {
    control::socket_path(prefix)
}

/// Waits (watchdog 20 s) until the supervisor answers and `f` holds.
fn wait_status(
    prefix: &Path,
    what: &str,
    f: impl Fn(&SupervisorStatus) -> bool,
) -> SupervisorStatus {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = control::request(&socket(prefix), &Request::Status) {
            let s = r
                .status
                .unwrap_or_else(|| panic!("status request refused: {:?}", r.error));
            if f(&s) {
                return s;
            }
            if Instant::now() > until {
                panic!("timed out waiting for {what}: {s:#?}");
            }
        } else if Instant::now() > until {
            panic!("timed out waiting for the supervisor to answer ({what})");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("supervisor did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills the supervisor if a test fails before it stopped it.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Fails the test unless `unshare` may make a PID namespace here (root).
fn require_pid_namespace() {
    let probe = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .output();
    assert!(
        probe.as_ref().is_ok_and(|o| o.status.success()),
        "`unshare --pid --fork --mount-proc` is not permitted here ({probe:?})"
    );
}

fn gone(pid: i32) -> bool {
    let until = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}")).exists() {
        if Instant::now() > until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

#[test]
fn an_invalid_robot_yaml_starts_nothing_and_exits_2() {
    let prefix = prefix_with("  - name: Bad Name\n    exec: /bin/sleep\n    policy: fifo\n");
    let out = Command::new(DEPLOY)
        .args([
            "--prefix",
            prefix.path().to_str().unwrap(),
            "supervise",
            "--skip-cpu-plan",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("robot.yaml:"), "{err}");
    assert!(err.contains("not a valid process name"), "{err}");
    assert!(err.contains("needs a priority"), "{err}");
    assert!(!socket(prefix.path()).exists());
    assert!(!prefix.path().join("var/log/rtdeploy").exists());
}

#[test]
fn sigterm_is_an_orderly_shutdown() {
    let prefix = prefix_with(
        "  - name: a\n    exec: /bin/sleep\n    args: [\"600\"]\n  - name: b\n    exec: /bin/sh\n    args: [-c, \"sleep 600 & sleep 600\"]\n    after: [a]\n",
    );
    let mut sup = Command::new(DEPLOY)
        .args([
            "-q",
            "--prefix",
            prefix.path().to_str().unwrap(),
            "supervise",
            "--skip-cpu-plan",
        ])
        .stdout(Stdio::null())
        .spawn()
        .map(Guard)
        .unwrap();
    let s = wait_status(prefix.path(), "both running", |s| {
        s.processes.iter().all(|p| p.state == "running")
    });
    let pids: Vec<i32> = s.processes.iter().map(|p| p.pid.unwrap()).collect();
    // The status command prints the same, exit 0.
    let out = Command::new(DEPLOY)
        .args([
            "--prefix",
            prefix.path().to_str().unwrap(),
            "--json",
            "status",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["schema_version"], 1);
    assert_eq!(doc["processes"][1]["name"], "b");
    assert_eq!(doc["processes"][1]["in_force"]["policy"], "other");
    // Grandchildren of `b` (its `sleep 600 &`).
    let grandchildren: Vec<i32> = services::procfs::children_of(Path::new("/proc"), pids[1])
        .iter()
        .map(|s| s.pid)
        .collect();
    let kill = Command::new("kill")
        .args(["-TERM", &sup.0.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let st = wait_exit(&mut sup.0);
    assert_eq!(st.code(), Some(0));
    for pid in pids.iter().chain(&grandchildren) {
        assert!(gone(*pid), "pid {pid} outlived the supervisor");
    }
    assert!(!socket(prefix.path()).exists());
}

#[test]
#[ignore = "needs root: a PID namespace of its own (unshare --pid --mount-proc)"]
fn pid1_in_a_fresh_pid_namespace_reaps_orphans_and_stops_on_request() {
    require_pid_namespace();
    // `orphans` leaves short-lived orphans behind every 100 ms: they are
    // reparented to PID 1 and must be reaped there.
    let prefix = prefix_with(
        "  - name: orphans\n    exec: /bin/sh\n    args: [-c, \"while :; do (sleep 0.05 &); sleep 0.1; done\"]\n  - name: steady\n    exec: /bin/sleep\n    args: [\"600\"]\n",
    );
    let mut unshare = Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            DEPLOY,
            "-q",
            "--prefix",
        ])
        .arg(prefix.path())
        .args(["supervise", "--skip-cpu-plan"])
        .stdout(Stdio::null())
        .spawn()
        .map(Guard)
        .unwrap();
    let s = wait_status(prefix.path(), "running as pid 1", |s| {
        s.processes.iter().all(|p| p.state == "running")
    });
    assert!(s.pid1);
    assert_eq!(s.pid, 1);
    let mounts: Vec<_> = s
        .startup
        .iter()
        .filter(|st| st.step.starts_with("mount "))
        .collect();
    assert_eq!(mounts.len(), 6, "{:?}", s.startup);
    for m in &mounts {
        eprintln!("{}: {} ({})", m.step, m.result, m.detail);
    }
    // The supervisor's pid outside the namespace: the child of unshare.
    let init = services::procfs::children_of(Path::new("/proc"), unshare.0.id() as i32)
        .into_iter()
        .next()
        .expect("unshare forked the supervisor");
    std::thread::sleep(Duration::from_millis(600));
    let zombies: Vec<_> = services::procfs::children_of(Path::new("/proc"), init.pid)
        .into_iter()
        .filter(|c| c.state == 'Z')
        .collect();
    // A zombie may exist for the instant between exit and reaping; it must
    // not stay.
    for z in &zombies {
        assert!(gone(z.pid), "zombie {} was never reaped by pid 1", z.pid);
    }
    let out = Command::new(DEPLOY)
        .args(["--prefix", prefix.path().to_str().unwrap(), "stop", "--all"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = wait_exit(&mut unshare.0);
    assert_eq!(st.code(), Some(0));
    assert!(gone(init.pid));
}

#[test]
#[ignore = "needs root: the boot check's SCHED_FIFO workers and a SCHED_FIFO process, on CPU 1"]
fn the_boot_check_runs_before_the_processes_and_decides_for_realtime_ones() {
    assert!(
        Path::new("/sys/devices/system/cpu/cpu1").exists(),
        "the boot check needs CPU 1 (isolated in this robot.yaml)"
    );
    // `refuse`: a failed check keeps the fifo process from starting; a
    // passed one starts it. Which one happens depends on this machine;
    // the supervisor's decision must match the check's own report.
    let prefix = prefix_with_boot_check(
        "  - name: rt\n    exec: /bin/sleep\n    args: [\"600\"]\n    policy: fifo\n    priority: 10\n    memlock: 16MiB\n  - name: bg\n    exec: /bin/sleep\n    args: [\"600\"]\n",
        "check:\n  budgets:\n    delivery_max: 50ms\nboot_check:\n  duration: 1s\n  on_failure: refuse\n",
    );
    let sup = Command::new(DEPLOY)
        .args([
            "-q",
            "--prefix",
            prefix.path().to_str().unwrap(),
            "supervise",
            "--skip-cpu-plan",
        ])
        .stdout(Stdio::null())
        .spawn()
        .map(Guard)
        .unwrap();
    let s = wait_status(prefix.path(), "bg running", |s| {
        s.processes[1].state == "running"
    });
    let report_path = prefix.path().join("var/lib/rtdeploy/boot-check.json");
    eprintln!("boot check: {}", s.boot_check);
    if s.boot_check.starts_with("failed: could not run") {
        assert_eq!(s.processes[0].state, "refused", "{s:#?}");
        return;
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
    match report["verdict"].as_str().unwrap() {
        "pass" => {
            assert!(s.boot_check.starts_with("passed"), "{}", s.boot_check);
            assert_eq!(s.processes[0].state, "running");
        }
        _ => {
            assert!(
                s.boot_check.starts_with("failed: over budget"),
                "{}",
                s.boot_check
            );
            assert_eq!(s.processes[0].state, "refused");
        }
    }
    drop(sup);
}

/// Starts `a` and `b` (`b_extra`: more of `b`'s robot.yaml entry), waits
/// until both run, SIGKILLs the supervisor and checks that both die with it.
fn children_die_with_a_killed_supervisor_when(b_extra: &str) {
    let prefix = prefix_with(&format!(
        "  - name: a\n    exec: /bin/sleep\n    args: [\"600\"]\n  - name: b\n    exec: /bin/sleep\n    args: [\"600\"]\n{b_extra}"
    ));
    let mut sup = Command::new(DEPLOY)
        .args([
            "-q",
            "--prefix",
            prefix.path().to_str().unwrap(),
            "supervise",
            "--skip-cpu-plan",
        ])
        .stdout(Stdio::null())
        .spawn()
        .map(Guard)
        .unwrap();
    let s = wait_status(prefix.path(), "both running", |s| {
        s.processes.iter().all(|p| p.state == "running")
    });
    // SIGKILL: no shutdown code runs; PR_SET_PDEATHSIG (armed after the
    // uid change, which would clear it) takes the children down.
    sup.0.kill().unwrap();
    sup.0.wait().unwrap();
    for p in &s.processes {
        let pid = p.pid.unwrap();
        assert!(
            gone(pid),
            "{} (pid {pid}) outlived a SIGKILLed supervisor",
            p.name
        );
    }
}

#[test]
fn children_die_with_a_killed_supervisor() {
    children_die_with_a_killed_supervisor_when("");
}

#[test]
#[ignore = "needs root: running `b` as user 65534 (CAP_SETUID and CAP_SETGID)"]
fn children_die_with_a_killed_supervisor_after_a_user_change() {
    children_die_with_a_killed_supervisor_when("    user: \"65534\"\n");
}

#[test]
#[ignore = "needs root: a PID namespace of its own (unshare --pid --mount-proc)"]
fn pid1_powers_off_when_asked() {
    require_pid_namespace();
    let prefix = prefix_with("  - name: a\n    exec: /bin/sleep\n    args: [\"600\"]\n");
    let mut unshare = Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            DEPLOY,
            "-q",
            "--prefix",
        ])
        .arg(prefix.path())
        .args(["supervise", "--skip-cpu-plan", "--poweroff-on-exit"])
        .stdout(Stdio::null())
        .spawn()
        .map(Guard)
        .unwrap();
    wait_status(prefix.path(), "running", |s| {
        s.pid1 && s.processes[0].state == "running"
    });
    let out = Command::new(DEPLOY)
        .args(["--prefix", prefix.path().to_str().unwrap(), "stop", "--all"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    // reboot(2) with POWER_OFF from a PID namespace's init ends that init
    // with SIGINT (see reboot(2)); unshare passes the signal on.
    let st = wait_exit(&mut unshare.0);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        st.signal().or(st.code().map(|c| c - 128)),
        Some(2),
        "{st:?}"
    );
}

/// `deploy` as a user: itself when not root; as root, nobody without
/// capabilities (setpriv, util-linux).
fn as_a_user() -> Vec<&'static str> {
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
    if root {
        vec![
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ]
    } else {
        Vec::new()
    }
}

/// A supervisor started as a user applies the CPU plan to the live /proc
/// and /sys, and every write is refused: its status says so in a sentence
/// with the fix, not as a dump of the first failures' Rust values.
#[test]
fn a_supervisor_started_as_a_user_says_the_cpu_plan_needs_root() {
    use std::os::unix::fs::PermissionsExt;
    let prefix = prefix_with("  - name: a\n    exec: /bin/sleep\n    args: [\"600\"]\n");
    std::fs::set_permissions(prefix.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let wrap = as_a_user();
    let (_bin, exe) = common::deploy_anyone_may_run();
    let mut cmd = Command::new(wrap.first().copied().map_or(exe.clone(), PathBuf::from));
    if !wrap.is_empty() {
        cmd.args(&wrap[1..]).arg(&exe);
    }
    let _sup = cmd
        .args([
            "-q",
            "--prefix",
            prefix.path().to_str().unwrap(),
            "supervise",
        ])
        .stdout(Stdio::null())
        .spawn()
        .map(Guard)
        .unwrap();
    let s = wait_status(prefix.path(), "a running", |s| {
        s.processes[0].state == "running"
    });
    let plan = s
        .startup
        .iter()
        .find(|st| st.step == "cpu plan")
        .expect("a cpu plan step");
    assert_eq!(plan.result, "failed", "{plan:?}");
    assert!(
        plan.detail
            .contains(" writes to /proc and /sys were refused: applying the CPU plan needs root"),
        "{plan:?}"
    );
    assert!(plan.detail.contains("--skip-cpu-plan"), "{plan:?}");
    let out = Command::new(DEPLOY)
        .args(["--prefix", prefix.path().to_str().unwrap(), "status"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("cpu plan: failed ("), "{text}");
    assert!(
        !text.contains("Failed {") && !text.contains("error: \""),
        "a Rust value in the status: {text}"
    );
}

/// `deploy logs` of a process that never started (it waits for one that
/// failed) says so, and why, with exit 1; of one unknown, exit 1 too.
#[test]
fn logs_of_a_process_that_never_started_say_why() {
    let prefix = prefix_with(
        "  - name: broken\n    exec: /nonexistent/program\n    restart: {policy: never}\n  - name: waiter\n    exec: /bin/sleep\n    args: [\"600\"]\n    after: [broken]\n",
    );
    let _sup = Command::new(DEPLOY)
        .args([
            "-q",
            "--prefix",
            prefix.path().to_str().unwrap(),
            "supervise",
            "--skip-cpu-plan",
        ])
        .stdout(Stdio::null())
        .spawn()
        .map(Guard)
        .unwrap();
    wait_status(prefix.path(), "broken failed", |s| {
        s.processes[0].state == "failed"
    });
    let logs = |name: &str| {
        Command::new(DEPLOY)
            .args(["--prefix", prefix.path().to_str().unwrap(), "logs", name])
            .output()
            .unwrap()
    };
    let o = logs("waiter");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("deploy: `waiter` has no output: it never started (state waiting"),
        "{err}"
    );
    // The one that failed to start has its failure in its log.
    let o = logs("broken");
    assert_eq!(o.status.code(), Some(0));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("exec /nonexistent/program failed: No such file or directory"),
        "{out}"
    );
    let o = logs("nosuch");
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no process `nosuch`"));
}

/// A check run as a user where root's runs left /dev/shm/rtdeploy says
/// whose the directory is and how to get a directory of one's own.
#[test]
#[ignore = "needs root: a shared-memory directory of root's, and deploy run as nobody"]
fn a_check_as_a_user_under_roots_shm_directory_says_what_to_do() {
    use std::os::unix::fs::PermissionsExt;
    let prefix = prefix_with("");
    std::fs::set_permissions(prefix.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let shm = prefix.path().join("dev/shm/rtdeploy");
    std::fs::create_dir_all(&shm).unwrap();
    std::fs::set_permissions(&shm, std::fs::Permissions::from_mode(0o750)).unwrap();
    // The binary and robot.yaml where nobody may read them (the clone
    // may be under /root).
    let (bin_dir, exe) = common::deploy_anyone_may_run();
    let dev = bin_dir.path().join("dev.yaml");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/dev.yaml"),
        &dev,
    )
    .unwrap();
    std::fs::set_permissions(&dev, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .arg("--prefix")
        .arg(prefix.path())
        .arg("-c")
        .arg(dev)
        .args(["check", "--duration", "1s", "-q", "--no-verify"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!(
            "this user (uid 65534) cannot write in {}, which belongs to uid 0",
            shm.display()
        )),
        "{err}"
    );
    assert!(err.contains("--prefix"), "{err}");
}

/// A watchdog device that is missing, or is not a watchdog, does not stop
/// the supervisor: it runs its processes, says so at start, and the status
/// (table, JSON, metrics) keeps saying the board does not reset. A robot
/// under `--prefix` on this machine's own /dev does not open it at all.
#[test]
fn a_missing_watchdog_is_said_and_the_processes_run() {
    for (device, sysroot, state, why) in [
        (
            "/dev/null",
            false,
            "skipped",
            "not opened: a robot under --prefix",
        ),
        (
            "/dev/rtdeploy-no-such-watchdog",
            true,
            "missing",
            "not there",
        ),
        ("/dev/watchdog", true, "missing", "not a character device"),
        (
            "/dev/null",
            true,
            "missing",
            "not a watchdog (WDIOC_GETSUPPORT",
        ),
    ] {
        let prefix = prefix_with_boot_check(
            "  - name: a\n    exec: /bin/sleep\n    args: [\"600\"]\n",
            &format!(
                "boot_check:\n  enabled: false\nmetrics:\n  textfile: /var/lib/rtdeploy/metrics.prom\n  every: 1s\nwatchdog:\n  device: {device}\n  timeout: 20s\n"
            ),
        );
        let p = prefix.path().to_str().unwrap();
        // A system tree of its own: this machine's /proc and /sys, and a
        // /dev with a regular file named watchdog and /dev/null.
        let sys = prefix.path().join("sysroot");
        std::fs::create_dir_all(sys.join("dev")).unwrap();
        for d in ["proc", "sys"] {
            std::os::unix::fs::symlink(format!("/{d}"), sys.join(d)).unwrap();
        }
        std::fs::write(sys.join("dev/watchdog"), "").unwrap();
        std::os::unix::fs::symlink("/dev/null", sys.join("dev/null")).unwrap();
        let mut args = vec!["--prefix", p];
        if sysroot {
            args.extend(["--sysroot", sys.to_str().unwrap()]);
        }
        let err = prefix.path().join("supervise.err");
        let mut sup = Command::new(DEPLOY)
            .args(&args)
            .args(["supervise", "--skip-cpu-plan"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .map(Guard)
            .unwrap();
        let s = wait_status(prefix.path(), "a running", |s| {
            s.processes.iter().all(|p| p.state == "running")
        });
        let w = s.watchdog.as_ref().expect("the status has the watchdog");
        assert_eq!((w.device.as_str(), w.state.as_str()), (device, state));
        assert!(w.detail.contains(why), "{}", w.detail);
        assert_eq!((w.fed, w.timeout_s), (0, None));
        if state == "missing" {
            assert!(w.detail.contains("does not reset"), "{}", w.detail);
        }
        let step = s.startup.iter().find(|s| s.step == "watchdog").unwrap();
        assert_eq!(
            step.result,
            if state == "missing" {
                "failed"
            } else {
                "skipped"
            }
        );
        let table = Command::new(DEPLOY)
            .args(["--prefix", p, "status"])
            .output()
            .unwrap();
        let table = String::from_utf8_lossy(&table.stdout);
        let line = table
            .lines()
            .find(|l| l.starts_with("watchdog: "))
            .unwrap_or_else(|| panic!("no watchdog line in:\n{table}"));
        assert!(
            line.starts_with(&format!("watchdog: {device} {state}: ")),
            "{line}"
        );
        assert_eq!(
            table.matches("watchdog").count(),
            line.matches("watchdog").count(),
            "said once:\n{table}"
        );
        let prom = prefix.path().join("var/lib/rtdeploy/metrics.prom");
        let until = Instant::now() + Duration::from_secs(20);
        let sample = format!("rtdeploy_watchdog_armed{{robot=\"clibot\",device=\"{device}\"}} 0");
        while !std::fs::read_to_string(&prom)
            .unwrap_or_default()
            .contains(&sample)
        {
            assert!(
                Instant::now() < until,
                "no `{sample}` in {}",
                prom.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let kill = Command::new("kill")
            .args(["-TERM", &sup.0.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        assert_eq!(wait_exit(&mut sup.0).code(), Some(0));
        let said = std::fs::read_to_string(&err).unwrap();
        assert!(
            said.lines()
                .any(|l| l.contains("watchdog: ") && l.contains(why)),
            "the start does not say it:\n{said}"
        );
    }
}

/// On a Jetson with rootfs A/B, the supervisor reads the slots at its
/// start (efivarfs and `nvbootctrl` under the system root): `deploy
/// status` and the metrics say which slot runs and which one the firmware
/// gave up on. Here a system tree of its own holds NVIDIA's variables and
/// a stand-in `nvbootctrl` that prints what R35.3.1's prints.
#[test]
fn rootfs_slots_given_up_are_in_status_and_metrics() {
    let prefix = prefix_with_boot_check(
        "  - name: a\n    exec: /bin/sleep\n    args: [\"600\"]\n",
        "boot_check:\n  enabled: false\nmetrics:\n  textfile: /var/lib/rtdeploy/metrics.prom\n  every: 1s\n",
    );
    let p = prefix.path().to_str().unwrap();
    // This machine's /proc, /dev and /sys, but /sys/firmware of its own.
    let sys = prefix.path().join("sysroot");
    for d in ["proc", "dev"] {
        std::fs::create_dir_all(&sys).unwrap();
        std::os::unix::fs::symlink(format!("/{d}"), sys.join(d)).unwrap();
    }
    std::fs::create_dir_all(sys.join("sys")).unwrap();
    for e in std::fs::read_dir("/sys").unwrap() {
        let name = e.unwrap().file_name();
        if name != "firmware" {
            std::os::unix::fs::symlink(Path::new("/sys").join(&name), sys.join("sys").join(&name))
                .unwrap();
        }
    }
    let efivars = sys.join("sys/firmware/efi/efivars");
    std::fs::create_dir_all(&efivars).unwrap();
    for (name, v) in [
        ("RootfsRedundancyLevel", 1u32),
        ("RootfsRetryCountMax", 3),
        ("RootfsStatusSlotA", 0xFF),
        ("RootfsStatusSlotB", 0),
    ] {
        let mut b = 7u32.to_le_bytes().to_vec();
        b.extend_from_slice(&v.to_le_bytes());
        std::fs::write(
            efivars.join(format!("{name}-{}", releases::l4t_slots::NVIDIA_GUID)),
            b,
        )
        .unwrap();
    }
    let tool = sys.join("usr/sbin/nvbootctrl");
    let asked = prefix.path().join("nvbootctrl-asked");
    std::fs::create_dir_all(tool.parent().unwrap()).unwrap();
    std::fs::write(
        &tool,
        format!("#!/bin/sh\necho \"$*\" >> {}\n", asked.display())
            + "[ \"$*\" = \"-t rootfs dump-slots-info\" ] || exit 1\nprintf 'Current rootfs slot: B\\nActive rootfs slot: B\\nnum_slots: 2\\nslot: 0,             retry_count: 0,             status: unbootable\\nslot: 1,             retry_count: 3,             status: normal\\n'\n",
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let _sup = Command::new(DEPLOY)
        .args(["--prefix", p, "--sysroot", sys.to_str().unwrap()])
        .args(["supervise", "--skip-cpu-plan"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Guard)
        .unwrap();
    let s = wait_status(prefix.path(), "a running", |s| {
        s.processes.iter().all(|p| p.state == "running")
    });
    let r = s.rootfs_slots.as_ref().expect("the status has the slots");
    assert_eq!(
        (r.current, r.active, r.retry_max),
        (Some('B'), Some('B'), Some(3))
    );
    // Read once, for the status and the boot history both; and with the
    // CPU plan skipped this boot is not a good one: the slot is left to
    // the firmware's count.
    assert_eq!(
        std::fs::read_to_string(&asked).unwrap(),
        "-t rootfs dump-slots-info\n"
    );
    let slot = s
        .startup
        .iter()
        .find(|st| st.step == "rootfs slot")
        .unwrap();
    assert_eq!(slot.result, "skipped", "{slot:?}");
    assert!(
        slot.detail.starts_with(
            "slot B not confirmed: the CPU plan is not applied (skipped: --skip-cpu-plan)"
        ),
        "{slot:?}"
    );
    let table = Command::new(DEPLOY)
        .args(["--prefix", p, "status"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("rootfs slots: running slot B; slot A unbootable: the firmware gave up on it after its retries and booted B; slot B retry count 3 of 3; not confirmed by this boot (see its rootfs slot step)\n"),
        "{table}"
    );
    let prom = prefix.path().join("var/lib/rtdeploy/metrics.prom");
    let until = Instant::now() + Duration::from_secs(20);
    let want = [
        "rtdeploy_rootfs_slot_booted{robot=\"clibot\",slot=\"B\"} 1",
        "rtdeploy_rootfs_slot_unbootable{robot=\"clibot\",slot=\"A\"} 1",
    ];
    loop {
        let text = std::fs::read_to_string(&prom).unwrap_or_default();
        if want.iter().all(|w| text.contains(w)) {
            break;
        }
        assert!(Instant::now() < until, "not all of {want:?} in:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
