//! The boot script of `releases::boot_attempts` under U-Boot itself:
//! Debian's `u-boot-qemu` for QEMU's arm64 virt machine boots a GPT disk
//! whose first partition is the FAT boot partition (the script and the
//! state as Linux writes them) and whose second holds extlinux.conf with
//! two labels. The labels' kernels do not exist, so every boot comes back
//! to the script, which resets the machine: `-no-reboot` makes that reset
//! the end of one QEMU run, one boot per run. What each boot chose is on
//! the console (the script's lines, and the kernel file U-Boot tried
//! first), what it counted is in the state read back from the disk.
//!
//! Every U-Boot found is tested: the host's (`/usr/lib/u-boot/qemu_arm64`,
//! bookworm's 2023.01 with `sysboot`), the aarch64 end-to-end test's (in
//! `$RTDEPLOY_CACHE/arm64-base-*`, trixie's 2025.01 with `bootflow`), and
//! any named by `RTDEPLOY_UBOOT_ARM64` (colon-separated).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use releases::boot_attempts::{self, read_state, write_state, STATE_FILES};

const FAT_START: u64 = 2048;
const FAT_SECTORS: u64 = 16384;
const ROOT_START: u64 = FAT_START + FAT_SECTORS;
const ROOT_SECTORS: u64 = 16384;

fn run(c: &mut Command) -> String {
    let out = c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"));
    assert!(
        out.status.success(),
        "{c:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn u_boots() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::env::var("RTDEPLOY_UBOOT_ARM64")
        .map(|v| v.split(':').map(PathBuf::from).collect())
        .unwrap_or_default();
    found.push("/usr/lib/u-boot/qemu_arm64/u-boot.bin".into());
    let cache = std::env::var_os(units::env::CACHE).unwrap_or("/var/cache/rtdeploy".into());
    if let Ok(dir) = std::fs::read_dir(cache) {
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with("arm64-base-") {
                found.push(e.path().join("u-boot.bin"));
            }
        }
    }
    found.retain(|p| p.is_file());
    found.sort();
    found.dedup();
    found
}

/// A disk: the boot partition (FAT) with the script and `state` (the
/// directory Linux wrote it in), and the root partition (ext4) with
/// extlinux.conf: `DEFAULT new`, labels `old` and `new`.
fn disk(work: &Path, state: &Path) -> PathBuf {
    let fat = work.join("fat.img");
    let _ = std::fs::remove_file(&fat);
    run(Command::new("mkfs.vfat")
        .args(["-C", "-n", "RTBOOT"])
        .arg(&fat)
        .arg((FAT_SECTORS / 2).to_string()));
    let i = fat.display().to_string();
    run(Command::new("mmd").args(["-i", &i, "::/rtdeploy"]));
    for (rel, bytes) in boot_attempts::partition_files() {
        let src = work.join("file");
        std::fs::write(&src, bytes).unwrap();
        run(Command::new("mcopy")
            .args(["-o", "-i", &i])
            .arg(&src)
            .arg(format!("::/{}", rel.display())));
    }
    for name in STATE_FILES {
        let p = state.join(name);
        if p.exists() {
            run(Command::new("mcopy")
                .args(["-o", "-i", &i])
                .arg(&p)
                .arg(format!("::/{name}")));
        } else {
            run(Command::new("mdel").args(["-i", &i, &format!("::/{name}")]));
        }
    }
    let root = work.join("root");
    std::fs::create_dir_all(root.join("boot/extlinux")).unwrap();
    std::fs::write(
        root.join("boot/extlinux/extlinux.conf"),
        "TIMEOUT 0\nDEFAULT new\n\nLABEL old\n  LINUX /boot/vmlinuz-old\n  APPEND root=/dev/vda2 old\n\nLABEL new\n  LINUX /boot/vmlinuz-new\n  APPEND root=/dev/vda2 new\n",
    )
    .unwrap();
    let ext = work.join("root.img");
    let _ = std::fs::remove_file(&ext);
    run(Command::new("mke2fs")
        .args(["-q", "-t", "ext4", "-d"])
        .arg(&root)
        .arg(&ext)
        .arg(format!("{}k", ROOT_SECTORS / 2)));
    let disk = work.join("disk.img");
    let _ = std::fs::remove_file(&disk);
    let f = std::fs::File::create(&disk).unwrap();
    f.set_len((ROOT_START + ROOT_SECTORS + 2048) * 512).unwrap();
    drop(f);
    let mut c = Command::new("sfdisk");
    c.args(["-q"]).arg(&disk).stdin(Stdio::piped());
    let mut child = c.spawn().unwrap();
    use std::io::Write;
    // Both partitions bootable: U-Boot scans only bootable partitions when
    // any is, the boot partition first.
    write!(
        child.stdin.take().unwrap(),
        "label: gpt\nstart={FAT_START}, size={FAT_SECTORS}, type=EBD0A0A2-B9E5-4433-87C0-68B6B72699C7, name=rtboot, attrs=LegacyBIOSBootable\nstart={ROOT_START}, size={ROOT_SECTORS}, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name=rootfs, attrs=LegacyBIOSBootable\n"
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
    for (img, start) in [(&fat, FAT_START), (&ext, ROOT_START)] {
        run(Command::new("dd")
            .arg(format!("if={}", img.display()))
            .arg(format!("of={}", disk.display()))
            .args(["bs=512", "conv=notrunc", "status=none"])
            .arg(format!("seek={start}")));
    }
    disk
}

/// What one boot did: the script's lines and the first kernel U-Boot
/// tried to load.
#[derive(Debug)]
struct Boot {
    said: Vec<String>,
    kernel: Option<String>,
}

fn boot(uboot: &Path, disk: &Path, console: &Path) -> Boot {
    let mut child = Command::new("qemu-system-aarch64")
        .args(["-M", "virt", "-cpu", "cortex-a57", "-smp", "1", "-m", "256"])
        .arg("-bios")
        .arg(uboot)
        .args([
            "-display",
            "none",
            "-monitor",
            "none",
            "-nic",
            "none",
            "-no-reboot",
        ])
        .arg("-drive")
        .arg(format!("if=none,id=hd0,file={},format=raw", disk.display()))
        .args(["-device", "virtio-blk-pci,drive=hd0"])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("qemu-system-aarch64");
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "U-Boot {} did not reset within 120 s:\n{}",
                uboot.display(),
                String::from_utf8_lossy(&std::fs::read(console).unwrap_or_default())
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = String::from_utf8_lossy(&std::fs::read(console).unwrap()).into_owned();
    let said: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("rtdeploy: "))
        .map(str::to_string)
        .collect();
    let kernel = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Retrieving file: /boot/vmlinuz-"))
        .next()
        .map(str::to_string);
    assert!(
        said.last()
            .is_some_and(|l| l.starts_with("no label of extlinux.conf booted")),
        "U-Boot {}: the script did not run to its end:\n{text}",
        uboot.display()
    );
    Boot { said, kernel }
}

/// Copies the state U-Boot left on the disk into `state`.
fn read_back(disk: &Path, state: &Path) {
    let i = format!("{}@@{}", disk.display(), FAT_START * 512);
    for name in STATE_FILES {
        let _ = std::fs::remove_file(state.join(name));
        run(Command::new("mcopy")
            .args(["-n", "-i", &i, &format!("::/{name}")])
            .arg(state.join(name)));
    }
}

#[test]
#[ignore = "needs U-Boot under QEMU: qemu-system-aarch64, u-boot-qemu, sfdisk, mkfs.vfat, mtools, mke2fs"]
fn u_boot_counts_the_attempts_and_boots_the_fallback_label_after_the_limit() {
    let boots = u_boots();
    assert!(
        !boots.is_empty(),
        "no U-Boot for qemu_arm64: install u-boot-qemu, or name one in RTDEPLOY_UBOOT_ARM64"
    );
    for uboot in boots {
        let version = String::from_utf8_lossy(&std::fs::read(&uboot).unwrap())
            .split("U-Boot 20")
            .nth(1)
            .map(|s| format!("20{}", s.split(' ').next().unwrap_or("")))
            .unwrap_or_default();
        eprintln!("U-Boot {version} ({})", uboot.display());
        let work = tempfile::tempdir().unwrap();
        let state = work.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(
            state.join(boot_attempts::SCRIPT_FILE),
            boot_attempts::script_image(&boot_attempts::script()),
        )
        .unwrap();
        let console = work.path().join("console.log");
        let say = |b: &Boot| b.said.join(" | ");

        // No trial: the DEFAULT label, nothing written.
        write_state(&state, None).unwrap();
        let d = disk(work.path(), &state);
        let b = boot(&uboot, &d, &console);
        assert_eq!(b.kernel.as_deref(), Some("new"), "{version}: {}", say(&b));
        assert_eq!(b.said.len(), 1, "{version}: {}", say(&b));
        read_back(&d, &state);
        assert_eq!(read_state(&state).unwrap().trial, None);

        // A trial with a limit of 2: two boots of `new`, then `old`, and
        // `old` again without a write.
        write_state(&state, Some(("new", "old", 2))).unwrap();
        let d = disk(work.path(), &state);
        let want = [
            ("new", "boot attempt 1 of 2 of label new", 1),
            ("new", "boot attempt 2 of 2 of label new", 2),
            (
                "old",
                "label new failed 2 boot attempts: booting label old",
                3,
            ),
            (
                "old",
                "label new failed 2 boot attempts: booting label old",
                3,
            ),
        ];
        for (i, (kernel, line, count)) in want.into_iter().enumerate() {
            let b = boot(&uboot, &d, &console);
            assert_eq!(
                b.kernel.as_deref(),
                Some(kernel),
                "{version} boot {i}: {}",
                say(&b)
            );
            assert_eq!(b.said[0], line, "{version} boot {i}");
            read_back(&d, &state);
            let s = read_state(&state).unwrap();
            assert!(s.notes.is_empty(), "{version} boot {i}: {:?}", s.notes);
            let t = s.trial.unwrap();
            assert_eq!(t.attempts, count, "{version} boot {i}");
            assert_eq!(t.fell_back(), count > 2);
        }
        // Linux clears the trial (a verdict): the DEFAULT label again.
        write_state(&state, None).unwrap();
        let d = disk(work.path(), &state);
        let b = boot(&uboot, &d, &console);
        assert_eq!(b.kernel.as_deref(), Some("new"), "{version}: {}", say(&b));

        // A count that is not one rtdeploy writes: a first attempt, said;
        // copy A cut short: copy B is read, and both are written whole.
        let g = write_state(&state, Some(("new", "old", 3))).unwrap();
        for name in STATE_FILES {
            let p = state.join(name);
            let t = std::fs::read_to_string(&p).unwrap();
            std::fs::write(&p, t.replace("rtd_attempts=0", "rtd_attempts=zz")).unwrap();
        }
        let a = state.join(STATE_FILES[0]);
        let t = std::fs::read(&a).unwrap();
        std::fs::write(&a, &t[..t.len() / 2]).unwrap();
        let d = disk(work.path(), &state);
        let b = boot(&uboot, &d, &console);
        assert_eq!(
            b.said[..2],
            [
                "boot attempt count [zz] is not one rtdeploy writes: taken as a first attempt",
                "boot attempt 1 of 3 of label new"
            ],
            "{version}"
        );
        read_back(&d, &state);
        let s = read_state(&state).unwrap();
        assert!(s.notes.is_empty(), "{version}: {:?}", s.notes);
        assert_eq!(s.generation, g);
        assert_eq!(s.trial.unwrap().attempts, 1);

        // Neither copy whole: the DEFAULT label, said.
        for name in STATE_FILES {
            std::fs::write(state.join(name), "rtd_gen=7\nrtd_trial=new\n").unwrap();
        }
        let d = disk(work.path(), &state);
        let b = boot(&uboot, &d, &console);
        assert_eq!(
            b.said[0], "neither copy of the boot state is whole: booting the default label",
            "{version}"
        );
        assert_eq!(b.kernel.as_deref(), Some("new"), "{version}");
        // No state at all (a partition never armed): as no trial.
        for name in STATE_FILES {
            std::fs::remove_file(state.join(name)).unwrap();
        }
        let d = disk(work.path(), &state);
        let b = boot(&uboot, &d, &console);
        assert_eq!(b.kernel.as_deref(), Some("new"), "{version}: {}", say(&b));
    }
}
