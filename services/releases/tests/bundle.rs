//! Bundles as files: deterministic bytes, a round trip through the reader,
//! and release directories the writer refuses.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use releases::bundle::{
    load_trusted_keys, write_bundle, BundleReader, BundleSpec, Compat, SecretKey,
};

fn release(dir: &Path) -> std::path::PathBuf {
    let r = dir.join("rel");
    std::fs::create_dir_all(r.join("bin")).unwrap();
    std::fs::write(r.join("bin/ctl"), b"#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(r.join("bin/ctl"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(r.join("bin/copy"), b"#!/bin/sh\nexit 0\n").unwrap();
    std::fs::write(r.join("params.txt"), b"gain 3\n").unwrap();
    std::fs::write(r.join("robot.yaml"), b"robot: {name: arm}\n").unwrap();
    r
}

fn spec(r: &Path) -> BundleSpec {
    BundleSpec {
        release_dir: r.to_path_buf(),
        version: "1.2.3".into(),
        robot: "arm".into(),
        board: "generic".into(),
        robot_yaml: std::fs::read_to_string(r.join("robot.yaml")).unwrap(),
        programs: Vec::new(),
    }
}

#[test]
fn same_inputs_give_the_same_bytes() {
    let d = tempfile::tempdir().unwrap();
    let r = release(d.path());
    let key = SecretKey::from_seed([3; 32]);
    let a = write_bundle(&spec(&r), &key, &d.path().join("a")).unwrap();
    // a different mtime and a copy in another place change nothing
    std::thread::sleep(std::time::Duration::from_millis(10));
    std::fs::write(r.join("params.txt"), b"gain 3\n").unwrap();
    let b = write_bundle(&spec(&r), &key, &d.path().join("b")).unwrap();
    assert_eq!(
        std::fs::read(d.path().join("a")).unwrap(),
        std::fs::read(d.path().join("b")).unwrap()
    );
    assert_eq!(a.release, b.release);
    assert!(a.release.starts_with("1.2.3-"));
    // the content changes the bytes and the release name
    std::fs::write(r.join("params.txt"), b"gain 4\n").unwrap();
    let c = write_bundle(&spec(&r), &key, &d.path().join("c")).unwrap();
    assert_ne!(a.release, c.release);
}

#[test]
fn reader_returns_each_blob_once_after_the_signature() {
    let d = tempfile::tempdir().unwrap();
    let r = release(d.path());
    let key = SecretKey::from_seed([3; 32]);
    let w = write_bundle(&spec(&r), &key, &d.path().join("a")).unwrap();
    // robot.yaml goes into the manifest, not the file list
    let paths: Vec<_> = w.manifest.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["bin/copy", "bin/ctl", "params.txt"]);
    assert_eq!(w.manifest.files[1].mode, 0o755);
    std::fs::write(d.path().join("k.pub"), key.public_base64()).unwrap();
    let trusted = load_trusted_keys(d.path(), &[]).unwrap();
    let compat = Compat {
        robot: "arm".into(),
        board: "generic".into(),
    };
    let blobs = std::cell::RefCell::new(Vec::new());
    let mut manifest_first = false;
    let v = BundleReader::read(
        std::fs::File::open(d.path().join("a")).unwrap(),
        &trusted,
        &compat,
        |_| {
            manifest_first = blobs.borrow().is_empty();
            Ok(())
        },
        |sha, data| {
            let mut v = Vec::new();
            std::io::Read::read_to_end(data, &mut v)?;
            blobs.borrow_mut().push((sha.clone(), v));
            Ok(())
        },
    )
    .unwrap();
    assert!(manifest_first);
    // bin/copy and bin/ctl have the same content: one blob
    let blobs = blobs.into_inner();
    assert_eq!(blobs.len(), 2);
    assert_eq!(v.release, w.release);
    assert!(v.signer.ends_with("k.pub"));
    for (sha, data) in blobs {
        assert_eq!(releases::bundle::sha256_hex(&data), sha);
    }
}

#[test]
fn writer_refuses_links_and_special_files() {
    let d = tempfile::tempdir().unwrap();
    let r = release(d.path());
    std::os::unix::fs::symlink("/etc/passwd", r.join("bin/passwd")).unwrap();
    let e = write_bundle(
        &spec(&r),
        &SecretKey::from_seed([3; 32]),
        &d.path().join("a"),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("bin/passwd is a symbolic link"),
        "{e}"
    );
    assert!(!d.path().join("a").exists());
    assert!(!d.path().join("a.tmp").exists());
}
