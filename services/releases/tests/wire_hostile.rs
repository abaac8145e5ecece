//! `serve-update` against a broken or hostile sender: each refusal is a
//! clear error named as a wire error, bounded in memory (each case that
//! announces gigabytes runs in a child process whose peak RSS is read with
//! wait4, under a watchdog), `store/.partial` stays bounded, and the next
//! legitimate update works on its first try.

mod util;

mod hostile;

use std::io::{self, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread;

use hostile::child::bounded;
use hostile::{zstd_frame, Piece, GIB};
use releases::bundle::wire::{self, kind, send_bundle, BlobStart, Need, SendOptions, WireError};
use releases::bundle::{BundleReader, Sha256Hex, Store};
use releases::{serve_update, InstallReport, ReleaseError};
use util::*;

type Served = thread::JoinHandle<Result<Option<InstallReport>, ReleaseError>>;

/// A robot serving one session on a socket; the other end for the test
/// to speak the protocol by hand.
fn robot_session(prefix: &Path) -> (Served, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    let p = prefix.to_path_buf();
    let served = thread::spawn(move || serve_update(&p, &opts(), a.try_clone().unwrap(), a));
    (served, b)
}

fn send(s: &mut UnixStream, k: u8, payload: &[u8]) {
    wire::write_frame(s, k, payload).unwrap();
    s.flush().unwrap();
}

fn recv(s: &mut UnixStream) -> (u8, Vec<u8>) {
    wire::read_frame(s).unwrap().expect("a frame")
}

/// HELLO and MANIFEST from `bundle`; returns the robot's NEED.
fn start(s: &mut UnixStream, bundle: &Path) -> Need {
    send(s, kind::HELLO, wire::PROTOCOL.as_bytes());
    assert_eq!(recv(s).0, kind::HELLO);
    let f = BufReader::new(std::fs::File::open(bundle).unwrap());
    let (m, sig) = BundleReader::read_manifest(f).unwrap();
    send(s, kind::MANIFEST, &wire::encode_manifest(&m, &sig));
    let (k, p) = recv(s);
    assert_eq!(k, kind::NEED, "{}", String::from_utf8_lossy(&p));
    serde_json::from_slice(&p).unwrap()
}

/// The robot's ERROR text and its own error.
fn refused(s: &mut UnixStream, served: Served) -> (String, ReleaseError) {
    let (k, p) = recv(s);
    assert_eq!(k, kind::ERROR);
    let e = served.join().unwrap().unwrap_err();
    (String::from_utf8(p).unwrap(), e)
}

fn legit_session(prefix: &Path, bundle: &Path) -> wire::SendReport {
    let (a, b) = UnixStream::pair().unwrap();
    let p = prefix.to_path_buf();
    let robot = thread::spawn(move || serve_update(&p, &opts(), a.try_clone().unwrap(), a));
    let sent = send_bundle(
        bundle,
        b.try_clone().unwrap(),
        &b,
        &SendOptions::default(),
        &mut |_| {},
    );
    drop(b);
    let installed = robot.join().unwrap();
    let sent = sent.unwrap();
    installed.unwrap().unwrap();
    sent
}

/// A release of four 64 KiB files and its bundle.
fn four_files(dir: &Path) -> PathBuf {
    let files: Vec<(String, Vec<u8>, u32)> = (0..4u8)
        .map(|i| {
            let data: Vec<u8> = (0..65536u32)
                .map(|j| (j.wrapping_mul(2654435761) >> 13) as u8 ^ i)
                .collect();
            (format!("bin/p{i}"), data, 0o755)
        })
        .collect();
    let refs: Vec<(&str, Vec<u8>, u32)> = files
        .iter()
        .map(|(p, d, m)| (p.as_str(), d.clone(), *m))
        .collect();
    let r = release(dir, "r1", &refs);
    bundle(&r, "1", &dir.join("v1.bundle"))
}

fn partial_dir(prefix: &Path) -> PathBuf {
    prefix.join("opt/rtdeploy/store/.partial")
}

fn partials(prefix: &Path) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = std::fs::read_dir(partial_dir(prefix))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().len(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_blob_that_decompresses_past_its_size_is_cut_off_and_the_next_update_works() {
    bounded(
        "a_blob_that_decompresses_past_its_size_is_cut_off_and_the_next_update_works",
        || {
            let d = tempfile::tempdir().unwrap();
            let prefix = robot(d.path());
            let b1 = four_files(d.path());
            let (served, mut s) = robot_session(&prefix);
            let need = start(&mut s, &b1);
            let n = &need.need[0];
            let start_blob = serde_json::to_vec(&BlobStart {
                sha256: n.sha256.clone(),
                offset: 0,
            })
            .unwrap();
            send(&mut s, kind::BLOB_START, &start_blob);
            // 1 GiB of zeros in 32 KiB of zstd (RLE blocks)
            let bomb = zstd_frame(&[Piece::Run(0, GIB)]);
            for c in bomb.chunks(60 << 10) {
                // the robot stops reading once it refused the blob
                if wire::write_frame(&mut s, kind::BLOB_DATA, c).is_err() {
                    break;
                }
            }
            let _ = wire::write_frame(&mut s, kind::BLOB_END, &[]);
            let (text, e) = refused(&mut s, served);
            let want = format!(
                "received blob {} decompresses to more than the {} bytes its manifest gives; discarded",
                n.sha256, n.size
            );
            assert_eq!(text, want);
            assert_eq!(e.to_string(), want);
            assert_eq!(partials(&prefix), vec![], "the partial was discarded");
            // the next update starts that blob over and installs
            let sent = legit_session(&prefix, &b1);
            assert_eq!((sent.blobs_sent, sent.resumed_bytes), (4, 0));
            assert_eq!(current_version(&prefix), "1");
        },
    );
}

#[test]
fn a_partial_longer_than_its_blob_is_dropped_and_the_update_works() {
    let d = tempfile::tempdir().unwrap();
    let prefix = robot(d.path());
    let b1 = four_files(d.path());
    let (served, mut s) = robot_session(&prefix);
    let need = start(&mut s, &b1);
    drop(s);
    let _ = served.join();
    // as an older robot left it after a zip bomb
    let n = &need.need[1];
    std::fs::create_dir_all(partial_dir(&prefix)).unwrap();
    std::fs::write(
        partial_dir(&prefix).join(&n.sha256),
        vec![0u8; n.size as usize + 4096],
    )
    .unwrap();
    let sent = legit_session(&prefix, &b1);
    assert_eq!((sent.blobs_sent, sent.resumed_bytes), (4, 0));
    assert_eq!(current_version(&prefix), "1");
    assert_eq!(partials(&prefix), vec![]);
}

#[test]
fn a_partial_with_wrong_bytes_is_sent_again_from_the_start() {
    let d = tempfile::tempdir().unwrap();
    let prefix = robot(d.path());
    let b1 = four_files(d.path());
    let (served, mut s) = robot_session(&prefix);
    let need = start(&mut s, &b1);
    // a sender that sent half a blob of garbage, then went away
    let n = &need.need[2];
    let start_blob = serde_json::to_vec(&BlobStart {
        sha256: n.sha256.clone(),
        offset: 0,
    })
    .unwrap();
    send(&mut s, kind::BLOB_START, &start_blob);
    let garbage = zstd::encode_all(&vec![0x55u8; n.size as usize / 2][..], 3).unwrap();
    send(&mut s, kind::BLOB_DATA, &garbage);
    drop(s);
    let e = served.join().unwrap().unwrap_err();
    assert_eq!(
        e.to_string(),
        "update connection: the sender closed the connection before INSTALL"
    );
    assert_eq!(partials(&prefix), vec![(n.sha256.clone(), n.size / 2)]);
    // the robot offers the half it has; the sender's bytes differ, so it
    // sends the blob from 0 and the update installs on the first try
    let sent = legit_session(&prefix, &b1);
    assert_eq!((sent.blobs_sent, sent.resumed_bytes), (4, 0));
    assert_eq!(current_version(&prefix), "1");
    assert_eq!(partials(&prefix), vec![]);
}

#[test]
fn a_blob_with_wrong_content_is_refused_and_discarded() {
    let d = tempfile::tempdir().unwrap();
    let prefix = robot(d.path());
    let b1 = four_files(d.path());
    let (served, mut s) = robot_session(&prefix);
    let need = start(&mut s, &b1);
    let n = &need.need[0];
    let start_blob = serde_json::to_vec(&BlobStart {
        sha256: n.sha256.clone(),
        offset: 0,
    })
    .unwrap();
    send(&mut s, kind::BLOB_START, &start_blob);
    let wrong = zstd::encode_all(&vec![1u8; n.size as usize][..], 3).unwrap();
    send(&mut s, kind::BLOB_DATA, &wrong);
    send(&mut s, kind::BLOB_END, &[]);
    let (text, _) = refused(&mut s, served);
    assert!(
        text.starts_with(&format!("received blob {} hashes to ", n.sha256))
            && text.ends_with(&format!(
                "({} bytes, expected {}); discarded",
                n.size, n.size
            )),
        "{text}"
    );
    assert_eq!(partials(&prefix), vec![]);
    // garbage that is not zstd at all
    let (served, mut s) = robot_session(&prefix);
    start(&mut s, &b1);
    send(&mut s, kind::BLOB_START, &start_blob);
    send(&mut s, kind::BLOB_DATA, b"this is not zstd");
    let (text, _) = refused(&mut s, served);
    assert!(
        text.starts_with(&format!(
            "received blob {} is not a valid zstd stream (",
            n.sha256
        )) && text.ends_with("); discarded"),
        "{text}"
    );
    assert_eq!(partials(&prefix), vec![]);
    // a zstd frame asking for a 64 MiB window (zstd's default limit would
    // allocate it)
    let (served, mut s) = robot_session(&prefix);
    start(&mut s, &b1);
    send(&mut s, kind::BLOB_START, &start_blob);
    send(
        &mut s,
        kind::BLOB_DATA,
        &hostile::zstd_frame_with_window(&[Piece::Run(0, 10)], 16),
    );
    let (text, _) = refused(&mut s, served);
    assert!(
        text.contains("is not a valid zstd stream (") && text.contains("memory"),
        "{text}"
    );
    assert_eq!(partials(&prefix), vec![]);
    legit_session(&prefix, &b1);
    assert_eq!(current_version(&prefix), "1");
}

#[test]
fn partials_are_trimmed_to_the_release_being_received_and_collected_by_gc() {
    let d = tempfile::tempdir().unwrap();
    let prefix = robot(d.path());
    let b1 = four_files(d.path());
    let pdir = partial_dir(&prefix);
    std::fs::create_dir_all(pdir.join("a-directory")).unwrap();
    std::fs::write(pdir.join("not-a-sha"), b"x").unwrap();
    for i in 0..20u8 {
        // partials of blobs of some other release
        let sha = releases::bundle::sha256_hex(&[i]);
        std::fs::write(pdir.join(sha.as_str()), [i]).unwrap();
    }
    // a session that stops after NEED: only partials of its release may
    // stay, and it has none
    let (served, mut s) = robot_session(&prefix);
    let need = start(&mut s, &b1);
    assert!(need.need.iter().all(|n| n.offset == 0), "{need:?}");
    assert_eq!(partials(&prefix), vec![]);
    drop(s);
    let _ = served.join();

    // gc (after an install) removes every partial no receiver holds
    let n = &need.need[0];
    std::fs::write(pdir.join(&n.sha256), [0u8; 100]).unwrap();
    let store = Store::new(prefix.join("opt/rtdeploy/store"));
    let held_sha = Sha256Hex::parse(&need.need[1].sha256).unwrap();
    let held = store.receive(&held_sha, 0, need.need[1].size).unwrap();
    store.gc(&Default::default()).unwrap();
    assert_eq!(
        partials(&prefix),
        vec![(held_sha.to_string(), 0)],
        "only the partial being received is left"
    );
    // and a second receiver of the same blob is told, not let in
    let e = store.receive(&held_sha, 0, 1).err().unwrap();
    assert_eq!(
        e.to_string(),
        format!("blob {held_sha} is being received by another update right now")
    );
    drop(held);
    store.gc(&Default::default()).unwrap();
    assert_eq!(partials(&prefix), vec![]);
}

#[test]
fn at_most_eight_partials_are_kept() {
    let d = tempfile::tempdir().unwrap();
    let store = Store::new(d.path().join("store"));
    let mut blobs = std::collections::BTreeMap::new();
    for i in 0..12u8 {
        let sha = releases::bundle::sha256_hex(&[i]);
        let mut rx = store.receive(&sha, 0, 1000).unwrap();
        rx.write_compressed(&zstd::encode_all(&[i; 10][..], 3).unwrap())
            .unwrap();
        rx.suspend().unwrap();
        blobs.insert(sha, 1000u64);
    }
    assert_eq!(store.trim_partials(&blobs).unwrap(), 12 - 8);
    let left = std::fs::read_dir(d.path().join("store/.partial"))
        .unwrap()
        .count();
    assert_eq!(left, releases::bundle::MAX_PARTIALS);
    assert_eq!(left, 8);
}

#[test]
fn oversized_frames_are_refused_before_they_are_read() {
    bounded("oversized_frames_are_refused_before_they_are_read", || {
        let d = tempfile::tempdir().unwrap();
        let prefix = robot(d.path());
        let b1 = four_files(d.path());
        // a MANIFEST frame announcing 4 GiB
        let (served, mut s) = robot_session(&prefix);
        send(&mut s, kind::HELLO, wire::PROTOCOL.as_bytes());
        recv(&mut s);
        s.write_all(&[kind::MANIFEST, 0xff, 0xff, 0xff, 0xff])
            .unwrap();
        let (text, e) = refused(&mut s, served);
        assert_eq!(
            text,
            "update protocol: frame of kind 2 with 4294967295 bytes (at most 16777284)"
        );
        assert!(matches!(e, ReleaseError::Protocol(_)), "{e:?}");
        // a BLOB_DATA frame announcing 64 MiB (the old limit for all)
        let (served, mut s) = robot_session(&prefix);
        let need = start(&mut s, &b1);
        let start_blob = serde_json::to_vec(&BlobStart {
            sha256: need.need[0].sha256.clone(),
            offset: 0,
        })
        .unwrap();
        send(&mut s, kind::BLOB_START, &start_blob);
        s.write_all(&[kind::BLOB_DATA, 4, 0, 0, 0]).unwrap();
        let (text, _) = refused(&mut s, served);
        assert_eq!(
            text,
            "update protocol: frame of kind 5 with 67108864 bytes (at most 1048576)"
        );
        // a NEED of 64 MiB announced, 10 bytes sent: nothing allocated
        // for the rest (read as it arrives)
        let mut fake = &[&[kind::NEED, 4, 0, 0, 0][..], &[b'x'; 10]].concat()[..];
        let e = wire::read_frame(&mut fake).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the connection ended inside a frame of kind 3, 10 of 67108864 bytes"
        );
    });
}

#[test]
fn wire_errors_say_wire_not_bundle() {
    let d = tempfile::tempdir().unwrap();
    let prefix = robot(d.path());
    let b1 = four_files(d.path());
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            vec![42, 0, 0, 0, 0],
            "update protocol: frame of kind 42, which this protocol does not have",
        ),
        (
            vec![kind::HELLO, 0, 0, 0, 9, b'x'],
            "update connection: the connection ended inside a frame of kind 1, 1 of 9 bytes",
        ),
        (
            vec![kind::INSTALL, 0, 0, 0, 0],
            "update protocol: expected HELLO, got frame kind 7",
        ),
    ];
    for (bytes, want) in cases {
        let (served, mut s) = robot_session(&prefix);
        s.write_all(&bytes).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let e = served.join().unwrap().unwrap_err().to_string();
        assert_eq!(e, want);
        assert!(!e.contains("bundle"), "{e}");
    }
    // a peer speaking something else is named, cut and escaped
    let (served, mut s) = robot_session(&prefix);
    send(
        &mut s,
        kind::HELLO,
        format!("evil\x1b[2J{}", "v".repeat(40)).as_bytes(),
    );
    let (text, _) = refused(&mut s, served);
    assert_eq!(
        text,
        format!(
            "update protocol: the sender speaks `evil\\u{{1b}}[2J{}` (expected `rtdeploy-update/1`)",
            "v".repeat(40)
        )
    );
    // a blob name from the peer, cut and escaped
    let (served, mut s) = robot_session(&prefix);
    start(&mut s, &b1);
    let long = format!("\n{}", "f".repeat(3000));
    let p = serde_json::to_vec(&BlobStart {
        sha256: long,
        offset: 0,
    })
    .unwrap();
    send(&mut s, kind::BLOB_START, &p);
    let (text, _) = refused(&mut s, served);
    assert_eq!(
        text,
        format!(
            "update protocol: blob `\\n{}`... (3001 bytes) is not in the manifest",
            "f".repeat(99)
        )
    );
    // the sender's side: a robot's ERROR text is cut and kept on one line
    let (a, b) = UnixStream::pair().unwrap();
    let fake_robot = thread::spawn(move || {
        let mut a = a;
        recv(&mut a);
        send(
            &mut a,
            kind::ERROR,
            format!("no\n{}", "e".repeat(50_000)).as_bytes(),
        );
    });
    let e = send_bundle(
        &b1,
        b.try_clone().unwrap(),
        &b,
        &SendOptions::default(),
        &mut |_| {},
    )
    .unwrap_err();
    fake_robot.join().unwrap();
    let s = e.to_string();
    assert!(matches!(e, WireError::Remote(_)), "{e:?}");
    assert!(s.starts_with("robot refused: no\\neee"), "{s}");
    assert!(s.ends_with("... (50003 bytes)"), "{s}");
    assert!(s.len() < 2100, "{}", s.len());
}

/// `{:#}` of an anyhow error: each cause in the chain after the last.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[test]
fn causes_are_printed_once_in_the_chain() {
    let d = tempfile::tempdir().unwrap();
    let not_there = d.path().join("missing.bundle");
    std::fs::write(d.path().join("file"), b"").unwrap();
    // (error, its cause's text)
    let errors: Vec<(Box<dyn std::error::Error>, &str)> = vec![
        (
            Box::new(releases::install_bundle(&robot(d.path()), &not_there, &opts()).unwrap_err()),
            "(os error 2)",
        ),
        (
            Box::new(
                send_bundle(
                    &not_there,
                    io::empty(),
                    io::sink(),
                    &SendOptions::default(),
                    &mut |_| {},
                )
                .unwrap_err(),
            ),
            "(os error 2)",
        ),
        (
            Box::new(WireError::from(io::Error::other("the cable fell out"))),
            "the cable fell out",
        ),
        (
            Box::new(
                Store::new(d.path().join("file"))
                    .receive(&releases::bundle::sha256_hex(b""), 0, 0)
                    .err()
                    .unwrap(),
            ),
            "(os error 20)",
        ),
        (
            Box::new(releases::bundle::load_secret_key(&not_there).err().unwrap()),
            "(os error 2)",
        ),
    ];
    for (e, cause) in errors {
        let c = chain(e.as_ref());
        assert_eq!(c.matches(cause).count(), 1, "the cause once: {c}");
    }
}
