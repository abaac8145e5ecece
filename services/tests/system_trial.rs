//! A system update's trial as the supervisor runs it, with real processes
//! under a temporary prefix and a fake /proc (boot id, command line): the
//! install writes the new extlinux.conf label and the running supervisor
//! leaves the processes alone until the reboot; the first start after the
//! reboot (the new line booted) takes the trial up, and commits it when
//! the CPU plan applied and the processes stay healthy, or rolls it back
//! (the previous extlinux.conf, the previous release, a reboot back asked
//! for) when the plan did not apply.

mod common;
#[path = "../releases/tests/util/mod.rs"]
mod util;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{process, Running};
use releases::system::{BootEntry, REBOOT_MARKER};
use releases::{install_bundle, InstallOptions, ReleaseState, SystemUpdate};
use serde_json::json;
use services::control;
use services::robot::RobotLoadError;
use services::status::{StepStatus, SupervisorStatus};
use services::supervisor::{Options, Roots, Supervisor};
use util::{bundle, current_version, key, opts, release};

const CONF: &str = "boot/extlinux/extlinux.conf";
const OLD: &str = "isolcpus=managed_irq,domain,2-3";
const NEW: &str = "isolcpus=managed_irq,domain,3";

fn old_conf() -> String {
    format!("DEFAULT primary\n\nLABEL primary\n      LINUX /boot/Image\n      APPEND root=/dev/vda2 {OLD}\n")
}

fn new_conf() -> String {
    format!(
        "DEFAULT rtdeploy-release-2\n\nLABEL primary\n      LINUX /boot/Image\n      APPEND root=/dev/vda2 {OLD}\n\nLABEL rtdeploy-release-2\n      LINUX /boot/Image\n      APPEND root=/dev/vda2 {NEW}\n"
    )
}

fn ctl_release(dir: &Path, tag: &str) -> PathBuf {
    release(
        dir,
        &format!("src-{tag}"),
        &[(
            "bin/ctl",
            format!("#!/bin/sh\necho release-{tag}\nexec sleep 60\n").into_bytes(),
            0o755,
        )],
    )
}

/// Writes the fake /proc of a boot.
fn boot(proc_root: &Path, id: &str, line: &str) {
    fs::create_dir_all(proc_root.join("sys/kernel/random")).unwrap();
    fs::write(
        proc_root.join("sys/kernel/random/boot_id"),
        format!("{id}\n"),
    )
    .unwrap();
    fs::write(
        proc_root.join("cmdline"),
        format!("root=/dev/vda2 {line}\n"),
    )
    .unwrap();
}

fn supervise(prefix: tempfile::TempDir, proc_root: &Path, plan: &'static str) -> Running {
    let ctl = process(json!({
        "name": "ctl", "exec": "bin/ctl",
        "restart": {"initial_backoff": "50ms", "max_backoff": "200ms"},
    }));
    let opts = Options {
        handle_signals: false,
        verbose: false,
        log_max_bytes: 1 << 20,
        health_window: Duration::from_secs(1),
        keep: 3,
        ..Default::default()
    };
    let boot = common::TestBoot {
        cpu_plan: Some(Box::new(move || StepStatus {
            step: "cpu plan".into(),
            result: plan.into(),
            detail: format!("test: {plan}"),
        })),
        ..Default::default()
    };
    let roots = Roots {
        proc_root: proc_root.to_path_buf(),
        ..common::roots(prefix.path())
    };
    let sup = Supervisor::new(
        common::config(vec![ctl], None),
        roots,
        opts,
        boot.boxed(),
        None,
    )
    .expect("supervisor starts");
    let thread = std::thread::spawn(move || sup.run().map_err(|e| e.to_string()));
    Running {
        socket: control::socket_path(prefix.path()),
        prefix,
        thread: Some(thread),
    }
}

fn runs(sup: &Running) -> Vec<String> {
    sup.log("ctl")
        .lines()
        .filter_map(|l| l.strip_prefix("release-"))
        .map(String::from)
        .collect()
}

fn release_of(s: &SupervisorStatus) -> (String, Option<String>, Option<String>) {
    let r = s.release.clone().unwrap_or_default();
    (r.state, r.phase, r.current)
}

/// A robot running A (committed, booted with its line), with B installed
/// as a system update while the supervisor runs: nothing restarts before
/// the reboot. Returns the stopped robot, the fake /proc and B's name.
fn install_b_then_shut_down(src: &Path) -> (tempfile::TempDir, PathBuf, String) {
    install_b(src, false)
}

/// Where the boot partition is mounted in the counted tests.
const RTBOOT: &str = "boot/rtboot";

/// [`install_b_then_shut_down`], with `counted`: the boot attempts
/// counted by the boot loader (a boot partition at [`RTBOOT`], limit 3).
fn install_b(src: &Path, counted: bool) -> (tempfile::TempDir, PathBuf, String) {
    let prefix = common::prefix_trusting(&key().public_base64());
    fs::create_dir_all(prefix.path().join("boot/extlinux")).unwrap();
    if counted {
        for (rel, bytes) in releases::boot_attempts::partition_files() {
            let p = prefix.path().join(RTBOOT).join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, bytes).unwrap();
        }
    }
    fs::write(prefix.path().join(CONF), old_conf()).unwrap();
    let proc_root = src.join("proc");
    boot(&proc_root, "boot-1", OLD);
    let a = bundle(&ctl_release(src, "A"), "1", &src.join("a.bundle"));
    install_bundle(prefix.path(), &a, &opts()).unwrap();

    let sup = supervise(prefix, &proc_root, "ok");
    sup.wait_for("A running", |s| {
        runs(&sup) == ["A"] && s.processes[0].state == "running"
    });
    let b = bundle(&ctl_release(src, "B"), "2", &src.join("b.bundle"));
    let system = InstallOptions {
        plan_system: Some(Box::new(move |_release: &str, _yaml: &str| {
            Ok(Some(SystemUpdate {
                changes: vec!["isolated CPUs 2-3 -> 3".into()],
                tokens: vec![NEW.into()],
                previous_tokens: vec![OLD.into()],
                boot_entry: Some(BootEntry {
                    path: CONF.into(),
                    label: "rtdeploy-release-2".into(),
                    previous_label: "primary".into(),
                    text: new_conf(),
                    previous_text: old_conf(),
                }),
                boot_attempts: counted.then(|| releases::boot_attempts::BootAttempts {
                    dir: RTBOOT.into(),
                    limit: 3,
                }),
                boot_loader: None,
                install_boot: "boot-1".into(),
                boots: 0,
                judged_boot: None,
            }))
        })),
        ..opts()
    };
    let b = install_bundle(sup.prefix.path(), &b, &system)
        .unwrap()
        .release;
    let s = sup.wait_for("reboot-pending", |s| {
        release_of(s).1.as_deref() == Some("reboot-pending")
    });
    assert_eq!(release_of(&s).0, "trial");
    assert!(
        s.release
            .as_ref()
            .unwrap()
            .detail
            .as_deref()
            .unwrap()
            .contains("waits for a reboot"),
        "{s:?}"
    );
    // A few polls later: still A, not restarted.
    std::thread::sleep(Duration::from_millis(2500));
    let s = sup.status();
    assert_eq!(release_of(&s).1.as_deref(), Some("reboot-pending"));
    assert_eq!(runs(&sup), ["A"]);
    assert_eq!(s.processes[0].restarts, 0, "{s:?}");
    assert_eq!(
        fs::read_to_string(sup.prefix.path().join(CONF)).unwrap(),
        new_conf()
    );
    let prefix = sup.stop_all();
    (prefix, proc_root, b)
}

#[test]
fn a_system_update_is_judged_after_its_reboot_and_committed() {
    let src = tempfile::tempdir().unwrap();
    let (prefix, proc_root, b) = install_b_then_shut_down(src.path());
    // The reboot: the new label's line.
    boot(&proc_root, "boot-2", NEW);
    let sup = supervise(prefix, &proc_root, "ok");
    let s = sup.wait_for("commit", |s| {
        release_of(s).0 == "committed" && release_of(s).2.as_deref() == Some(b.as_str())
    });
    let step = s
        .startup
        .iter()
        .find(|st| st.step == "release recovery")
        .unwrap();
    assert!(
        step.detail.contains("booted with its kernel command line"),
        "{step:?}"
    );
    assert_eq!(runs(&sup), ["A", "B"]);
    assert_eq!(
        releases::read_state(sup.prefix.path()).unwrap(),
        Some(ReleaseState::Committed { release: b })
    );
    assert_eq!(
        fs::read_to_string(sup.prefix.path().join(CONF)).unwrap(),
        new_conf()
    );
    let prefix = sup.stop_all();
    assert_eq!(current_version(prefix.path()), "2");
}

/// Counted by the boot loader: the boot is its first attempt (U-Boot's
/// script wrote 1 into both copies of the state), which the status and
/// the metrics show through the trial and after the commit, and the
/// commit stops the count.
#[test]
fn a_counted_system_updates_attempt_is_shown_and_its_commit_stops_the_count() {
    let src = tempfile::tempdir().unwrap();
    let (prefix, proc_root, b) = install_b(src.path(), true);
    let dir = prefix.path().join(RTBOOT);
    let armed = releases::boot_attempts::read_state(&dir).unwrap();
    assert_eq!(armed.trial.as_ref().unwrap().attempts, 0);
    // The reboot, through U-Boot's script: attempt 1 recorded, then the
    // new label's line.
    for name in releases::boot_attempts::STATE_FILES {
        let p = dir.join(name);
        let t = fs::read_to_string(&p).unwrap();
        fs::write(&p, t.replace("rtd_attempts=0", "rtd_attempts=1") + "\0").unwrap();
    }
    boot(&proc_root, "boot-2", NEW);
    let sup = supervise(prefix, &proc_root, "ok");
    let s = sup.wait_for("commit", |s| {
        release_of(s).0 == "committed" && release_of(s).2.as_deref() == Some(b.as_str())
    });
    let r = s.release.clone().unwrap();
    let saw = r
        .boot_loader
        .clone()
        .expect("the boot loader's count in the status");
    assert_eq!(
        (saw.label.as_str(), saw.attempts, saw.limit, saw.fell_back),
        ("rtdeploy-release-2", 1, 3, false)
    );
    assert!(
        r.describe()
            .ends_with("; boot loader: boot attempt 1 of 3 of label rtdeploy-release-2"),
        "{}",
        r.describe()
    );
    let m = services::metrics::exposition(&s);
    for line in [
        "rtdeploy_boot_attempts{robot=\"",
        "rtdeploy_boot_attempt_limit{robot=\"",
        "rtdeploy_boot_fell_back{robot=\"",
    ] {
        assert!(m.contains(line), "{line}: {m}");
    }
    assert!(
        m.lines().any(|l| l.starts_with("rtdeploy_boot_attempts{")
            && l.contains("label=\"rtdeploy-release-2\"")
            && l.ends_with(" 1")),
        "{m}"
    );
    assert_eq!(
        releases::boot_attempts::read_state(&sup.prefix.path().join(RTBOOT))
            .unwrap()
            .trial,
        None
    );
    sup.stop_all();
}

#[test]
fn a_system_update_whose_plan_did_not_apply_is_rolled_back_with_a_reboot_back() {
    let src = tempfile::tempdir().unwrap();
    let (prefix, proc_root, b) = install_b_then_shut_down(src.path());
    boot(&proc_root, "boot-2", NEW);
    let sup = supervise(prefix, &proc_root, "failed");
    let s = sup.wait_for("rollback", |s| release_of(s).0 == "rolled-back");
    let r = s.release.clone().unwrap();
    assert_eq!(r.other.as_deref(), Some(b.as_str()));
    let detail = r.detail.unwrap();
    assert!(detail.contains("CPU plan"), "{detail}");
    assert!(detail.contains("reboot"), "{detail}");
    assert_eq!(
        fs::read_to_string(sup.prefix.path().join(CONF)).unwrap(),
        old_conf()
    );
    assert!(sup.prefix.path().join(REBOOT_MARKER).is_file());
    // B never judged healthy: A runs again.
    let s = sup.wait_for("A again", |s| {
        runs(&sup).last().map(String::as_str) == Some("A") && s.processes[0].state == "running"
    });
    assert_eq!(release_of(&s).0, "rolled-back");
    let prefix = sup.stop_all();
    assert_eq!(current_version(prefix.path()), "1");
}

/// A release's robot.yaml is loaded when its trial restarts the processes,
/// and the previous release's again when the trial is rolled back: each
/// `ctl` says which release and which configuration (its argument, from
/// the version in the bundle's robot.yaml) it runs with.
#[test]
fn a_trial_runs_with_its_own_robot_yaml_and_a_rollback_with_the_previous_one() {
    let src = tempfile::tempdir().unwrap();
    let prefix = common::prefix_trusting(&key().public_base64());
    let ctl_with = |dir: &Path, tag: &str, tail: &str| {
        release(
            dir,
            &format!("cfg-{tag}"),
            &[(
                "bin/ctl",
                format!("#!/bin/sh\necho \"run-{tag} $1\"\n{tail}\n").into_bytes(),
                0o755,
            )],
        )
    };
    let a = bundle(
        &ctl_with(src.path(), "A", "exec sleep 60"),
        "1",
        &src.path().join("a.bundle"),
    );
    install_bundle(prefix.path(), &a, &opts()).unwrap();
    // robot.yaml -> the supervisor's configuration: `ctl` gets the
    // version named in the file's comment as its argument.
    fn config_of(text: &str) -> services::supervisor::SupervisorConfig {
        let version = text
            .lines()
            .find_map(|l| l.strip_prefix("# "))
            .unwrap_or("?");
        common::config(
            vec![process(json!({
                "name": "ctl", "exec": "bin/ctl", "args": [format!("cfg-{version}")],
                "restart": {"initial_backoff": "50ms", "max_backoff": "200ms"},
            }))],
            None,
        )
    }
    let start_cfg = config_of(
        &fs::read_to_string(prefix.path().join("opt/rtdeploy/current/robot.yaml")).unwrap(),
    );
    let opts_s = Options {
        handle_signals: false,
        verbose: false,
        log_max_bytes: 1 << 20,
        health_window: Duration::from_secs(1),
        keep: 3,
        ..Default::default()
    };
    let boot = common::TestBoot {
        release_config: Some(Box::new(|path: &Path| {
            fs::read_to_string(path)
                .map(|t| config_of(&t))
                .map_err(|source| RobotLoadError::Read {
                    path: path.to_path_buf(),
                    source,
                })
        })),
        ..Default::default()
    };
    let sup = Supervisor::new(
        start_cfg,
        common::roots(prefix.path()),
        opts_s,
        boot.boxed(),
        None,
    )
    .expect("supervisor starts");
    let thread = std::thread::spawn(move || sup.run().map_err(|e| e.to_string()));
    let sup = Running {
        socket: control::socket_path(prefix.path()),
        prefix,
        thread: Some(thread),
    };
    let seen = |sup: &Running| -> Vec<String> {
        sup.log("ctl")
            .lines()
            .filter_map(|l| l.strip_prefix("run-"))
            .map(String::from)
            .collect()
    };
    sup.wait_for("A", |s| {
        s.processes[0].state == "running" && seen(&sup) == ["A cfg-1"]
    });
    // B's ctl exits at once: its trial is rolled back.
    let b = bundle(
        &ctl_with(src.path(), "B", "exit 3"),
        "2",
        &src.path().join("b.bundle"),
    );
    install_bundle(sup.prefix.path(), &b, &opts()).unwrap();
    sup.wait_for("rollback", |s| release_of(s).0 == "rolled-back");
    sup.wait_for("A again", |s| {
        s.processes[0].state == "running"
            && seen(&sup).last().map(String::as_str) == Some("A cfg-1")
    });
    let ran = seen(&sup);
    assert_eq!(ran.first().map(String::as_str), Some("A cfg-1"), "{ran:?}");
    assert!(ran.iter().any(|r| r == "B cfg-2"), "{ran:?}");
    assert!(
        !ran.iter().any(|r| r == "B cfg-1" || r == "A cfg-2"),
        "{ran:?}"
    );
    sup.stop_all();
}

/// A release whose robot.yaml adds a process cannot be loaded into the
/// running process table: with `restart_to_reload` the supervisor stops
/// every process and ends with `Ended::Restart`, having named the trial in
/// the restart marker; the next start (what `deploy supervise` does by
/// executing itself again) takes the trial up instead of rolling it back,
/// runs both processes, and commits it. A start without the marker (a
/// crash) still rolls a trial back.
#[test]
fn a_release_that_adds_a_process_is_loaded_by_starting_again_and_its_trial_goes_on() {
    use services::supervisor::Ended;
    let src = tempfile::tempdir().unwrap();
    let prefix = common::prefix_trusting(&key().public_base64());
    let rel = |tag: &str| {
        release(
            src.path(),
            &format!("add-{tag}"),
            &[
                (
                    "bin/ctl",
                    format!("#!/bin/sh\necho \"run-{tag} ctl\"\nexec sleep 60\n").into_bytes(),
                    0o755,
                ),
                (
                    "bin/helper",
                    format!("#!/bin/sh\necho \"run-{tag} helper\"\nexec sleep 60\n").into_bytes(),
                    0o755,
                ),
            ],
        )
    };
    let a = bundle(&rel("A"), "1", &src.path().join("a.bundle"));
    install_bundle(prefix.path(), &a, &opts()).unwrap();
    // Version 1 runs `ctl`; version 2 adds `helper`.
    fn config_of(text: &str) -> services::supervisor::SupervisorConfig {
        let version = text
            .lines()
            .find_map(|l| l.strip_prefix("# "))
            .unwrap_or("?");
        let mut procs = vec![process(json!({
            "name": "ctl", "exec": "bin/ctl",
            "restart": {"initial_backoff": "50ms", "max_backoff": "200ms"},
        }))];
        if version == "2" {
            procs.push(process(json!({
                "name": "helper", "exec": "bin/helper",
                "restart": {"initial_backoff": "50ms", "max_backoff": "200ms"},
            })));
        }
        common::config(procs, None)
    }
    let current_cfg = |p: &Path| {
        config_of(&fs::read_to_string(p.join("opt/rtdeploy/current/robot.yaml")).unwrap())
    };
    let opts_s = |recovered| Options {
        handle_signals: false,
        verbose: false,
        log_max_bytes: 1 << 20,
        health_window: Duration::from_secs(1),
        keep: 3,
        restart_to_reload: true,
        recovered,
        ..Default::default()
    };
    let boot = || common::TestBoot {
        release_config: Some(Box::new(|path: &Path| {
            fs::read_to_string(path)
                .map(|t| config_of(&t))
                .map_err(|source| RobotLoadError::Read {
                    path: path.to_path_buf(),
                    source,
                })
        })),
        ..Default::default()
    };
    let sup = Supervisor::new(
        current_cfg(prefix.path()),
        common::roots(prefix.path()),
        opts_s(None),
        boot().boxed(),
        None,
    )
    .expect("supervisor starts");
    let thread = std::thread::spawn(move || sup.run_to_end().map_err(|e| e.to_string()));
    let sock = control::socket_path(prefix.path());
    let status = || -> Option<SupervisorStatus> {
        match control::request(&sock, &control::Request::Status) {
            Ok(r) => r.status,
            Err(_) => None,
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while status().is_none_or(|s| s.processes.first().is_none_or(|p| p.state != "running")) {
        assert!(std::time::Instant::now() < deadline, "A never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    let b = bundle(&rel("B"), "2", &src.path().join("b.bundle"));
    let b_name = install_bundle(prefix.path(), &b, &opts()).unwrap().release;
    // The first supervisor ends by itself, every process stopped, the
    // trial named for the next start.
    let ended = thread.join().unwrap().unwrap();
    match &ended {
        Ended::Restart(why) => assert!(why.contains("helper"), "{why}"),
        other => panic!("expected a restart, got {other:?}"),
    }
    let marker = fs::read_to_string(prefix.path().join(releases::system::RESTART_MARKER)).unwrap();
    assert!(marker.starts_with(&format!("{b_name} ")), "{marker}");

    // The next start: recovery keeps the trial, both processes run from
    // B, and the trial is committed.
    let recovered = services::supervisor::recover(prefix.path(), Path::new("/proc"));
    assert_eq!(recovered.1.state, "trial", "{:?}", recovered);
    assert!(!prefix
        .path()
        .join(releases::system::RESTART_MARKER)
        .exists());
    let sup = Supervisor::new(
        current_cfg(prefix.path()),
        common::roots(prefix.path()),
        opts_s(Some(recovered)),
        boot().boxed(),
        None,
    )
    .expect("supervisor starts again");
    let thread = std::thread::spawn(move || sup.run().map_err(|e| e.to_string()));
    let sup = Running {
        socket: control::socket_path(prefix.path()),
        prefix,
        thread: Some(thread),
    };
    let s = sup.wait_for("B committed with both processes", |s| {
        release_of(s).0 == "committed"
            && s.processes.len() == 2
            && s.processes.iter().all(|p| p.state == "running")
    });
    assert_eq!(release_of(&s).2.as_deref(), Some(b_name.as_str()));
    assert!(
        sup.log("helper").contains("run-B helper"),
        "{}",
        sup.log("helper")
    );
    assert!(sup.log("ctl").contains("run-B ctl"));
    let prefix = sup.stop_all();
    assert_eq!(current_version(prefix.path()), "2");

    // Without the marker a start during a trial is an interruption.
    let c = bundle(&rel("C"), "3", &src.path().join("c.bundle"));
    install_bundle(prefix.path(), &c, &opts()).unwrap();
    let (_, st) = services::supervisor::recover(prefix.path(), Path::new("/proc"));
    assert_eq!(st.state, "rolled-back", "{st:?}");
    assert_eq!(current_version(prefix.path()), "2");
}
