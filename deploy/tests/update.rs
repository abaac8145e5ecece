//! Field updates with the real binary: keygen, bundle, install, releases,
//! rollback and commit on a prefix; and `deploy update` over a real sshd on
//! loopback to two robots (two prefixes), with a connection cut and resumed.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

fn deploy(args: &[&str]) -> Output {
    deploy_env(args, &[])
}

fn deploy_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_deploy"));
    c.args(args)
        .env_remove(units::env::CONFIG)
        .env_remove(units::env::FAULT)
        .env_remove(units::env::TEST_CUT_AFTER);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_str(&ok(o)).unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn robot_yaml() -> String {
    fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/dev.yaml")).unwrap()
}

/// Bytes that zstd cannot shrink much, like machine code.
fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A release: bin/talker, bin/listener (1 MiB each; `changed` alters
/// listener) and robot.yaml.
fn release(dir: &Path, name: &str, changed: u64) -> PathBuf {
    let r = dir.join(name);
    fs::create_dir_all(r.join("bin")).unwrap();
    fs::write(r.join("bin/talker"), noise(1, 1 << 20)).unwrap();
    fs::write(r.join("bin/listener"), noise(100 + changed, 1 << 20)).unwrap();
    for b in ["talker", "listener"] {
        fs::set_permissions(r.join("bin").join(b), fs::Permissions::from_mode(0o755)).unwrap();
    }
    fs::write(r.join("robot.yaml"), robot_yaml()).unwrap();
    r
}

/// A robot prefix trusting `pubkey`, with its robot.yaml outside the
/// prefix for the first install (the install then links
/// etc/rtdeploy/robot.yaml to the current release's).
fn robot(prefix: &Path, pubkey: &Path) {
    common::trust_key(prefix, pubkey);
}

fn current_listener(prefix: &Path) -> Vec<u8> {
    fs::read(prefix.join("opt/rtdeploy/current/bin/listener")).unwrap()
}

#[test]
fn keygen_bundle_install_releases_rollback_commit() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let key = dir.join("key");
    let k = json(&deploy(&["--json", "keygen", "--out", s(&key)]));
    assert_eq!(k["public_key"].as_str().unwrap().len(), 44);
    assert_eq!(
        fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let pubkey = dir.join("key.pub");

    let b1 = dir.join("v1.bundle");
    let w = json(&deploy(&[
        "--json",
        "bundle",
        "--release",
        s(&release(dir, "r1", 0)),
        "--version",
        "1.0",
        "--key",
        s(&key),
        "--out",
        s(&b1),
    ]));
    assert_eq!(w["robot"], "dev");
    assert_eq!(w["board"], "generic");
    // deterministic: the same inputs give the same bytes
    let b1b = dir.join("v1b.bundle");
    ok(&deploy(&[
        "bundle",
        "--release",
        s(&dir.join("r1")),
        "--version",
        "1.0",
        "--key",
        s(&key),
        "--out",
        s(&b1b),
    ]));
    assert_eq!(fs::read(&b1).unwrap(), fs::read(&b1b).unwrap());

    let prefix = dir.join("robot");
    robot(&prefix, &pubkey);
    let first_cfg = dir.join("robot.yaml");
    fs::write(&first_cfg, robot_yaml()).unwrap();
    let p = s(&prefix);
    let r = json(&deploy(&[
        "--prefix",
        p,
        "-c",
        s(&first_cfg),
        "--json",
        "install",
        s(&b1),
    ]));
    assert_eq!(r["state"], "committed");
    // from now on the robot's config is the current release's
    assert!(fs::symlink_metadata(prefix.join("etc/rtdeploy/robot.yaml"))
        .unwrap()
        .file_type()
        .is_symlink());

    let b2 = dir.join("v2.bundle");
    ok(&deploy(&[
        "bundle",
        "--release",
        s(&release(dir, "r2", 1)),
        "--version",
        "2.0",
        "--key",
        s(&key),
        "--out",
        s(&b2),
    ]));
    let r = json(&deploy(&["--prefix", p, "--json", "install", s(&b2)]));
    assert_eq!(r["state"], "trial");
    assert_eq!(r["new_blobs"], 1, "only the changed binary is new");
    let l = json(&deploy(&["--prefix", p, "--json", "releases"]));
    assert_eq!(l["state"]["state"], "trial");
    assert!(l["current"].as_str().unwrap().starts_with("2.0-"));
    assert!(l["previous"].as_str().unwrap().starts_with("1.0-"));
    assert_eq!(current_listener(&prefix), noise(101, 1 << 20));

    let rb = json(&deploy(&["--prefix", p, "--json", "rollback"]));
    assert_eq!(rb["trial"], true);
    assert_eq!(current_listener(&prefix), noise(100, 1 << 20));
    let l = json(&deploy(&["--prefix", p, "--json", "releases"]));
    assert_eq!(l["state"]["state"], "committed");

    // again, and this time commit it by hand
    json(&deploy(&["--prefix", p, "--json", "install", s(&b2)]));
    let c = json(&deploy(&["--prefix", p, "--json", "commit"]));
    assert!(c["committed"].as_str().unwrap().starts_with("2.0-"));
    let text = ok(&deploy(&["--prefix", p, "releases"]));
    assert!(text.contains("current,committed"), "{text}");
}

/// One check of the programs robot.yaml runs, made by `deploy bundle`
/// before it signs and by `deploy install` before anything is written
/// (`deploy image` makes it too: deploy/tests/image.rs).
#[test]
fn a_release_without_the_programs_its_robot_yaml_runs_is_refused_by_bundle_and_install() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let key = dir.join("key");
    ok(&deploy(&["keygen", "--out", s(&key)]));
    // dev.yaml runs bin/talker and bin/listener; this release has talker
    // only.
    let rel = release(dir, "r1", 0);
    fs::remove_file(rel.join("bin/listener")).unwrap();
    let b = dir.join("v1.bundle");
    let o = deploy(&[
        "bundle",
        "--release",
        s(&rel),
        "--version",
        "1.0",
        "--key",
        s(&key),
        "--out",
        s(&b),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("lacks 1 program(s) its robot.yaml runs: bin/listener (not in the release)"),
        "{err}"
    );
    assert!(!b.exists(), "a bundle was written");

    // A bundle made without the check (by the library, as an older
    // deploy did): install refuses it and installs nothing.
    let secret = releases::bundle::load_secret_key(&key).unwrap();
    releases::bundle::write_bundle(
        &releases::bundle::BundleSpec {
            release_dir: rel.clone(),
            version: "1.0".into(),
            robot: "dev".into(),
            board: "generic".into(),
            robot_yaml: robot_yaml(),
            programs: Vec::new(),
        },
        &secret,
        &b,
    )
    .unwrap();
    let prefix = dir.join("robot");
    robot(&prefix, &dir.join("key.pub"));
    let cfg = dir.join("robot.yaml");
    fs::write(&cfg, robot_yaml()).unwrap();
    let o = deploy(&["--prefix", s(&prefix), "-c", s(&cfg), "install", s(&b)]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("lacks 1 program(s) its robot.yaml runs: bin/listener (not in the release)"),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&o.stdout).contains("installed"));
    assert!(fs::symlink_metadata(prefix.join("opt/rtdeploy/current")).is_err());
}

/// The programs of a bundle go in stripped of their debug information,
/// which `deploy bundle` keeps beside the bundle (`<bundle>.debug/`) for
/// symbolising a crash; `--no-strip` bundles them as given.
#[test]
fn bundled_programs_are_stripped_and_their_debug_information_kept_beside_the_bundle() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let key = dir.join("key");
    ok(&deploy(&["keygen", "--out", s(&key)]));
    let rel = release(dir, "r1", 0);
    // A real program with debug information: this test binary.
    let original = fs::read(std::env::current_exe().unwrap()).unwrap();
    fs::write(rel.join("bin/talker"), &original).unwrap();
    let b = dir.join("v1.bundle");
    let w = json(&deploy(&[
        "--json",
        "bundle",
        "--release",
        s(&rel),
        "--version",
        "1.0",
        "--key",
        s(&key),
        "--out",
        s(&b),
    ]));
    let debug = dir.join("v1.bundle.debug");
    assert_eq!(w["debug"], s(&debug));
    assert!(fs::read(debug.join("bin/talker.debug")).unwrap() == original);
    // The non-ELF listener is bundled as it is, with no debug file.
    assert!(!debug.join("bin/listener.debug").exists());
    // Installed, the program is the stripped one and links its debug file.
    let prefix = dir.join("robot");
    robot(&prefix, &dir.join("key.pub"));
    let cfg = dir.join("robot.yaml");
    fs::write(&cfg, robot_yaml()).unwrap();
    ok(&deploy(&[
        "--prefix",
        s(&prefix),
        "-c",
        s(&cfg),
        "install",
        s(&b),
    ]));
    let installed = fs::read(prefix.join("opt/rtdeploy/current/bin/talker")).unwrap();
    assert!(
        installed.len() < original.len() / 2,
        "{} of {} bytes",
        installed.len(),
        original.len()
    );
    assert_eq!(
        rootfs::elf::debuglink(&installed).unwrap(),
        Some(("talker.debug".to_string(), rootfs::elf::crc32(&original)))
    );
    // --no-strip: as given, no debug directory.
    let b2 = dir.join("v2.bundle");
    let w = json(&deploy(&[
        "--json",
        "bundle",
        "--release",
        s(&rel),
        "--version",
        "2.0",
        "--key",
        s(&key),
        "--out",
        s(&b2),
        "--no-strip",
    ]));
    assert!(w.get("debug").is_none(), "{w}");
    assert!(!dir.join("v2.bundle.debug").exists());
    assert!(w["release_bytes"].as_u64().unwrap() >= original.len() as u64);
}

#[test]
fn install_refuses_a_bundle_signed_by_an_unknown_key() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    ok(&deploy(&["keygen", "--out", s(&dir.join("trusted"))]));
    ok(&deploy(&["keygen", "--out", s(&dir.join("other"))]));
    let b = dir.join("v1.bundle");
    ok(&deploy(&[
        "bundle",
        "--release",
        s(&release(dir, "r1", 0)),
        "--version",
        "1",
        "--key",
        s(&dir.join("other")),
        "--out",
        s(&b),
    ]));
    let prefix = dir.join("robot");
    robot(&prefix, &dir.join("trusted.pub"));
    fs::write(dir.join("robot.yaml"), robot_yaml()).unwrap();
    let o = deploy(&[
        "--prefix",
        s(&prefix),
        "-c",
        s(&dir.join("robot.yaml")),
        "install",
        s(&b),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("signature does not verify"), "{err}");
    assert!(!prefix.join("opt").exists(), "nothing was written");
}

#[test]
fn an_installer_killed_mid_switch_leaves_a_whole_release() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    ok(&deploy(&["keygen", "--out", s(&dir.join("key"))]));
    let prefix = dir.join("robot");
    robot(&prefix, &dir.join("key.pub"));
    fs::write(dir.join("robot.yaml"), robot_yaml()).unwrap();
    let (b1, b2) = (dir.join("v1.bundle"), dir.join("v2.bundle"));
    for (r, v, b, c) in [("r1", "1", &b1, 0), ("r2", "2", &b2, 1)] {
        ok(&deploy(&[
            "bundle",
            "--release",
            s(&release(dir, r, c)),
            "--version",
            v,
            "--key",
            s(&dir.join("key")),
            "--out",
            s(b),
        ]));
    }
    let p = s(&prefix);
    ok(&deploy(&[
        "--prefix",
        p,
        "-c",
        s(&dir.join("robot.yaml")),
        "install",
        s(&b1),
    ]));
    for step in ["release-built", "previous-switched", "current-switched"] {
        let o = deploy_env(
            &["--prefix", p, "install", s(&b2)],
            &[(units::env::FAULT, step)],
        );
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            o.status.signal(),
            Some(libc_sigabrt()),
            "{step}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let cur = current_listener(&prefix);
        assert!(
            cur == noise(100, 1 << 20) || cur == noise(101, 1 << 20),
            "{step}: a mix"
        );
        // a manual rollback (or the supervisor's recovery) brings the old one back
        let l = json(&deploy(&["--prefix", p, "--json", "releases"]));
        if l["state"]["state"] == "trial" {
            ok(&deploy(&["--prefix", p, "rollback"]));
        }
        assert_eq!(current_listener(&prefix), noise(100, 1 << 20), "{step}");
    }
}

fn libc_sigabrt() -> i32 {
    6
}

// ------------------------------------------------------------ real sshd

struct Sshd {
    child: Child,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts Debian's sshd on a free loopback port with generated keys, or
/// says why it cannot.
fn start_sshd(dir: &Path) -> Result<(Sshd, Vec<String>), String> {
    let sshd = Path::new("/usr/sbin/sshd");
    if !sshd.exists() {
        return Err("no /usr/sbin/sshd (install openssh-server)".into());
    }
    if !Command::new("ssh")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Err("no ssh client (install openssh-client)".into());
    }
    // sshd needs root to log a user in.
    let uid = fs::read_to_string("/proc/self/status").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .map(|l| l.split_whitespace().nth(1).unwrap_or("").to_string())
    });
    if uid.as_deref() != Some("0") {
        return Err("not root (sshd needs root to log a user in)".into());
    }
    fs::create_dir_all(dir).unwrap();
    for (name, file) in [("host", "host_key"), ("user", "user_key")] {
        let o = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
            .arg(dir.join(file))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "ssh-keygen: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    fs::copy(dir.join("user_key.pub"), dir.join("authorized_keys")).unwrap();
    let port = free_port();
    let config = format!(
        "ListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\nAuthorizedKeysFile {d}/authorized_keys\n\
         PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
         StrictModes no\nLogLevel ERROR\n",
        d = dir.display()
    );
    fs::write(dir.join("sshd_config"), config).unwrap();
    // sshd insists on its privilege separation directory
    let _ = fs::create_dir_all("/run/sshd");
    let child = Command::new(sshd)
        .args(["-D", "-e", "-f"])
        .arg(dir.join("sshd_config"))
        .args(["-p", &port.to_string()])
        .stderr(fs::File::create(dir.join("sshd.log")).unwrap())
        .spawn()
        .map_err(|e| format!("cannot start sshd: {e}"))?;
    let guard = Sshd { child };
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if start.elapsed() > Duration::from_secs(10) {
            return Err(format!(
                "sshd did not listen: {}",
                fs::read_to_string(dir.join("sshd.log")).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let opts = vec![
        format!("Port={port}"),
        "User=root".into(),
        format!("IdentityFile={}", dir.join("user_key").display()),
        "IdentitiesOnly=yes".into(),
        "UserKnownHostsFile=/dev/null".into(),
        "StrictHostKeyChecking=no".into(),
        "LogLevel=ERROR".into(),
    ];
    Ok((guard, opts))
}

#[test]
#[ignore = "needs sshd: Debian's sshd on a loopback port, as root to log a user in (openssh-server)"]
fn update_two_robots_over_real_ssh_with_a_cut_and_resume() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let (_sshd, ssh_opts) = start_sshd(&dir.join("ssh")).unwrap_or_else(|why| panic!("{why}"));
    ok(&deploy(&["keygen", "--out", s(&dir.join("key"))]));
    let b1 = dir.join("v1.bundle");
    let b2 = dir.join("v2.bundle");
    ok(&deploy(&[
        "bundle",
        "--release",
        s(&release(dir, "r1", 0)),
        "--version",
        "1",
        "--key",
        s(&dir.join("key")),
        "--out",
        s(&b1),
    ]));
    ok(&deploy(&[
        "bundle",
        "--release",
        s(&release(dir, "r2", 1)),
        "--version",
        "2",
        "--key",
        s(&dir.join("key")),
        "--out",
        s(&b2),
    ]));

    // Two robots on this host: two prefixes, one with a name no shell
    // should see unquoted.
    let robots = [dir.join("robot-a"), dir.join("robot b'$(touch pwned)\"`x`")];
    for r in &robots {
        robot(r, &dir.join("key.pub"));
        fs::write(r.join("etc/rtdeploy/robot.yaml"), robot_yaml()).unwrap();
    }
    let hosts = dir.join("hosts");
    // a hosts file line is `DESTINATION [REMOTE_PREFIX]`: split on blanks,
    // so the odd prefix goes through --remote-prefix for the second robot
    fs::write(
        &hosts,
        format!("# robots\n127.0.0.1 {}\n", robots[0].display()),
    )
    .unwrap();
    let mut common: Vec<String> = vec![
        "--remote-deploy".into(),
        env!("CARGO_BIN_EXE_deploy").into(),
    ];
    for o in &ssh_opts {
        common.push("--ssh-option".into());
        common.push(o.clone());
    }
    let run = |bundle: &Path, extra: &[&str], env: &[(&str, &str)]| -> Output {
        let mut a: Vec<&str> = vec!["--json", "update"];
        a.extend(extra);
        a.extend(common.iter().map(String::as_str));
        a.push(s(bundle));
        deploy_env(&a, env)
    };

    // v1 to both robots, in parallel
    let o1 = run(&b1, &["--hosts-file", s(&hosts)], &[]);
    let o2 = run(
        &b1,
        &["--host", "127.0.0.1", "--remote-prefix", s(&robots[1])],
        &[],
    );
    for o in [&o1, &o2] {
        let j = json(o);
        assert_eq!(j["robots"][0]["ok"], true, "{j}");
        assert_eq!(j["robots"][0]["state"], "committed");
    }
    assert!(
        !dir.join("pwned").exists() && !Path::new("pwned").exists(),
        "the prefix reached a shell unquoted"
    );

    // v2 (one binary changed), the first connection cut mid-blob
    let o = run(
        &b2,
        &["--hosts-file", s(&hosts), "--jobs", "2"],
        &[(units::env::TEST_CUT_AFTER, "300000")],
    );
    let j = json(&o);
    let r = &j["robots"][0];
    assert_eq!(r["ok"], true, "{j}");
    assert_eq!(r["state"], "trial");
    assert_eq!(r["attempts"], 2, "{j}");
    assert!(
        r["resumed_bytes"].as_u64().unwrap() > 0,
        "the second connection resumed: {j}"
    );
    assert_eq!(
        r["blobs_sent"], 1,
        "only the changed blob (its rest, after the cut): {j}"
    );
    assert_eq!(current_listener(&robots[0]), noise(101, 1 << 20));
    // the other robot is untouched until it gets its own update
    assert_eq!(current_listener(&robots[1]), noise(100, 1 << 20));
    let o = run(
        &b2,
        &["--host", "127.0.0.1", "--remote-prefix", s(&robots[1])],
        &[],
    );
    let j = json(&o);
    assert_eq!(j["robots"][0]["ok"], true, "{j}");
    // only the changed binary crossed: about its size, not the release's
    let wire = j["robots"][0]["bytes_on_wire"].as_u64().unwrap();
    assert!(wire < (1 << 20) + (64 << 10), "{wire} bytes on the wire");
    assert_eq!(current_listener(&robots[1]), noise(101, 1 << 20));

    // a robot that refuses (no robot.yaml under that prefix): exit 1, named
    let missing = dir.join("no-robot");
    let o = run(
        &b2,
        &["--host", "127.0.0.1", "--remote-prefix", s(&missing)],
        &[],
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["failed"], 1);
    assert!(
        j["robots"][0]["error"]
            .as_str()
            .unwrap()
            .contains("robot.yaml"),
        "{j}"
    );
    assert_eq!(
        j["robots"][0]["attempts"], 1,
        "a refusal is not retried: {j}"
    );
}
