//! The update protocol end to end over a socket pair: only missing blobs
//! cross, a cut connection resumes from the bytes already received, and a
//! bundle the robot does not trust is refused before any blob is asked for.

mod util;

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::thread;

use releases::bundle::wire::{send_bundle, SendOptions, SendReport, WireError};
use releases::{serve_update, ReleaseError};
use util::*;

/// Runs one session: the robot side in a thread, the sender here.
fn session(
    prefix: &Path,
    bundle: &Path,
    opts_send: SendOptions,
) -> (
    Result<SendReport, WireError>,
    Result<Option<releases::InstallReport>, ReleaseError>,
) {
    let (a, b) = UnixStream::pair().unwrap();
    let p = prefix.to_path_buf();
    let robot = thread::spawn(move || serve_update(&p, &opts(), a.try_clone().unwrap(), a));
    let sent = send_bundle(bundle, b.try_clone().unwrap(), &b, &opts_send, &mut |_| {});
    drop(b);
    (sent, robot.join().unwrap())
}

/// Pseudo-random, incompressible-ish bytes.
fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn ten_binaries(dir: &Path, name: &str, changed: u64) -> std::path::PathBuf {
    binaries(dir, name, changed, 200_000)
}

fn binaries(dir: &Path, name: &str, changed: u64, size: usize) -> std::path::PathBuf {
    let files: Vec<(String, Vec<u8>, u32)> = (0..10u64)
        .map(|i| {
            let seed = if i == 3 { 1000 + changed } else { i };
            (format!("bin/ctl{i}"), noise(seed, size), 0o755)
        })
        .collect();
    let refs: Vec<(&str, Vec<u8>, u32)> = files
        .iter()
        .map(|(p, d, m)| (p.as_str(), d.clone(), *m))
        .collect();
    release(dir, name, &refs)
}

#[test]
fn only_missing_blobs_cross_and_the_robot_installs() {
    let d = tempfile::tempdir().unwrap();
    let prefix = robot(d.path());
    let b1 = bundle(
        &ten_binaries(d.path(), "r1", 0),
        "1",
        &d.path().join("v1.bundle"),
    );
    let (sent, robot) = session(&prefix, &b1, SendOptions::default());
    let sent = sent.unwrap();
    assert_eq!(sent.blobs_sent, 10);
    assert_eq!(robot.unwrap().unwrap().state, "committed");
    assert_eq!(current_version(&prefix), "1");

    let b2 = bundle(
        &ten_binaries(d.path(), "r2", 1),
        "2",
        &d.path().join("v2.bundle"),
    );
    let (sent2, robot) = session(&prefix, &b2, SendOptions::default());
    let sent2 = sent2.unwrap();
    assert_eq!((sent2.blobs_sent, sent2.blobs_skipped), (1, 9));
    assert_eq!(robot.unwrap().unwrap().state, "trial");
    assert_eq!(current_version(&prefix), "2");
    // one changed binary costs about one binary, not ten
    let changed = std::fs::read(d.path().join("r2/bin/ctl3")).unwrap();
    let zsize = zstd::encode_all(&changed[..], 9).unwrap().len() as u64;
    assert!(
        sent2.bytes_out < zsize + 4096,
        "{} bytes for one {zsize}-byte blob",
        sent2.bytes_out
    );
    assert!(sent2.bytes_out * 5 < sent.bytes_out);
}

#[test]
fn a_cut_connection_resumes_from_what_arrived() {
    let d = tempfile::tempdir().unwrap();
    let prefix = robot(d.path());
    let b1 = bundle(
        &binaries(d.path(), "r1", 0, 1 << 20),
        "1",
        &d.path().join("v1.bundle"),
    );
    let before = tree_digest(&prefix);
    // cut in the middle of the transfer, halfway into the third blob
    let (sent, robot) = session(
        &prefix,
        &b1,
        SendOptions {
            cut_after: Some(5 << 19),
        },
    );
    assert!(sent.is_err(), "{sent:?}");
    assert!(robot.is_err());
    assert!(
        prefix
            .join("opt/rtdeploy/current")
            .symlink_metadata()
            .is_err(),
        "nothing installed"
    );
    let partial: u64 = std::fs::read_dir(prefix.join("opt/rtdeploy/store/.partial"))
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(partial > 0, "a partial blob is kept");
    assert_ne!(before, tree_digest(&prefix));
    let (sent, robot) = session(&prefix, &b1, SendOptions::default());
    let sent = sent.unwrap();
    assert_eq!(
        sent.resumed_bytes, partial,
        "the robot asked only for the rest: {sent:?}"
    );
    assert!(sent.blobs_sent < 10, "{sent:?}");
    robot.unwrap().unwrap();
    assert_eq!(current_version(&prefix), "1");
}

#[test]
fn an_untrusted_bundle_is_refused_before_any_blob() {
    let d = tempfile::tempdir().unwrap();
    let prefix = robot(d.path());
    let b1 = bundle(
        &ten_binaries(d.path(), "r1", 0),
        "1",
        &d.path().join("v1.bundle"),
    );
    session(&prefix, &b1, SendOptions::default()).0.unwrap();
    let before = tree_digest(&prefix);
    let bad = bundle_with(
        &ten_binaries(d.path(), "r2", 1),
        "2",
        BOARD,
        &other_key(),
        &d.path().join("bad.bundle"),
    );
    let (sent, robot) = session(&prefix, &bad, SendOptions::default());
    let e = sent.unwrap_err().to_string();
    assert!(
        e.contains("robot refused") && e.contains("signature does not verify"),
        "{e}"
    );
    assert!(robot.is_err());
    assert_eq!(before, tree_digest(&prefix));
    let wb = bundle_with(
        &ten_binaries(d.path(), "r3", 1),
        "3",
        "orin-nano",
        &key(),
        &d.path().join("wb.bundle"),
    );
    let e = session(&prefix, &wb, SendOptions::default())
        .0
        .unwrap_err()
        .to_string();
    assert!(e.contains("board `orin-nano`"), "{e}");
    assert_eq!(before, tree_digest(&prefix));
}
