//! Fixtures: an L4T-shaped base root filesystem, a release, a spec.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use cpusets::board::BootLoader;
use cpusets::config::{CpusSection, KernelSection, PartitionKind};
use rootfs::{Base, ImageSpec};
use units::cpu::CpuSet;

/// extlinux.conf shaped like the one Jetson Linux R36 installs.
pub const EXTLINUX: &str = "TIMEOUT 30
DEFAULT primary

MENU TITLE L4T boot options

LABEL primary
      MENU LABEL primary kernel
      LINUX /boot/Image
      INITRD /boot/initrd
      APPEND ${cbootargs} root=/dev/mmcblk0p1 rw rootwait rootfstype=ext4 mminit_loglevel=4 console=ttyTCU0,115200 firmware_class.path=/etc/firmware fbcon=map:0 nospectre_bhb video=efifb:off console=tty0

# Keep a known-good kernel as /boot/Image.backup and add a label for it
# before trying a new one:
# LABEL backup
#    MENU LABEL backup kernel
#    LINUX /boot/Image.backup
#    INITRD /boot/initrd
#    APPEND ${cbootargs}
";

pub const BASE_MTIME: u64 = 1_600_000_000;
pub const RELEASE_MTIME: u64 = 1_700_000_000;
/// Later than the release: must be clamped.
pub const FUTURE_MTIME: u64 = 1_900_000_000;

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

pub fn set_mtime(p: &Path, secs: u64) {
    let t = rustix::fs::Timespec {
        tv_sec: secs as i64,
        tv_nsec: 0,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        p,
        &rustix::fs::Timestamps {
            last_access: t,
            last_modification: t,
        },
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

fn write(p: &Path, bytes: &[u8], mode: u32) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, bytes).unwrap();
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// A small Jetson Linux root filesystem. As root it also holds a device
/// node and files owned by other users.
pub fn make_base(root: &Path) {
    for d in [
        "etc",
        "usr/bin",
        "usr/lib/aarch64-linux-gnu",
        "boot/extlinux",
        "home/ubuntu",
        "dev",
        "run",
        "var/log",
    ] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    fs::create_dir_all(root.join("tmp")).unwrap();
    fs::set_permissions(root.join("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
    write(&root.join("etc/hostname"), b"tegra-ubuntu\n", 0o644);
    write(
        &root.join("etc/passwd"),
        b"root:x:0:0:root:/root:/bin/bash\nubuntu:x:1000:1000::/home/ubuntu:/bin/bash\n",
        0o644,
    );
    write(
        &root.join("etc/shadow"),
        b"root:*:19000:0:99999:7:::\n",
        0o640,
    );
    write(&root.join("boot/Image"), &vec![0x4d; 300_000], 0o644);
    write(&root.join("boot/initrd"), &vec![0x1f; 70_000], 0o644);
    write(
        &root.join("boot/extlinux/extlinux.conf"),
        EXTLINUX.as_bytes(),
        0o644,
    );
    write(&root.join("usr/bin/sudo"), b"\x7fELF sudo", 0o4755);
    write(&root.join("usr/bin/perl"), b"\x7fELF perl", 0o755);
    fs::hard_link(root.join("usr/bin/perl"), root.join("usr/bin/perl5.34.0")).unwrap();
    write(
        &root.join("usr/lib/aarch64-linux-gnu/libnvrm_gpu.so"),
        &vec![7u8; 5000],
        0o644,
    );
    // Over the 1 MiB read-ahead chunk: read in several pieces.
    write(
        &root.join("usr/lib/aarch64-linux-gnu/libnvinfer.so.8"),
        &big_file(),
        0o644,
    );
    write(&root.join("home/ubuntu/.bashrc"), b"# shell\n", 0o644);
    // A long path (over tar's 100-byte name field).
    let long = "usr/lib/aarch64-linux-gnu/nvidia/a-directory-name-long-enough/to-need-the-gnu-long-name-extension-in-tar/libcuda.so.1.1";
    write(&root.join(long), b"cuda", 0o644);
    std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
    std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
    std::os::unix::fs::symlink(
        "../run/systemd/resolve/stub-resolv.conf",
        root.join("etc/resolv.conf"),
    )
    .unwrap();
    std::os::unix::fs::symlink("/usr/share/zoneinfo/Etc/UTC", root.join("etc/localtime")).unwrap();
    if is_root() {
        std::os::unix::fs::lchown(root.join("home/ubuntu"), Some(1000), Some(1000)).unwrap();
        std::os::unix::fs::lchown(root.join("home/ubuntu/.bashrc"), Some(1000), Some(1000))
            .unwrap();
        std::os::unix::fs::lchown(root.join("etc/shadow"), Some(0), Some(42)).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("dev/null"),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o666),
            rustix::fs::makedev(1, 3),
        )
        .unwrap();
        fs::set_permissions(root.join("dev/null"), fs::Permissions::from_mode(0o666)).unwrap();
    }
    // Fixed mtimes, deepest first so directories keep theirs.
    let mut all = Vec::new();
    walk(root, &mut all);
    all.sort();
    for p in all.iter().rev() {
        set_mtime(p, BASE_MTIME);
    }
    set_mtime(&root.join("etc/hostname"), FUTURE_MTIME);
    set_mtime(root, BASE_MTIME);
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        out.push(p.clone());
        if fs::symlink_metadata(&p).unwrap().is_dir() {
            walk(&p, out);
        }
    }
}

/// 3 MiB and 5 bytes of varied content.
pub fn big_file() -> Vec<u8> {
    (0..(3 << 20) + 5u32)
        .map(|i| (i.wrapping_mul(7) % 251) as u8)
        .collect()
}

pub fn make_release(dir: &Path) {
    write(&dir.join("bin/imu_reader"), &elf(183, "imu reader"), 0o755);
    write(&dir.join("bin/controller"), &elf(183, "controller"), 0o755);
    write(&dir.join("share/gains.csv"), b"kp,ki\n1,2\n", 0o600);
    let mut all = Vec::new();
    walk(dir, &mut all);
    for p in all {
        set_mtime(&p, RELEASE_MTIME);
    }
}

pub fn make_deploy_binary(p: &Path) {
    write(p, &elf(183, "deploy"), 0o755);
}
/// A static ELF program's 64-byte header for `machine` (183 aarch64, 62
/// x86_64), then `tag`: what the image's checks read of a program.
pub fn elf(machine: u16, tag: &str) -> Vec<u8> {
    let mut h = vec![0u8; 64];
    h[..4].copy_from_slice(b"\x7fELF");
    h[4] = 2; // 64-bit
    h[5] = 1; // little-endian
    h[6] = 1;
    h[16..18].copy_from_slice(&2u16.to_le_bytes()); // an executable
    h[18..20].copy_from_slice(&machine.to_le_bytes());
    h[20..24].copy_from_slice(&1u32.to_le_bytes());
    h[52..54].copy_from_slice(&64u16.to_le_bytes());
    h.extend_from_slice(tag.as_bytes());
    h
}

pub fn planned() -> Vec<cpusets::cmdline::Token> {
    let cpus = CpusSection {
        housekeeping: None,
        isolated: "4-5".parse().unwrap(),
        nohz_full: true,
        partition: PartitionKind::Isolated,
    };
    let kernel = KernelSection {
        cmdline: vec!["mitigations=off".into(), "fbcon=map:1".into()],
        ..KernelSection::default()
    };
    cpusets::cmdline::plan(&cpus, &kernel, &CpuSet::first(6))
}

/// Inputs laid out in `dir`: base/, release/, deploy.
pub struct Inputs {
    pub dir: PathBuf,
}

impl Inputs {
    pub fn new(dir: &Path) -> Inputs {
        make_base(&dir.join("base"));
        make_release(&dir.join("release"));
        make_deploy_binary(&dir.join("deploy"));
        Inputs {
            dir: dir.to_path_buf(),
        }
    }

    pub fn spec(&self) -> ImageSpec {
        ImageSpec {
            base: Base::Dir(self.dir.join("base")),
            release: self.dir.join("release"),
            deploy_binary: self.dir.join("deploy"),
            tools: Vec::new(),
            robot_yaml: "robot:\n  name: arm1\nboard:\n  model: jetson-orin-nano\n".into(),
            robot_name: "arm1".into(),
            version: "1.4.0".into(),
            rtdeploy_version: "0.1.0".into(),
            source_date_epoch: None,
            cmdline: planned(),
            boot: BootLoader::Extlinux,
            unit: Some((
                "rtdeploy.service".into(),
                "[Unit]\nDescription=rtdeploy supervisor\n".into(),
            )),
            sysctl: "kernel.sched_rt_runtime_us = -1\n".into(),
            limits: "@rtdeploy - rtprio 99\n@rtdeploy - memlock unlimited\n".into(),
            extra_files: Vec::new(),
            programs: vec!["bin/imu_reader".into(), "bin/controller".into()],
            board: "jetson-orin-nano".into(),
            arch: Some("aarch64".into()),
            strip: true,
            size: None,
            force: false,
            sync: false,
        }
    }
}

/// One tar member as read back.
#[derive(Debug, Clone)]
pub struct Member {
    pub kind: tar::EntryType,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime: u64,
    pub link: Option<String>,
    pub data: Vec<u8>,
    pub device: Option<(u32, u32)>,
}

/// Reads a tar (zstd-compressed or not) into path -> member, keeping the
/// order in a separate list.
pub fn read_tar(path: &Path) -> (Vec<String>, BTreeMap<String, Member>) {
    let bytes = fs::read(path).unwrap();
    let raw = if bytes.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        zstd::stream::decode_all(&bytes[..]).unwrap()
    } else {
        bytes
    };
    let mut a = tar::Archive::new(&raw[..]);
    let mut order = Vec::new();
    let mut map = BTreeMap::new();
    for e in a.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().to_string_lossy().into_owned();
        let h = e.header().clone();
        let link = e
            .link_name()
            .unwrap()
            .map(|l| l.to_string_lossy().into_owned());
        let mut data = Vec::new();
        e.read_to_end(&mut data).unwrap();
        order.push(name.clone());
        let device = match h.entry_type() {
            tar::EntryType::Char | tar::EntryType::Block => Some((
                h.device_major().unwrap().unwrap(),
                h.device_minor().unwrap().unwrap(),
            )),
            _ => None,
        };
        map.insert(
            name,
            Member {
                kind: h.entry_type(),
                mode: h.mode().unwrap(),
                uid: h.uid().unwrap(),
                gid: h.gid().unwrap(),
                mtime: h.mtime().unwrap(),
                link,
                data,
                device,
            },
        );
    }
    (order, map)
}

pub fn sha256_file(p: &Path) -> String {
    rootfs::release::sha256_file(p).unwrap()
}

pub fn no_progress() -> impl FnMut(rootfs::Progress) {
    |_| {}
}

/// Files left in `dir` whose name starts with `.` (temporary names).
pub fn leftovers(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect()
}

pub fn wait_a_moment() {
    std::thread::sleep(Duration::from_millis(1100));
    let _ = SystemTime::now();
}
