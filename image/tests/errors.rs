//! Bad input: each a clear error naming what is wrong, nothing left behind.

mod common;

use std::fs;

use common::*;
use rootfs::{build, Base, Format, ImageBuildError};

#[test]
fn base_that_is_not_a_root_filesystem() {
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    fs::remove_dir_all(t.path().join("base/usr")).unwrap();
    fs::remove_file(t.path().join("base/bin")).unwrap();
    fs::remove_file(t.path().join("base/lib")).unwrap();
    let out = t.path().join("x.tar");
    let e = build(&inputs.spec(), &out, Format::Tar, &mut no_progress()).unwrap_err();
    assert!(matches!(e, ImageBuildError::NotRootFs { .. }), "{e}");
    assert!(e.to_string().contains("no /usr"), "{e}");
    assert!(!out.exists());
    assert!(leftovers(t.path()).is_empty());
}

#[test]
fn release_missing_programs_lists_them_all() {
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    let mut spec = inputs.spec();
    spec.programs = vec![
        "bin/imu_reader".into(),
        "bin/planner".into(),
        "bin/logger".into(),
        "/usr/bin/python3".into(),
    ];
    fs::set_permissions(
        t.path().join("release/bin/imu_reader"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let e = build(
        &spec,
        &t.path().join("x.tar"),
        Format::Tar,
        &mut no_progress(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("lacks 3 program(s)"), "{e}");
    for p in ["bin/imu_reader", "bin/planner", "bin/logger"] {
        assert!(e.contains(p), "{e}");
    }
    assert!(
        !e.contains("python3"),
        "absolute programs come from the base: {e}"
    );
}

#[test]
fn existing_output_is_refused_unless_forced() {
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    let out = t.path().join("x.tar");
    fs::write(&out, b"precious").unwrap();
    let e = build(&inputs.spec(), &out, Format::Tar, &mut no_progress()).unwrap_err();
    assert!(matches!(e, ImageBuildError::OutputExists { .. }), "{e}");
    assert!(e.to_string().contains("--force"));
    assert_eq!(fs::read(&out).unwrap(), b"precious");
    let mut spec = inputs.spec();
    spec.force = true;
    build(&spec, &out, Format::Tar, &mut no_progress()).unwrap();
    assert_ne!(fs::read(&out).unwrap(), b"precious");
    // Replaced again, sidecars included: the old files are gone, not left
    // under a temporary name.
    fs::write(&out, b"precious").unwrap();
    build(&spec, &out, Format::Tar, &mut no_progress()).unwrap();
    assert_ne!(fs::read(&out).unwrap(), b"precious");
    assert!(leftovers(t.path()).is_empty(), "{:?}", leftovers(t.path()));
}

#[test]
fn unreadable_base_leaves_nothing_behind() {
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    // A truncated tar: its last member's data is cut short.
    let mut b = tar::Builder::new(Vec::new());
    for d in ["etc", "usr"] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        h.set_mode(0o755);
        b.append_data(&mut h, d, std::io::empty()).unwrap();
    }
    let mut h = tar::Header::new_gnu();
    h.set_size(100_000);
    h.set_mode(0o644);
    b.append_data(&mut h, "usr/big", &vec![1u8; 100_000][..])
        .unwrap();
    let mut raw = b.into_inner().unwrap();
    raw.truncate(30_000);
    let base = t.path().join("cut.tar");
    fs::write(&base, &raw).unwrap();
    let mut spec = inputs.spec();
    spec.base = Base::Tar(base.clone());
    let out = t.path().join("x.tar.zst");
    let e = build(&spec, &out, Format::TarZst, &mut no_progress())
        .unwrap_err()
        .to_string();
    assert!(e.contains("cut.tar"), "{e}");
    assert!(!out.exists());
    assert!(leftovers(t.path()).is_empty(), "{:?}", leftovers(t.path()));

    // A base file that cannot be opened.
    let missing = t.path().join("no-such-base.tar");
    spec.base = Base::Tar(missing);
    let e = build(&spec, &out, Format::Tar, &mut no_progress())
        .unwrap_err()
        .to_string();
    assert!(e.contains("no-such-base.tar"), "{e}");
    // A file of the base nobody may read: built on a thread (and so by
    // reader threads) without the capabilities that let root read it
    // anyway.
    fs::set_permissions(
        t.path().join("base/etc/shadow"),
        std::os::unix::fs::PermissionsExt::from_mode(0o000),
    )
    .unwrap();
    let spec = inputs.spec();
    let out2 = out.clone();
    let e = std::thread::spawn(move || {
        use rustix::thread::{capabilities, set_capabilities, CapabilitySet};
        let mut caps = capabilities(None).unwrap();
        caps.effective
            .remove(CapabilitySet::DAC_OVERRIDE | CapabilitySet::DAC_READ_SEARCH);
        set_capabilities(None, caps).unwrap();
        build(&spec, &out2, Format::Tar, &mut no_progress())
            .unwrap_err()
            .to_string()
    })
    .join()
    .unwrap();
    assert!(e.contains("etc/shadow"), "{e}");
    assert!(leftovers(t.path()).is_empty());
    assert!(!out.exists());
}

#[test]
fn sockets_cannot_go_into_tar_but_can_into_cpio() {
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    let sock = t.path().join("base/run/acpid.socket");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let e = build(
        &inputs.spec(),
        &t.path().join("x.tar"),
        Format::Tar,
        &mut no_progress(),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(e, "the tar format cannot hold socket /run/acpid.socket");
    build(
        &inputs.spec(),
        &t.path().join("x.cpio.gz"),
        Format::CpioGz,
        &mut no_progress(),
    )
    .unwrap();
}

#[test]
fn a_symlink_where_rtdeploy_needs_a_directory_is_not_followed() {
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    fs::create_dir_all(t.path().join("base/etc/systemd")).unwrap();
    std::os::unix::fs::symlink(
        "/lib/systemd/system",
        t.path().join("base/etc/systemd/system"),
    )
    .unwrap();
    let e = build(
        &inputs.spec(),
        &t.path().join("x.tar"),
        Format::Tar,
        &mut no_progress(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("/etc/systemd/system") && e.contains("symlink"),
        "{e}"
    );
}

#[test]
fn bad_extlinux_conf_is_refused_with_its_problems() {
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    fs::write(
        t.path().join("base/boot/extlinux/extlinux.conf"),
        "DEFAULT primary\nLABEL primary\n  LINUX Image\n  FDTDIR /boot/dtb\n  APPEND root=/dev/mmcblk0p1\n",
    )
    .unwrap();
    let e = build(
        &inputs.spec(),
        &t.path().join("x.tar"),
        Format::Tar,
        &mut no_progress(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("/boot/extlinux/extlinux.conf: "), "{e}");
    assert!(
        e.contains("FDTDIR") && e.contains("`Image` is not absolute"),
        "{e}"
    );
}
