//! Installing bundles into a prefix: switch, trial, commit, rollback,
//! pruning, the update lock, and every kind of bad bundle refused with
//! nothing on the robot changed.

mod util;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use releases::bundle::{sha256_hex, FileEntry, Manifest};
use releases::{install_bundle, read_state, ReleaseState, UpdateLock};
use util::*;

fn installed_v1(dir: &Path) -> PathBuf {
    let prefix = robot(dir);
    let b = bundle(
        &simple_release(dir, "r1", "one"),
        "1",
        &dir.join("v1.bundle"),
    );
    let rep = install_bundle(&prefix, &b, &opts()).unwrap();
    assert_eq!(
        rep.state, "committed",
        "the first release has nothing to go back to"
    );
    prefix
}

#[test]
fn install_switches_in_trial_then_commits() {
    let d = tempfile::tempdir().unwrap();
    let prefix = installed_v1(d.path());
    let b2 = bundle(
        &simple_release(d.path(), "r2", "two"),
        "2",
        &d.path().join("v2.bundle"),
    );
    let rep = install_bundle(&prefix, &b2, &opts()).unwrap();
    assert_eq!(rep.state, "trial");
    assert!(rep.release.starts_with("2-"), "{}", rep.release);
    // share/params.txt is the same in both: only two new blobs
    assert_eq!(rep.new_blobs, 2);
    assert_eq!(current_version(&prefix), "2");
    let cur = prefix.join("opt/rtdeploy/current");
    let ctl = std::fs::read_to_string(cur.join("bin/ctl")).unwrap();
    assert!(ctl.contains("two"));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(cur.join("bin/ctl"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755
    );
    assert_eq!(
        std::fs::metadata(cur.join("share/params.txt"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o644
    );
    assert!(std::fs::read_to_string(cur.join("robot.yaml"))
        .unwrap()
        .contains("# 2"));
    // the config link follows current
    assert!(
        std::fs::read_to_string(prefix.join("etc/rtdeploy/robot.yaml"))
            .unwrap()
            .contains("# 2")
    );
    let prev = std::fs::canonicalize(prefix.join("opt/rtdeploy/previous")).unwrap();
    assert_eq!(releases::verify_release(&prev).unwrap().version, "1");
    match read_state(&prefix).unwrap() {
        Some(ReleaseState::Trial {
            release, previous, ..
        }) => {
            assert_eq!(release, rep.release);
            assert!(previous.starts_with("1-"));
        }
        other => panic!("expected trial, got {other:?}"),
    }
    // a second install during the trial is refused
    let b3 = bundle(
        &simple_release(d.path(), "r3", "three"),
        "3",
        &d.path().join("v3.bundle"),
    );
    let e = install_bundle(&prefix, &b3, &opts()).unwrap_err();
    assert!(e.to_string().contains("is in trial"), "{e}");
    assert_eq!(releases::commit(&prefix, 3).unwrap(), rep.release);
    assert_eq!(
        read_state(&prefix).unwrap(),
        Some(ReleaseState::Committed {
            release: rep.release.clone()
        })
    );
    let list = releases::list(&prefix).unwrap();
    assert_eq!(list.current.as_deref(), Some(rep.release.as_str()));
    assert!(list.releases.iter().any(|r| r.committed && r.current));
    // installing the current release again changes nothing
    let again = install_bundle(&prefix, &b2, &opts()).unwrap();
    assert_eq!(again.state, "already-current");
}

#[test]
fn rollback_of_a_trial_restores_the_old_release_and_links() {
    let d = tempfile::tempdir().unwrap();
    let prefix = installed_v1(d.path());
    let before_links = (
        releases::link_target(&prefix.join("opt/rtdeploy/current")),
        releases::link_target(&prefix.join("opt/rtdeploy/previous")),
    );
    let b2 = bundle(
        &simple_release(d.path(), "r2", "two"),
        "2",
        &d.path().join("v2.bundle"),
    );
    install_bundle(&prefix, &b2, &opts()).unwrap();
    let rb = releases::rollback(&prefix).unwrap();
    assert!(rb.trial);
    assert_eq!(current_version(&prefix), "1");
    let after_links = (
        releases::link_target(&prefix.join("opt/rtdeploy/current")),
        releases::link_target(&prefix.join("opt/rtdeploy/previous")),
    );
    assert_eq!(before_links, after_links);
    assert_eq!(
        read_state(&prefix).unwrap(),
        Some(ReleaseState::Committed { release: rb.to })
    );
    // a manual rollback needs a previous release
    let e = releases::rollback(&prefix).unwrap_err();
    assert!(e.to_string().contains("nothing to roll back to"), "{e}");
}

#[test]
fn manual_rollback_swaps_current_and_previous() {
    let d = tempfile::tempdir().unwrap();
    let prefix = installed_v1(d.path());
    let b2 = bundle(
        &simple_release(d.path(), "r2", "two"),
        "2",
        &d.path().join("v2.bundle"),
    );
    install_bundle(&prefix, &b2, &opts()).unwrap();
    releases::commit(&prefix, 3).unwrap();
    let rb = releases::rollback(&prefix).unwrap();
    assert!(!rb.trial);
    assert_eq!(current_version(&prefix), "1");
    let rb2 = releases::rollback(&prefix).unwrap();
    assert_eq!((rb2.from, rb2.to), (rb.to, rb.from));
    assert_eq!(current_version(&prefix), "2");
}

#[test]
fn recover_at_start_rolls_back_an_interrupted_trial() {
    let d = tempfile::tempdir().unwrap();
    let prefix = installed_v1(d.path());
    let b2 = bundle(
        &simple_release(d.path(), "r2", "two"),
        "2",
        &d.path().join("v2.bundle"),
    );
    install_bundle(&prefix, &b2, &opts()).unwrap();
    // power cut during the trial: the next start finds it
    let rec = releases::recover_at_start(&prefix).unwrap();
    assert!(rec.rolled_back.is_some_and(|r| r.trial));
    assert_eq!(current_version(&prefix), "1");
    // and a second start has nothing to do
    let rec = releases::recover_at_start(&prefix).unwrap();
    assert!(rec.rolled_back.is_none() && !rec.repaired);
}

#[test]
fn prune_keeps_the_newest_releases_and_their_blobs_only() {
    let d = tempfile::tempdir().unwrap();
    let prefix = installed_v1(d.path());
    for v in 2..=5 {
        let b = bundle(
            &simple_release(d.path(), &format!("r{v}"), &format!("v{v}")),
            &v.to_string(),
            &d.path().join(format!("v{v}.bundle")),
        );
        install_bundle(&prefix, &b, &opts()).unwrap();
        releases::commit(&prefix, 3).unwrap();
        // distinct mtimes order the releases
        std::thread::sleep(Duration::from_millis(20));
    }
    let list = releases::list(&prefix).unwrap();
    let versions: Vec<_> = list
        .releases
        .iter()
        .map(|r| r.version.clone().unwrap())
        .collect();
    assert_eq!(versions.len(), 3, "{versions:?}");
    assert!(versions.contains(&"5".to_string()) && versions.contains(&"4".to_string()));
    // every blob in the store is used by a kept release, and each kept release is whole
    let mut used = std::collections::BTreeSet::new();
    for r in &list.releases {
        let m =
            releases::verify_release(&prefix.join("opt/rtdeploy/releases").join(&r.name)).unwrap();
        used.extend(m.files.iter().map(|f| f.sha256.clone()));
    }
    let store: std::collections::BTreeSet<String> =
        std::fs::read_dir(prefix.join("opt/rtdeploy/store"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
    assert_eq!(store, used);
}

#[test]
fn install_waits_for_the_update_lock_then_names_the_holder() {
    let d = tempfile::tempdir().unwrap();
    let prefix = installed_v1(d.path());
    let b2 = bundle(
        &simple_release(d.path(), "r2", "two"),
        "2",
        &d.path().join("v2.bundle"),
    );
    let held = UpdateLock::acquire(&prefix, "imu_ctl", Duration::from_secs(1)).unwrap();
    let mut o = opts();
    o.lock_timeout = Duration::from_millis(200);
    let e = install_bundle(&prefix, &b2, &o).unwrap_err().to_string();
    assert!(
        e.contains(&format!("pid {} (imu_ctl)", std::process::id())),
        "{e}"
    );
    assert_eq!(current_version(&prefix), "1");
    drop(held);
    assert_eq!(
        std::fs::read_to_string(prefix.join("run/rtdeploy/update.lock")).unwrap(),
        ""
    );
    install_bundle(&prefix, &b2, &o).unwrap();
    assert_eq!(current_version(&prefix), "2");
}

#[test]
fn a_lock_released_while_waiting_lets_the_install_through() {
    let d = tempfile::tempdir().unwrap();
    let prefix = installed_v1(d.path());
    let b2 = bundle(
        &simple_release(d.path(), "r2", "two"),
        "2",
        &d.path().join("v2.bundle"),
    );
    let held = UpdateLock::acquire(&prefix, "imu_ctl", Duration::from_secs(1)).unwrap();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        drop(held);
    });
    install_bundle(&prefix, &b2, &opts()).unwrap();
    t.join().unwrap();
    assert_eq!(current_version(&prefix), "2");
}

// ------------------------------------------------------------ bad bundles

/// One raw tar entry for crafting hostile bundles.
struct Raw {
    name: Vec<u8>,
    kind: tar::EntryType,
    data: Vec<u8>,
    link: Vec<u8>,
}

fn file(name: &str, data: Vec<u8>) -> Raw {
    Raw {
        name: name.as_bytes().to_vec(),
        kind: tar::EntryType::Regular,
        data,
        link: vec![],
    }
}

fn entries_of(bundle: &Path) -> Vec<Raw> {
    let f = std::fs::File::open(bundle).unwrap();
    let mut ar = tar::Archive::new(zstd::Decoder::new(f).unwrap());
    ar.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let name = e.path_bytes().to_vec();
            let mut data = vec![];
            e.read_to_end(&mut data).unwrap();
            Raw {
                name,
                kind: tar::EntryType::Regular,
                data,
                link: vec![],
            }
        })
        .collect()
}

/// Writes entries with raw names (no sanitising, unlike tar::Builder's
/// path setters), zstd-compressed.
fn craft(entries: &[Raw], out: &Path) -> PathBuf {
    let mut tar = Vec::new();
    for e in entries {
        let mut h = tar::Header::new_ustar();
        {
            let u = h.as_ustar_mut().unwrap();
            u.name[..e.name.len()].copy_from_slice(&e.name);
            u.linkname[..e.link.len()].copy_from_slice(&e.link);
        }
        h.set_size(e.data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(e.kind);
        h.set_cksum();
        tar.extend_from_slice(h.as_bytes());
        tar.extend_from_slice(&e.data);
        tar.resize(tar.len().div_ceil(512) * 512, 0);
    }
    tar.resize(tar.len() + 1024, 0);
    std::fs::write(out, zstd::encode_all(&tar[..], 3).unwrap()).unwrap();
    out.to_path_buf()
}

fn signed_manifest(m: &Manifest) -> (Raw, Raw) {
    let bytes = m.to_bytes();
    let sig = key().sign(&bytes);
    (
        file("manifest.json", bytes),
        file("manifest.sig", sig.to_vec()),
    )
}

/// Installs `bad` into a robot running v1 and checks it is refused with a
/// message containing `want`, and that no byte of the robot changed.
fn refused(dir: &Path, prefix: &Path, bad: &Path, want: &str) {
    let before = tree_digest(prefix);
    let e = install_bundle(prefix, bad, &opts())
        .expect_err(want)
        .to_string();
    eprintln!("refused: {e}");
    assert!(e.contains(want), "expected `{want}` in: {e}");
    let after = tree_digest(prefix);
    assert_eq!(before, after, "the robot changed after refusing: {e}");
    assert_eq!(current_version(prefix), "1");
    let _ = dir;
}

#[test]
fn bad_bundles_are_refused_and_change_nothing() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let prefix = installed_v1(dir);
    let r2 = simple_release(dir, "r2", "two");
    let good = bundle(&r2, "2", &dir.join("good.bundle"));
    let base = entries_of(&good);
    let out = |n: &str| dir.join(n);
    let blob_name = String::from_utf8(base[2].name.clone()).unwrap();

    // tampered blob
    let mut t = entries_of(&good);
    t[2].data[0] ^= 1;
    refused(
        dir,
        &prefix,
        &craft(&t, &out("tampered-blob")),
        "is not what the manifest says",
    );
    // tampered manifest
    let mut t = entries_of(&good);
    let pos = t[0].data.iter().position(|&b| b == b'2').unwrap();
    t[0].data[pos] = b'3';
    refused(
        dir,
        &prefix,
        &craft(&t, &out("tampered-manifest")),
        "signature does not verify",
    );
    // truncated file (inside the zstd stream)
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(out("truncated"), &bytes[..bytes.len() / 2]).unwrap();
    refused(dir, &prefix, &out("truncated"), "truncated");
    // truncated archive (a whole blob missing, the stream itself intact)
    refused(
        dir,
        &prefix,
        &craft(&base[..base.len() - 1], &out("short")),
        "is missing",
    );
    // unsigned
    let t: Vec<Raw> = entries_of(&good)
        .into_iter()
        .filter(|e| e.name != b"manifest.sig")
        .collect();
    refused(dir, &prefix, &craft(&t, &out("unsigned")), "unsigned");
    // wrong key
    let wk = bundle_with(&r2, "2", BOARD, &other_key(), &out("wrong-key"));
    refused(dir, &prefix, &wk, "signature does not verify");
    // wrong board
    let wb = bundle_with(&r2, "2", "orin-nano", &key(), &out("wrong-board"));
    refused(
        dir,
        &prefix,
        &wb,
        "on board `orin-nano`, but this robot is `arm` on board `generic`",
    );

    // hostile entries after a valid signed manifest
    let m0 = |extra: Raw| -> Vec<Raw> {
        let mut v = entries_of(&good);
        v.insert(2, extra);
        v
    };
    refused(
        dir,
        &prefix,
        &craft(
            &m0(file("blobs/../../../../tmp/evil", b"x".to_vec())),
            &out("dotdot"),
        ),
        "`..`",
    );
    refused(
        dir,
        &prefix,
        &craft(&m0(file("/etc/evil", b"x".to_vec())), &out("abs")),
        "absolute",
    );
    let link = |kind, target: &str| Raw {
        name: blob_name.clone().into_bytes(),
        kind,
        data: vec![],
        link: target.as_bytes().to_vec(),
    };
    refused(
        dir,
        &prefix,
        &craft(
            &m0(link(tar::EntryType::Symlink, "/etc/shadow")),
            &out("symlink"),
        ),
        "symbolic link",
    );
    refused(
        dir,
        &prefix,
        &craft(
            &m0(link(tar::EntryType::Link, "../../etc/shadow")),
            &out("hardlink"),
        ),
        "hard link",
    );
    let dev = Raw {
        name: b"blobs/dev".to_vec(),
        kind: tar::EntryType::Char,
        data: vec![],
        link: vec![],
    };
    refused(dir, &prefix, &craft(&m0(dev), &out("dev")), "device node");
    let unlisted = sha256_hex(b"not listed");
    refused(
        dir,
        &prefix,
        &craft(
            &m0(file(&format!("blobs/{unlisted}"), b"not listed".to_vec())),
            &out("unlisted"),
        ),
        "not a file the manifest lists",
    );
    refused(
        dir,
        &prefix,
        &craft(&m0(file("evil.sh", b"rm -rf /".to_vec())), &out("extra")),
        "not a file the manifest lists",
    );
    let dup = base[2].data.clone();
    refused(
        dir,
        &prefix,
        &craft(&m0(file(&blob_name, dup)), &out("dup")),
        "appears twice",
    );

    // a signed manifest whose paths leave the release
    for p in ["../evil", "bin/../../evil", "/etc/evil"] {
        let data = b"x".to_vec();
        let m = Manifest {
            format: 1,
            robot: ROBOT.into(),
            board: BOARD.into(),
            version: "9".into(),
            robot_yaml: "robot: {name: arm}\n".into(),
            files: vec![FileEntry {
                path: p.into(),
                mode: 0o755,
                size: 1,
                sha256: sha256_hex(&data).to_string(),
            }],
        };
        let (mj, ms) = signed_manifest(&m);
        let sha = sha256_hex(&data);
        let b = craft(
            &[mj, ms, file(&format!("blobs/{sha}"), data)],
            &out("escape"),
        );
        refused(dir, &prefix, &b, &format!("file path `{p}`"));
    }

    // and no key at all on the robot: refused, never accepted unsigned
    std::fs::remove_file(prefix.join("etc/rtdeploy/keys/test.pub")).unwrap();
    refused(dir, &prefix, &good, "no trusted public key");
}
