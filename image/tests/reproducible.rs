//! Two builds from the same inputs are byte-identical, in every format.
//! The second build reads a fresh copy of the inputs, made later (other
//! inode numbers, ctimes and atimes), into another directory.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use rootfs::{build, Format};

/// Where `tool` is: on PATH or in /usr/sbin or /sbin, where e2fsprogs
/// installs and which a user's PATH often lacks (Debian's does).
fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

fn build_twice(format: Format) -> Option<(String, String, std::path::PathBuf, tempfile::TempDir)> {
    if format == Format::Ext4 {
        for t in ["mke2fs", "debugfs", "e2fsck"] {
            assert!(
                which(t).is_some(),
                "{t} is not installed (Debian package e2fsprogs)"
            );
        }
    }
    let a = tempfile::tempdir().unwrap();
    let ia = Inputs::new(a.path());
    let out_a = a.path().join(format!("a.{format}"));
    let spec = |i: &Inputs| {
        let mut s = i.spec();
        // Small enough to write and hash quickly.
        s.size = Some(24 << 20);
        s
    };
    let sa = build(&spec(&ia), &out_a, format, &mut no_progress()).unwrap();
    wait_a_moment();
    let b = tempfile::tempdir().unwrap();
    let ib = Inputs::new(b.path());
    let out_b = b.path().join(format!("b.{format}"));
    let sb = build(&spec(&ib), &out_b, format, &mut no_progress()).unwrap();
    // Equal manifests: equal trees, file by file.
    assert_eq!(sa.manifest_sha256, sb.manifest_sha256);
    // The sidecars name the image by digest; they match too.
    assert_eq!(
        std::fs::read(&sa.manifest).unwrap(),
        std::fs::read(&sb.manifest).unwrap()
    );
    assert_eq!(
        std::fs::read(&sa.sbom).unwrap(),
        std::fs::read(&sb.sbom).unwrap()
    );
    Some((sha256_file(&out_a), sha256_file(&out_b), out_a, a))
}

#[test]
fn tar_is_byte_identical() {
    let (a, b, ..) = build_twice(Format::Tar).unwrap();
    assert_eq!(a, b);
}

#[test]
fn tar_zst_is_byte_identical() {
    let (a, b, ..) = build_twice(Format::TarZst).unwrap();
    assert_eq!(a, b);
}

#[test]
fn cpio_gz_is_byte_identical() {
    let (a, b, ..) = build_twice(Format::CpioGz).unwrap();
    assert_eq!(a, b);
}

#[test]
fn ext4_is_byte_identical_and_clean() {
    let Some((a, b, img, _keep)) = build_twice(Format::Ext4) else {
        return;
    };
    assert_eq!(a, b);
    let debugfs = which("debugfs").unwrap();
    let fsck = Command::new(which("e2fsck").unwrap())
        .args(["-f", "-n"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "e2fsck: {}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    let stat = |path: &str| {
        let o = Command::new(&debugfs)
            .arg("-R")
            .arg(format!("stat {path}"))
            .arg(&img)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let sudo = stat("/usr/bin/sudo");
    assert!(sudo.contains("Mode:  04755"), "{sudo}");
    // Owners as in the base (the builder's own when not run as root).
    let uid = rustix::process::geteuid().as_raw();
    let owner = format!(
        "User: {uid:>5}   Group: {:>5}",
        rustix::process::getegid().as_raw()
    );
    assert!(sudo.contains(&owner), "{owner} in {sudo}");
    let deploy = stat("/usr/bin/deploy");
    assert!(
        deploy.contains("User:     0   Group:     0"),
        "rtdeploy's files are root's: {deploy}"
    );
    if is_root() {
        let bashrc = stat("/home/ubuntu/.bashrc");
        assert!(bashrc.contains("User:  1000   Group:  1000"), "{bashrc}");
        let null = stat("/dev/null");
        assert!(null.contains("Type: character special"), "{null}");
    }
    let link = Command::new(&debugfs)
        .args(["-R", "stat /bin"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&link.stdout).contains("Fast link dest: \"usr/bin\""));
    // Times come from the epoch, not the clock.
    let cur = stat("/etc/hostname");
    let epoch = format!("{RELEASE_MTIME:x}");
    for field in ["ctime", "atime", "mtime", "crtime"] {
        let line = cur
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{field}:")))
            .unwrap();
        assert!(line.contains(&epoch), "{field}: {line}");
    }
}
