//! Fault injection: the installer is aborted (as a power cut or SIGKILL
//! would stop it) after every step, in a child process; each time the robot
//! runs exactly the old or exactly the new release, whole, and after the
//! start-up recovery exactly the old one, and the next install succeeds.

mod util;

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;

use releases::{install_bundle, FAULT_STEPS};
use util::*;

/// Not a test on its own: the child half of `install_killed_at_every_step`
/// (run with `--ignored` and the environment it sets; on its own it does
/// nothing).
#[test]
#[ignore = "helper process: run by install_killed_at_every_step"]
fn fault_child() {
    let (Some(prefix), Some(bundle)) = (
        std::env::var_os(units::env::TEST_PREFIX),
        std::env::var_os(units::env::TEST_BUNDLE),
    ) else {
        return;
    };
    install_bundle(&PathBuf::from(prefix), &PathBuf::from(bundle), &opts()).unwrap();
}

#[test]
fn install_killed_at_every_step() {
    let d = tempfile::tempdir().unwrap();
    let b1 = bundle(
        &simple_release(d.path(), "r1", "one"),
        "1",
        &d.path().join("v1.bundle"),
    );
    let b2 = bundle(
        &simple_release(d.path(), "r2", "two"),
        "2",
        &d.path().join("v2.bundle"),
    );
    let exe = std::env::current_exe().unwrap();
    for step in FAULT_STEPS {
        let case = tempfile::tempdir().unwrap();
        let prefix = robot(case.path());
        install_bundle(&prefix, &b1, &opts()).unwrap();
        let status = Command::new(&exe)
            .args([
                "fault_child",
                "--exact",
                "--ignored",
                "--test-threads=1",
                "-q",
            ])
            .env(units::env::FAULT, step)
            .env(units::env::TEST_PREFIX, &prefix)
            .env(units::env::TEST_BUNDLE, &b2)
            .output()
            .unwrap();
        assert_eq!(
            status.status.signal(),
            Some(libc::SIGABRT),
            "step {step}: the installer did not stop there: {}",
            String::from_utf8_lossy(&status.stderr)
        );
        // Right after the cut: old or new, whole (verify_release checks
        // every file's mode, size and sha256 and that nothing else is there).
        let v = current_version(&prefix);
        assert!(v == "1" || v == "2", "step {step}: current is {v}");
        // The next start rolls an interrupted trial back: exactly the old.
        releases::recover_at_start(&prefix).unwrap();
        assert_eq!(current_version(&prefix), "1", "step {step}: after recovery");
        let ctl = std::fs::read_to_string(prefix.join("opt/rtdeploy/current/bin/ctl")).unwrap();
        assert!(ctl.contains("one"), "step {step}");
        let names: Vec<String> = std::fs::read_dir(prefix.join("opt/rtdeploy/releases"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !names.iter().any(|n| n.starts_with('.')),
            "step {step}: leftovers {names:?}"
        );
        // And the update goes through on the next try.
        let rep = install_bundle(&prefix, &b2, &opts()).unwrap();
        assert_eq!(rep.state, "trial", "step {step}");
        assert_eq!(current_version(&prefix), "2", "step {step}");
    }
}
