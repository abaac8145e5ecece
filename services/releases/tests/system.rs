//! System updates on a fake tree: a release that moves the isolated CPUs
//! (3 instead of 2-3) is installed with a new extlinux.conf label made
//! DEFAULT; a "boot" here is the boot loader's part played by the test
//! (the DEFAULT label's APPEND becomes `proc/cmdline`, with a new boot id),
//! then the supervisor's start-up recovery. Asserted: extlinux.conf's
//! labels before, during and after the trial (commit and rollback), the
//! boot counter, and an install killed after every step: each time the
//! robot boots the old or the new plan and runs the release that goes
//! with it. With boot attempts counted below the kernel, the boot loader
//! is U-Boot's script as [`uboot_boot`] models it (the script itself runs
//! under U-Boot in tests/uboot.rs): boots that never reach the
//! supervisor use up the attempts, the previous label boots, and the
//! recovery says why.

mod util;

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use releases::boot_attempts::{read_state as boot_state, BootAttempts, STATE_FILES};
use releases::system::{BootEntry, REBOOT_MARKER};
use releases::{
    install_bundle, read_state, recover_at_boot, InstallOptions, ReleaseError, ReleaseState,
    SystemUpdate, FAULT_STEPS, SYSTEM_FAULT_STEPS,
};
use util::*;

const CONF: &str = "boot/extlinux/extlinux.conf";
const OLD_TOKEN: &str = "isolcpus=managed_irq,domain,2-3";
const NEW_TOKEN: &str = "isolcpus=managed_irq,domain,3";
const NEW_LABEL: &str = "rtdeploy-release-2";

fn old_conf() -> String {
    format!(
        "TIMEOUT 30\nDEFAULT primary\n\nMENU TITLE L4T boot options\n\nLABEL primary\n      MENU LABEL primary kernel\n      LINUX /boot/Image\n      INITRD /boot/initrd\n      APPEND ${{cbootargs}} root=/dev/mmcblk0p1 rw {OLD_TOKEN} rcu_nocb_poll\n"
    )
}

fn new_conf() -> String {
    format!(
        "{}\nLABEL {NEW_LABEL}\n      MENU LABEL release 2\n      LINUX /boot/Image\n      INITRD /boot/initrd\n      APPEND ${{cbootargs}} root=/dev/mmcblk0p1 rw {NEW_TOKEN} rcu_nocb_poll\n",
        old_conf().replace("DEFAULT primary", &format!("DEFAULT {NEW_LABEL}"))
    )
}

/// The boot loader's choice: the DEFAULT label and its APPEND.
fn default_append(text: &str) -> (String, String) {
    let default = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("DEFAULT "))
        .unwrap()
        .to_string();
    label_append(text, &default)
}

/// A label's APPEND line, as the kernel sees it.
fn label_append(text: &str, default: &str) -> (String, String) {
    let default = default.to_string();
    let mut in_label = false;
    for l in text.lines().map(str::trim) {
        if let Some(n) = l.strip_prefix("LABEL ") {
            in_label = n == default;
        } else if in_label {
            if let Some(a) = l.strip_prefix("APPEND ") {
                return (default, a.replace("${cbootargs} ", "console=ttyTCU0 "));
            }
        }
    }
    panic!("no APPEND for {default} in {text}")
}

fn labels(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("LABEL "))
        .map(String::from)
        .collect()
}

/// A robot with extlinux.conf and release 1 (committed).
fn robot_with_boot(dir: &Path, b1: &Path) -> PathBuf {
    let prefix = robot(dir);
    fs::create_dir_all(prefix.join("boot/extlinux")).unwrap();
    fs::write(prefix.join(CONF), old_conf()).unwrap();
    install_bundle(&prefix, b1, &opts()).unwrap();
    boot(&prefix, "boot-1");
    prefix
}

/// Boots the robot: the DEFAULT label's line and a new boot id in
/// `<prefix>/proc`. Returns the label booted.
fn boot(prefix: &Path, id: &str) -> String {
    let (label, line) = default_append(&fs::read_to_string(prefix.join(CONF)).unwrap());
    let p = proc_root(prefix);
    fs::create_dir_all(p.join("sys/kernel/random")).unwrap();
    fs::write(p.join("sys/kernel/random/boot_id"), format!("{id}\n")).unwrap();
    fs::write(p.join("cmdline"), format!("{line}\n")).unwrap();
    let _ = fs::remove_file(prefix.join(REBOOT_MARKER));
    label
}

/// Where the boot partition is mounted, relative to the prefix.
const RTBOOT: &str = "boot/rtboot";
const LIMIT: u8 = 2;

/// Boots the robot through U-Boot's boot-attempts script, as
/// `releases::boot_attempts::script` does it: a trial's label while
/// attempts remain (counted first), the fallback after; a label that
/// extlinux.conf lacks gives way to DEFAULT. Returns the label booted.
fn uboot_boot(prefix: &Path, id: &str) -> String {
    let dir = prefix.join(RTBOOT);
    let text = conf(prefix);
    let default = default_append(&text).0;
    let want = match boot_state(&dir) {
        Ok(s) => match s.trial {
            Some(t) => {
                let (pick, next) = if t.attempts >= t.limit {
                    (t.fallback.clone(), t.limit + 1)
                } else {
                    (t.label.clone(), t.attempts + 1)
                };
                if next != t.attempts {
                    // U-Boot's `env export -t`, written over both copies.
                    for name in STATE_FILES {
                        let p = dir.join(name);
                        let old = fs::read_to_string(&p).unwrap_or_default();
                        let old = old.trim_end_matches('\0');
                        let new: String = old
                            .lines()
                            .map(|l| {
                                if l.starts_with("rtd_attempts=") {
                                    format!("rtd_attempts={next}\n")
                                } else {
                                    format!("{l}\n")
                                }
                            })
                            .collect();
                        fs::write(&p, format!("{new}\0")).unwrap();
                    }
                }
                pick
            }
            None => default.clone(),
        },
        Err(_) => default.clone(),
    };
    let label = if labels(&text).contains(&want) {
        want
    } else {
        default
    };
    let (_, line) = label_append(&text, &label);
    let p = proc_root(prefix);
    fs::create_dir_all(p.join("sys/kernel/random")).unwrap();
    fs::write(p.join("sys/kernel/random/boot_id"), format!("{id}\n")).unwrap();
    fs::write(p.join("cmdline"), format!("{line}\n")).unwrap();
    let _ = fs::remove_file(prefix.join(REBOOT_MARKER));
    label
}

fn proc_root(prefix: &Path) -> PathBuf {
    prefix.parent().unwrap().join("proc")
}

fn system_opts(prefix: &Path) -> InstallOptions<'static> {
    opts_with(prefix, false)
}

/// [`system_opts`], the boot attempts counted by the boot loader.
fn counted_opts(prefix: &Path) -> InstallOptions<'static> {
    boot_partition(prefix);
    opts_with(prefix, true)
}

/// The boot partition, as mounted: its files as the image holds them.
fn boot_partition(prefix: &Path) {
    for (rel, bytes) in releases::boot_attempts::partition_files() {
        let p = prefix.join(RTBOOT).join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, bytes).unwrap();
    }
}

fn opts_with(prefix: &Path, counted: bool) -> InstallOptions<'static> {
    let boot_id = fs::read_to_string(proc_root(prefix).join("sys/kernel/random/boot_id"))
        .unwrap()
        .trim()
        .to_string();
    InstallOptions {
        plan_system: Some(Box::new(move |_release: &str, _yaml: &str| {
            Ok(Some(SystemUpdate {
                changes: vec!["isolated CPUs 2-3 -> 3".into()],
                tokens: vec![NEW_TOKEN.into(), "rcu_nocb_poll".into()],
                previous_tokens: vec![OLD_TOKEN.into(), "rcu_nocb_poll".into()],
                boot_entry: Some(BootEntry {
                    path: CONF.into(),
                    label: NEW_LABEL.into(),
                    previous_label: "primary".into(),
                    text: new_conf(),
                    previous_text: old_conf(),
                }),
                boot_attempts: counted.then(|| BootAttempts {
                    dir: RTBOOT.into(),
                    limit: LIMIT,
                }),
                boot_loader: None,
                install_boot: boot_id.clone(),
                boots: 0,
                judged_boot: None,
            }))
        })),
        ..opts()
    }
}

fn bundles(dir: &Path) -> (PathBuf, PathBuf) {
    (
        bundle(
            &simple_release(dir, "r1", "one"),
            "1",
            &dir.join("v1.bundle"),
        ),
        bundle(
            &simple_release(dir, "r2", "two"),
            "2",
            &dir.join("v2.bundle"),
        ),
    )
}

fn conf(prefix: &Path) -> String {
    fs::read_to_string(prefix.join(CONF)).unwrap()
}

fn running_line(prefix: &Path) -> String {
    fs::read_to_string(proc_root(prefix).join("cmdline")).unwrap()
}

/// Installs release 2 as a system update: extlinux.conf has the new label
/// DEFAULT and the old one beside it, a reboot is asked for, and the trial
/// cannot be committed before it.
fn install_system_update(prefix: &Path, b2: &Path) {
    assert_eq!(labels(&conf(prefix)), ["primary"]);
    let rep = install_bundle(prefix, b2, &system_opts(prefix)).unwrap();
    assert_eq!(rep.state, "trial");
    assert!(rep.reboot);
    assert_eq!(
        rep.system.as_ref().unwrap().changes,
        ["isolated CPUs 2-3 -> 3"]
    );
    // During the trial, before the reboot.
    assert_eq!(conf(prefix), new_conf());
    assert_eq!(labels(&conf(prefix)), ["primary", NEW_LABEL]);
    assert_eq!(default_append(&conf(prefix)).0, NEW_LABEL);
    assert!(prefix.join(REBOOT_MARKER).is_file());
    assert!(matches!(
        releases::commit(prefix, 3),
        Err(ReleaseError::RebootPending { .. })
    ));
}

#[test]
fn a_system_update_commits_after_the_reboot_with_the_new_line() {
    let d = tempfile::tempdir().unwrap();
    let (b1, b2) = bundles(d.path());
    let prefix = robot_with_boot(d.path(), &b1);
    install_system_update(&prefix, &b2);

    assert_eq!(boot(&prefix, "boot-2"), NEW_LABEL);
    let rec = recover_at_boot(&prefix, &proc_root(&prefix)).unwrap();
    assert_eq!(rec.rolled_back, None, "{rec:?}");
    assert!(rec.system_trial.unwrap().starts_with("2-"));
    assert_eq!(current_version(&prefix), "2");
    match read_state(&prefix).unwrap() {
        Some(ReleaseState::Trial {
            system: Some(s), ..
        }) => {
            assert_eq!(s.boots, 1);
            assert_eq!(s.judged_boot.as_deref(), Some("boot-2"));
        }
        other => panic!("{other:?}"),
    }
    releases::commit(&prefix, 3).unwrap();
    // After the commit: the new label stays DEFAULT, the old one is the
    // fallback.
    assert_eq!(labels(&conf(&prefix)), ["primary", NEW_LABEL]);
    assert_eq!(default_append(&conf(&prefix)).0, NEW_LABEL);
    assert!(running_line(&prefix).contains(NEW_TOKEN));
}

#[test]
fn a_failed_system_trial_restores_the_label_and_asks_to_reboot_back() {
    let d = tempfile::tempdir().unwrap();
    let (b1, b2) = bundles(d.path());
    let prefix = robot_with_boot(d.path(), &b1);
    install_system_update(&prefix, &b2);
    boot(&prefix, "boot-2");
    recover_at_boot(&prefix, &proc_root(&prefix)).unwrap();
    // The supervisor's verdict: rollback.
    let rb = releases::rollback(&prefix).unwrap();
    assert!(rb.trial && rb.reboot, "{rb:?}");
    assert_eq!(conf(&prefix), old_conf());
    assert_eq!(labels(&conf(&prefix)), ["primary"]);
    assert_eq!(current_version(&prefix), "1");
    assert!(fs::read_to_string(prefix.join(REBOOT_MARKER))
        .unwrap()
        .contains("reboot"));
    // The reboot back: the old line, nothing to recover.
    assert_eq!(boot(&prefix, "boot-3"), "primary");
    let rec = recover_at_boot(&prefix, &proc_root(&prefix)).unwrap();
    assert_eq!(rec.rolled_back, None);
    assert!(running_line(&prefix).contains(OLD_TOKEN));
    assert_eq!(current_version(&prefix), "1");
}

#[test]
fn the_boot_counter_rolls_back_a_trial_that_started_twice() {
    let d = tempfile::tempdir().unwrap();
    let (b1, b2) = bundles(d.path());
    let prefix = robot_with_boot(d.path(), &b1);
    install_system_update(&prefix, &b2);
    boot(&prefix, "boot-2");
    recover_at_boot(&prefix, &proc_root(&prefix)).unwrap();
    // A watchdog reset before the verdict: the same label boots again.
    assert_eq!(boot(&prefix, "boot-3"), NEW_LABEL);
    let rec = recover_at_boot(&prefix, &proc_root(&prefix)).unwrap();
    let rb = rec.rolled_back.expect("rolled back");
    assert!(rb.reboot);
    assert!(rec.reason.unwrap().contains("boot counter"));
    assert_eq!(conf(&prefix), old_conf());
    assert_eq!(current_version(&prefix), "1");
    assert!(prefix.join(REBOOT_MARKER).is_file());
}

#[test]
fn a_supervisor_restart_before_the_reboot_undoes_the_system_update() {
    let d = tempfile::tempdir().unwrap();
    let (b1, b2) = bundles(d.path());
    let prefix = robot_with_boot(d.path(), &b1);
    install_system_update(&prefix, &b2);
    // Same boot id: no reboot happened.
    let rec = recover_at_boot(&prefix, &proc_root(&prefix)).unwrap();
    let rb = rec.rolled_back.expect("rolled back");
    assert!(!rb.reboot, "the old line still runs");
    assert!(rec.reason.unwrap().contains("before the reboot"));
    assert_eq!(conf(&prefix), old_conf());
    assert!(!prefix.join(REBOOT_MARKER).exists());
    assert_eq!(conf(&prefix), old_conf());
}

/// Not a test on its own: the child half of
/// `system_update_killed_at_every_step` and
/// `marking_a_counted_boot_good_killed_at_every_step` (on its own it does
/// nothing): installs the bundle, with the boot attempts counted when
/// asked, or commits.
#[test]
#[ignore = "helper process: run by system_update_killed_at_every_step"]
fn system_fault_child() {
    let (Some(prefix), Some(action)) = (
        std::env::var_os(units::env::TEST_PREFIX),
        std::env::var(units::env::TEST_ACTION).ok(),
    ) else {
        return;
    };
    let prefix = PathBuf::from(prefix);
    match action.as_str() {
        "commit" => {
            releases::commit(&prefix, 3).unwrap();
        }
        "install" | "install-counted" => {
            let bundle = PathBuf::from(std::env::var_os(units::env::TEST_BUNDLE).unwrap());
            let opts = opts_with(&prefix, action == "install-counted");
            install_bundle(&prefix, &bundle, &opts).unwrap();
        }
        other => panic!("unknown action {other}"),
    }
}

/// Runs [`system_fault_child`] with `action`, killed after `step`.
fn killed_at(step: &str, action: &str, prefix: &Path, bundle: &Path) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "system_fault_child",
            "--exact",
            "--ignored",
            "--test-threads=1",
            "-q",
        ])
        .env(units::env::FAULT, step)
        .env(units::env::TEST_ACTION, action)
        .env(units::env::TEST_PREFIX, prefix)
        .env(units::env::TEST_BUNDLE, bundle)
        .output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "{action}, step {step}: it did not stop there: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A power cut after every step of a system update's install (the
/// installer's steps and the boot file's; with the boot attempts counted,
/// theirs too): extlinux.conf is whole, old or new; the board boots what
/// it says (or what the boot loader's count says); the recovery then runs
/// the release that goes with the line booted, or restores the old label
/// and asks for the reboot back, after which the old line runs. Never
/// neither.
#[test]
fn system_update_killed_at_every_step() {
    let d = tempfile::tempdir().unwrap();
    let (b1, b2) = bundles(d.path());
    for counted in [false, true] {
        for step in FAULT_STEPS.iter().chain(SYSTEM_FAULT_STEPS) {
            if !counted && step.starts_with("attempts-") {
                continue;
            }
            let step = &format!("{step}{}", if counted { " (counted)" } else { "" });
            let case = tempfile::tempdir().unwrap();
            let prefix = robot_with_boot(case.path(), &b1);
            boot_partition(&prefix);
            killed_at(
                step.trim_end_matches(" (counted)"),
                if counted {
                    "install-counted"
                } else {
                    "install"
                },
                &prefix,
                &b2,
            );
            let text = conf(&prefix);
            assert!(
                text == old_conf() || text == new_conf(),
                "step {step}: extlinux.conf is neither the old nor the new file:\n{text}"
            );
            // The power comes back.
            let label = uboot_boot(&prefix, "boot-2");
            let rec = recover_at_boot(&prefix, &proc_root(&prefix)).unwrap();
            let v = current_version(&prefix);
            if v == "2" {
                assert_eq!(label, NEW_LABEL, "step {step}");
                assert!(rec.system_trial.is_some(), "step {step}: {rec:?}");
            } else {
                assert_eq!(v, "1", "step {step}");
                assert_eq!(conf(&prefix), old_conf(), "step {step}");
                if prefix.join(REBOOT_MARKER).exists() {
                    assert_eq!(label, NEW_LABEL, "step {step}");
                    assert_eq!(uboot_boot(&prefix, "boot-3"), "primary", "step {step}");
                    let again = recover_at_boot(&prefix, &proc_root(&prefix)).unwrap();
                    assert_eq!(again.rolled_back, None, "step {step}");
                }
                // Nothing left counting once the old release is back.
                if counted {
                    assert_eq!(
                        boot_state(&prefix.join(RTBOOT)).unwrap().trial,
                        None,
                        "step {step}"
                    );
                }
            }
            // Whatever happened, the line running is the current release's.
            let want = if current_version(&prefix) == "2" {
                NEW_TOKEN
            } else {
                OLD_TOKEN
            };
            assert!(
                running_line(&prefix).split_whitespace().any(|t| t == want),
                "step {step}: running {} with release {}",
                running_line(&prefix),
                current_version(&prefix)
            );
            let leftovers: Vec<String> = fs::read_dir(prefix.join("boot/extlinux"))
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with('.'))
                .collect();
            assert!(leftovers.is_empty(), "step {step}: {leftovers:?}");
        }
    }
}

/// Boot attempts counted: the new label boots (attempt 1 of 2), the
/// recovery says so, and the commit stops the count.
#[test]
fn a_counted_system_update_commits_and_the_count_stops() {
    let d = tempfile::tempdir().unwrap();
    let (b1, b2) = bundles(d.path());
    let prefix = robot_with_boot(d.path(), &b1);
    let rep = install_bundle(&prefix, &b2, &counted_opts(&prefix)).unwrap();
    assert!(rep.reboot);
    let t = boot_state(&prefix.join(RTBOOT)).unwrap().trial.unwrap();
    assert_eq!(
        (t.label.as_str(), t.fallback.as_str(), t.attempts, t.limit),
        (NEW_LABEL, "primary", 0, LIMIT)
    );
    assert_eq!(uboot_boot(&prefix, "boot-2"), NEW_LABEL);
    let rec = recover_at_boot(&prefix, &proc_root(&prefix)).unwrap();
    assert!(rec.system_trial.is_some(), "{rec:?}");
    assert_eq!(
        rec.boot_loader.as_ref().map(|b| b.describe()),
        Some(format!("boot attempt 1 of {LIMIT} of label {NEW_LABEL}"))
    );
    match read_state(&prefix).unwrap() {
        Some(ReleaseState::Trial {
            system: Some(s), ..
        }) => {
            let saw = s.boot_loader.unwrap();
            assert_eq!((saw.attempts, saw.fell_back), (1, false));
        }
        other => panic!("{other:?}"),
    }
    releases::commit(&prefix, 3).unwrap();
    assert_eq!(boot_state(&prefix.join(RTBOOT)).unwrap().trial, None);
    // Later boots: DEFAULT, the new label, uncounted.
    assert_eq!(uboot_boot(&prefix, "boot-3"), NEW_LABEL);
    assert_eq!(uboot_boot(&prefix, "boot-4"), NEW_LABEL);
    let rec = recover_at_boot(&prefix, &proc_root(&prefix)).unwrap();
    assert_eq!((rec.rolled_back, rec.boot_loader), (None, None));
    assert_eq!(current_version(&prefix), "2");
}

/// The new line hangs every boot before the supervisor starts (nothing
/// runs the recovery): after `LIMIT` boots of the new label the boot
/// loader boots the previous one, whose supervisor rolls the release back
/// and says why; no reboot is needed, the old line runs already.
#[test]
fn boots_that_never_reach_the_supervisor_fall_back_to_the_previous_label() {
    let d = tempfile::tempdir().unwrap();
    let (b1, b2) = bundles(d.path());
    let prefix = robot_with_boot(d.path(), &b1);
    install_bundle(&prefix, &b2, &counted_opts(&prefix)).unwrap();
    for i in 0..LIMIT {
        // Hangs: the watchdog resets the board, no start of the supervisor.
        assert_eq!(uboot_boot(&prefix, &format!("hung-{i}")), NEW_LABEL);
    }
    assert_eq!(uboot_boot(&prefix, "boot-fallback"), "primary");
    let rec = recover_at_boot(&prefix, &proc_root(&prefix)).unwrap();
    let rb = rec.rolled_back.clone().expect("rolled back");
    assert!(!rb.reboot, "{rec:?}");
    let why = rec.reason.unwrap();
    assert!(
        why.starts_with(&format!(
            "the boot loader gave up on label {NEW_LABEL} after {LIMIT} boots without a verdict and booted the previous label: the kernel runs without `{NEW_TOKEN}`"
        )),
        "{why}"
    );
    assert_eq!(current_version(&prefix), "1");
    assert_eq!(conf(&prefix), old_conf());
    assert!(!prefix.join(REBOOT_MARKER).exists());
    assert_eq!(boot_state(&prefix.join(RTBOOT)).unwrap().trial, None);
    assert_eq!(uboot_boot(&prefix, "boot-after"), "primary");
}

/// A power cut while a counted boot is marked good (the count cleared,
/// copy by copy, then the release committed): the robot boots a line and
/// runs the release that goes with it, every time: the new one committed,
/// or (the verdict lost with the cut) the Linux boot counter rolls the
/// trial back and the old line boots after. Never neither.
#[test]
fn marking_a_counted_boot_good_killed_at_every_step() {
    let d = tempfile::tempdir().unwrap();
    let (b1, b2) = bundles(d.path());
    for step in ["attempts-first-copy", "state-trial"] {
        let case = tempfile::tempdir().unwrap();
        let prefix = robot_with_boot(case.path(), &b1);
        install_bundle(&prefix, &b2, &counted_opts(&prefix)).unwrap();
        assert_eq!(uboot_boot(&prefix, "boot-2"), NEW_LABEL);
        recover_at_boot(&prefix, &proc_root(&prefix)).unwrap();
        if step == "state-trial" {
            // A cut after the commit itself: the commit has no later step.
            releases::commit(&prefix, 3).unwrap();
        } else {
            killed_at(step, "commit", &prefix, &b2);
        }
        for boot_id in ["boot-3", "boot-4", "boot-5"] {
            uboot_boot(&prefix, boot_id);
            recover_at_boot(&prefix, &proc_root(&prefix)).unwrap();
            let want = if current_version(&prefix) == "2" {
                NEW_TOKEN
            } else {
                OLD_TOKEN
            };
            if running_line(&prefix).split_whitespace().any(|t| t == want) {
                continue;
            }
            // Rolled back after the new line booted: the reboot back.
            assert!(prefix.join(REBOOT_MARKER).exists(), "step {step} {boot_id}");
        }
        let want = if current_version(&prefix) == "2" {
            NEW_TOKEN
        } else {
            OLD_TOKEN
        };
        assert!(
            running_line(&prefix).split_whitespace().any(|t| t == want),
            "step {step}: running {} with release {}",
            running_line(&prefix),
            current_version(&prefix)
        );
        assert!(matches!(
            read_state(&prefix).unwrap(),
            Some(ReleaseState::Committed { .. })
        ));
        assert_eq!(
            boot_state(&prefix.join(RTBOOT)).unwrap().trial,
            None,
            "step {step}"
        );
    }
}

/// The boot file cannot be written (here: a directory stands where its
/// temporary file goes): the install fails and the trial is undone at
/// once, the old release current and committed, the old file in place, no
/// reboot asked for.
#[test]
fn a_boot_file_that_cannot_be_written_undoes_the_trial() {
    let d = tempfile::tempdir().unwrap();
    let (b1, b2) = bundles(d.path());
    let prefix = robot_with_boot(d.path(), &b1);
    fs::create_dir_all(prefix.join("boot/extlinux/.extlinux.conf.rtdeploy-tmp/x")).unwrap();
    let err = install_bundle(&prefix, &b2, &system_opts(&prefix)).unwrap_err();
    assert!(err.to_string().contains("extlinux.conf"), "{err}");
    assert_eq!(current_version(&prefix), "1");
    assert!(matches!(
        read_state(&prefix).unwrap(),
        Some(ReleaseState::Committed { .. })
    ));
    assert!(!prefix.join(REBOOT_MARKER).exists());
    assert_eq!(conf(&prefix), old_conf());
}
