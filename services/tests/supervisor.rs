//! The supervisor with real processes under a temporary prefix: restarts
//! with backoff, crash loops, stop escalation, orderly shutdown, dependency
//! order, bad input on the control socket.

mod common;

use std::time::{Duration, Instant};

use common::{config, pid_alive, process, start};
use serde_json::json;
use services::control::{Client, Request};

#[test]
fn a_crashing_process_restarts_with_growing_delays_then_fails() {
    let crasher = process(json!({
        "name": "crasher", "exec": "/bin/sh", "args": ["-c", "echo up; exit 3"],
        "restart": {"initial_backoff": "50ms", "max_backoff": "300ms", "factor": 2.0,
                    "crash_loop_restarts": 4, "crash_loop_window": "60s"},
    }));
    let steady = process(json!({"name": "steady", "exec": "/bin/sleep", "args": ["60"]}));
    let sup = start(config(vec![crasher, steady], None), None);
    let s = sup.wait_for("crasher failed", |s| s.processes[0].state == "failed");
    let p = &s.processes[0];
    assert_eq!(p.restarts, 4);
    assert_eq!(p.last_exit.as_deref(), Some("exit 3"));
    assert!(
        p.reason
            .as_deref()
            .unwrap()
            .starts_with("crash loop: 4 restarts within 1m, last exit 3"),
        "{p:?}"
    );
    // The other process is untouched.
    assert_eq!(s.processes[1].state, "running");
    assert_eq!(s.processes[1].restarts, 0);

    let log = sup.log("crasher");
    let delays: Vec<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("[rtdeploy] restart in "))
        .collect();
    assert_eq!(delays, ["0.050s", "0.100s", "0.200s", "0.300s"], "{log}");
    assert_eq!(
        log.matches("\nup\n").count() + usize::from(log.starts_with("up\n")),
        5,
        "{log}"
    );
    sup.stop_all();
}

#[test]
fn sigkill_after_the_stop_timeout() {
    let stubborn = process(json!({
        "name": "stubborn", "exec": "/bin/sh",
        "args": ["-c", "trap '' TERM; echo armed; while :; do sleep 0.05; done"],
        "stop_timeout": "300ms",
    }));
    let sup = start(config(vec![stubborn], None), None);
    sup.wait_log("stubborn", "armed");
    let pid = sup.process("stubborn").pid.unwrap();
    let reply = sup.request(&Request::Stop {
        name: "stubborn".into(),
    });
    assert!(reply.ok, "{reply:?}");
    assert_eq!(
        reply.message.as_deref(),
        Some("`stubborn` stopped (SIGKILL after stop timeout)")
    );
    let p = sup.process("stubborn");
    assert_eq!(p.state, "stopped");
    assert_eq!(p.last_exit.as_deref(), Some("killed by SIGKILL"));
    assert!(!pid_alive(pid));
    let log = sup.log("stubborn");
    assert!(log.contains("[rtdeploy] stopping: sent SIGTERM\n"), "{log}");
    assert!(
        log.contains("[rtdeploy] still running 300ms after SIGTERM: sent SIGKILL\n"),
        "{log}"
    );

    // A polite process stops on SIGTERM alone.
    let reply = sup.request(&Request::Start {
        name: "stubborn".into(),
    });
    assert!(reply.ok, "{reply:?}");
    sup.stop_all();
}

#[test]
fn orderly_shutdown_leaves_no_child_and_no_zombie() {
    // `tree` leaves a grandchild in its process group; `base` must outlive
    // `tree` (reverse dependency order on the way down).
    let base = process(
        json!({"name": "base", "exec": "/bin/sh", "args": ["-c", "trap 'echo base-term; exit 0' TERM; while :; do sleep 0.05; done"]}),
    );
    let tree = process(json!({
        "name": "tree", "exec": "/bin/sh", "after": ["base"],
        "args": ["-c", "sleep 600 & echo grandchild $!; trap 'echo tree-term; exit 0' TERM; while :; do sleep 0.05; done"],
    }));
    let sup = start(config(vec![base, tree], None), None);
    sup.wait_log("tree", "grandchild ");
    let s = sup.status();
    let pids: Vec<i32> = s.processes.iter().map(|p| p.pid.unwrap()).collect();
    let log = sup.log("tree");
    let grandchild: i32 = log
        .lines()
        .find_map(|l| l.strip_prefix("grandchild "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(pid_alive(grandchild));
    let prefix = sup.stop_all();

    for pid in pids.iter().chain([&grandchild]) {
        // The grandchild is reparented and reaped outside this process;
        // give init a moment (watchdog-bounded) to reap it.
        let until = Instant::now() + Duration::from_secs(10);
        while pid_alive(*pid) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!pid_alive(*pid), "pid {pid} survived the shutdown");
    }
    let me = std::process::id() as i32;
    let zombies: Vec<_> = services::procfs::children_of(std::path::Path::new("/proc"), me)
        .into_iter()
        .filter(|s| s.state == 'Z')
        .collect();
    assert!(zombies.is_empty(), "{zombies:?}");
    // `tree` went down before `base`.
    let base_log =
        std::fs::read_to_string(prefix.path().join("var/log/rtdeploy/base.log")).unwrap();
    let tree_log =
        std::fs::read_to_string(prefix.path().join("var/log/rtdeploy/tree.log")).unwrap();
    assert!(base_log.contains("base-term") && tree_log.contains("tree-term"));
    assert!(!prefix.path().join("run/rtdeploy/control.sock").exists());
}

#[test]
fn dependency_order_and_a_missing_executable_leave_the_others_running() {
    let a = process(json!({"name": "a", "exec": "/bin/sleep", "args": ["60"], "after": ["b"]}));
    let b = process(json!({"name": "b", "exec": "/bin/sleep", "args": ["60"]}));
    let missing = process(json!({"name": "missing", "exec": "bin/not_there"}));
    let orphan = process(
        json!({"name": "orphan", "exec": "/bin/sleep", "args": ["60"], "after": ["missing"]}),
    );
    let nobody =
        process(json!({"name": "ghostly", "exec": "/bin/sleep", "args": ["60"], "user": "ghost"}));
    let sup = start(config(vec![a, b, missing, orphan, nobody], None), None);
    let s = sup.wait_for("a running", |s| s.processes[0].state == "running");
    let by = |n: &str| s.processes.iter().find(|p| p.name == n).unwrap().clone();
    assert_eq!(by("b").state, "running");
    // a started after b: a larger start time in /proc.
    let start_of = |pid: i32| {
        services::procfs::read_stat(std::path::Path::new("/proc"), pid)
            .unwrap()
            .starttime
    };
    assert!(start_of(by("a").pid.unwrap()) >= start_of(by("b").pid.unwrap()));
    assert_eq!(by("missing").state, "failed");
    assert!(by("missing")
        .reason
        .unwrap()
        .contains("/opt/rtdeploy/current/bin/not_there failed: No such file or directory"));
    assert_eq!(by("orphan").state, "waiting");
    assert_eq!(
        by("orphan").reason.as_deref(),
        Some("waiting: dependency `missing` is failed")
    );
    assert_eq!(by("ghostly").state, "failed");
    assert!(by("ghostly")
        .reason
        .unwrap()
        .contains("unknown user `ghost`"));
    sup.stop_all();
}

#[test]
fn bad_requests_get_error_replies_and_the_socket_keeps_working() {
    let p = process(
        json!({"name": "p", "exec": "/bin/sh", "args": ["-c", "echo hello-log; sleep 60"]}),
    );
    let sup = start(config(vec![p], None), None);
    let mut c = Client::connect(&sup.socket).unwrap();
    let r = c.raw("this is not json").unwrap();
    assert!(!r.ok);
    assert!(r
        .error
        .unwrap()
        .starts_with("bad request `this is not json`"));
    let r = c.raw(r#"{"cmd":"launch","name":"p"}"#).unwrap();
    assert!(r.error.unwrap().contains("unknown variant `launch`"));
    let r = c.raw(&"x".repeat(70_000)).unwrap();
    assert!(!r.ok);
    let r = c
        .raw(&format!("{{\"cmd\":\"stop\",\"name\":\"{}\"}}", "\u{fffd}"))
        .unwrap();
    assert!(r.error.unwrap().starts_with("no process `\u{fffd}`"));
    let r = sup.request(&Request::Start { name: "p".into() });
    assert_eq!(r.error.as_deref(), Some("`p` is already running"));
    // Still answering.
    assert_eq!(sup.status().processes[0].state, "running");

    // logs: tail, then follow sees new supervisor notes.
    sup.wait_log("p", "hello-log");
    let r = sup.request(&Request::Logs {
        name: "p".into(),
        lines: 10,
        follow: false,
    });
    assert!(r.lines.unwrap().iter().any(|l| l == "hello-log"));
    let mut f = Client::connect(&sup.socket).unwrap();
    let first = f
        .request(&Request::Logs {
            name: "p".into(),
            lines: 1,
            follow: true,
        })
        .unwrap();
    assert!(first.ok);
    let r = sup.request(&Request::Restart { name: "p".into() });
    assert!(r.message.unwrap().starts_with("restarted `p`, pid "));
    let mut seen = String::new();
    while !seen.contains("hello-log") {
        let r = f.next_reply().unwrap().expect("follow stream open");
        seen.push_str(&r.data.unwrap());
    }
    assert!(seen.contains("[rtdeploy] stopping: sent SIGTERM"), "{seen}");
    sup.stop_all();
}

#[test]
fn boot_check_failure_refuses_realtime_processes_only() {
    // `rt` is refused, never started: no privilege needed.
    let rt = process(
        json!({"name": "rt", "exec": "/bin/sleep", "args": ["60"], "policy": "fifo", "priority": 10}),
    );
    let bg = process(json!({"name": "bg", "exec": "/bin/sleep", "args": ["60"]}));
    let boot = common::TestBoot {
        boot_check: Some(Box::new(|_, _| {
            services::supervisor::BootCheckOutcome::Failed(
                "wakeup max 900us over budget 200us".into(),
            )
        })),
        ..Default::default()
    };
    let sup = start(config(vec![rt, bg], None), boot.boxed());
    let s = sup.wait_for("bg running", |s| s.processes[1].state == "running");
    assert_eq!(s.processes[0].state, "refused");
    assert!(s
        .boot_check
        .starts_with("failed: wakeup max 900us over budget 200us"));
    let f = s.processes[1].in_force.as_ref().unwrap();
    assert_eq!(f.policy, "other");
    sup.stop_all();
}

#[test]
#[ignore = "needs root: SCHED_RR for the process, chrt on it"]
fn status_reports_attributes_read_back_from_the_kernel() {
    let rt = process(
        json!({"name": "rt", "exec": "/bin/sleep", "args": ["60"], "policy": "rr", "priority": 33, "cpus": "0"}),
    );
    let sup = start(config(vec![rt], None), None);
    let s = sup.wait_for("rt running", |s| s.processes[0].state == "running");
    let f = s.processes[0].in_force.as_ref().unwrap();
    assert_eq!(
        (f.policy.as_str(), f.priority, f.cpus.as_str()),
        ("rr", 33, "0")
    );
    // Changed behind the supervisor's back: status shows the kernel's view.
    let pid = s.processes[0].pid.unwrap();
    let out = std::process::Command::new("chrt")
        .args(["-f", "-p", "44", &pid.to_string()])
        .output()
        .expect("chrt (util-linux)");
    assert!(out.status.success(), "chrt: {out:?}");
    let f = sup.process("rt").in_force.unwrap();
    assert_eq!((f.policy.as_str(), f.priority), ("fifo", 44));
    assert!(s.boot_check.starts_with("skipped: engine not available"));
    sup.stop_all();
}

#[test]
fn channels_exist_with_mode_and_group_before_processes_start() {
    // Handing a file to a group one is not in needs CAP_CHOWN (bit 0):
    // without it the robot's group is the test's own.
    let prefix = common::prefix();
    let (group, gid) = if common::has_cap(0) {
        ("rtctl", 4242)
    } else {
        let gid = rustix::process::getegid().as_raw();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(prefix.path().join("etc/group"))
            .unwrap();
        use std::io::Write;
        writeln!(f, "tester:x:{gid}:").unwrap();
        eprintln!("no CAP_CHOWN: the robot's group is this test's own (gid {gid}), not rtctl");
        ("tester", gid)
    };
    let mut cfg = config(
        vec![process(json!({
            "name": "lister", "exec": "/bin/sh",
            "args": ["-c", "echo shm=$RTDEPLOY_SHM_DIR proc=$RTDEPLOY_PROCESS; ls $RTDEPLOY_SHM_DIR/imu; sleep 60"],
            "publishes": ["/imu/raw"],
        }))],
        Some(group),
    );
    cfg.channels =
        vec![
            serde_json::from_value(json!({"name": "/imu/raw", "max_size": 64, "rate": 1000}))
                .unwrap(),
        ];
    let sup = common::start_in(prefix, cfg, None);
    sup.wait_log("lister", "raw.v");
    let shm = sup.prefix.path().join("dev/shm/rtdeploy");
    let log = sup.log("lister");
    assert!(
        log.contains(&format!("shm={} proc=lister\n", shm.display())),
        "{log}"
    );
    let file = std::fs::read_dir(shm.join("imu"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(file
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("raw.v"));
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), gid);
    let s = sup.status();
    let ch = s.startup.iter().find(|st| st.step == "channels").unwrap();
    assert_eq!(ch.result, "ok", "{ch:?}");
    assert!(ch.detail.ends_with(": 1 created, 0 reused"), "{ch:?}");
    sup.stop_all();
}

/// A datagram socket in `dir` standing in for systemd's NOTIFY_SOCKET
/// (reads wait at most 20 s), and its path.
fn notify_socket(dir: &std::path::Path) -> (std::os::unix::net::UnixDatagram, std::path::PathBuf) {
    let path = dir.join("notify.sock");
    let server = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    server
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    (server, path)
}

#[test]
fn systemd_notifications_ready_then_watchdog() {
    use services::notify::Notifier;
    let prefix = common::prefix();
    let (server, path) = notify_socket(prefix.path());
    // WATCHDOG_USEC=200000: a WATCHDOG=1 every 100 ms.
    let notifier = Notifier::new(
        Some(path.to_str().unwrap()),
        Some("200000"),
        None,
        std::process::id(),
    )
    .unwrap();
    let p = process(json!({"name": "p", "exec": "/bin/sleep", "args": ["60"]}));
    let opts = services::supervisor::Options {
        handle_signals: false,
        verbose: false,
        ..Default::default()
    };
    let sup = services::supervisor::Supervisor::new(
        config(vec![p], None),
        common::roots(prefix.path()),
        opts,
        None,
        notifier,
    )
    .unwrap();
    let socket = services::control::socket_path(prefix.path());
    let thread = std::thread::spawn(move || sup.run().map_err(|e| e.to_string()));
    let mut buf = [0u8; 64];
    let mut got = Vec::new();
    while got
        .iter()
        .filter(|m: &&String| m.as_str() == "WATCHDOG=1")
        .count()
        < 2
    {
        let n = server.recv(&mut buf).unwrap();
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert_eq!(got[0], "READY=1", "{got:?}");
    let r = services::control::request(&socket, &Request::StopAll).unwrap();
    assert!(r.ok);
    thread.join().unwrap().unwrap();
    let mut rest = Vec::new();
    server
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    while let Ok(n) = server.recv(&mut buf) {
        rest.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(rest.iter().any(|m| m == "STOPPING=1"), "{rest:?}");
}

/// A boot check as long as robot.yaml says would outlast systemd's start
/// timeout: before running it the supervisor asks systemd to wait for it
/// (EXTEND_TIMEOUT_USEC covers the check and a margin), then says READY=1.
#[test]
fn systemd_start_timeout_is_extended_by_the_boot_check() {
    use services::notify::Notifier;
    let prefix = common::prefix();
    let (server, path) = notify_socket(prefix.path());
    let notifier =
        Notifier::new(Some(path.to_str().unwrap()), None, None, std::process::id()).unwrap();
    let p = process(json!({"name": "p", "exec": "/bin/sleep", "args": ["60"]}));
    let mut cfg = config(vec![p], None);
    cfg.boot_check.enabled = true;
    cfg.boot_check.duration = units::duration::Dur(Duration::from_secs(300));
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ran2 = ran.clone();
    let boot = common::TestBoot {
        boot_check: Some(Box::new(move |d, _| {
            ran2.store(true, std::sync::atomic::Ordering::SeqCst);
            services::supervisor::BootCheckOutcome::Passed(format!("{}s", d.as_secs()))
        })),
        ..Default::default()
    };
    let opts = services::supervisor::Options {
        handle_signals: false,
        verbose: false,
        ..Default::default()
    };
    let sup = services::supervisor::Supervisor::new(
        cfg,
        common::roots(prefix.path()),
        opts,
        boot.boxed(),
        notifier,
    )
    .unwrap();
    assert!(ran.load(std::sync::atomic::Ordering::SeqCst));
    let mut buf = [0u8; 256];
    let n = server.recv(&mut buf).unwrap();
    let first = String::from_utf8_lossy(&buf[..n]).into_owned();
    let extend: u64 = first
        .lines()
        .find_map(|l| l.strip_prefix("EXTEND_TIMEOUT_USEC="))
        .unwrap_or_else(|| panic!("{first:?}"))
        .parse()
        .unwrap();
    assert_eq!(extend, 420_000_000, "300 s of check and a 120 s margin");
    let socket = services::control::socket_path(prefix.path());
    let thread = std::thread::spawn(move || sup.run().map_err(|e| e.to_string()));
    let n = server.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"READY=1");
    assert!(
        services::control::request(&socket, &Request::StopAll)
            .unwrap()
            .ok
    );
    thread.join().unwrap().unwrap();
}

/// The boot check is told what the release recovery at this start found
/// (a rollback and why, the boot loader's count): the boot history keeps
/// it beside the check.
#[test]
fn the_boot_check_is_told_what_the_release_recovery_found() {
    let prefix = common::prefix();
    let p = process(json!({"name": "p", "exec": "/bin/sleep", "args": ["60"]}));
    let mut cfg = config(vec![p], None);
    cfg.boot_check.enabled = true;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen2 = seen.clone();
    let boot = common::TestBoot {
        boot_check: Some(Box::new(move |_, release| {
            *seen2.lock().unwrap() = Some(release.clone());
            services::supervisor::BootCheckOutcome::Passed("ok".into())
        })),
        ..Default::default()
    };
    let recovered = services::status::ReleaseStatus {
        state: "rolled-back".into(),
        current: Some("4-aaaaaaaa".into()),
        other: Some("5-bbbbbbbb".into()),
        detail: Some("the boot loader gave up on label rtdeploy-release-5-bbbbbbbb".into()),
        boot_loader: Some(releases::boot_attempts::BootLoaderSaw {
            label: "rtdeploy-release-5-bbbbbbbb".into(),
            attempts: 2,
            limit: 1,
            fell_back: true,
            notes: vec![],
        }),
        ..Default::default()
    };
    let opts = services::supervisor::Options {
        handle_signals: false,
        verbose: false,
        recovered: Some((
            services::status::StepStatus {
                step: "release recovery".into(),
                result: "ok".into(),
                detail: "rolled back".into(),
            },
            recovered.clone(),
        )),
        ..Default::default()
    };
    let sup = services::supervisor::Supervisor::new(
        cfg,
        common::roots(prefix.path()),
        opts,
        boot.boxed(),
        None,
    )
    .unwrap();
    assert_eq!(seen.lock().unwrap().as_ref(), Some(&recovered));
    drop(sup);
}

#[test]
#[ignore = "needs root: starting a SCHED_FIFO process"]
fn boot_check_failure_with_degrade_starts_realtime_processes_marked_degraded() {
    let rt = process(
        json!({"name": "rt", "exec": "/bin/sleep", "args": ["60"], "policy": "fifo", "priority": 10}),
    );
    let bg = process(json!({"name": "bg", "exec": "/bin/sleep", "args": ["60"]}));
    let mut cfg = config(vec![rt, bg], None);
    cfg.boot_check.on_failure = check::config::OnFailure::Degrade;
    let boot = common::TestBoot {
        boot_check: Some(Box::new(|_, _| {
            services::supervisor::BootCheckOutcome::Failed("timer max 3ms over budget 1ms".into())
        })),
        ..Default::default()
    };
    let sup = start(cfg, boot.boxed());
    let s = sup.wait_for("both running", |s| {
        s.processes.iter().all(|p| p.state == "running")
    });
    assert!(
        s.boot_check
            .ends_with("(real-time processes started degraded)"),
        "{}",
        s.boot_check
    );
    assert!(s.processes[0].degraded);
    assert!(!s.processes[1].degraded);
    assert_eq!(s.processes[0].in_force.as_ref().unwrap().policy, "fifo");
    sup.stop_all();
}

#[test]
fn a_process_that_closes_its_output_does_not_keep_the_loop_awake() {
    // It closes stdout and stderr and lives on: the pipe's hang-up must
    // be read once and the pipe dropped from the poll set, not make every
    // later poll return at once for it. Counted, not timed: once the
    // hang-up is pending (the marker exists), the supervisor's next turns
    // (20 status requests, at least one turn each) must not find the pipe
    // readable again.
    let marks = tempfile::tempdir().unwrap();
    let closed = marks.path().join("closed");
    let quiet = process(json!({
        "name": "quiet", "exec": "/bin/sh",
        "args": ["-c", format!("echo closing; exec >&- 2>&-; : > {}; sleep 60", closed.display())],
    }));
    let sup = start(config(vec![quiet], None), None);
    let until = Instant::now() + Duration::from_secs(20);
    while !closed.exists() {
        assert!(
            Instant::now() < until,
            "the process never closed its output"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The hang-up was pending before this request's poll: read by now.
    let before = sup.status().event_loop.expect("the loop's counts");
    for _ in 0..20 {
        sup.status();
    }
    let after = sup.status().event_loop.expect("the loop's counts");
    assert!(
        after.turns >= before.turns + 20,
        "20 requests, {} turns: {before:?} -> {after:?}",
        after.turns - before.turns
    );
    assert_eq!(
        after.output_wakes, before.output_wakes,
        "the closed pipe woke the loop again: {before:?} -> {after:?}"
    );
    assert!(sup.log("quiet").contains("closing"));
    let s = sup.status();
    assert_eq!(s.processes[0].state, "running", "{s:?}");
    sup.stop_all();
}

/// A Jetson with rootfs A/B counts boots per slot and boots the other slot
/// once a slot's retries are used up: only a good boot confirms its slot
/// (`nvbootctrl verify`). Good: the CPU plan applied and the boot check
/// passed, or failed under `on_failure: degrade`. The slots and the tool
/// are NVIDIA's variables in an efivarfs tree and a stand-in `nvbootctrl`
/// that prints what R35.3.1's prints and logs what it was asked.
#[test]
fn only_a_good_boot_confirms_its_rootfs_slot() {
    use services::supervisor::BootCheckOutcome;
    let plan = |result: &'static str| -> Box<dyn FnMut() -> services::status::StepStatus + Send> {
        Box::new(move || services::status::StepStatus {
            step: "cpu plan".into(),
            result: result.into(),
            detail: "test".into(),
        })
    };
    struct Case {
        plan: &'static str,
        check: BootCheckOutcome,
        degrade: bool,
        verify_fails: bool,
        result: &'static str,
        says: &'static str,
    }
    let cases = [
        Case {
            plan: "ok",
            check: BootCheckOutcome::Passed("all budgets held".into()),
            degrade: false,
            verify_fails: false,
            result: "ok",
            says: "slot B confirmed (nvbootctrl verify: its retry count is back to the maximum): CPU plan applied, boot check passed: all budgets held",
        },
        Case {
            plan: "ok",
            check: BootCheckOutcome::Failed("wakeup max 900us over budget 200us".into()),
            degrade: true,
            verify_fails: false,
            result: "ok",
            says: "slot B confirmed (",
        },
        Case {
            plan: "ok",
            check: BootCheckOutcome::Failed("wakeup max 900us over budget 200us".into()),
            degrade: false,
            verify_fails: false,
            result: "skipped",
            says: "slot B not confirmed: the boot check failed: wakeup max 900us over budget 200us (real-time processes refused); the firmware takes one of its retries at the next boot",
        },
        Case {
            plan: "failed",
            check: BootCheckOutcome::Passed("all budgets held".into()),
            degrade: false,
            verify_fails: false,
            result: "skipped",
            says: "slot B not confirmed: the CPU plan is not applied (failed: test)",
        },
        Case {
            plan: "ok",
            check: BootCheckOutcome::Passed("all budgets held".into()),
            degrade: false,
            verify_fails: true,
            result: "failed",
            says: "slot B not confirmed: ",
        },
    ];
    for c in cases {
        let d = tempfile::tempdir().unwrap();
        let efivars = d.path().join("efivars");
        std::fs::create_dir_all(&efivars).unwrap();
        for (name, v) in [("RootfsRedundancyLevel", 1u32), ("RootfsRetryCountMax", 3)] {
            let mut b = 7u32.to_le_bytes().to_vec();
            b.extend_from_slice(&v.to_le_bytes());
            std::fs::write(
                efivars.join(format!("{name}-{}", releases::l4t_slots::NVIDIA_GUID)),
                b,
            )
            .unwrap();
        }
        let log = d.path().join("asked");
        let tool = d.path().join("nvbootctrl");
        std::fs::write(
            &tool,
            format!(
                "#!/bin/sh\necho \"$*\" >> {log}\ncase \"$*\" in\n'-t rootfs dump-slots-info') printf 'Current rootfs slot: B\\nActive rootfs slot: B\\nnum_slots: 2\\nslot: 0,             retry_count: 3,             status: normal\\nslot: 1,             retry_count: 2,             status: normal\\n' ;;\nverify) {} ;;\n*) exit 1 ;;\nesac\n",
                if c.verify_fails { "echo 'cannot open /dev/mem' >&2; exit 1" } else { "exit 0" },
                log = log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let mut cfg = config(
            vec![process(
                json!({"name": "bg", "exec": "/bin/sleep", "args": ["60"]}),
            )],
            None,
        );
        cfg.boot_check.enabled = true;
        if c.degrade {
            cfg.boot_check.on_failure = check::config::OnFailure::Degrade;
        }
        let outcome = c.check.clone();
        let boot = common::TestBoot {
            cpu_plan: Some(plan(c.plan)),
            boot_check: Some(Box::new(move |_, _| outcome.clone())),
            rootfs: Some((efivars, tool)),
            ..Default::default()
        };
        let sup = start(cfg, boot.boxed());
        let s = sup.wait_for("bg running", |s| s.processes[0].state == "running");
        let st = s
            .startup
            .iter()
            .find(|st| st.step == "rootfs slot")
            .unwrap_or_else(|| panic!("no rootfs slot step: {:?}", s.startup));
        assert_eq!(st.result, c.result, "{st:?}");
        assert!(st.detail.starts_with(c.says), "{st:?}");
        let asked = std::fs::read_to_string(&log).unwrap();
        let verified = asked.lines().filter(|l| *l == "verify").count();
        assert_eq!(
            verified,
            usize::from(c.result != "skipped"),
            "nvbootctrl was asked: {asked}"
        );
        let r = s.rootfs_slots.as_ref().expect("the status has the slots");
        assert_eq!(
            (r.current, r.confirmed),
            (Some('B'), Some(c.result == "ok"))
        );
        sup.stop_all();
    }
}
