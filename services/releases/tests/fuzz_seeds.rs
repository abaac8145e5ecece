//! The seed corpus of the `bundle_read` fuzz target, run as a test (CI
//! runs this; the fuzzer itself runs by hand: `cargo fuzz run bundle_read
//! fuzz/seeds/bundle_read`). Each seed goes through the target's body,
//! which asserts that the reader returns, refuses with a short line and
//! never feeds a sink more than a blob's signed size.
//!
//! The seeds are made here: `RTDEPLOY_WRITE_SEEDS=1 cargo test -p releases
//! --test fuzz_seeds` writes them; otherwise the test checks the
//! committed ones are what this code makes.

mod hostile;

#[path = "../../../fuzz/fuzz_targets/bundle_body.rs"]
mod bundle_body;

use std::path::{Path, PathBuf};

use hostile::*;
use releases::bundle::{sha256_hex, write_bundle, BundleSpec, SecretKey};

fn seed_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/bundle_read")
}

/// A small valid bundle signed with the fuzz target's key.
fn valid_bundle() -> Vec<u8> {
    let d = tempfile::tempdir().unwrap();
    let r = d.path().join("rel");
    std::fs::create_dir_all(r.join("bin")).unwrap();
    std::fs::write(r.join("bin/ctl"), b"#!/bin/sh\nexec sleep 1\n").unwrap();
    std::fs::write(r.join("bin/copy"), b"#!/bin/sh\nexec sleep 1\n").unwrap();
    std::fs::write(r.join("params.txt"), b"gain 3\n").unwrap();
    let spec = BundleSpec {
        release_dir: r,
        version: "1.0".into(),
        robot: bundle_body::ROBOT.into(),
        board: bundle_body::BOARD.into(),
        robot_yaml: "robot: {name: arm}\nboard: {model: generic}\n".into(),
        programs: Vec::new(),
    };
    let out = d.path().join("b");
    write_bundle(&spec, &SecretKey::from_seed(bundle_body::KEY_SEED), &out).unwrap();
    std::fs::read(out).unwrap()
}

/// Every seed: (file name, bytes).
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let valid = valid_bundle();
    let blob = b"gain 3\n";
    let blob_name = format!("blobs/{}", sha256_hex(blob));
    let mut base256 = tar_header(b"manifest.json", b'0', 0);
    base256[124..136].copy_from_slice(&[0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    base256[148..156].fill(b' ');
    let sum: u64 = base256.iter().map(|&b| u64::from(b)).sum();
    base256[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    vec![
        ("valid", valid.clone()),
        ("valid-cut", valid[..valid.len() - 40].to_vec()),
        (
            "pax-size-over-manifest-cap",
            Tar::new()
                .entry(b"pax", b'x', &pax(&[("size", "1073741824")]))
                .header(b"manifest.json", b'0', 10)
                .run(b'{', 4096)
                .zst(),
        ),
        (
            "gnu-long-name-2g",
            Tar::new()
                .header(b"././@LongLink", b'L', 2 << 30)
                .run(b'a', 8192)
                .zst(),
        ),
        (
            "pax-header-64m",
            Tar::new()
                .header(b"PaxHeaders/x", b'x', 64 << 20)
                .run(b'9', 8192)
                .zst(),
        ),
        (
            "long-link",
            Tar::new()
                .entry(b"././@LongLink", b'K', "t\x1b".repeat(1000).as_bytes())
                .entry(b"manifest.json", b'2', b"")
                .end()
                .zst(),
        ),
        (
            "pax-path",
            Tar::new()
                .entry(
                    b"pax",
                    b'x',
                    &pax(&[("path", "manifest.json"), ("mtime", "1.5")]),
                )
                .header(b"ignored", b'0', 2)
                .run(b'{', 2)
                .end()
                .zst(),
        ),
        ("base256-size", {
            let mut t = Tar::new();
            t.pieces.push(Piece::Raw(base256.clone()));
            t.run(b'{', 2).end().zst()
        }),
        (
            "blob-pax-size-over-manifest",
            signed_tar(&[("params.txt", blob)])
                .entry(b"pax", b'x', &pax(&[("size", "9999")]))
                .header(blob_name.as_bytes(), b'0', blob.len() as u64)
                .run(b'z', 9999)
                .end()
                .zst(),
        ),
        (
            "blob-wrong-content",
            signed_tar(&[("params.txt", blob)])
                .file(&blob_name, b"gain 4\n")
                .end()
                .zst(),
        ),
        (
            "signed-then-unlisted",
            signed_tar(&[("params.txt", blob)])
                .file(&blob_name, blob)
                .file("blobs/extra", b"x")
                .end()
                .zst(),
        ),
        (
            "unsigned",
            Tar::new()
                .file("manifest.json", b"{}")
                .file(&blob_name, blob)
                .end()
                .zst(),
        ),
    ]
}

#[test]
fn the_bundle_seed_corpus_runs_clean() {
    let dir = seed_dir();
    let mut n = 0;
    let mut accepted = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let e = e.unwrap();
        let data = std::fs::read(e.path()).unwrap();
        println!("seed {}", e.file_name().to_string_lossy());
        accepted += usize::from(bundle_body::run(&data));
        n += 1;
    }
    assert!(n >= 12, "only {n} seeds in {}", dir.display());
    // the fuzzer needs a bundle that gets past the signature
    assert!(accepted >= 1, "no seed is a valid bundle");
}

#[test]
fn the_bundle_seeds_are_what_this_code_makes() {
    let dir = seed_dir();
    let write = std::env::var_os(units::env::WRITE_SEEDS).is_some();
    if write {
        std::fs::create_dir_all(&dir).unwrap();
    }
    for (name, bytes) in seeds() {
        let p = dir.join(name);
        if write {
            std::fs::write(&p, &bytes).unwrap();
        }
        let have = std::fs::read(&p).unwrap_or_default();
        assert!(
            have == bytes,
            "{} is not what this code makes; run `RTDEPLOY_WRITE_SEEDS=1 cargo test -p releases --test fuzz_seeds`",
            p.display()
        );
    }
    assert!(bundle_body::run(&valid_bundle()), "the valid seed reads");
}
