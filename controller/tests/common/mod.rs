//! Shared by the controller's test binaries.

use std::process::Command;

/// The kernel profiles a suite re-runs under (see the runtime's
/// `RTDEPLOY_TEST_KERNEL_PROFILE`): a JetPack 6 kernel (5.15: io_uring
/// without futex waits, no `futex_waitv`) and a system with io_uring
/// switched off. The probe must pick the doorbell backend under both.
pub const KERNEL_PROFILES: [&str; 2] = ["jetpack6", "no-io_uring"];

/// Whether this process runs under a test kernel profile (a re-run).
pub fn under_profile() -> bool {
    std::env::var_os(units::env::TEST_KERNEL_PROFILE).is_some()
}

/// Runs this test binary again under every kernel profile and fails
/// unless each run passes, runs at least `min_tests` tests and probes the
/// doorbell backend (in the re-run, the calling test checks the probe).
pub fn rerun_under_kernel_profiles(min_tests: usize) {
    if under_profile() {
        check_profile_probe();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for profile in KERNEL_PROFILES {
        let out = Command::new(&exe)
            .args(["--test-threads", "2", "--nocapture"])
            .env(units::env::TEST_KERNEL_PROFILE, profile)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "under kernel profile {profile}: {}\n{stdout}\n{stderr}",
            out.status
        );
        let passed: usize = stdout
            .lines()
            .filter_map(|l| l.strip_prefix("test result: ok. "))
            .filter_map(|l| l.split(' ').next()?.parse::<usize>().ok())
            .sum();
        assert!(
            passed >= min_tests,
            "under kernel profile {profile}: {passed} tests passed, expected at least {min_tests}\n{stdout}"
        );
        assert!(
            stdout.contains("probe under kernel profile picks doorbell"),
            "under kernel profile {profile}: the probe did not pick the doorbell backend\n{stdout}"
        );
        println!("kernel profile {profile}: {passed} tests passed on the doorbell backend");
    }
}

/// In a re-run: probes, prints what it picked (the parent looks for it)
/// and asserts it is the doorbell backend.
pub fn check_profile_probe() {
    if !under_profile() {
        return;
    }
    let p = controller::event_loop::probe();
    assert!(!p.io_uring_futex && !p.futex_waitv, "{p:?}");
    assert_eq!(
        p.backend,
        Some(controller::event_loop::Backend::Doorbell),
        "{p:?}"
    );
    println!("probe under kernel profile picks doorbell ({p:?})");
}
