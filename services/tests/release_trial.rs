//! A trial decided by the health of real processes started from the new
//! release: one that crashes is rolled back by itself, one that stays up
//! for the health window is committed.

#[path = "../releases/tests/util/mod.rs"]
mod util;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use releases::{install_bundle, ReleaseState};
use services::trial::{self, ProcessHealth, TrialOutcome};
use util::*;

fn ctl_release(dir: &Path, name: &str, script: &str) -> std::path::PathBuf {
    release(
        dir,
        name,
        &[(
            "bin/ctl",
            format!("#!/bin/sh\n{script}\n").into_bytes(),
            0o755,
        )],
    )
}

/// Starts `current/bin/ctl` the way a supervisor would, and reports its
/// health (ready = running for this test program).
struct Proc {
    child: Child,
    restarts: u32,
}

impl Proc {
    fn start(prefix: &Path) -> Proc {
        let child = Command::new(prefix.join("opt/rtdeploy/current/bin/ctl"))
            .spawn()
            .unwrap();
        Proc { child, restarts: 0 }
    }
    fn health(&mut self) -> Vec<ProcessHealth> {
        let running = self.child.try_wait().unwrap().is_none();
        vec![ProcessHealth {
            name: "ctl".into(),
            running,
            ready: running,
            over_budget: 0,
            restarts: self.restarts,
        }]
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_crashing_release_rolls_back_by_itself_and_a_healthy_one_commits() {
    let d = tempfile::tempdir().unwrap();
    let prefix = robot(d.path());
    let watchdog = Instant::now();
    let b1 = bundle(
        &ctl_release(d.path(), "r1", "exec sleep 30"),
        "1",
        &d.path().join("v1.bundle"),
    );
    install_bundle(&prefix, &b1, &opts()).unwrap();

    // v2 exits at once
    let b2 = bundle(
        &ctl_release(d.path(), "r2", "exit 3"),
        "2",
        &d.path().join("v2.bundle"),
    );
    install_bundle(&prefix, &b2, &opts()).unwrap();
    let mut p = Proc::start(&prefix);
    let out = trial::watch_trial(
        &prefix,
        Duration::from_millis(300),
        3,
        Duration::from_millis(20),
        || p.health(),
    )
    .unwrap();
    match out {
        TrialOutcome::RolledBack { rollback, reason } => {
            assert!(
                rollback.trial && rollback.from.starts_with("2-") && rollback.to.starts_with("1-")
            );
            assert!(reason.contains("ctl is not running"), "{reason}");
        }
        other => panic!("expected a rollback, got {other:?}"),
    }
    drop(p);
    assert_eq!(current_version(&prefix), "1");
    assert!(
        matches!(releases::read_state(&prefix).unwrap(), Some(ReleaseState::Committed { release }) if release.starts_with("1-"))
    );
    // after the rollback the old release runs again
    let mut p = Proc::start(&prefix);
    std::thread::sleep(Duration::from_millis(50));
    assert!(p.health()[0].running);
    drop(p);

    // v3 stays up for the whole window
    let b3 = bundle(
        &ctl_release(d.path(), "r3", "exec sleep 30"),
        "3",
        &d.path().join("v3.bundle"),
    );
    install_bundle(&prefix, &b3, &opts()).unwrap();
    let mut p = Proc::start(&prefix);
    let out = trial::watch_trial(
        &prefix,
        Duration::from_millis(300),
        3,
        Duration::from_millis(20),
        || p.health(),
    )
    .unwrap();
    assert!(
        matches!(&out, TrialOutcome::Committed(r) if r.starts_with("3-")),
        "{out:?}"
    );
    assert_eq!(current_version(&prefix), "3");
    assert!(watchdog.elapsed() < Duration::from_secs(30), "watchdog");
}

#[test]
fn a_process_that_restarts_during_the_trial_fails_it() {
    let d = tempfile::tempdir().unwrap();
    let prefix = robot(d.path());
    let b1 = bundle(
        &ctl_release(d.path(), "r1", "exec sleep 30"),
        "1",
        &d.path().join("v1.bundle"),
    );
    install_bundle(&prefix, &b1, &opts()).unwrap();
    let b2 = bundle(
        &ctl_release(d.path(), "r2", "sleep 0.05; exit 1"),
        "2",
        &d.path().join("v2.bundle"),
    );
    install_bundle(&prefix, &b2, &opts()).unwrap();
    // a supervisor that restarts the process whenever it exits: it is
    // always found running, but the restart count gives it away
    let mut p = Proc::start(&prefix);
    let prefix2 = prefix.clone();
    let out = trial::watch_trial(
        &prefix,
        Duration::from_secs(5),
        3,
        Duration::from_millis(20),
        || {
            if p.child.try_wait().unwrap().is_some() {
                p.child = Command::new(prefix2.join("opt/rtdeploy/current/bin/ctl"))
                    .spawn()
                    .unwrap();
                p.restarts += 1;
            }
            p.health()
        },
    )
    .unwrap();
    assert!(
        matches!(&out, TrialOutcome::RolledBack { reason, .. } if reason.contains("restarted")),
        "{out:?}"
    );
    assert_eq!(current_version(&prefix), "1");
}
