//! Building images from an L4T-shaped base, read back and checked.

mod common;

use std::fs;
use std::path::Path;

use common::*;
use rootfs::{build, Base, Format};

#[test]
fn l4t_base_to_tar_with_merged_append_line_and_manifest() {
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    let out = t.path().join("arm1.tar");
    let summary = build(&inputs.spec(), &out, Format::Tar, &mut no_progress()).unwrap();
    assert_eq!(
        summary.source_date_epoch, RELEASE_MTIME,
        "epoch comes from the release"
    );
    let (order, m) = read_tar(&out);

    // Sorted, root first, every directory before what it holds.
    let mut sorted = order.clone();
    sorted.sort_by(|a, b| (a != ".", a.as_str()).cmp(&(b != ".", b.as_str())));
    assert_eq!(order[0], ".");
    assert_eq!(order, sorted);

    // The APPEND line of the default label, token by token.
    let conf = String::from_utf8(m["boot/extlinux/extlinux.conf"].data.clone()).unwrap();
    let append = rootfs::extlinux::append_of(&conf, "primary").unwrap();
    let tokens: Vec<&str> = append.split_whitespace().collect();
    assert_eq!(
        tokens,
        [
            "${cbootargs}",
            "root=/dev/mmcblk0p1",
            "rw",
            "rootwait",
            "rootfstype=ext4",
            "mminit_loglevel=4",
            "console=ttyTCU0,115200",
            "firmware_class.path=/etc/firmware",
            "fbcon=map:1",
            "nospectre_bhb",
            "video=efifb:off",
            "console=tty0",
            "isolcpus=managed_irq,domain,4-5",
            "nohz_full=4-5",
            "rcu_nocbs=4-5",
            "rcu_nocb_poll",
            "irqaffinity=0-3",
            "mitigations=off",
        ]
    );
    assert_eq!(summary.append.as_deref(), Some(append.as_str()));
    // The fallback label boots the original line; the rest is kept.
    let original = EXTLINUX
        .lines()
        .find(|l| l.trim_start().starts_with("APPEND"))
        .unwrap()
        .trim_start();
    assert_eq!(
        format!(
            "APPEND {}",
            rootfs::extlinux::append_of(&conf, rootfs::extlinux::FALLBACK_LABEL).unwrap()
        ),
        original
    );
    assert!(conf.contains("# LABEL backup\n#    MENU LABEL backup kernel\n"));
    assert!(conf.starts_with("TIMEOUT 30\nDEFAULT primary\n"));
    assert!(rootfs::extlinux::lint(&conf).is_empty());
    let cmdline = String::from_utf8(m["etc/rtdeploy/cmdline"].data.clone()).unwrap();
    assert_eq!(
        cmdline,
        format!("{}\n", cpusets::cmdline::render(&planned()))
    );

    // The release, named by its manifest's digest.
    let rdir = summary.release_dir.trim_start_matches('/').to_string();
    assert!(rdir.starts_with("opt/rtdeploy/releases/1.4.0-"), "{rdir}");
    let manifest_bytes = &m[&format!("{rdir}/manifest.json")].data;
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(manifest_bytes));
    assert_eq!(&rdir[rdir.len() - 8..], &sha[..8]);
    assert_eq!(summary.release_manifest_sha256, sha);
    let manifest: serde_json::Value = serde_json::from_slice(manifest_bytes).unwrap();
    let files = manifest["files"].as_array().unwrap();
    let paths: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "bin",
            "bin/controller",
            "bin/imu_reader",
            "robot.yaml",
            "share",
            "share/gains.csv"
        ]
    );
    for f in files {
        let p = f["path"].as_str().unwrap();
        let member = &m[&format!("{rdir}/{p}")];
        assert_eq!(
            f["mode"].as_str().unwrap(),
            format!("{:04o}", member.mode),
            "{p}"
        );
        assert_eq!(f["uid"], 0);
        assert_eq!(f["gid"], 0);
        if f["type"] == "file" {
            let want = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&member.data));
            assert_eq!(f["sha256"].as_str().unwrap(), want, "{p}");
            assert_eq!(f["size"].as_u64().unwrap(), member.data.len() as u64, "{p}");
        }
    }
    // Normalised modes: executables 0755, the rest 0644, whatever the host had.
    assert_eq!(m[&format!("{rdir}/share/gains.csv")].mode, 0o644);
    assert_eq!(m[&format!("{rdir}/bin/controller")].mode, 0o755);
    assert_eq!(
        m["opt/rtdeploy/current"].link.as_deref(),
        Some(&rdir["opt/rtdeploy/".len()..])
    );
    assert_eq!(
        m["etc/rtdeploy/robot.yaml"].link.as_deref(),
        Some("/opt/rtdeploy/current/robot.yaml")
    );
    assert_eq!(
        m[&format!("{rdir}/robot.yaml")].data,
        inputs.spec().robot_yaml.as_bytes()
    );

    // The supervisor, enabled; sysctl and limits; the deploy binary.
    assert_eq!(
        m["etc/systemd/system/multi-user.target.wants/rtdeploy.service"]
            .link
            .as_deref(),
        Some("/etc/systemd/system/rtdeploy.service")
    );
    assert!(m["etc/systemd/system/rtdeploy.service"]
        .data
        .starts_with(b"[Unit]"));
    assert_eq!(
        m["etc/sysctl.d/90-rtdeploy.conf"].data,
        b"kernel.sched_rt_runtime_us = -1\n"
    );
    assert!(m["etc/security/limits.d/90-rtdeploy.conf"]
        .data
        .ends_with(b"memlock unlimited\n"));
    assert_eq!(m["usr/bin/deploy"].data, elf(183, "deploy"));
    assert_eq!(m["usr/bin/deploy"].mode, 0o755);

    // The base as it was: symlinks untouched, modes, hard links, owners.
    assert_eq!(m["bin"].link.as_deref(), Some("usr/bin"));
    assert_eq!(
        m["etc/resolv.conf"].link.as_deref(),
        Some("../run/systemd/resolve/stub-resolv.conf")
    );
    assert_eq!(
        m["etc/localtime"].link.as_deref(),
        Some("/usr/share/zoneinfo/Etc/UTC")
    );
    assert_eq!(m["usr/bin/sudo"].mode, 0o4755);
    assert_eq!(m["tmp"].mode, 0o1777);
    assert_eq!(m["usr/bin/perl5.34.0"].kind, tar::EntryType::Link);
    assert_eq!(
        m["usr/bin/perl5.34.0"].link.as_deref(),
        Some("usr/bin/perl")
    );
    assert!(m
        .keys()
        .any(|k| k.ends_with("libcuda.so.1.1") && k.len() > 100));
    // Every mtime clamped to the epoch, none from the clock.
    assert!(m.values().all(|e| e.mtime <= RELEASE_MTIME));
    assert_eq!(m["etc/hostname"].mtime, RELEASE_MTIME);
    assert_eq!(m["boot/Image"].mtime, BASE_MTIME);

    // The image manifest (sidecar) lists every entry with its digest.
    let im: serde_json::Value =
        serde_json::from_slice(&fs::read(&summary.manifest).unwrap()).unwrap();
    let im_files = im["files"].as_array().unwrap();
    assert_eq!(im_files.len(), m.len());
    let image_line = im_files
        .iter()
        .find(|f| f["path"] == "/boot/Image")
        .unwrap();
    assert_eq!(
        image_line["sha256"].as_str().unwrap(),
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
            &m["boot/Image"].data
        ))
    );
    let big = im_files
        .iter()
        .find(|f| f["path"] == "/usr/lib/aarch64-linux-gnu/libnvinfer.so.8")
        .unwrap();
    assert_eq!(
        m["usr/lib/aarch64-linux-gnu/libnvinfer.so.8"].data,
        big_file()
    );
    assert_eq!(
        big["sha256"].as_str().unwrap(),
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(big_file()))
    );
    let perl = im_files
        .iter()
        .find(|f| f["path"] == "/usr/bin/perl5.34.0")
        .unwrap();
    assert_eq!(perl["type"], "hardlink");
    assert_eq!(perl["target"], "/usr/bin/perl");

    // The SBOM: base digest, rtdeploy, each controller program.
    let sbom: serde_json::Value =
        serde_json::from_slice(&fs::read(&summary.sbom).unwrap()).unwrap();
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(sbom["specVersion"], "1.5");
    assert_eq!(
        sbom["metadata"]["component"]["properties"][0]["value"]
            .as_str()
            .unwrap(),
        sha256_file(&summary.manifest)
    );
    assert_eq!(summary.manifest_sha256, sha256_file(&summary.manifest));
    let comps = sbom["components"].as_array().unwrap();
    assert_eq!(
        comps[0]["hashes"][0]["content"].as_str(),
        summary.base_sha256.as_deref()
    );
    let names: Vec<&str> = comps.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "base root filesystem",
            "rtdeploy",
            "controller",
            "imu_reader"
        ]
    );
    assert_eq!(
        comps[3]["hashes"][0]["content"].as_str().unwrap(),
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(elf(
            183,
            "imu reader"
        )))
    );
    assert!(leftovers(t.path()).is_empty(), "{:?}", leftovers(t.path()));
    // Made like any file of the user's: the umask decides, not 0600.
    let umask = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
    rustix::process::umask(umask);
    for p in [&out, &summary.manifest, &summary.sbom] {
        let mode = std::os::unix::fs::PermissionsExt::mode(&fs::metadata(p).unwrap().permissions());
        assert_eq!(
            mode & 0o777,
            0o666 & !umask.as_raw_mode() as u32,
            "{}",
            p.display()
        );
    }
}

/// The base's owners other than the user and its device node reach the
/// image as they are (a base made by root).
#[test]
#[ignore = "needs root: a base with files of other owners and a device node"]
fn owners_and_device_nodes_of_the_base_are_kept() {
    assert!(
        is_root(),
        "make_base gives other owners and /dev/null only as root"
    );
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    let out = t.path().join("owners.tar");
    build(&inputs.spec(), &out, Format::Tar, &mut no_progress()).unwrap();
    let (_, m) = read_tar(&out);
    assert_eq!(
        (m["home/ubuntu/.bashrc"].uid, m["home/ubuntu/.bashrc"].gid),
        (1000, 1000)
    );
    assert_eq!(m["etc/shadow"].gid, 42);
    assert_eq!(m["dev/null"].kind, tar::EntryType::Char);
    assert_eq!(m["dev/null"].device, Some((1, 3)));
}

/// The same base given as a directory, a plain tar, a .tar.gz, a .tbz2 and a
/// .tar.zst gives the same image bytes.
#[test]
fn tar_bases_give_the_same_image_as_the_directory() {
    require("tar");
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    let base_tar = t.path().join("base.tar");
    let st = std::process::Command::new("tar")
        .args(["--sort=name", "--numeric-owner", "-C"])
        .arg(t.path().join("base"))
        .arg("-cf")
        .arg(&base_tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    let raw = fs::read(&base_tar).unwrap();
    let gz = t.path().join("base.tar.gz");
    let mut enc =
        flate2::write::GzEncoder::new(fs::File::create(&gz).unwrap(), flate2::Compression::fast());
    std::io::Write::write_all(&mut enc, &raw).unwrap();
    enc.finish().unwrap();
    let zst = t.path().join("base.tar.zst");
    fs::write(&zst, zstd::stream::encode_all(&raw[..], 3).unwrap()).unwrap();
    // As Jetson Linux ships its sample root filesystem: a .tbz2, here of
    // two concatenated streams as pbzip2 and lbzip2 write.
    let tbz2 = t.path().join("base.tbz2");
    let half = raw.len() / 2;
    let mut bz = Vec::new();
    for part in [&raw[..half], &raw[half..]] {
        let mut enc = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
        std::io::Write::write_all(&mut enc, part).unwrap();
        bz.extend(enc.finish().unwrap());
    }
    fs::write(&tbz2, bz).unwrap();

    let from_dir = t.path().join("dir.tar");
    build(&inputs.spec(), &from_dir, Format::Tar, &mut no_progress()).unwrap();
    let want = sha256_file(&from_dir);
    for (i, base) in [&base_tar, &gz, &zst, &tbz2].into_iter().enumerate() {
        let mut spec = inputs.spec();
        spec.base = Base::from_arg(base);
        assert!(matches!(spec.base, Base::Tar(_)));
        let out = t.path().join(format!("from-tar-{i}.tar"));
        let s = build(&spec, &out, Format::Tar, &mut no_progress()).unwrap();
        assert_eq!(
            sha256_file(&out),
            want,
            "image from {} differs from the directory's",
            base.display()
        );
        assert_eq!(s.base_sha256.unwrap(), sha256_file(base));
    }
}

#[test]
fn overlay_only_image_has_the_release_and_its_parents() {
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    let mut spec = inputs.spec();
    spec.base = Base::None;
    spec.source_date_epoch = Some(1_650_000_000);
    let out = t.path().join("overlay.tar.zst");
    let s = build(&spec, &out, Format::TarZst, &mut no_progress()).unwrap();
    assert_eq!(s.source_date_epoch, 1_650_000_000);
    assert!(s.append.is_none());
    assert!(
        s.warnings.iter().any(|w| w.contains("extlinux")),
        "{:?}",
        s.warnings
    );
    let (_, m) = read_tar(&out);
    for d in ["opt", "opt/rtdeploy", "etc/security/limits.d", "usr/bin"] {
        assert_eq!(m[d].kind, tar::EntryType::Directory, "{d}");
        assert_eq!((m[d].mode, m[d].uid), (0o755, 0), "{d}");
    }
    assert!(m.contains_key("etc/rtdeploy/cmdline"));
    assert!(!m.contains_key("boot/extlinux/extlinux.conf"));
    assert!(m.values().all(|e| e.mtime == 1_650_000_000));
}

#[test]
fn cpio_is_newc_with_the_release() {
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    let out = t.path().join("initramfs.cpio.gz");
    build(&inputs.spec(), &out, Format::CpioGz, &mut no_progress()).unwrap();
    let gz = fs::read(&out).unwrap();
    // gzip header: no mtime, so the bytes do not depend on the clock.
    assert_eq!(&gz[..4], &[0x1f, 0x8b, 8, 0]);
    assert_eq!(&gz[4..8], &[0, 0, 0, 0]);
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
    let names = cpio_names(&raw);
    assert_eq!(names[0], ".");
    assert_eq!(names.last().unwrap(), "TRAILER!!!");
    assert!(names.contains(&"usr/bin/deploy".to_string()));
    assert!(names.contains(&"opt/rtdeploy/current".to_string()));
}

/// GNU cpio unpacks the initramfs.
#[test]
#[ignore = "needs cpio: GNU cpio reads the image back (Debian package cpio)"]
fn cpio_unpacks_the_initramfs() {
    require("cpio");
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    let out = t.path().join("initramfs.cpio.gz");
    build(&inputs.spec(), &out, Format::CpioGz, &mut no_progress()).unwrap();
    let mut raw = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(fs::File::open(&out).unwrap()),
        &mut raw,
    )
    .unwrap();
    let dir = t.path().join("unpacked");
    fs::create_dir(&dir).unwrap();
    let st = std::process::Command::new("cpio")
        .args(["-i", "-d", "--quiet", "--no-absolute-filenames"])
        .current_dir(&dir)
        .stdin(fs::File::open(write_raw(t.path(), &raw)).unwrap())
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(
        fs::read(dir.join("usr/bin/deploy")).unwrap(),
        elf(183, "deploy")
    );
    assert_eq!(
        fs::read_link(dir.join("bin")).unwrap(),
        Path::new("usr/bin")
    );
}

/// An output the build would read back or overwrite is refused before
/// anything is written: inside the release directory, or one of the input
/// files (--force or not).
#[test]
fn an_output_among_the_inputs_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    let out = t.path().join("release/share/image.tar");
    let e = build(&inputs.spec(), &out, Format::Tar, &mut no_progress())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the output is inside the release directory"),
        "{e}"
    );
    let mut names: Vec<_> = fs::read_dir(t.path().join("release/share"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["gains.csv"]);

    let mut spec = inputs.spec();
    spec.force = true;
    let deploy = t.path().join("deploy");
    let e = build(&spec, &deploy, Format::Tar, &mut no_progress())
        .unwrap_err()
        .to_string();
    assert!(e.contains("the output is the deploy binary"), "{e}");
    assert_eq!(fs::read(&deploy).unwrap(), elf(183, "deploy"));

    // A tar base replaced by the image made from it.
    let base_tar = t.path().join("base.tar");
    build(&inputs.spec(), &base_tar, Format::Tar, &mut no_progress()).unwrap();
    let before = fs::read(&base_tar).unwrap();
    spec.base = Base::Tar(base_tar.clone());
    let e = build(&spec, &base_tar, Format::Tar, &mut no_progress())
        .unwrap_err()
        .to_string();
    assert!(e.contains("the output is the base"), "{e}");
    assert_eq!(fs::read(&base_tar).unwrap(), before);
    assert!(leftovers(t.path()).is_empty(), "{:?}", leftovers(t.path()));
}

/// Makes `rel` in the base: `size` bytes, `writes` in it, holes elsewhere.
/// `false` when the filesystem keeps no holes (the file is then removed).
fn sparse_file(base: &Path, rel: &str, size: u64, writes: &[(u64, &[u8])]) -> bool {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let p = base.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    let f = fs::File::create(&p).unwrap();
    f.set_len(size).unwrap();
    for (at, bytes) in writes {
        f.write_all_at(bytes, *at).unwrap();
    }
    set_mtime(&p, BASE_MTIME);
    set_mtime(p.parent().unwrap(), BASE_MTIME);
    let sparse = f.metadata().unwrap().blocks() * 512 < size;
    if !sparse {
        fs::remove_file(&p).unwrap();
    }
    sparse
}

/// Whether two files hold the same bytes (read a piece at a time).
fn same_content(a: &Path, b: &Path) -> bool {
    use std::io::Read;
    let (mut a, mut b) = (fs::File::open(a).unwrap(), fs::File::open(b).unwrap());
    if a.metadata().unwrap().len() != b.metadata().unwrap().len() {
        return false;
    }
    let (mut x, mut y) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = a.read(&mut x).unwrap();
        if n == 0 {
            return true;
        }
        b.read_exact(&mut y[..n]).unwrap();
        if x[..n] != y[..n] {
            return false;
        }
    }
}

fn allocated(p: &Path) -> u64 {
    std::os::unix::fs::MetadataExt::blocks(&fs::metadata(p).unwrap()) * 512
}

/// The apparent size of the big sparse file: many times the rest of the
/// base (about 3.5 MiB). Every byte of it, holes included, is hashed for
/// the image manifest, and this crate's tests run unoptimised, where that
/// costs over a minute per GiB; the holes are kept the same way at any size.
const BIG: u64 = 64 << 20;
const DISK: &str = "var/lib/machines/disk.img";
const TAIL: &str = "var/lib/machines/tail.img";

/// The fixture base plus two sparse files: DISK (BIG bytes, 4 KiB of data
/// in the middle and 4 bytes near the start, ends in a hole) and TAIL
/// (ends in 10 bytes of data after a 1 MiB hole). `None` when the
/// filesystem of the temporary directory keeps no holes, which fails the
/// test: ext4, xfs, btrfs and tmpfs keep them (set TMPDIR to one of
/// those).
fn sparse_inputs(dir: &Path) -> Inputs {
    let inputs = Inputs::new(dir);
    let base = dir.join("base");
    let sparse = sparse_file(
        &base,
        DISK,
        BIG,
        &[(BIG / 2, &[0xa5; 4096]), (4096, b"head")],
    ) && sparse_file(
        &base,
        TAIL,
        (1 << 20) + 100,
        &[((1 << 20) + 90, b"0123456789")],
    );
    assert!(sparse, "{NO_HOLES}");
    inputs
}

const NO_HOLES: &str =
    "the temporary directory's filesystem keeps no holes (set TMPDIR to ext4, xfs, btrfs or tmpfs)";

/// Fails the test when `tool` is missing.
fn require(tool: &str) {
    assert!(which(tool), "`{tool}` is not installed");
}

/// GNU tar or bsdtar extract the sparse image to the same bytes, with
/// their holes.
fn extract_sparse(tool: &str) {
    require(tool);
    let t = tempfile::tempdir().unwrap();
    let inputs = sparse_inputs(t.path());
    let base = t.path().join("base");
    let out = t.path().join("sparse.tar");
    build(&inputs.spec(), &out, Format::Tar, &mut no_progress()).unwrap();
    let dir = t.path().join(format!("x-{tool}"));
    fs::create_dir(&dir).unwrap();
    let st = std::process::Command::new(tool)
        .arg("-xf")
        .arg(&out)
        .current_dir(&dir)
        .status()
        .unwrap();
    assert!(st.success(), "{tool}");
    for rel in [DISK, TAIL] {
        assert!(
            same_content(&base.join(rel), &dir.join(rel)),
            "{tool}: /{rel}"
        );
    }
    assert!(
        allocated(&dir.join(DISK)) < 1 << 20,
        "{tool} wrote the holes"
    );
    assert_eq!(
        fs::read(dir.join("etc/hostname")).unwrap(),
        b"tegra-ubuntu\n"
    );
}

#[test]
fn gnu_tar_extracts_a_sparse_file_with_its_holes() {
    extract_sparse("tar");
}

#[test]
#[ignore = "needs bsdtar: libarchive's tar extracts the image (Debian package libarchive-tools)"]
fn bsdtar_extracts_a_sparse_file_with_its_holes() {
    extract_sparse("bsdtar");
}

/// A sparse file stays sparse in a tar: the image is small (the tests
/// above extract it).
#[test]
fn a_sparse_file_stays_sparse_in_a_tar() {
    let t = tempfile::tempdir().unwrap();
    let inputs = sparse_inputs(t.path());
    let out = t.path().join("sparse.tar");
    let s = build(&inputs.spec(), &out, Format::Tar, &mut no_progress()).unwrap();
    assert!(s.data_bytes > BIG);
    assert!(s.bytes < 8 << 20, "image of {} bytes", s.bytes);
    // The manifest describes the whole file.
    let im: serde_json::Value = serde_json::from_slice(&fs::read(&s.manifest).unwrap()).unwrap();
    let line = im["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == format!("/{DISK}"))
        .unwrap();
    assert_eq!(line["size"], BIG);
}

/// The same content with its zeros written out in part (other blocks on
/// disk, same bytes) gives the same image: the map follows the content.
#[test]
fn sparse_maps_follow_the_content_not_the_disk_layout() {
    let t = tempfile::tempdir().unwrap();
    let inputs = sparse_inputs(t.path());
    let a = t.path().join("a.tar");
    build(&inputs.spec(), &a, Format::Tar, &mut no_progress()).unwrap();
    // Zeros written over part of the holes (and over the start).
    let base = t.path().join("base");
    let zeros = vec![0u8; 3 << 20];
    assert!(sparse_file(
        &base,
        DISK,
        BIG,
        &[
            (0, &zeros),
            (BIG / 4, &zeros),
            (BIG / 2, &[0xa5; 4096]),
            (4096, b"head")
        ]
    ));
    assert!(allocated(&base.join(DISK)) >= 6 << 20);
    let b = t.path().join("b.tar");
    build(&inputs.spec(), &b, Format::Tar, &mut no_progress()).unwrap();
    assert_eq!(sha256_file(&a), sha256_file(&b));
    assert!(fs::metadata(&b).unwrap().len() < 8 << 20);
}

/// ext4 keeps the holes: the file system is sized by the data, and the
/// file in it has only its data blocks.
#[test]
fn a_sparse_file_stays_sparse_in_ext4() {
    require("mke2fs");
    let debugfs = tool_path("debugfs").expect("debugfs (Debian package e2fsprogs)");
    let t = tempfile::tempdir().unwrap();
    let inputs = sparse_inputs(t.path());
    let out = t.path().join("sparse.ext4");
    let s = build(&inputs.spec(), &out, Format::Ext4, &mut no_progress()).unwrap();
    // Sized for the data (plus 20% and 96 MiB of headroom): counting the
    // holes as data it would be over BIG + 96 MiB.
    assert!(
        s.bytes < BIG + (96 << 20),
        "file system of {} bytes",
        s.bytes
    );
    let stat = std::process::Command::new(&debugfs)
        .arg("-R")
        .arg(format!("stat /{DISK}"))
        .arg(&out)
        .output()
        .unwrap();
    let stat = String::from_utf8_lossy(&stat.stdout).into_owned();
    assert!(stat.contains(&format!("Size: {BIG}")), "{stat}");
    let blocks: u64 = stat
        .split("Blockcount: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no Blockcount in {stat}"));
    // 512-byte units: two 4 KiB data blocks (and maybe an extent block).
    assert!(blocks * 512 <= 3 * 4096, "{blocks} blocks: {stat}");
    let dumped = t.path().join("disk.img");
    let st = std::process::Command::new(&debugfs)
        .arg("-R")
        .arg(format!("dump /{DISK} {}", dumped.display()))
        .arg(&out)
        .output()
        .unwrap();
    assert!(st.status.success());
    assert!(same_content(&t.path().join("base").join(DISK), &dumped));
}

/// Sparse members of a tar base (GNU `S`, as `tar --sparse` writes;
/// pax 1.0, as `tar --format=posix --sparse` and bsdtar write) give the
/// same image as the directory they were made from; the pax formats 0.x
/// are refused by name, not read as a file holding a map.
#[test]
fn sparse_tar_bases_give_the_same_image_as_the_directory() {
    require("tar");
    let (t, inputs, want) = sparse_base();
    let base = t.path().join("base");
    let make = |name: &str, args: &[&str]| make_tar(&t, &base, name, "tar", args);
    let bases = vec![
        make("gnu.tar", &["--sort=name", "--numeric-owner", "--sparse"]),
        make(
            "pax.tar",
            &[
                "--sort=name",
                "--numeric-owner",
                "--sparse",
                "--format=posix",
            ],
        ),
    ];
    for base_tar in &bases {
        let mut spec = inputs.spec();
        spec.base = Base::Tar(base_tar.clone());
        let out = base_tar.with_extension("image.tar");
        build(&spec, &out, Format::Tar, &mut no_progress()).unwrap();
        assert_eq!(
            sha256_file(&out),
            want,
            "image from {} differs from the directory's",
            base_tar.display()
        );
    }

    let old = make(
        "pax01.tar",
        &[
            "--numeric-owner",
            "--sparse",
            "--format=posix",
            "--sparse-version=0.1",
        ],
    );
    let mut spec = inputs.spec();
    spec.base = Base::Tar(old);
    let e = build(
        &spec,
        &t.path().join("x.tar"),
        Format::Tar,
        &mut no_progress(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("is in pax sparse format 0.1, which rtdeploy does not read"),
        "{e}"
    );
}

/// A base of sparse files (one with more runs than a GNU header holds,
/// one all hole), and the digest of the image made from it as a
/// directory.
fn sparse_base() -> (tempfile::TempDir, Inputs, String) {
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    let base = t.path().join("base");
    let many: Vec<(u64, &[u8])> = (0..40u64).map(|i| (i * 65536 + 100, &b"run"[..])).collect();
    let sparse = sparse_file(&base, DISK, 8 << 20, &[(4 << 20, &[0xa5; 5000]), (0, b"head")])
        && sparse_file(&base, TAIL, (1 << 20) + 100, &[((1 << 20) + 90, b"0123456789")])
        // Over the 4 runs of a GNU header: extension blocks.
        && sparse_file(&base, "var/lib/many.img", 40 * 65536, &many)
        && sparse_file(&base, "var/lib/empty.img", 1 << 20, &[]);
    assert!(sparse, "{NO_HOLES}");
    let from_dir = t.path().join("dir.tar");
    build(&inputs.spec(), &from_dir, Format::Tar, &mut no_progress()).unwrap();
    assert!(fs::metadata(&from_dir).unwrap().len() < 5 << 20);
    let want = sha256_file(&from_dir);
    (t, inputs, want)
}

/// `tool args -cf T/name -C base .`
fn make_tar(
    t: &tempfile::TempDir,
    base: &Path,
    name: &str,
    tool: &str,
    args: &[&str],
) -> std::path::PathBuf {
    let out = t.path().join(name);
    let st = std::process::Command::new(tool)
        .args(args)
        .arg("-cf")
        .arg(&out)
        .arg("-C")
        .arg(base)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success(), "{tool} {args:?}");
    out
}

/// bsdtar's sparse members (pax 1.0) give the same image as the
/// directory.
#[test]
#[ignore = "needs bsdtar: libarchive's tar writes the base (Debian package libarchive-tools)"]
fn a_sparse_bsdtar_base_gives_the_same_image_as_the_directory() {
    require("bsdtar");
    let (t, inputs, want) = sparse_base();
    let base_tar = make_tar(
        &t,
        &t.path().join("base"),
        "bsd.tar",
        "bsdtar",
        &["--numeric-owner", "--read-sparse"],
    );
    let mut spec = inputs.spec();
    spec.base = Base::Tar(base_tar.clone());
    let out = base_tar.with_extension("image.tar");
    build(&spec, &out, Format::Tar, &mut no_progress()).unwrap();
    assert_eq!(sha256_file(&out), want);
}

/// cpio cannot say a run is a hole: the file is written whole and the
/// build says so.
#[test]
fn cpio_writes_sparse_files_whole_and_says_so() {
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    // Small: the gzip stream holds every zero.
    assert!(
        sparse_file(&t.path().join("base"), TAIL, 4 << 20, &[(100, b"data")]),
        "{NO_HOLES}"
    );
    let out = t.path().join("initramfs.cpio.gz");
    let s = build(&inputs.spec(), &out, Format::CpioGz, &mut no_progress()).unwrap();
    assert_eq!(
        s.warnings,
        [format!(
            "cpio cannot hold holes: 1 sparse file(s) are written as data, {} bytes of zeros in all: /{TAIL}",
            (4 << 20) - 4096
        )]
    );
    // The tar of the same base has no warning.
    let s = build(
        &inputs.spec(),
        &t.path().join("b.tar"),
        Format::Tar,
        &mut no_progress(),
    )
    .unwrap();
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
}

fn write_raw(dir: &Path, raw: &[u8]) -> std::path::PathBuf {
    let p = dir.join("raw.cpio");
    fs::write(&p, raw).unwrap();
    p
}

/// Where `tool` is: on PATH or in /usr/sbin or /sbin, where e2fsprogs
/// installs and which a user's PATH often lacks (Debian's does).
pub fn tool_path(tool: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([Path::new("/usr/sbin").into(), Path::new("/sbin").into()])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

pub fn which(tool: &str) -> bool {
    tool_path(tool).is_some()
}

/// The member names of a newc archive.
fn cpio_names(raw: &[u8]) -> Vec<String> {
    let mut names = Vec::new();
    let mut at = 0;
    loop {
        let h = std::str::from_utf8(&raw[at..at + 110]).unwrap();
        assert_eq!(&h[..6], "070701");
        let field = |i: usize| usize::from_str_radix(&h[6 + i * 8..14 + i * 8], 16).unwrap();
        let size = field(6);
        let namesize = field(11);
        let name = std::str::from_utf8(&raw[at + 110..at + 110 + namesize - 1])
            .unwrap()
            .to_string();
        at = (at + 110 + namesize).div_ceil(4) * 4;
        at = (at + size).div_ceil(4) * 4;
        let done = name == "TRAILER!!!";
        names.push(name);
        if done {
            return names;
        }
    }
}

/// `cap_net_raw+ep` as the kernel stores it in `security.capability`
/// (vfs_cap_data revision 2: magic with the effective flag, then permitted
/// and inheritable, low and high words), as Ubuntu's ping carries it.
fn cap_net_raw_ep() -> Vec<u8> {
    let mut v = Vec::new();
    for word in [0x0200_0001u32, 1 << 13, 0, 0, 0] {
        v.extend_from_slice(&word.to_le_bytes());
    }
    v
}

/// An access ACL in the kernel's `system.posix_acl_access` form: owner
/// rwx, user 1000 r-x, group r-x, mask r-x, other ---.
fn acl_user_1000() -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 7u16, u32::MAX),
        (0x02, 5, 1000),
        (0x04, 5, u32::MAX),
        (0x10, 5, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// Extended attributes of the base (a file capability, a user attribute,
/// a POSIX ACL) reach tar images as pax records and ext4 images as
/// attributes; a tar base made with `tar --xattrs` gives the same image
/// bytes as the directory; cpio.gz says it drops them.
#[test]
#[ignore = "needs root: setting security.capability on the base"]
fn extended_attributes_survive_into_tar_and_ext4() {
    require("tar");
    require("mke2fs");
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    let base = t.path().join("base");
    let ping = base.join("usr/bin/pingx");
    fs::create_dir_all(ping.parent().unwrap()).unwrap();
    fs::write(&ping, b"#!/bin/sh\n").unwrap();
    let cap = cap_net_raw_ep();
    let set = |p: &Path, name: &str, value: &[u8]| {
        rustix::fs::lsetxattr(p, name, value, rustix::fs::XattrFlags::empty())
    };
    set(&ping, "security.capability", &cap)
        .unwrap_or_else(|e| panic!("this filesystem takes no file capability: {e}"));
    set(&ping, "user.rtdeploy.note", b"raw sockets").unwrap();
    set_mtime(&ping, 1_600_000_000);
    set_mtime(ping.parent().unwrap(), 1_600_000_000);

    let from_dir = t.path().join("dir.tar");
    build(&inputs.spec(), &from_dir, Format::Tar, &mut no_progress()).unwrap();
    let mut archive = tar::Archive::new(fs::File::open(&from_dir).unwrap());
    let mut found = Vec::new();
    for m in archive.entries().unwrap() {
        let mut m = m.unwrap();
        if m.path().unwrap() == Path::new("usr/bin/pingx") {
            for ext in m.pax_extensions().unwrap().expect("pax records") {
                let ext = ext.unwrap();
                found.push((ext.key().unwrap().to_string(), ext.value_bytes().to_vec()));
            }
        }
    }
    assert_eq!(
        found,
        [
            ("SCHILY.xattr.security.capability".to_string(), cap.clone()),
            (
                "SCHILY.xattr.user.rtdeploy.note".to_string(),
                b"raw sockets".to_vec()
            ),
        ]
    );

    // GNU tar reads them back onto the file.
    {
        let out = t.path().join("unpacked");
        fs::create_dir(&out).unwrap();
        let st = std::process::Command::new("tar")
            .args(["--xattrs", "--xattrs-include=*", "-xf"])
            .arg(&from_dir)
            .arg("-C")
            .arg(&out)
            .arg("usr/bin/pingx")
            .status()
            .unwrap();
        assert!(st.success());
        let mut buf = vec![0u8; 64];
        let n = rustix::fs::lgetxattr(out.join("usr/bin/pingx"), "security.capability", &mut buf)
            .unwrap();
        assert_eq!(&buf[..n], &cap[..]);

        // A tar base made with `tar --xattrs` gives the same image.
        let base_tar = t.path().join("base.tar");
        let st = std::process::Command::new("tar")
            .args([
                "--xattrs",
                "--xattrs-include=*",
                "--sort=name",
                "--numeric-owner",
                "-C",
            ])
            .arg(&base)
            .arg("-cf")
            .arg(&base_tar)
            .arg(".")
            .status()
            .unwrap();
        assert!(st.success());
        let mut spec = inputs.spec();
        spec.base = Base::Tar(base_tar);
        let from_tar = t.path().join("from-tar.tar");
        build(&spec, &from_tar, Format::Tar, &mut no_progress()).unwrap();
        assert_eq!(sha256_file(&from_tar), sha256_file(&from_dir));
    }

    // A POSIX ACL on a directory, and the image manifest counts them.
    let srv = base.join("srv");
    fs::create_dir(&srv).unwrap();
    let acl = acl_user_1000();
    set(&srv, "system.posix_acl_access", &acl).unwrap();
    set_mtime(&srv, 1_600_000_000);
    set_mtime(&base, 1_600_000_000);
    let s = build(
        &inputs.spec(),
        &t.path().join("acl.tar"),
        Format::Tar,
        &mut no_progress(),
    )
    .unwrap();
    let manifest = fs::read_to_string(&s.manifest).unwrap();
    assert!(
        manifest.contains(&format!("\"security.capability\": \"{}\"", hex(&cap))),
        "{manifest}"
    );

    // ext4: read back by e2fsprogs.
    {
        let debugfs = tool_path("debugfs").expect("debugfs (Debian package e2fsprogs)");
        let img = t.path().join("x.ext4");
        build(&inputs.spec(), &img, Format::Ext4, &mut no_progress()).unwrap();
        for (path, name, want) in [
            ("/usr/bin/pingx", "security.capability", &cap[..]),
            ("/usr/bin/pingx", "user.rtdeploy.note", b"raw sockets"),
            ("/srv", "system.posix_acl_access", &acl[..]),
        ] {
            let got = t.path().join("got");
            let _ = fs::remove_file(&got);
            let out = std::process::Command::new(&debugfs)
                .arg("-R")
                .arg(format!("ea_get -f {} {path} {name}", got.display()))
                .arg(&img)
                .output()
                .unwrap();
            let mut got = fs::read(&got).unwrap_or_default();
            let mut want = want.to_vec();
            if name.starts_with("system.posix_acl") {
                // Entries that name no user or group carry no id: the
                // kernel says -1, e2fsprogs 0.
                for v in [&mut got, &mut want] {
                    for e in v.get_mut(4..).unwrap_or_default().chunks_mut(8) {
                        if e.len() == 8 && !matches!(e[0], 0x02 | 0x08) {
                            e[4..].fill(0xff);
                        }
                    }
                }
            }
            assert_eq!(
                got,
                want,
                "{path} {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    // cpio.gz cannot hold them, and says so.
    let s = build(
        &inputs.spec(),
        &t.path().join("i.cpio.gz"),
        Format::CpioGz,
        &mut no_progress(),
    )
    .unwrap();
    assert!(
        s.warnings.iter().any(|w| w.contains(
            "cpio.gz cannot hold extended attributes: 2 entries lose theirs (/srv (system.posix_acl_access); /usr/bin/pingx (security.capability, user.rtdeploy.note))"
        )),
        "{:?}",
        s.warnings
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
