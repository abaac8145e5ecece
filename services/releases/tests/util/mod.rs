//! Helpers shared by the release store's tests (`mod util;` in each) and
//! the supervisor's trial tests (`#[path]` to this file).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use releases::bundle::{sha256_hex, write_bundle, BundleSpec, Compat, SecretKey};
use releases::InstallOptions;

pub const ROBOT: &str = "arm";
pub const BOARD: &str = "generic";

pub fn key() -> SecretKey {
    SecretKey::from_seed([7; 32])
}

pub fn other_key() -> SecretKey {
    SecretKey::from_seed([8; 32])
}

/// A robot prefix that trusts `key()`.
pub fn robot(dir: &Path) -> PathBuf {
    let prefix = dir.join("robot");
    std::fs::create_dir_all(prefix.join("etc/rtdeploy/keys")).unwrap();
    std::fs::write(
        prefix.join("etc/rtdeploy/keys/test.pub"),
        format!("{}\n", key().public_base64()),
    )
    .unwrap();
    prefix
}

pub fn opts() -> InstallOptions<'static> {
    InstallOptions {
        compat: Compat {
            robot: ROBOT.into(),
            board: BOARD.into(),
        },
        public_keys: vec![],
        keep: 3,
        lock_timeout: Duration::from_secs(5),
        holder: "release-test".into(),
        validate_robot_yaml: None,
        plan_system: None,
    }
}

/// A release directory with `files` (path, contents, mode).
pub fn release(dir: &Path, name: &str, files: &[(&str, Vec<u8>, u32)]) -> PathBuf {
    let r = dir.join(name);
    for (p, data, mode) in files {
        let f = r.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(&f, data).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(*mode)).unwrap();
    }
    std::fs::create_dir_all(&r).unwrap();
    r
}

/// A ten-binary-ish release whose files all mention `tag`.
pub fn simple_release(dir: &Path, name: &str, tag: &str) -> PathBuf {
    release(
        dir,
        name,
        &[
            (
                "bin/ctl",
                format!("#!/bin/sh\n# {tag}\nexec sleep 30\n").into_bytes(),
                0o755,
            ),
            ("bin/imu", format!("imu {tag}").into_bytes(), 0o755),
            ("share/params.txt", b"gain 3\n".to_vec(), 0o644),
        ],
    )
}

pub fn bundle_with(
    release_dir: &Path,
    version: &str,
    board: &str,
    key: &SecretKey,
    out: &Path,
) -> PathBuf {
    let spec = BundleSpec {
        release_dir: release_dir.to_path_buf(),
        version: version.into(),
        robot: ROBOT.into(),
        board: board.into(),
        robot_yaml: format!("robot: {{name: {ROBOT}}}\nboard: {{model: {board}}}\n# {version}\n"),
        programs: Vec::new(),
    };
    write_bundle(&spec, key, out).unwrap();
    out.to_path_buf()
}

pub fn bundle(release_dir: &Path, version: &str, out: &Path) -> PathBuf {
    bundle_with(release_dir, version, BOARD, &key(), out)
}

/// Every path under `root` with its type, mode and content (or link
/// target): equal digests mean nothing changed.
pub fn tree_digest(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let rel = p.strip_prefix(root).unwrap().display().to_string();
        let md = std::fs::symlink_metadata(&p).unwrap();
        let t = md.file_type();
        let v = if t.is_symlink() {
            format!("link -> {}", std::fs::read_link(&p).unwrap().display())
        } else if t.is_dir() {
            walk(root, &p, out);
            format!("dir {:o}", md.mode() & 0o7777)
        } else {
            format!(
                "file {:o} {}",
                md.mode() & 0o7777,
                sha256_hex(&std::fs::read(&p).unwrap())
            )
        };
        out.insert(rel, v);
    }
}

/// The version of the release `current` names, after checking it whole.
pub fn current_version(prefix: &Path) -> String {
    let cur = prefix.join("opt/rtdeploy/current");
    let dir = std::fs::canonicalize(&cur).unwrap();
    let m = releases::verify_release(&dir).unwrap();
    m.version
}
