//! `deploy demo`, the README's first run: the example robot for a bounded
//! time under a directory of its own, as whoever runs the tests (no
//! privilege), then its status, timing and log.

mod common;

use std::process::Command;

use common::DEPLOY;

fn demo(args: &[&str]) -> std::process::Output {
    common::examples().unwrap_or_else(|why| panic!("{why}"));
    Command::new("timeout")
        .args(["-s", "KILL", "120", DEPLOY, "demo"])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_first_run_shows_the_example_robot_running_and_exits_0() {
    let o = demo(&["--for", "3s"]);
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    for want in [
        "== deploy status",
        "robot first-run",
        "cpu plan: skipped (--skip-cpu-plan)",
        "== wakeup timing since each event loop started",
        "== deploy logs listener",
        "listener: process listener, channel /demo/ping",
        "next: `deploy plan -c examples/orin-nano.yaml`",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    for p in ["talker", "listener"] {
        // Running, or degraded: running with a report over its budget
        // (a loaded machine; the row then says `budget: over`).
        let row = out
            .lines()
            .find(|l| l.starts_with(p) && (l.contains(" running ") || l.contains(" degraded ")))
            .unwrap_or_else(|| panic!("no running {p}: {out}"));
        assert!(
            row.contains("budget: ok") || row.contains("budget: over"),
            "{row}"
        );
        let timing = out
            .lines()
            .find(|l| l.starts_with(p) && l.contains(" reports, backend "))
            .unwrap_or_else(|| panic!("no timing of {p}: {out}"));
        assert!(timing.contains("median "), "{timing}");
    }
    // The temporary directory is gone.
    let dir = err
        .split(" under ")
        .nth(1)
        .and_then(|r| r.split(" for ").next())
        .unwrap_or_else(|| panic!("{err}"));
    assert!(!std::path::Path::new(dir).exists(), "{dir} left behind");
}

#[test]
fn keep_leaves_the_robots_directory_and_a_bad_duration_exits_2() {
    let keep = tempfile::tempdir().unwrap();
    let dir = keep.path().join("robot");
    let o = demo(&["--for", "1s", "--keep", dir.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(dir.join("etc/rtdeploy/robot.yaml").is_file());
    assert!(dir.join("var/log/rtdeploy/listener.log").is_file());
    // No supervisor is left behind.
    assert!(!services::control::socket_path(&dir).exists());
    let o = demo(&["--for", "soon"]);
    assert_eq!(o.status.code(), Some(2));
}
