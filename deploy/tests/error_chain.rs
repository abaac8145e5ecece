//! A failing command prints its error chain once: `deploy: <what failed>:
//! <why>`, no cause repeated. Run as the real binary in a temporary
//! directory.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name)
}

fn deploy(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_deploy"))
        .args(args)
        .current_dir(dir)
        .env_remove("SOURCE_DATE_EPOCH")
        .env_remove(units::env::CONFIG)
        .output()
        .unwrap()
}

fn write(p: &Path, bytes: &[u8], mode: u32) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, bytes).unwrap();
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// A release with every program orin-nano.yaml names, and a deploy binary.
fn release(dir: &Path) {
    for p in [
        "imu_reader",
        "motor_controller",
        "state_estimator",
        "planner",
        "logger",
        "rt_sender",
        "rt_receiver",
        "diag_publisher",
    ] {
        write(&dir.join("release/bin").join(p), &elf_aarch64(p), 0o755);
    }
    write(&dir.join("deploy-aarch64"), &elf_aarch64("deploy"), 0o755);
}

/// A static aarch64 ELF program's 64-byte header, then `tag`: what
/// `deploy image` reads of a program.
fn elf_aarch64(tag: &str) -> Vec<u8> {
    let mut h = vec![0u8; 64];
    h[..4].copy_from_slice(b"\x7fELF");
    h[4] = 2;
    h[5] = 1;
    h[6] = 1;
    h[16..18].copy_from_slice(&2u16.to_le_bytes());
    h[18..20].copy_from_slice(&183u16.to_le_bytes());
    h[20..24].copy_from_slice(&1u32.to_le_bytes());
    h[52..54].copy_from_slice(&64u16.to_le_bytes());
    h.extend_from_slice(tag.as_bytes());
    h
}

/// The command failed (exit 2) with one `deploy: ` line that holds every
/// `expected` piece, and none of its `: `-separated parts twice.
fn assert_said_once(o: &Output, expected: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("deploy: "))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    let line = lines[0];
    for e in expected {
        assert!(line.contains(e), "`{e}` missing from: {line}");
    }
    let parts: Vec<&str> = line.split(": ").collect();
    for (i, part) in parts.iter().enumerate() {
        assert!(
            !parts[..i].contains(part),
            "`{part}` is printed twice in: {line}"
        );
    }
    assert!(line.matches("(os error").count() <= 1, "{line}");
    line.to_string()
}

#[test]
fn image_with_a_missing_base_or_release() {
    let t = tempfile::tempdir().unwrap();
    release(t.path());
    let cfg = example("orin-nano.yaml");
    let cfg = cfg.to_str().unwrap();
    let image = |base: &str, release: &str| {
        deploy(
            t.path(),
            &[
                "-c",
                cfg,
                "image",
                "--base",
                base,
                "--release",
                release,
                "--deploy-binary",
                "deploy-aarch64",
                "--out",
                "robot.tar",
            ],
        )
    };
    let o = image("no-such-base", "release");
    assert_said_once(
        &o,
        &[
            "deploy: cannot build robot.tar: ",
            "no-such-base",
            "No such file or directory (os error 2)",
        ],
    );
    let o = image("none", "no-such-release");
    assert_said_once(
        &o,
        &[
            "deploy: cannot build robot.tar: ",
            "no-such-release",
            "No such file or directory (os error 2)",
        ],
    );
}

#[test]
fn install_with_a_missing_bundle() {
    let t = tempfile::tempdir().unwrap();
    let cfg = example("orin-nano.yaml");
    let prefix = t.path().join("robot");
    fs::create_dir(&prefix).unwrap();
    let o = deploy(
        t.path(),
        &[
            "--prefix",
            prefix.to_str().unwrap(),
            "-c",
            cfg.to_str().unwrap(),
            "install",
            "no-such.bundle",
        ],
    );
    assert_said_once(
        &o,
        &["no-such.bundle", "No such file or directory (os error 2)"],
    );
}

#[test]
fn a_missing_config() {
    let t = tempfile::tempdir().unwrap();
    for args in [
        &["-c", "no-such.yaml", "plan"][..],
        &["-c", "no-such.yaml", "config", "check"][..],
    ] {
        let o = deploy(t.path(), args);
        assert_said_once(
            &o,
            &["no-such.yaml", "No such file or directory (os error 2)"],
        );
    }
}

#[test]
fn status_without_a_supervisor() {
    let t = tempfile::tempdir().unwrap();
    let cfg = example("orin-nano.yaml");
    let o = deploy(
        t.path(),
        &[
            "--prefix",
            t.path().to_str().unwrap(),
            "-c",
            cfg.to_str().unwrap(),
            "status",
        ],
    );
    assert_said_once(&o, &["(os error"]);
}
