//! `deploy supervise` loading a release whose robot.yaml adds a process:
//! the running supervisor cannot add it to its process table, so it
//! stops every process and executes itself again (same pid); the new start
//! takes the trial up from the restart marker instead of rolling it back,
//! runs both processes from the new release and commits it.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{supervise, wait_status, DEPLOY};

fn deploy(args: &[&str]) -> Output {
    Command::new(DEPLOY)
        .args(args)
        .env_remove(units::env::CONFIG)
        .output()
        .unwrap()
}

fn ok(o: Output) -> Output {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// robot.yaml running `procs` (shell stand-ins), trials judged for 2 s.
fn robot_yaml(procs: &[&str]) -> String {
    let mut y = String::from(
        "robot:\n  name: reloadbot\nboard:\n  model: generic\n  cpus: 2\n\
         cpus:\n  housekeeping: 0\n  isolated: 1\nboot_check:\n  enabled: false\nprocesses:\n",
    );
    for p in procs {
        y += &format!(
            "  - name: {p}\n    exec: bin/{p}\n    restart: {{policy: always, initial_backoff: 50ms, max_backoff: 200ms}}\n"
        );
    }
    y + "update:\n  health_window: 2s\n"
}

/// A release of `procs`, each printing the release's tag.
fn release(dir: &Path, tag: &str, procs: &[&str]) -> PathBuf {
    let r = dir.join(format!("release-{tag}"));
    fs::create_dir_all(r.join("bin")).unwrap();
    for p in ["a", "b"] {
        let f = r.join("bin").join(p);
        fs::write(
            &f,
            format!("#!/bin/sh\necho \"{p} of {tag}\"\nexec sleep 3600\n"),
        )
        .unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o755)).unwrap();
    }
    fs::write(r.join("robot.yaml"), robot_yaml(procs)).unwrap();
    r
}

#[test]
fn a_release_that_adds_a_process_restarts_the_supervisor_and_its_trial_is_committed() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let key = dir.join("key");
    ok(deploy(&["keygen", "--out", s(&key)]));
    let bundle = |tag: &str, procs: &[&str]| {
        let b = dir.join(format!("{tag}.bundle"));
        ok(deploy(&[
            "bundle",
            "--release",
            s(&release(dir, tag, procs)),
            "--version",
            tag,
            "--key",
            s(&key),
            "--out",
            s(&b),
        ]));
        b
    };
    let (b1, b2) = (bundle("1.0", &["a"]), bundle("2.0", &["a", "b"]));
    let prefix = dir.join("robot");
    common::trust_key(&prefix, &dir.join("key.pub"));
    let first = dir.join("first.yaml");
    fs::write(&first, robot_yaml(&["a"])).unwrap();
    ok(deploy(&[
        "--prefix",
        s(&prefix),
        "-c",
        s(&first),
        "install",
        s(&b1),
    ]));

    let mut sup = supervise(&prefix);
    let pid = sup.0.id();
    wait_status(&prefix, "release 1.0 running a", |st| {
        st.processes.len() == 1 && st.processes[0].state == "running"
    });
    ok(deploy(&["--prefix", s(&prefix), "install", s(&b2)]));
    let st = wait_status(&prefix, "release 2.0 committed, a and b running", |st| {
        let r = st.release.clone().unwrap_or_default();
        r.state == "committed"
            && r.current.as_deref().is_some_and(|c| c.starts_with("2.0-"))
            && st.processes.len() == 2
            && st.processes.iter().all(|p| p.state == "running")
    });
    // The same process, executed again: never exited.
    assert!(sup.0.try_wait().unwrap().is_none(), "the supervisor exited");
    assert_eq!(st.pid as u32, pid, "{st:#?}");
    let recovery = st
        .startup
        .iter()
        .find(|s| s.step == "release recovery")
        .expect("a recovery step");
    assert!(recovery.detail.contains("taken up again"), "{recovery:?}");
    let log =
        |p: &str| fs::read_to_string(services::logfile::log_path(&prefix, p)).unwrap_or_default();
    assert!(log("b").contains("b of 2.0"), "{}", log("b"));
    assert!(!prefix.join(releases::system::RESTART_MARKER).exists());

    ok(deploy(&["--prefix", s(&prefix), "stop", "--all"]));
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = sup.0.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < until, "the supervisor did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}
