//! Releases delivered by Mender's client in standalone mode (`mender
//! install ARTIFACT`, `mender commit`, `mender rollback`; no server)
//! through our update module, on a prefix robot whose `deploy supervise`
//! judges each trial: a healthy release is committed and Mender's commit
//! succeeds; a release whose listener misses its timing budget is rolled
//! back by the supervisor and Mender's commit fails; `mender rollback`
//! ends a trial; an artifact for another device type and a bundle whose
//! signature fails inside a valid artifact are refused with nothing
//! installed.
//!
//! Mender 3's client reads its update modules from the fixed
//! /usr/share/mender/modules/v3 and its first artifact name from
//! /etc/mender/artifact_info, so each `mender` runs in a private mount
//! namespace (`unshare --mount`) with the test's directories bound over
//! those two: root is needed, and Debian's `mender-client` and
//! `mender-artifact`; those tests are ignored unless asked for.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{Guard, DEPLOY};
use releases::ReleaseState;

/// The device type of the test robot.
const DEVICE: &str = "rtdeploy-test-board";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn deploy(args: &[&str]) -> Output {
    Command::new(DEPLOY)
        .args(args)
        .env_remove(units::env::CONFIG)
        .env_remove(units::env::FAULT)
        .output()
        .unwrap()
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

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// Why these tests cannot run here, if they cannot: run, they fail with it.
fn cannot_run() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Some(format!(
            "uid {euid}: mender reads its modules from /usr/share/mender/modules/v3, which the test binds over in a mount namespace (root only)"
        ));
    }
    for tool in ["mender", "mender-artifact", "unshare", "mount"] {
        if !on_path(tool) {
            return Some(format!(
                "`{tool}` is not installed (Debian: mender-client, mender-artifact, util-linux, mount)"
            ));
        }
    }
    if let Err(e) = common::examples() {
        return Some(e);
    }
    None
}

macro_rules! require_runnable {
    () => {
        if let Some(why) = cannot_run() {
            panic!("{why}");
        }
    };
}

/// Mender's client with its own configuration, data directory, modules
/// directory and /etc/mender, run as root in a private mount namespace.
struct Mender {
    dir: PathBuf,
}

impl Mender {
    /// A client whose only update module is ours, calling this test's
    /// `deploy` for `prefix`.
    fn new(dir: &Path, prefix: &Path) -> Mender {
        let dir = dir.join("mender");
        for d in ["modules", "data", "etc"] {
            fs::create_dir_all(dir.join(d)).unwrap();
        }
        let module = dir.join("modules").join(releases::mender::MODULE_TYPE);
        fs::write(
            &module,
            releases::mender::module_script(DEPLOY, &["--prefix", s(prefix)]),
        )
        .unwrap();
        fs::set_permissions(&module, fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(
            dir.join("data/device_type"),
            format!("device_type={DEVICE}\n"),
        )
        .unwrap();
        fs::write(dir.join("etc/artifact_info"), "artifact_name=factory\n").unwrap();
        // No ArtifactVerifyKey: Mender accepts unsigned artifacts; our
        // ed25519 signature inside is what the module checks.
        fs::write(
            dir.join("mender.conf"),
            serde_json::json!({
                "DeviceTypeFile": dir.join("data/device_type"),
                "ArtifactScriptsPath": dir.join("data/scripts"),
                "RootfsScriptsPath": dir.join("etc/scripts"),
                "DBus": {"Enabled": false},
            })
            .to_string(),
        )
        .unwrap();
        Mender { dir }
    }

    fn run(&self, args: &[&str]) -> Output {
        let script = format!(
            "set -e\nmount --bind {} /usr/share/mender/modules/v3\nmount --bind {} /etc/mender\nexec mender --config {} --data {} --no-syslog \"$@\"\n",
            s(&self.dir.join("modules")),
            s(&self.dir.join("etc")),
            s(&self.dir.join("mender.conf")),
            s(&self.dir.join("data")),
        );
        let o = Command::new("timeout")
            .args(["120", "unshare", "--mount", "sh", "-c", &script, "mender"])
            .args(args)
            .output()
            .unwrap();
        eprintln!("== mender {}\n{}", args.join(" "), text(&o));
        o
    }

    fn artifact_name(&self) -> String {
        let o = self.run(&["show-artifact"]);
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }
}

/// A release directory: the example controllers under bin/ (`listener`
/// optionally a script around the real one; shell stand-ins where the
/// examples are not built, for the tests that start no process),
/// robot.yaml, and a VERSION file that makes each release differ.
fn release(dir: &Path, tag: &str, listener_script: Option<&str>) -> PathBuf {
    let r = dir.join(format!("release-{tag}"));
    fs::create_dir_all(r.join("bin")).unwrap();
    let stand_in = "#!/bin/sh\nexec sleep 3600\n";
    match common::examples() {
        Ok((talker, _)) => {
            fs::copy(&talker, r.join("bin/talker")).unwrap();
        }
        Err(_) => fs::write(r.join("bin/talker"), stand_in).unwrap(),
    }
    let listener = common::examples().ok().map(|(_, l)| l);
    match (listener_script, &listener) {
        (None, Some(l)) => {
            fs::copy(l, r.join("bin/listener")).unwrap();
        }
        (Some(script), Some(l)) => {
            fs::write(r.join("bin/listener"), script.replace("@LISTENER@", s(l))).unwrap()
        }
        (_, None) => fs::write(r.join("bin/listener"), stand_in).unwrap(),
    }
    for b in ["talker", "listener"] {
        fs::set_permissions(r.join("bin").join(b), fs::Permissions::from_mode(0o755)).unwrap();
    }
    fs::write(r.join("VERSION"), format!("{tag}\n")).unwrap();
    fs::write(r.join("robot.yaml"), robot_yaml()).unwrap();
    r
}

/// A release of shell stand-ins (for the tests that start no process):
/// small, so that a test can make many.
fn small_release(dir: &Path, tag: &str) -> PathBuf {
    let r = dir.join(format!("small-{tag}"));
    fs::create_dir_all(r.join("bin")).unwrap();
    for b in ["talker", "listener"] {
        fs::write(r.join("bin").join(b), "#!/bin/sh\nexec sleep 3600\n").unwrap();
        fs::set_permissions(r.join("bin").join(b), fs::Permissions::from_mode(0o755)).unwrap();
    }
    fs::write(r.join("VERSION"), format!("{tag}\n")).unwrap();
    fs::write(r.join("robot.yaml"), robot_yaml()).unwrap();
    r
}

/// talker at 100 Hz and listener on one channel; the listener's wakeup
/// budget (250 ms) holds on a busy machine without real-time scheduling,
/// and fails when the listener is held for 600 ms; trials are judged for
/// 3 s.
fn robot_yaml() -> String {
    format!(
        "robot:\n  name: menderbot\nboard:\n  model: generic\n  cpus: 2\n\
         cpus:\n  housekeeping: 0\n  isolated: 1\nboot_check:\n  enabled: false\n\
         channels:\n  - name: /demo/ping\n    max_size: 64\n    rate: 100\n    retention: 2s\n\
         processes:\n\
         \x20 - name: talker\n    exec: bin/talker\n\
         \x20   args: [--channel, /demo/ping, --period-us, \"10000\", --every, \"100000\"]\n\
         \x20   publishes: [/demo/ping]\n\
         \x20 - name: listener\n    exec: bin/listener\n\
         \x20   args: [--channel, /demo/ping, --every, \"100000\"]\n\
         \x20   subscribes: [/demo/ping]\n    budgets: {{wakeup: 250ms}}\n    after: [talker]\n\
         update:\n  health_window: 3s\n  mender:\n    device_type: {DEVICE}\n    verdict_timeout: 60s\n"
    )
}

/// The real listener, stopped for 600 ms every 300 ms by a shell beside
/// it (the listener keeps the supervised pid: the supervisor takes timing
/// reports from that pid only): its messages wait, and its timing reports
/// show wakeups far over the budget.
const STALLED_LISTENER: &str = "#!/bin/sh
me=$$
(
    while sleep 0.3 && kill -STOP $me 2>/dev/null; do
        sleep 0.6
        kill -CONT $me 2>/dev/null || break
    done
) </dev/null >/dev/null 2>&1 &
exec @LISTENER@ \"$@\"
";

/// The bundle and its artifact for `release_dir`, signed with `key`.
fn artifact(dir: &Path, release_dir: &Path, version: &str, key: &Path, device: &str) -> PathBuf {
    let bundle = dir.join(format!("{version}-{device}.bundle"));
    let art = dir.join(format!("{version}-{device}.mender"));
    ok(deploy(&[
        "bundle",
        "--release",
        s(release_dir),
        "--version",
        version,
        "--key",
        s(key),
        "--out",
        s(&bundle),
        "--mender-artifact",
        s(&art),
        "--device-type",
        device,
    ]));
    art
}

/// A robot under `dir/robot` trusting `dir/key`, release 1.0 installed
/// and committed by `deploy install`; the key's path.
fn robot(dir: &Path) -> (PathBuf, PathBuf) {
    let key = dir.join("key");
    ok(deploy(&["keygen", "--out", s(&key)]));
    let prefix = dir.join("robot");
    common::trust_key(&prefix, &dir.join("key.pub"));
    let bundle = dir.join("1.0.bundle");
    ok(deploy(&[
        "bundle",
        "--release",
        s(&release(dir, "1.0", None)),
        "--version",
        "1.0",
        "--key",
        s(&key),
        "--out",
        s(&bundle),
    ]));
    let first = dir.join("first.yaml");
    fs::write(&first, robot_yaml()).unwrap();
    ok(deploy(&[
        "--prefix",
        s(&prefix),
        "-c",
        s(&first),
        "install",
        s(&bundle),
    ]));
    (prefix, key)
}

fn state(prefix: &Path) -> ReleaseState {
    releases::read_state(prefix).unwrap().unwrap()
}

fn committed(prefix: &Path) -> String {
    match state(prefix) {
        ReleaseState::Committed { release } => release,
        other => panic!("expected a committed release, found {other:?}"),
    }
}

fn current(prefix: &Path) -> String {
    releases::link_target(&prefix.join("opt/rtdeploy/current")).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
#[ignore = "needs root: Debian's mender-client with its modules directory bound over in a mount namespace"]
fn mender_commits_a_healthy_trial_and_fails_one_rolled_back_on_its_budget() {
    require_runnable!();
    let d = tempfile::Builder::new()
        .prefix("rtdeploy-mender-")
        .tempdir()
        .unwrap();
    let dir = d.path();
    let (prefix, key) = robot(dir);
    let first = committed(&prefix);
    let _sup: Guard = common::supervise(&prefix);
    common::wait_reports(&prefix, 1);
    let mender = Mender::new(dir, &prefix);

    // 2.0 is healthy: `mender install` leaves it in our trial, `mender
    // commit` waits for the supervisor's commit.
    let a2 = artifact(dir, &release(dir, "2.0", None), "2.0", &key, DEVICE);
    let o = mender.run(&["install", s(&a2)]);
    assert!(o.status.success(), "{}", text(&o));
    let two = match state(&prefix) {
        ReleaseState::Trial {
            release, previous, ..
        } => {
            assert_eq!(previous, first);
            release
        }
        other => panic!("expected 2.0 in trial, found {other:?}"),
    };
    assert!(two.starts_with("2.0-"), "{two}");
    assert!(
        stderr(&o).contains(&format!("{two}: installed in trial")),
        "{}",
        text(&o)
    );
    let o = mender.run(&["commit"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        stderr(&o).contains(&format!("{two}: committed by the supervisor")),
        "{}",
        text(&o)
    );
    assert_eq!(committed(&prefix), two);
    assert_eq!(mender.artifact_name(), two);

    // 3.0's listener is held up 600 ms at a time: the supervisor rolls the
    // trial back on its budget, and Mender's commit fails with our reason.
    let a3 = artifact(
        dir,
        &release(dir, "3.0", Some(STALLED_LISTENER)),
        "3.0",
        &key,
        DEVICE,
    );
    let o = mender.run(&["install", s(&a3)]);
    assert!(o.status.success(), "{}", text(&o));
    let three = current(&prefix);
    assert!(three.starts_with("3.0-"), "{three}");
    let o = mender.run(&["commit"]);
    assert!(!o.status.success(), "{}", text(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "{three}: the trial failed and was rolled back to {two}: process listener went over its timing budget"
        )),
        "{}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("Rolling back Artifact"),
        "{}",
        text(&o)
    );
    assert!(
        err.contains(&format!("nothing to roll back: current is {two}")),
        "{}",
        text(&o)
    );
    assert_eq!(committed(&prefix), two);
    assert_eq!(current(&prefix), two);
    assert_eq!(mender.artifact_name(), two, "Mender's record is unchanged");
    // The robot runs 2.0 again, healthy.
    common::wait_status(&prefix, "2.0 running again after the rollback", |s| {
        s.release
            .as_ref()
            .is_some_and(|r| r.state == "rolled-back" && r.current.as_deref() == Some(&*two))
            && s.processes.iter().all(|p| p.state == "running")
    });

    // 4.0 installed, then `mender rollback` ends its trial by our rollback.
    let a4 = artifact(dir, &release(dir, "4.0", None), "4.0", &key, DEVICE);
    let o = mender.run(&["install", s(&a4)]);
    assert!(o.status.success(), "{}", text(&o));
    let four = current(&prefix);
    assert!(four.starts_with("4.0-"), "{four}");
    let o = mender.run(&["rollback"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        stderr(&o).contains(&format!("rolled back the trial: {four} -> {two}")),
        "{}",
        text(&o)
    );
    assert_eq!(committed(&prefix), two);
    assert_eq!(mender.artifact_name(), two);
    // Cleanup ran: neither our record nor a bundle is left in Mender's
    // work directory.
    let left = files_under(&mender.dir.join("data/modules"));
    assert!(left.is_empty(), "{left:?}");
}

/// Every file under `dir` (none if it does not exist).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().unwrap().is_dir() {
                todo.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

#[test]
#[ignore = "needs root: Debian's mender-client with its modules directory bound over in a mount namespace"]
fn mender_refuses_another_device_type_and_our_module_a_bad_signature() {
    require_runnable!();
    let d = tempfile::Builder::new()
        .prefix("rtdeploy-mender-")
        .tempdir()
        .unwrap();
    let dir = d.path();
    let (prefix, key) = robot(dir);
    let first = committed(&prefix);
    let releases_before = fs::read_dir(prefix.join("opt/rtdeploy/releases"))
        .unwrap()
        .count();
    let mender = Mender::new(dir, &prefix);

    // Another board's artifact: Mender itself refuses it; our module is
    // not asked to install anything.
    let other = artifact(
        dir,
        &release(dir, "2.0", None),
        "2.0",
        &key,
        "another-board",
    );
    let o = mender.run(&["install", s(&other)]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        stderr(&o).contains(&format!(
            "image (device types [another-board]) not compatible with device {DEVICE}"
        )),
        "{}",
        text(&o)
    );
    assert!(!stderr(&o).contains("rtdeploy:"), "{}", text(&o));

    // A valid artifact for this board whose bundle is signed by a key the
    // robot does not trust: our ArtifactInstall refuses it before writing
    // anything, and Mender reports the failure.
    let stranger = dir.join("stranger");
    ok(deploy(&["keygen", "--out", s(&stranger)]));
    let bad = artifact(dir, &release(dir, "2.1", None), "2.1", &stranger, DEVICE);
    let o = mender.run(&["install", s(&bad)]);
    assert!(!o.status.success(), "{}", text(&o));
    let err = stderr(&o);
    assert!(
        err.contains(
            "bundle refused: signature does not verify against any of the 1 trusted public key(s)"
        ),
        "{}",
        text(&o)
    );
    assert!(err.contains("Installation failed"), "{}", text(&o));
    assert!(
        err.contains(&format!(
            "nothing to roll back: current is {first} (the install did not finish)"
        )),
        "{}",
        text(&o)
    );

    assert_eq!(committed(&prefix), first);
    assert_eq!(current(&prefix), first);
    assert_eq!(
        fs::read_dir(prefix.join("opt/rtdeploy/releases"))
            .unwrap()
            .count(),
        releases_before,
        "no release was added"
    );
    assert_eq!(mender.artifact_name(), "factory");
}

/// Runs one state of our module as Mender would, without Mender.
fn module(prefix: &Path, state: &str, files_dir: &Path, env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(DEPLOY);
    c.args(["--prefix", s(prefix), "mender-module", state, s(files_dir)])
        .env_remove(units::env::CONFIG)
        .env_remove(units::env::FAULT);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// A work directory as Mender's client lays it out for one payload:
/// `files/` with the bundle, `tmp/` empty.
fn files_dir(dir: &Path, name: &str, bundle: &Path) -> PathBuf {
    let f = dir.join(name);
    fs::create_dir_all(f.join("files")).unwrap();
    fs::create_dir_all(f.join("tmp")).unwrap();
    fs::copy(bundle, f.join("files/release.bundle")).unwrap();
    f
}

/// The protocol's states run by hand, as root or not: the answers, each
/// state run twice, and an install killed after every step (a power cut)
/// followed by Mender's rollback: the robot ends on the release it ran
/// before, committed.
#[test]
fn each_module_state_is_idempotent_and_a_killed_install_rolls_back() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let (prefix, key) = robot(dir);
    let first = committed(&prefix);
    let bundle = dir.join("2.0.bundle");
    ok(deploy(&[
        "bundle",
        "--release",
        s(&small_release(dir, "2.0")),
        "--version",
        "2.0",
        "--key",
        s(&key),
        "--out",
        s(&bundle),
    ]));

    let w = files_dir(dir, "work", &bundle);
    let o = ok(module(&prefix, "SupportsRollback", &w, &[]));
    assert_eq!(o.stdout, b"Yes\n");
    let o = ok(module(&prefix, "ProvidePayloadFileSizes", &w, &[]));
    assert!(o.stdout.is_empty() && o.stderr.is_empty(), "{}", text(&o));
    ok(module(&prefix, "Download", &w, &[]));

    // Install, twice: the second finds it done.
    ok(module(&prefix, "ArtifactInstall", &w, &[]));
    let two = current(&prefix);
    assert!(two.starts_with("2.0-"), "{two}");
    let o = ok(module(&prefix, "ArtifactInstall", &w, &[]));
    assert!(
        stderr(&o).contains(&format!("{two} is already installed by this artifact")),
        "{}",
        text(&o)
    );
    assert!(matches!(state(&prefix), ReleaseState::Trial { release, .. } if release == two));
    let o = ok(module(&prefix, "NeedsArtifactReboot", &w, &[]));
    assert_eq!(o.stdout, b"No\n");
    ok(module(&prefix, "ArtifactVerifyReboot", &w, &[]));

    // Rollback, twice: the second has nothing to do.
    let o = ok(module(&prefix, "ArtifactRollback", &w, &[]));
    assert!(
        stderr(&o).contains(&format!("rolled back the trial: {two} -> {first}")),
        "{}",
        text(&o)
    );
    let o = ok(module(&prefix, "ArtifactRollback", &w, &[]));
    assert!(
        stderr(&o).contains(&format!("nothing to roll back: current is {first}")),
        "{}",
        text(&o)
    );
    assert_eq!(committed(&prefix), first);
    ok(module(&prefix, "ArtifactVerifyRollbackReboot", &w, &[]));
    assert_eq!(
        module(&prefix, "ArtifactVerifyReboot", &w, &[])
            .status
            .code(),
        Some(1)
    );
    // A commit after the rollback reports the failure, every time.
    for _ in 0..2 {
        let o = module(&prefix, "ArtifactCommit", &w, &[]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(
            stderr(&o).contains(&format!("{two}: rolled back to {first} (")),
            "{}",
            text(&o)
        );
    }
    ok(module(&prefix, "ArtifactFailure", &w, &[]));
    ok(module(&prefix, "Cleanup", &w, &[]));
    ok(module(&prefix, "Cleanup", &w, &[]));
    assert!(files_under(&w.join("tmp")).is_empty());

    // A work directory whose leftover record names the running release
    // (another payload's, or an older module's without a bundle hash)
    // holds a new bundle: it is installed, not skipped as done.
    let other = dir.join("2.1.bundle");
    ok(deploy(&[
        "bundle",
        "--release",
        s(&small_release(dir, "2.1")),
        "--version",
        "2.1",
        "--key",
        s(&key),
        "--out",
        s(&other),
    ]));
    for (n, record) in [
        serde_json::json!({"previous": null, "release": first, "reboot": false}),
        serde_json::json!({"previous": null, "release": first, "bundle_sha256": "00".repeat(32)}),
    ]
    .iter()
    .enumerate()
    {
        let stale = files_dir(dir, &format!("stale{n}"), &other);
        fs::write(stale.join("tmp/rtdeploy-release.json"), record.to_string()).unwrap();
        let o = ok(module(&prefix, "ArtifactInstall", &stale, &[]));
        assert!(
            stderr(&o).contains(&format!(
                "a record of {first} is here, but not of this bundle"
            )),
            "{}",
            text(&o)
        );
        assert!(!stderr(&o).contains("already installed"), "{}", text(&o));
        assert!(current(&prefix).starts_with("2.1-"), "{}", current(&prefix));
        // And now the record is this bundle's: run again, it is done.
        let o = ok(module(&prefix, "ArtifactInstall", &stale, &[]));
        assert!(
            stderr(&o).contains("is already installed by this artifact"),
            "{}",
            text(&o)
        );
        ok(module(&prefix, "ArtifactRollback", &stale, &[]));
        assert_eq!(committed(&prefix), first);
        ok(module(&prefix, "Cleanup", &stale, &[]));
    }

    // No supervisor gives a verdict: the commit gives up after
    // update.mender.verdict_timeout (4 s in this release's robot.yaml).
    let slow = small_release(dir, "slow");
    fs::write(
        slow.join("robot.yaml"),
        robot_yaml().replace("verdict_timeout: 60s", "verdict_timeout: 4s"),
    )
    .unwrap();
    let b = dir.join("slow.bundle");
    ok(deploy(&[
        "bundle",
        "--release",
        s(&slow),
        "--version",
        "2.5",
        "--key",
        s(&key),
        "--out",
        s(&b),
    ]));
    let w = files_dir(dir, "slow", &b);
    ok(module(&prefix, "ArtifactInstall", &w, &[]));
    let slow = current(&prefix);
    let o = module(&prefix, "ArtifactCommit", &w, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        stderr(&o).contains(&format!(
            "{slow}: no verdict within update.mender.verdict_timeout (4s)"
        )),
        "{}",
        text(&o)
    );
    ok(module(&prefix, "ArtifactRollback", &w, &[]));
    assert_eq!(committed(&prefix), first);
    ok(module(&prefix, "Cleanup", &w, &[]));

    // An install cut after each step (a release of its own each time, so
    // that every step has work to do), then Mender's rollback, and a
    // second one, as after another power cut.
    let mut cut = Vec::new();
    for step in releases::FAULT_STEPS {
        let b = dir.join(format!("cut-{step}.bundle"));
        ok(deploy(&[
            "bundle",
            "--release",
            s(&small_release(dir, &format!("cut-{step}"))),
            "--version",
            &format!("3.0-{step}"),
            "--key",
            s(&key),
            "--out",
            s(&b),
        ]));
        let w = files_dir(dir, &format!("cut-{step}"), &b);
        let o = module(&prefix, "ArtifactInstall", &w, &[(units::env::FAULT, step)]);
        use std::os::unix::process::ExitStatusExt;
        if o.status.signal() == Some(libc::SIGABRT) {
            cut.push(*step);
        } else {
            assert!(o.status.success(), "{step}: {}", text(&o));
        }
        for _ in 0..2 {
            let o = module(&prefix, "ArtifactRollback", &w, &[]);
            assert!(o.status.success(), "{step}: {}", text(&o));
        }
        assert_eq!(committed(&prefix), first, "{step}");
        assert_eq!(current(&prefix), first, "{step}");
        ok(module(&prefix, "ArtifactFailure", &w, &[]));
        ok(module(&prefix, "Cleanup", &w, &[]));
    }
    assert_eq!(
        cut,
        releases::FAULT_STEPS,
        "the steps the install was cut at"
    );
}

/// `deploy bundle --mender-artifact`: an artifact `mender-artifact
/// validate` accepts, of our payload type, for the device type of
/// robot.yaml's `update.mender` unless `--device-type` says otherwise.
#[test]
#[ignore = "needs mender-artifact: Mender's own tool writes the artifact (Debian package mender-artifact)"]
fn the_artifact_carries_the_bundle_for_the_device_type() {
    assert!(
        on_path("mender-artifact"),
        "`mender-artifact` is not installed (Debian: mender-artifact)"
    );
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let key = dir.join("key");
    ok(deploy(&["keygen", "--out", s(&key)]));
    let rel = release(dir, "2.0", None);
    let (bundle, art) = (dir.join("2.0.bundle"), dir.join("2.0.mender"));
    let o = ok(deploy(&[
        "--json",
        "bundle",
        "--release",
        s(&rel),
        "--version",
        "2.0",
        "--key",
        s(&key),
        "--out",
        s(&bundle),
        "--mender-artifact",
        s(&art),
    ]));
    let w: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(w["device_type"], DEVICE);
    let name = w["release"].as_str().unwrap();
    let v = Command::new("mender-artifact")
        .args(["validate", s(&art)])
        .output()
        .unwrap();
    assert!(v.status.success(), "{}", text(&v));
    let r = Command::new("mender-artifact")
        .args(["read", s(&art)])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&r.stdout);
    assert!(out.contains(&format!("Name: {name}")), "{out}");
    assert!(
        out.contains(&format!("Compatible devices: '[{DEVICE}]'")),
        "{out}"
    );
    assert!(out.contains("Type:   rtdeploy-release"), "{out}");
    assert!(out.contains("name:     2.0.bundle"), "{out}");

    // Without update.mender and --device-type there is no device type.
    let plain = dir.join("plain");
    fs::create_dir_all(plain.join("bin")).unwrap();
    for b in ["talker", "listener"] {
        fs::copy(rel.join("bin").join(b), plain.join("bin").join(b)).unwrap();
    }
    let yaml = robot_yaml();
    fs::write(
        plain.join("robot.yaml"),
        &yaml[..yaml.find("  mender:").unwrap()],
    )
    .unwrap();
    let o = deploy(&[
        "bundle",
        "--release",
        s(&plain),
        "--version",
        "2.1",
        "--key",
        s(&key),
        "--out",
        s(&dir.join("2.1.bundle")),
        "--mender-artifact",
        s(&dir.join("2.1.mender")),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        stderr(&o).contains("no device type for the Mender artifact (pass --device-type or set update.mender.device_type in robot.yaml)"),
        "{}",
        text(&o)
    );
    assert!(!dir.join("2.1.mender").exists());
}

/// `deploy image` puts the module in Mender's modules directory when
/// robot.yaml asks for Mender, and not otherwise.
#[test]
fn the_image_installs_the_module_only_with_update_mender() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let rel = release(dir, "1.0", None);
    // A static ELF header of this machine's (the release holds this
    // machine's example controllers; the board is generic).
    let mut deploy_bin = std::fs::read(DEPLOY).unwrap()[..64].to_vec();
    deploy_bin[32..64].fill(0); // no program or section headers: static
    deploy_bin[52..54].copy_from_slice(&64u16.to_le_bytes());
    fs::write(dir.join("deploy-aarch64"), deploy_bin).unwrap();
    let yaml = robot_yaml();
    let with = dir.join("with.yaml");
    fs::rename(rel.join("robot.yaml"), &with).unwrap();
    let without = dir.join("without.yaml");
    fs::write(&without, &yaml[..yaml.find("  mender:").unwrap()]).unwrap();
    for (cfg, want) in [(with, true), (without, false)] {
        let img = dir.join(format!("{want}.tar"));
        ok(deploy(&[
            "-c",
            s(&cfg),
            "image",
            "--base",
            "none",
            "--release",
            s(&rel),
            "--deploy-binary",
            s(&dir.join("deploy-aarch64")),
            "--out",
            s(&img),
        ]));
        let o = Command::new("tar")
            .args(["-xOf", s(&img), releases::mender::MODULE_PATH])
            .output()
            .unwrap();
        if !want {
            assert!(!o.status.success(), "{}", text(&o));
            continue;
        }
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            releases::mender::module_script("/usr/bin/deploy", &[])
        );
        let l = Command::new("tar")
            .args(["-tvf", s(&img), releases::mender::MODULE_PATH])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&l.stdout).starts_with("-rwxr-xr-x"),
            "{}",
            text(&l)
        );
    }
}

/// `update.mender` is checked like every section: an unknown key and a
/// device type Mender would not take are errors at their place.
#[test]
fn config_check_refuses_a_bad_update_mender() {
    let d = tempfile::tempdir().unwrap();
    let cfg = d.path().join("robot.yaml");
    for (from, to, want) in [
        (
            "    verdict_timeout: 60s\n",
            "    verdict_timeout: 60s\n    server: https://mender.example\n",
            "server",
        ),
        (
            "device_type: rtdeploy-test-board",
            "device_type: \"orin nano\"",
            "update.mender.device_type",
        ),
        (
            "verdict_timeout: 60s",
            "verdict_timeout: 1s",
            "update.mender.verdict_timeout",
        ),
    ] {
        fs::write(&cfg, robot_yaml().replace(from, to)).unwrap();
        let o = deploy(&["-c", s(&cfg), "config", "check"]);
        assert_eq!(o.status.code(), Some(2), "{to}: {}", text(&o));
        let err = stderr(&o);
        assert!(err.contains(want), "{to}: {err}");
        assert!(err.contains(&format!("{}:", s(&cfg))), "{to}: {err}");
    }
    fs::write(&cfg, robot_yaml()).unwrap();
    ok(deploy(&["-c", s(&cfg), "config", "check"]));
}
