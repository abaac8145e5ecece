//! The supervisor runs a release trial with real processes under a
//! temporary prefix: an installed release whose process crashes is rolled
//! back by itself and the old release runs again; a healthy one is
//! committed after `update.health_window`; a trial left on disk by a power
//! cut is rolled back before any process starts.

mod common;
#[path = "../releases/tests/util/mod.rs"]
mod util;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{process, Running};
use releases::{install_bundle, ReleaseState};
use serde_json::json;
use services::control::{self, Request};
use services::status::SupervisorStatus;
use services::supervisor::{Options, Supervisor};
use util::{bundle, current_version, key, opts, release};

/// A release whose `bin/ctl` runs `script` after saying which release it is.
fn ctl_release(dir: &Path, tag: &str, script: &str) -> PathBuf {
    release(
        dir,
        &format!("src-{tag}"),
        &[(
            "bin/ctl",
            format!("#!/bin/sh\necho release-{tag}\n{script}\n").into_bytes(),
            0o755,
        )],
    )
}

/// A supervisor prefix (accounts from `common::prefix`) that trusts the
/// test key.
fn robot_prefix() -> tempfile::TempDir {
    common::prefix_trusting(&key().public_base64())
}

fn install(prefix: &Path, dir: &Path, tag: &str, version: &str, script: &str) -> String {
    let b = bundle(
        &ctl_release(dir, tag, script),
        version,
        &dir.join(format!("{tag}.bundle")),
    );
    install_bundle(prefix, &b, &opts()).unwrap().release
}

/// A supervisor running `ctl` from the current release, with a 1 s
/// health window.
fn supervise(prefix: tempfile::TempDir) -> Running {
    let ctl = process(json!({
        "name": "ctl", "exec": "bin/ctl",
        "restart": {"initial_backoff": "50ms", "max_backoff": "200ms"},
    }));
    supervise_with(prefix, ctl, Duration::from_secs(1))
}

fn supervise_with(
    prefix: tempfile::TempDir,
    ctl: services::config::ProcessConfig,
    health_window: Duration,
) -> Running {
    let opts = Options {
        handle_signals: false,
        verbose: false,
        log_max_bytes: 1 << 20,
        health_window,
        keep: 3,
        ..Default::default()
    };
    let sup = Supervisor::new(
        common::config(vec![ctl], None),
        common::roots(prefix.path()),
        opts,
        None,
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

/// The releases `ctl` announced, in order, from its log.
fn runs(sup: &Running) -> Vec<String> {
    sup.log("ctl")
        .lines()
        .filter_map(|l| l.strip_prefix("release-"))
        .map(String::from)
        .collect()
}

fn release_state(s: &SupervisorStatus) -> &str {
    s.release.as_ref().map_or("", |r| r.state.as_str())
}

/// Waits (watchdog-bounded) until `ctl` runs and its log's latest
/// announcement is `tag`.
fn wait_running_from(sup: &Running, tag: &str) -> SupervisorStatus {
    let until = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let s = sup.status();
        if s.processes[0].state == "running" && runs(sup).last().map(String::as_str) == Some(tag) {
            return s;
        }
        if std::time::Instant::now() > until {
            panic!(
                "timed out waiting for ctl running from {tag}; log: {}; status: {s:#?}",
                sup.log("ctl")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_crashing_release_is_rolled_back_and_the_old_one_runs_again() {
    let src = tempfile::tempdir().unwrap();
    let prefix = robot_prefix();
    let a = install(prefix.path(), src.path(), "A", "1", "exec sleep 60");
    let sup = supervise(prefix);
    let s = wait_running_from(&sup, "A");
    let r = s.release.as_ref().unwrap();
    assert_eq!(
        (r.state.as_str(), r.current.as_deref()),
        ("committed", Some(a.as_str()))
    );
    let pid_a = s.processes[0].pid.unwrap();

    // B's ctl exits at once; `deploy install` tells the supervisor.
    let b = install(sup.prefix.path(), src.path(), "B", "2", "exit 3");
    let reply = sup.request(&Request::ReleaseChanged);
    assert!(reply.ok, "{reply:?}");
    assert!(
        reply
            .message
            .as_deref()
            .unwrap()
            .starts_with(&format!("release: trial {b}")),
        "{reply:?}"
    );

    let s = sup.wait_for("rollback", |s| release_state(s) == "rolled-back");
    let r = s.release.clone().unwrap();
    assert_eq!(r.current.as_deref(), Some(a.as_str()));
    assert_eq!(r.other.as_deref(), Some(b.as_str()));
    assert!(r.detail.as_deref().unwrap().contains("ctl"), "{r:?}");
    assert!(
        status_table(&s).contains(&format!("release: rolled back to {a} from {b} (")),
        "{}",
        status_table(&s)
    );

    // Back on A, committed, and ctl runs from it again.
    let s = wait_running_from(&sup, "A");
    assert_ne!(s.processes[0].pid, Some(pid_a));
    let ran = runs(&sup);
    let first_b = ran.iter().position(|t| t == "B").expect("B ran");
    assert_eq!(ran[..first_b], ["A"], "{ran:?}");
    assert_eq!(ran.last().map(String::as_str), Some("A"), "{ran:?}");
    let prefix = sup.stop_all();
    assert_eq!(current_version(prefix.path()), "1");
    assert_eq!(
        releases::read_state(prefix.path()).unwrap(),
        Some(ReleaseState::Committed { release: a })
    );
}

fn status_table(s: &SupervisorStatus) -> String {
    services::status::render_table(s)
}

#[test]
fn a_healthy_release_is_committed_after_the_window_then_a_manual_rollback_restarts() {
    let src = tempfile::tempdir().unwrap();
    let prefix = robot_prefix();
    let a = install(prefix.path(), src.path(), "A", "1", "exec sleep 60");
    let sup = supervise(prefix);
    wait_running_from(&sup, "A");

    // Not told: the supervisor finds the trial on its own once a second.
    let b = install(sup.prefix.path(), src.path(), "B", "2", "exec sleep 60");
    let s = sup.wait_for("commit", |s| {
        release_state(s) == "committed"
            && s.release.as_ref().unwrap().current.as_deref() == Some(b.as_str())
    });
    assert_eq!(s.processes[0].state, "running");
    assert_eq!(runs(&sup), ["A", "B"]);
    // The bundles' robot.yaml differ (by a comment naming the version):
    // the supervisor says it keeps the configuration it started with.
    let detail = s.release.as_ref().unwrap().detail.clone().unwrap();
    assert!(
        detail.starts_with("healthy for 1s; its robot.yaml differs from the previous release's"),
        "{detail}"
    );
    assert_eq!(
        releases::read_state(sup.prefix.path()).unwrap(),
        Some(ReleaseState::Committed { release: b })
    );
    assert_eq!(current_version(sup.prefix.path()), "2");

    // `deploy rollback` of a committed release moves `current`: the
    // processes follow it.
    releases::rollback(sup.prefix.path()).unwrap();
    sup.request(&Request::ReleaseChanged);
    let s = wait_running_from(&sup, "A");
    assert_eq!(
        s.release.as_ref().unwrap().current.as_deref(),
        Some(a.as_str())
    );
    assert_eq!(runs(&sup), ["A", "B", "A"]);
    sup.stop_all();
}

#[test]
fn a_trial_found_at_start_is_rolled_back_before_any_process_starts() {
    let src = tempfile::tempdir().unwrap();
    let prefix = robot_prefix();
    let a = install(prefix.path(), src.path(), "A", "1", "exec sleep 60");
    // Installed and switched, then the power went: `state.json` says trial.
    let b = install(prefix.path(), src.path(), "B", "2", "exec sleep 60");
    assert!(matches!(
        releases::read_state(prefix.path()).unwrap(),
        Some(ReleaseState::Trial { .. })
    ));
    assert_eq!(current_version(prefix.path()), "2");

    let sup = supervise(prefix);
    let s = wait_running_from(&sup, "A");
    let step = s
        .startup
        .iter()
        .find(|st| st.step == "release recovery")
        .unwrap();
    assert_eq!(step.result, "ok", "{step:?}");
    assert!(
        step.detail.contains(&format!(
            "trial of {b} interrupted (reboot, crash or shutdown): rolled back to {a}"
        )),
        "{step:?}"
    );
    let r = s.release.as_ref().unwrap();
    assert_eq!(r.state, "rolled-back");
    assert_eq!(r.current.as_deref(), Some(a.as_str()));
    // B never ran.
    assert_eq!(runs(&sup), ["A"]);
    let prefix = sup.stop_all();
    assert_eq!(current_version(prefix.path()), "1");
}

/// Not a test on its own: the installer half of
/// `an_install_killed_before_the_switch_is_undone_while_running` (run with
/// `--ignored` and the environment it sets; on its own it does nothing).
#[test]
#[ignore = "helper process: run by an_install_killed_before_the_switch_is_undone_while_running"]
fn install_child() {
    let (Some(prefix), Some(bundle)) = (
        std::env::var_os(units::env::TEST_PREFIX),
        std::env::var_os(units::env::TEST_BUNDLE),
    ) else {
        return;
    };
    install_bundle(&PathBuf::from(prefix), &PathBuf::from(bundle), &opts()).unwrap();
}

#[test]
fn an_install_killed_before_the_switch_is_undone_while_running() {
    use std::os::unix::process::ExitStatusExt;
    let src = tempfile::tempdir().unwrap();
    let prefix = robot_prefix();
    let a = install(prefix.path(), src.path(), "A", "1", "exec sleep 60");
    let sup = supervise(prefix);
    let pid_a = wait_running_from(&sup, "A").processes[0].pid;

    // The installer dies after writing the trial and moving `previous`,
    // before `current` moves.
    let b = bundle(
        &ctl_release(src.path(), "B", "exec sleep 60"),
        "2",
        &src.path().join("B.bundle"),
    );
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "install_child",
            "--exact",
            "--ignored",
            "--test-threads=1",
            "-q",
        ])
        .env(units::env::FAULT, "previous-switched")
        .env(units::env::TEST_PREFIX, sup.prefix.path())
        .env(units::env::TEST_BUNDLE, &b)
        .output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let s = sup.wait_for("the half-begun trial undone", |s| {
        release_state(s) == "rolled-back"
    });
    let r = s.release.clone().unwrap();
    assert_eq!(r.current.as_deref(), Some(a.as_str()));
    assert!(
        r.detail
            .as_deref()
            .unwrap()
            .contains("stopped before it switched current"),
        "{r:?}"
    );
    // `current` never moved: ctl kept running, untouched.
    assert_eq!(s.processes[0].pid, pid_a);
    assert_eq!(runs(&sup), ["A"]);
    assert_eq!(
        releases::read_state(sup.prefix.path()).unwrap(),
        Some(ReleaseState::Committed { release: a })
    );
    // The next install is not refused as "in trial", and commits.
    let rep = install_bundle(sup.prefix.path(), &b, &opts()).unwrap();
    assert_eq!(rep.state, "trial");
    sup.request(&Request::ReleaseChanged);
    sup.wait_for("commit", |s| {
        release_state(s) == "committed"
            && s.release.as_ref().unwrap().current.as_deref() == Some(rep.release.as_str())
    });
    assert_eq!(runs(&sup), ["A", "B"]);
    sup.stop_all();
}

/// Run by the releases' `bin/ctl` in the test below: the controller
/// crate's event loop (10 ms phased loop, handler busy for `$HANDLER_US`),
/// publishing timing reports from the environment the supervisor gives
/// (on its own it does nothing).
#[test]
#[ignore = "helper process: run by a_release_over_its_timing_budget_is_rolled_back"]
fn reporter() {
    let Ok(handler) = std::env::var("HANDLER_US") else {
        return;
    };
    let handler = Duration::from_micros(handler.parse().unwrap());
    let opts = controller::event_loop::LoopOptions::from_env();
    assert!(
        opts.timing.is_some(),
        "{} and {} are set",
        units::env::SHM_DIR,
        units::env::PROCESS
    );
    let mut lp = controller::event_loop::EventLoop::new(opts).unwrap();
    lp.add_phased_loop(
        "tick",
        Duration::from_millis(10),
        Duration::ZERO,
        move |_| {
            let t = std::time::Instant::now();
            while t.elapsed() < handler {
                std::hint::spin_loop();
            }
        },
    );
    lp.run().unwrap();
}

#[test]
fn a_release_over_its_timing_budget_is_rolled_back() {
    let src = tempfile::tempdir().unwrap();
    let prefix = robot_prefix();
    let exe = std::env::current_exe().unwrap();
    let run = |us: u32| {
        format!(
            "HANDLER_US={us} exec {} --exact reporter --ignored --test-threads=1 -q",
            exe.display()
        )
    };
    let a = install(prefix.path(), src.path(), "A", "1", &run(0));
    let ctl = process(json!({
        "name": "ctl", "exec": "bin/ctl", "budgets": {"handler": "50ms"},
        "stop_timeout": "1s",
    }));
    // The window is long enough for the first report (one a second).
    let sup = supervise_with(prefix, ctl, Duration::from_secs(5));
    sup.wait_for("A reporting", |s| s.processes[0].budget == "ok");

    // B's handler takes 60 ms against the 50 ms budget.
    let b = install(sup.prefix.path(), src.path(), "B", "2", &run(60_000));
    sup.request(&Request::ReleaseChanged);
    let s = sup.wait_for("rollback", |s| release_state(s) == "rolled-back");
    let r = s.release.clone().unwrap();
    assert_eq!(r.current.as_deref(), Some(a.as_str()));
    assert_eq!(r.other.as_deref(), Some(b.as_str()));
    assert!(
        r.detail
            .as_deref()
            .unwrap()
            .contains("process ctl went over its timing budget"),
        "{r:?}"
    );
    wait_running_from(&sup, "A");
    assert_eq!(runs(&sup), ["A", "B", "A"]);
    sup.stop_all();
}
