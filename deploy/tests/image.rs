//! `deploy image` and `deploy flash`, run as the real binary in a
//! temporary directory.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const EXTLINUX: &str = "TIMEOUT 30
DEFAULT primary

MENU TITLE L4T boot options

LABEL primary
      MENU LABEL primary kernel
      LINUX /boot/Image
      INITRD /boot/initrd
      APPEND ${cbootargs} root=/dev/mmcblk0p1 rw rootwait rootfstype=ext4 console=ttyTCU0,115200 fbcon=map:0
";

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

/// base/ (L4T-shaped), release/ with every program orin-nano.yaml names.
fn inputs(dir: &Path) {
    for d in ["base/etc", "base/usr/bin"] {
        fs::create_dir_all(dir.join(d)).unwrap();
    }
    write(
        &dir.join("base/boot/extlinux/extlinux.conf"),
        EXTLINUX.as_bytes(),
        0o644,
    );
    write(&dir.join("base/boot/Image"), b"kernel", 0o644);
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

/// `deploy -q -c <cfg> image` of the inputs [`inputs`] lays out (the
/// base, the release, an aarch64 deploy binary), reproducible
/// (`--source-date-epoch`), into `out`, with `extra` after.
fn image_args<'a>(cfg: &'a str, out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "-q",
        "-c",
        cfg,
        "image",
        "--base",
        "base",
        "--release",
        "release",
        "--deploy-binary",
        "deploy-aarch64",
        "--source-date-epoch",
        "1700000000",
        "--out",
        out,
    ];
    a.extend_from_slice(extra);
    a
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn image_builds_reproducibly_and_refuses_to_overwrite() {
    let t = tempfile::tempdir().unwrap();
    inputs(t.path());
    let cfg = example("orin-nano.yaml");
    let cfg = cfg.to_str().unwrap();
    let o = deploy(
        t.path(),
        &image_args(cfg, "a.tar.zst", &["--release-version", "2.1.0"]),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("wrote a.tar.zst (tar.zst"), "{out}");
    assert!(
        out.contains("APPEND    ${cbootargs} root=/dev/mmcblk0p1 rw rootwait rootfstype=ext4 console=ttyTCU0,115200 fbcon=map:0 isolcpus=managed_irq,domain,4-5 nohz_full=4-5 rcu_nocbs=4-5 rcu_nocb_poll irqaffinity=0-3 nosoftlockup"),
        "{out}"
    );
    assert!(
        out.contains("release   /opt/rtdeploy/releases/2.1.0-"),
        "{out}"
    );
    assert!(t.path().join("a.tar.zst.manifest.json").is_file());
    assert!(t.path().join("a.tar.zst.cdx.json").is_file());
    // The supervisor's unit, enabled; the release; the deploy binary.
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(t.path().join("a.tar.zst.manifest.json")).unwrap())
            .unwrap();
    let entry = |path: &str| {
        manifest["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == path)
            .cloned()
    };
    assert_eq!(
        entry("/etc/systemd/system/rtdeploy.service").unwrap()["type"],
        "file"
    );
    assert_eq!(
        entry("/etc/systemd/system/multi-user.target.wants/rtdeploy.service").unwrap()["target"],
        "/etc/systemd/system/rtdeploy.service"
    );
    assert_eq!(entry("/usr/bin/deploy").unwrap()["mode"], "0755");
    assert!(entry("/opt/rtdeploy/current").unwrap()["target"]
        .as_str()
        .unwrap()
        .starts_with("releases/2.1.0-"));

    // Same inputs, --json: the same digest.
    let o = deploy(
        t.path(),
        &image_args(cfg, "b.tar.zst", &["--release-version", "2.1.0", "--json"]),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["schema_version"], 1);
    assert_eq!(j["format"], "tar.zst");
    assert_eq!(
        fs::read(t.path().join("a.tar.zst")).unwrap(),
        fs::read(t.path().join("b.tar.zst")).unwrap()
    );
    assert!(out.contains(j["manifest_sha256"].as_str().unwrap()));

    // The output exists: refused (exit 2), untouched; --force replaces it.
    let before = fs::read(t.path().join("a.tar.zst")).unwrap();
    let mut a = image_args(cfg, "a.tar.zst", &["--release-version", "2.1.0"]);
    let o = deploy(t.path(), &a);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("exists (pass --force to replace it)"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(fs::read(t.path().join("a.tar.zst")).unwrap(), before);
    a.push("--force");
    assert!(deploy(t.path(), &a).status.success());
}

#[test]
fn image_lists_every_missing_program() {
    let t = tempfile::tempdir().unwrap();
    inputs(t.path());
    fs::remove_file(t.path().join("release/bin/planner")).unwrap();
    fs::remove_file(t.path().join("release/bin/logger")).unwrap();
    let cfg = example("orin-nano.yaml");
    let o = deploy(t.path(), &image_args(cfg.to_str().unwrap(), "x.tar", &[]));
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o.stderr);
    assert!(
        err.contains("lacks 2 program(s) its robot.yaml runs: bin/planner (not in the release), bin/logger (not in the release)"),
        "{err}"
    );
    assert!(!t.path().join("x.tar").exists());
}

#[test]
fn flash_dry_run_prints_the_jetson_commands() {
    let t = tempfile::tempdir().unwrap();
    inputs(t.path());
    let l4t = t.path().join("Linux_for_Tegra");
    write(
        &l4t.join("tools/kernel_flash/l4t_initrd_flash.sh"),
        b"#!/bin/sh\nexit 1\n",
        0o755,
    );
    write(&l4t.join("flash.sh"), b"#!/bin/sh\nexit 1\n", 0o755);
    write(&l4t.join("rootfs/README.txt"), b"", 0o644);
    write(&l4t.join("jetson-orin-nano-devkit.conf"), b"", 0o644);
    // The release as Jetson Linux R36.4.3 names it; the example's
    // robot.yaml names none.
    write(
        &l4t.join("nv_tegra/bsp_version"),
        b"BSP_BRANCH=36\nBSP_MAJOR=4\nBSP_MINOR=3\n",
        0o644,
    );
    // A base that went through NVIDIA's apply_binaries.sh.
    write(
        &t.path().join("base/etc/nv_tegra_release"),
        b"# R36 (release), REVISION: 4.3\n",
        0o644,
    );
    let cfg = example("orin-nano.yaml");
    let o = deploy(
        t.path(),
        &image_args(cfg.to_str().unwrap(), "robot.tar.zst", &[]),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = deploy(
        t.path(),
        &[
            "-c",
            cfg.to_str().unwrap(),
            "flash",
            "--image",
            "robot.tar.zst",
            "--l4t",
            "Linux_for_Tegra",
            "--dry-run",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(
        out.contains("tar --numeric-owner --same-permissions -xf "),
        "{out}"
    );
    assert!(
        out.contains("./tools/kernel_flash/l4t_initrd_flash.sh --external-device nvme0n1p1 -c tools/kernel_flash/flash_l4t_t234_nvme.xml -p '-c bootloader/generic/cfg/flash_t234_qspi.xml' --showlogs --network usb0 jetson-orin-nano-devkit internal"),
        "{out}"
    );
    assert!(out.contains("Jetson Linux R36.4.3"), "{out}");

    // Rootfs A/B, where this directory's files provide it.
    let flash_ab = |extra: &[&str]| {
        let mut a = vec![
            "-c",
            cfg.to_str().unwrap(),
            "flash",
            "--image",
            "robot.tar.zst",
            "--l4t",
            "Linux_for_Tegra",
            "--dry-run",
        ];
        a.extend_from_slice(extra);
        deploy(t.path(), &a)
    };
    let o = flash_ab(&["--rootfs-ab", "--retry-count", "2"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("has no tools/kernel_flash/flash_l4t_t234_nvme_rootfs_ab.xml"),
        "{}",
        text(&o.stderr)
    );
    write(
        &l4t.join("tools/kernel_flash/flash_l4t_t234_nvme_rootfs_ab.xml"),
        b"<partition_layout/>",
        0o644,
    );
    write(
        &l4t.join("p3767.conf.common"),
        b"if [ \"${ROOTFS_AB}\" == 1 ]; then\n\trootfs_ab=1;\nfi;\n",
        0o644,
    );
    let o = flash_ab(&["--rootfs-ab", "--retry-count", "2"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("ROOTFS_AB=1 ROOTFS_RETRY_COUNT_MAX=2 ./tools/kernel_flash/l4t_initrd_flash.sh --external-device nvme0n1p1 -c tools/kernel_flash/flash_l4t_t234_nvme_rootfs_ab.xml "),
        "{}",
        text(&o.stdout)
    );
    // A retry count alone means nothing: a usage error.
    assert_eq!(flash_ab(&["--retry-count", "2"]).status.code(), Some(2));

    // A storage the Orin Nano lacks is refused, naming what it has.
    let o = deploy(
        t.path(),
        &[
            "-c",
            cfg.to_str().unwrap(),
            "flash",
            "--image",
            "robot.tar.zst",
            "--l4t",
            "Linux_for_Tegra",
            "--storage",
            "emmc",
            "--dry-run",
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains(
            "board `jetson-orin-nano` has no emmc storage (it has nvme, usb, sd); nothing was written"
        ),
        "{}",
        text(&o.stderr)
    );
    // Nothing ran: the rootfs is still empty.
    assert_eq!(fs::read_dir(l4t.join("rootfs")).unwrap().count(), 1);

    // A board without a flash configuration is refused.
    let o = deploy(
        t.path(),
        &[
            "-c",
            example("qemu.yaml").to_str().unwrap(),
            "flash",
            "--image",
            "robot.tar.zst",
            "--l4t",
            "Linux_for_Tegra",
            "--dry-run",
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("board `qemu-x86_64` has no Jetson Linux flash configuration"),
        "{}",
        text(&o.stderr)
    );
}

/// The names in `dir`, recursively, relative to it.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if fs::symlink_metadata(&p).unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn image_refuses_an_output_inside_the_base_even_with_force() {
    let t = tempfile::tempdir().unwrap();
    inputs(t.path());
    let cfg = example("orin-nano.yaml");
    let image = |out: &str, force: bool| {
        let force: &[&str] = if force { &["--force"] } else { &[] };
        deploy(t.path(), &image_args(cfg.to_str().unwrap(), out, force))
    };
    // A previous image, put in the base as a user writing into it would.
    let o = image("robot.tar", false);
    assert!(o.status.success(), "{}", text(&o.stderr));
    fs::copy(t.path().join("robot.tar"), t.path().join("base/robot.tar")).unwrap();
    let before = listing(&t.path().join("base"));
    let previous = fs::read(t.path().join("base/robot.tar")).unwrap();

    // Replacing it with --force would pack it into the new one: refused,
    // and the base is left as it was (no output, sidecars or temporary files).
    let o = image("base/robot.tar", true);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains(
            "deploy: cannot build base/robot.tar: base/robot.tar: the output is inside the base directory base, which the image is made from"
        ),
        "{err}"
    );
    assert_eq!(listing(&t.path().join("base")), before);
    assert_eq!(fs::read(t.path().join("base/robot.tar")).unwrap(), previous);

    // A new name deeper in the base, without --force: refused the same way.
    let o = image("base/boot/new.tar", false);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("inside the base directory base"));
    assert_eq!(listing(&t.path().join("base")), before);

    // Reached through a symlink from outside: still the base.
    std::os::unix::fs::symlink("base/etc", t.path().join("into-base")).unwrap();
    let o = image("into-base/x.tar", false);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("inside the base directory base"));
    assert_eq!(listing(&t.path().join("base")), before);

    // A symlink in the base to a directory outside it is an entry of the
    // image, not a directory the build walks: writing through it is fine.
    fs::create_dir(t.path().join("images")).unwrap();
    std::os::unix::fs::symlink("../images", t.path().join("base/images")).unwrap();
    let o = image("base/images/y.tar", false);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let members = Command::new("tar")
        .arg("-tf")
        .arg(t.path().join("images/y.tar"))
        .output()
        .unwrap();
    let members = text(&members.stdout);
    assert!(members.lines().any(|l| l == "images"), "{members}");
    assert!(!members.contains("y.tar"), "{members}");
}

/// With `update.boot_attempts`, the image holds the boot partition's files
/// (U-Boot's script image and an unarmed state) in
/// /usr/lib/rtdeploy/boot-partition, from which whoever makes the disk
/// makes the FAT partition; nothing at the mount point itself.
#[test]
fn image_holds_the_boot_partition_of_a_board_that_counts_boot_attempts() {
    let t = tempfile::tempdir().unwrap();
    inputs(t.path());
    for p in ["talker", "listener"] {
        write(
            &t.path().join("release/bin").join(p),
            &elf_aarch64(p),
            0o755,
        );
    }
    // The example counts boot attempts (update.boot_attempts).
    let yaml = fs::read_to_string(example("qemu-aarch64.yaml")).unwrap();
    assert!(
        yaml.contains("  boot_attempts:\n    limit: 1\n    partition: /boot/rtboot\n"),
        "{yaml}"
    );
    fs::write(t.path().join("robot.yaml"), yaml).unwrap();
    let o = deploy(t.path(), &image_args("robot.yaml", "a.tar", &[]));
    assert!(o.status.success(), "{}", text(&o.stderr));
    // The tar's regular files under boot/rtboot (ustar headers: the
    // paths here are short).
    let tar = fs::read(t.path().join("a.tar")).unwrap();
    let mut files = std::collections::BTreeMap::new();
    let mut at = 0;
    while at + 512 <= tar.len() && tar[at] != 0 {
        let h = &tar[at..at + 512];
        let field = |r: std::ops::Range<usize>| {
            String::from_utf8_lossy(&h[r])
                .trim_end_matches('\0')
                .trim()
                .to_string()
        };
        let size = usize::from_str_radix(&field(124..136), 8).unwrap();
        let (prefix, name) = (field(345..500), field(0..100));
        let path = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let path = path.trim_start_matches("./").to_string();
        assert!(!path.starts_with("boot/rtboot/"), "{path}");
        if path.starts_with("usr/lib/rtdeploy/boot-partition/") && matches!(h[156], b'0' | 0) {
            files.insert(path, tar[at + 512..at + 512 + size].to_vec());
        }
        at += 512 + size.div_ceil(512) * 512;
    }
    let want: std::collections::BTreeMap<String, Vec<u8>> =
        releases::boot_attempts::partition_files()
            .into_iter()
            .map(|(rel, b)| {
                (
                    format!("usr/lib/rtdeploy/boot-partition/{}", rel.display()),
                    b,
                )
            })
            .collect();
    assert_eq!(files, want);
    // The state as Linux reads it: whole, no trial.
    let dir = t.path().join("rtboot");
    for (rel, b) in &files {
        write(
            &dir.join(rel.trim_start_matches("usr/lib/rtdeploy/boot-partition/")),
            b,
            0o644,
        );
    }
    let s = releases::boot_attempts::read_state(&dir).unwrap();
    assert_eq!((s.trial, s.notes.len()), (None, 0));
}

/// A robot whose bridge runs the program images install
/// (/usr/bin/rtdeploy-bridge): the image carries it, taken from beside the
/// deploy binary or from --bridge-binary, checked for the board like
/// deploy; without one the image is refused, naming what to build.
#[test]
fn image_carries_the_bridge_a_robot_runs() {
    let t = tempfile::tempdir().unwrap();
    inputs(t.path());
    let mut yaml = fs::read_to_string(example("orin-nano.yaml")).unwrap();
    assert!(!yaml.contains("\nbridge:"), "{yaml}");
    yaml.push_str("bridge:\n  forward:\n    - {channels: /imu/*, direction: out}\n");
    fs::write(t.path().join("robot.yaml"), &yaml).unwrap();
    let args = |out, extra| image_args("robot.yaml", out, extra);
    let o = deploy(t.path(), &args("a.tar", &[]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stdout));
    let e = text(&o.stderr);
    assert!(
        e.contains("robot.yaml's bridge runs /usr/bin/rtdeploy-bridge")
            && e.contains("deploy-aarch64")
            && e.contains("--bridge-binary")
            && e.contains("cargo build --release -p bridge"),
        "{e}"
    );
    assert!(!t.path().join("a.tar").exists());

    let listed = |out: &str| -> serde_json::Value {
        let m: serde_json::Value = serde_json::from_slice(
            &fs::read(t.path().join(format!("{out}.manifest.json"))).unwrap(),
        )
        .unwrap();
        m["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == "/usr/bin/rtdeploy-bridge")
            .cloned()
            .unwrap_or(serde_json::Value::Null)
    };
    // Beside the deploy binary, as cargo builds them.
    write(
        &t.path().join("rtdeploy-bridge"),
        &elf_aarch64("bridge"),
        0o755,
    );
    let o = deploy(t.path(), &args("a.tar", &[]));
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(listed("a.tar")["mode"], "0755");
    // Given: for the wrong board, refused by its path.
    write(&t.path().join("other/bridge"), &elf_x86_64("bridge"), 0o755);
    let o = deploy(
        t.path(),
        &args("b.tar", &["--bridge-binary", "other/bridge"]),
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr)
            .contains("/usr/bin/rtdeploy-bridge (from other/bridge) is built for x86_64"),
        "{}",
        text(&o.stderr)
    );
    // A robot without a bridge: none unless asked for.
    let o = deploy(
        t.path(),
        &image_args(example("orin-nano.yaml").to_str().unwrap(), "c.tar", &[]),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(listed("c.tar").is_null());
}

/// As [`elf_aarch64`], for x86_64.
fn elf_x86_64(tag: &str) -> Vec<u8> {
    let mut h = elf_aarch64(tag);
    h[18..20].copy_from_slice(&62u16.to_le_bytes());
    h
}
