//! System updates with the real binary on a fake tree (`--prefix` for the
//! robot, `--sysroot` for its /proc): release 2.0 moves the isolated CPUs
//! of the aarch64 test machine from 2-3 to 3, which changes the kernel
//! command line. `deploy install` says so, writes a new extlinux.conf
//! label made DEFAULT beside the previous one and asks for a reboot; the
//! test plays the boot loader (the DEFAULT label's APPEND becomes
//! /proc/cmdline, with a new boot id) and the supervisor's start-up
//! recovery; then the trial is committed (labels kept) or rolled back
//! (the previous file and release back, a reboot back asked for). An
//! install cut after every step leaves a robot that boots the old or the
//! new line, with the release that goes with it.

mod bounded;
mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use releases::ReleaseState;
use rootfs::extlinux::{append_of, default_of, label_names};

const DEPLOY: &str = env!("CARGO_BIN_EXE_deploy");
const CONF: &str = "boot/extlinux/extlinux.conf";
const MARKER: &str = "run/rtdeploy/reboot-required";

fn deploy_env(args: &[&str], fault: Option<&str>) -> Output {
    let mut c = Command::new(DEPLOY);
    c.args(args)
        .env_remove(units::env::CONFIG)
        .env_remove(units::env::FAULT);
    if let Some(f) = fault {
        c.env(units::env::FAULT, f);
    }
    c.output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(o: Output) -> Output {
    assert!(o.status.success(), "{}", text(&o));
    o
}

fn json(o: Output) -> serde_json::Value {
    serde_json::from_slice(&ok(o).stdout).unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The aarch64 test machine's robot.yaml with `isolated` CPUs (the
/// listener on the last one, the talker on the first).
fn robot_yaml(isolated: &str, talker: &str, listener: &str) -> String {
    let y = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/qemu-aarch64.yaml"),
    )
    .unwrap();
    let hk = if isolated == "3" { "0-2" } else { "0-1" };
    // This robot has neither the boot partition nor the watchdog of the
    // test machine: the boot-attempt count is the releases tests' (cut
    // there at each of its steps), the watchdog the end-to-end test's.
    let counted = "  boot_attempts:\n    limit: 1\n    partition: /boot/rtboot\n";
    let watchdog = "watchdog:\n  device: /dev/watchdog\n  timeout: 120s\n";
    assert!(y.contains(counted) && y.contains(watchdog), "{y}");
    let y = y
        .replace(counted, "")
        .replace(watchdog, "")
        .replace(
            "  housekeeping: 0-1\n  isolated: 2-3\n",
            &format!("  housekeeping: {hk}\n  isolated: {isolated}\n"),
        )
        .replace("      cpus: 0-1\n", &format!("      cpus: {hk}\n"))
        .replace("    cpus: 2\n", &format!("    cpus: {talker}\n"))
        .replace("    cpus: 3\n", &format!("    cpus: {listener}\n"));
    assert!(y.contains(&format!("isolated: {isolated}\n")), "{y}");
    y
}

fn release(dir: &Path, name: &str, yaml: &str) -> PathBuf {
    let r = dir.join(name);
    fs::create_dir_all(r.join("bin")).unwrap();
    for b in ["talker", "listener"] {
        fs::write(r.join("bin").join(b), format!("#!/bin/sh\n# {name}\n")).unwrap();
        fs::set_permissions(r.join("bin").join(b), fs::Permissions::from_mode(0o755)).unwrap();
    }
    fs::write(r.join("robot.yaml"), yaml).unwrap();
    r
}

/// Jetson Linux's extlinux.conf as `deploy image` leaves it for release
/// 1.0's plan (CPUs 2-3 isolated).
const BOOTED: &str = "TIMEOUT 30\nDEFAULT primary\n\nMENU TITLE L4T boot options\n\nLABEL primary\n      MENU LABEL primary kernel\n      LINUX /boot/Image\n      INITRD /boot/initrd\n      APPEND ${cbootargs} root=/dev/vda2 rw rootwait isolcpus=managed_irq,domain,2-3 nohz_full=2-3 rcu_nocbs=2-3 rcu_nocb_poll irqaffinity=0-1\n\nLABEL rtdeploy-original\n      MENU LABEL primary with the command line it had before rtdeploy\n      LINUX /boot/Image\n      INITRD /boot/initrd\n      APPEND ${cbootargs} root=/dev/vda2 rw rootwait\n";

struct Robot {
    _dir: tempfile::TempDir,
    prefix: PathBuf,
    sysroot: PathBuf,
    b2: PathBuf,
}

impl Robot {
    fn p(&self) -> &str {
        s(&self.prefix)
    }
    fn sys(&self) -> &str {
        s(&self.sysroot)
    }
    fn conf(&self) -> String {
        fs::read_to_string(self.prefix.join(CONF)).unwrap()
    }
    /// The boot loader: the DEFAULT label's line, a new boot id. Returns
    /// the label.
    fn boot(&self, id: &str) -> String {
        let conf = self.conf();
        let label = default_of(&conf).unwrap();
        let line = append_of(&conf, &label)
            .unwrap()
            .replace("${cbootargs}", "console=ttyAMA0");
        let p = self.sysroot.join("proc");
        fs::create_dir_all(p.join("sys/kernel/random")).unwrap();
        fs::write(p.join("sys/kernel/random/boot_id"), format!("{id}\n")).unwrap();
        fs::write(p.join("cmdline"), format!("{line}\n")).unwrap();
        let _ = fs::remove_file(self.prefix.join(MARKER));
        label
    }
    /// The supervisor's start-up recovery.
    fn start(&self) -> services::status::ReleaseStatus {
        services::supervisor::recover(&self.prefix, &self.sysroot.join("proc")).1
    }
    fn current(&self) -> String {
        releases::link_target(&self.prefix.join("opt/rtdeploy/current")).unwrap()
    }
    fn running(&self) -> String {
        fs::read_to_string(self.sysroot.join("proc/cmdline")).unwrap()
    }
    fn install(&self, fault: Option<&str>) -> Output {
        deploy_env(
            &[
                "--prefix",
                self.p(),
                "--sysroot",
                self.sys(),
                "--json",
                "install",
                s(&self.b2),
            ],
            fault,
        )
    }
}

/// A robot running release 1.0 (committed), booted with its line; the
/// bundle of 2.0 beside it.
fn robot() -> Robot {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let key = dir.join("key");
    ok(deploy_env(&["keygen", "--out", s(&key)], None));
    let y1 = robot_yaml("2-3", "2", "3");
    let y2 = robot_yaml("3", "3", "3");
    let (b1, b2) = (dir.join("v1.bundle"), dir.join("v2.bundle"));
    for (name, yaml, v, b) in [("r1", &y1, "1.0", &b1), ("r2", &y2, "2.0", &b2)] {
        ok(deploy_env(
            &[
                "bundle",
                "--release",
                s(&release(dir, name, yaml)),
                "--version",
                v,
                "--key",
                s(&key),
                "--out",
                s(b),
            ],
            None,
        ));
    }
    let prefix = dir.join("robot");
    common::trust_key(&prefix, &dir.join("key.pub"));
    fs::create_dir_all(prefix.join("boot/extlinux")).unwrap();
    fs::write(prefix.join(CONF), BOOTED).unwrap();
    let first = dir.join("robot.yaml");
    fs::write(&first, &y1).unwrap();
    let r = Robot {
        prefix,
        sysroot: dir.join("sysroot"),
        b2,
        _dir: d,
    };
    r.boot("boot-1");
    let j = json(deploy_env(
        &[
            "--prefix",
            r.p(),
            "--sysroot",
            r.sys(),
            "-c",
            s(&first),
            "--json",
            "install",
            s(&b1),
        ],
        None,
    ));
    assert_eq!(j["state"], "committed");
    assert_eq!(j["reboot"], false);
    r
}

/// Installs 2.0: a system update; returns its new label.
fn install_system_update(r: &Robot) -> String {
    // Before: the image's labels, the line of 1.0 running.
    assert_eq!(label_names(&r.conf()), ["primary", "rtdeploy-original"]);
    assert_eq!(default_of(&r.conf()).unwrap(), "primary");
    let j = json(r.install(None));
    assert_eq!(j["state"], "trial", "{j}");
    assert_eq!(j["reboot"], true, "{j}");
    let changes: Vec<&str> = j["system"]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(changes.contains(&"isolated CPUs 2-3 -> 3"), "{changes:?}");
    assert!(
        changes
            .iter()
            .any(|c| c.starts_with("process talker: CPUs 2 -> 3")),
        "{changes:?}"
    );
    let label = j["system"]["boot_entry"]["label"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(label.starts_with("rtdeploy-release-2.0-"), "{label}");
    // During the trial, before the reboot: the new label is DEFAULT, the
    // previous one kept.
    let conf = r.conf();
    assert_eq!(
        label_names(&conf),
        ["primary", "rtdeploy-original", label.as_str()]
    );
    assert_eq!(default_of(&conf).unwrap(), label);
    let append = append_of(&conf, &label).unwrap();
    assert!(
        append.contains("isolcpus=managed_irq,domain,3 "),
        "{append}"
    );
    assert!(
        append.contains("nohz_full=3 rcu_nocbs=3 rcu_nocb_poll irqaffinity=0-2"),
        "{append}"
    );
    assert!(
        append.starts_with("${cbootargs} root=/dev/vda2 rw rootwait"),
        "{append}"
    );
    assert_eq!(append_of(&conf, "primary"), append_of(BOOTED, "primary"));
    assert!(rootfs::extlinux::lint(&conf).is_empty());
    assert!(r.prefix.join(MARKER).is_file());
    // Not committed before the reboot.
    let c = deploy_env(&["--prefix", r.p(), "commit"], None);
    assert_eq!(c.status.code(), Some(2), "{}", text(&c));
    assert!(text(&c).contains("reboot first"), "{}", text(&c));
    label
}

#[test]
fn a_system_update_is_committed_after_its_reboot() {
    let r = robot();
    let label = install_system_update(&r);
    assert_eq!(r.boot("boot-2"), label);
    let st = r.start();
    assert_eq!(st.state, "trial", "{st:?}");
    assert!(r.current().starts_with("2.0-"));
    // The trial is judged with 2.0's robot.yaml in force.
    let cfg = fs::read_to_string(r.prefix.join("etc/rtdeploy/robot.yaml")).unwrap();
    assert!(cfg.contains("isolated: 3\n"));
    let c = json(deploy_env(&["--prefix", r.p(), "--json", "commit"], None));
    assert!(c["committed"].as_str().unwrap().starts_with("2.0-"));
    // After: the new label stays DEFAULT, the previous one the fallback.
    assert_eq!(default_of(&r.conf()).unwrap(), label);
    assert_eq!(
        label_names(&r.conf()),
        ["primary", "rtdeploy-original", label.as_str()]
    );
    assert!(r.running().contains("isolcpus=managed_irq,domain,3 "));
}

#[test]
fn a_failed_system_trial_boots_back_into_the_previous_label() {
    let r = robot();
    install_system_update(&r);
    r.boot("boot-2");
    assert_eq!(r.start().state, "trial");
    // The verdict: rollback (what the supervisor does on a missed budget,
    // by hand here).
    let rb = json(deploy_env(&["--prefix", r.p(), "--json", "rollback"], None));
    assert_eq!(rb["trial"], true);
    assert_eq!(rb["reboot"], true, "{rb}");
    assert_eq!(
        r.conf(),
        BOOTED,
        "the previous extlinux.conf, byte for byte"
    );
    assert!(r.current().starts_with("1.0-"));
    assert!(r.prefix.join(MARKER).is_file());
    assert_eq!(r.boot("boot-3"), "primary");
    let st = r.start();
    assert_eq!(st.state, "committed", "{st:?}");
    assert!(r.running().contains("isolcpus=managed_irq,domain,2-3 "));
    assert!(r.current().starts_with("1.0-"));
    // The next system update prunes nothing it needs and fits.
    install_system_update(&r);
}

#[test]
fn a_cut_at_every_step_boots_the_old_or_the_new_plan() {
    // Every step of the installer, and the boot file's. This robot's
    // boot attempts are not counted by the boot loader: the steps of
    // arming the count are cut in services/releases/tests/system.rs.
    let steps = releases::FAULT_STEPS
        .iter()
        .chain(releases::SYSTEM_FAULT_STEPS)
        .copied()
        .filter(|s| !s.starts_with("attempts-"));
    for step in steps {
        let r = robot();
        let o = r.install(Some(step));
        assert_eq!(
            o.status.signal(),
            Some(libc::SIGABRT),
            "step {step}: {}",
            text(&o)
        );
        let conf = r.conf();
        assert!(
            conf == BOOTED
                || default_of(&conf)
                    .unwrap()
                    .starts_with("rtdeploy-release-2.0-"),
            "step {step}: {conf}"
        );
        let label = r.boot("boot-2");
        let st = r.start();
        if r.current().starts_with("2.0-") {
            assert_ne!(label, "primary", "step {step}");
            assert_eq!(st.state, "trial", "step {step}: {st:?}");
        } else {
            assert_eq!(r.conf(), BOOTED, "step {step}");
            if r.prefix.join(MARKER).exists() {
                assert_eq!(r.boot("boot-3"), "primary", "step {step}");
                assert_ne!(r.start().state, "trial", "step {step}");
            }
        }
        let want = if r.current().starts_with("2.0-") {
            "isolcpus=managed_irq,domain,3"
        } else {
            "isolcpus=managed_irq,domain,2-3"
        };
        assert!(
            r.running().split_whitespace().any(|t| t == want),
            "step {step}: {} runs {}",
            r.current(),
            r.running()
        );
        let state = releases::read_state(&r.prefix).unwrap();
        assert!(
            matches!(
                &state,
                Some(ReleaseState::Committed { .. }) | Some(ReleaseState::Trial { .. })
            ),
            "step {step}: {state:?}"
        );
    }
}

/// `deploy update` to a robot whose new release needs a reboot: the
/// outcome says so; with `--reboot` the robot is asked (`deploy reboot`
/// there), and a `--prefix` robot, not being the running system, refuses,
/// which fails that robot. `deploy reboot` with nothing asked exits 1.
/// The transport is a local stand-in for ssh (`--ssh`) that runs the
/// remote command line here; real ssh is `update.rs`'s and the aarch64
/// end-to-end test's, which reboots a guest this way.
#[test]
fn deploy_update_reports_the_reboot_and_asks_for_it_with_reboot() {
    let update = |r: &Robot, extra: &[&str]| {
        let dir = r.prefix.parent().unwrap();
        let ssh = dir.join("local-ssh");
        fs::write(
            &ssh,
            "#!/bin/sh\n# ssh's options up to `--`, then the destination: the remote command line runs here\n\
             while [ $# -gt 0 ] && [ \"$1\" != -- ]; do shift; done\nshift 2\nexec sh -c \"$*\"\n",
        )
        .unwrap();
        fs::set_permissions(&ssh, fs::Permissions::from_mode(0o755)).unwrap();
        // The robot's deploy sees the robot's /proc (the sysroot).
        let remote = dir.join("robot-deploy");
        fs::write(
            &remote,
            format!(
                "#!/bin/sh\nexec {DEPLOY} --sysroot {} \"$@\"\n",
                r.sysroot.display()
            ),
        )
        .unwrap();
        fs::set_permissions(&remote, fs::Permissions::from_mode(0o755)).unwrap();
        let mut a = vec![
            "--json",
            "update",
            "--host",
            "robot1",
            "--ssh",
            s(&ssh),
            "--remote-deploy",
            s(&remote),
            "--remote-prefix",
            r.p(),
        ];
        a.extend(extra);
        a.push(s(&r.b2));
        deploy_env(&a, None)
    };

    // Without --reboot: installed, the outcome says a reboot is needed.
    let plain = robot();
    let j = json(update(&plain, &[]));
    let out = &j["robots"][0];
    assert_eq!(out["ok"], true, "{j}");
    assert_eq!(out["state"], "trial", "{j}");
    assert_eq!(out["reboot"], true, "{j}");
    assert_eq!(out["rebooted"], false, "{j}");

    // With --reboot: the robot is asked, and a --prefix robot refuses.
    let r = robot();
    let o = update(&r, &["--reboot"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let out = &j["robots"][0];
    assert_eq!(out["state"], "trial", "{j}");
    assert_eq!(out["reboot"], true, "{j}");
    assert_eq!(out["rebooted"], false, "{j}");
    assert_eq!(out["ok"], false, "{j}");
    let err = out["error"].as_str().unwrap();
    assert!(
        err.contains("reboot it needs was refused") && err.contains("not this running system"),
        "{err}"
    );
    assert!(r.prefix.join(MARKER).is_file());

    // On the robot: refused under a prefix, saying why it was asked.
    let o = deploy_env(&["--prefix", r.p(), "reboot"], None);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("changes the system"), "{}", text(&o));
    // After the reboot nothing asks for one.
    r.boot("boot-2");
    assert_eq!(r.start().state, "trial");
    let o = deploy_env(&["--prefix", r.p(), "--json", "reboot"], None);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["rebooting"], false, "{j}");
}

#[test]
fn the_state_of_a_system_trial_keeps_the_boot_file_once() {
    let r = robot();
    install_system_update(&r);
    let state = fs::read_to_string(r.prefix.join("var/lib/rtdeploy/state.json")).unwrap();
    let j: serde_json::Value = serde_json::from_str(&state).unwrap();
    let e = &j["system"]["boot_entry"];
    // What a rollback needs: the file as it was, and the labels.
    assert_eq!(e["previous_text"], BOOTED, "{state}");
    assert!(e["label"]
        .as_str()
        .unwrap()
        .starts_with("rtdeploy-release-2.0-"));
    // Not the new file a second time (it is on disk).
    assert!(e.get("text").is_none(), "{state}");
    assert!(
        state.len() < BOOTED.len() + 4096,
        "state.json is {} bytes for a {}-byte extlinux.conf",
        state.len(),
        BOOTED.len()
    );
}

#[test]
fn an_extlinux_conf_larger_than_the_boot_loader_reads_is_refused_within_bounds() {
    let r = robot();
    // 50 MB of comments: the lint alone passed it, and the state held it
    // twice (100 MB) for every reader of state.json to read.
    let mut big = String::from(BOOTED);
    let comment = format!("# {}\n", "x".repeat(98));
    while big.len() < 50_000_000 {
        big.push_str(&comment);
    }
    fs::write(r.prefix.join(CONF), &big).unwrap();
    drop(big);
    let state_before = fs::read(r.prefix.join("var/lib/rtdeploy/state.json")).unwrap();
    let run = bounded::deploy(&["--prefix", r.p(), "--sysroot", r.sys(), "install", s(&r.b2)]);
    run.assert_refused(&format!(
        "the board boots through extlinux.conf and {} cannot be read: holds more than 65536 bytes, the most read from it",
        r.prefix.join(CONF).display()
    ));
    // Nothing changed: the release, its state, the boot file.
    assert!(r.current().starts_with("1.0-"), "{}", r.current());
    assert_eq!(
        fs::read(r.prefix.join("var/lib/rtdeploy/state.json")).unwrap(),
        state_before
    );
    assert_eq!(
        fs::metadata(r.prefix.join(CONF)).unwrap().len() as usize / 1_000_000,
        50
    );
    assert!(!r.prefix.join(MARKER).exists());
    // Within the boot loader's sizes, the lint still says what is wrong
    // with a file, each problem once, the first 20 and a count.
    let mut bad = String::from(BOOTED);
    for _ in 0..500 {
        bad.push_str("KERNEL /boot/Image\n");
    }
    let p = rootfs::extlinux::lint(&bad);
    assert_eq!(p.len(), 21, "{p:?}");
    assert_eq!(p[20], "and 480 more problem(s)");
}
