//! Hostile bundles, read before their signature is checked (or after it,
//! with a replayed manifest): each refused with a clear error, bounded in
//! memory and time. Every case that announces gigabytes runs in a child
//! process whose peak RSS is read with wait4 and held under
//! `child::RSS_LIMIT_MIB`, under a watchdog.

mod hostile;

use std::cell::Cell;

use hostile::child::bounded;
use hostile::*;
use releases::bundle::{sha256_hex, BundleReadError, BundleReader, VerifiedManifest};

/// Reads `bundle` as a robot installing it would; the sink counts the
/// bytes it gets.
fn read(bundle: &[u8]) -> (Result<VerifiedManifest, BundleReadError>, u64) {
    let (keys, compat) = trust();
    let got = Cell::new(0u64);
    let r = BundleReader::read(
        bundle,
        &keys,
        &compat,
        |_| Ok(()),
        |_, data| {
            let n = std::io::copy(data, &mut std::io::sink())?;
            got.set(got.get() + n);
            Ok(())
        },
    );
    (r, got.get())
}

fn read_err(bundle: &[u8]) -> String {
    let e = read(bundle).0.unwrap_err();
    let s = e.to_string();
    assert!(
        s.len() < 400,
        "an error stays short: {} bytes: {s}",
        s.len()
    );
    s
}

#[test]
fn a_small_hand_made_bundle_reads() {
    // The builders make bundles the reader accepts: the refusals below
    // are about what each case changes.
    let blob = b"gain 3\n";
    let sha = sha256_hex(blob);
    let b = signed_tar(&[("params.txt", blob)])
        .file(&format!("blobs/{sha}"), blob)
        .end()
        .zst();
    let (r, got) = read(&b);
    r.unwrap();
    assert_eq!(got, blob.len() as u64);
}

#[test]
fn a_pax_size_cannot_lift_the_manifest_cap() {
    bounded("a_pax_size_cannot_lift_the_manifest_cap", || {
        // The ustar header says 10 bytes; the pax record says 1 GiB, and
        // the gigabyte is there.
        let b = Tar::new()
            .entry(b"pax", b'x', &pax(&[("size", &GIB.to_string())]))
            .header(b"manifest.json", b'0', 10)
            .run(b'{', GIB)
            .end()
            .zst();
        let e = read_err(&b);
        assert_eq!(
            e,
            "bundle entry `manifest.json` is 1073741824 bytes (at most 16777216)"
        );
        // the sending side reads the manifest the same way
        let e = BundleReader::read_manifest(&b[..]).unwrap_err().to_string();
        assert!(e.contains("is 1073741824 bytes (at most 16777216)"), "{e}");
    });
}

#[test]
fn a_huge_signature_entry_is_refused_unread() {
    bounded("a_huge_signature_entry_is_refused_unread", || {
        let b = Tar::new()
            .file("manifest.json", b"{}")
            .huge(b"manifest.sig", b'0', GIB, 0)
            .end()
            .zst();
        assert_eq!(
            read_err(&b),
            "bundle entry `manifest.sig` is 1073741824 bytes (at most 64)"
        );
    });
}

#[test]
fn a_gnu_long_name_is_capped_before_it_is_read() {
    bounded("a_gnu_long_name_is_capped_before_it_is_read", || {
        let b = Tar::new()
            .huge(b"././@LongLink", b'L', 2 * GIB, b'a')
            .file("manifest.json", b"{}")
            .end()
            .zst();
        assert_eq!(
            read_err(&b),
            "bundle is not a valid tar stream at byte 0: a GNU long name of 2147483648 bytes (at most 4096)"
        );
    });
}

#[test]
fn a_pax_header_is_capped_before_it_is_read() {
    bounded("a_pax_header_is_capped_before_it_is_read", || {
        let b = Tar::new()
            .huge(b"PaxHeaders/manifest.json", b'x', 2 * GIB, b'9')
            .file("manifest.json", b"{}")
            .end()
            .zst();
        assert_eq!(
            read_err(&b),
            "bundle is not a valid tar stream at byte 0: a pax extended header of 2147483648 bytes (at most 65536)"
        );
    });
}

#[test]
fn every_extension_header_is_capped_and_global_headers_are_refused_unread() {
    bounded(
        "every_extension_header_is_capped_and_global_headers_are_refused_unread",
        || {
            let e = read_err(
                &Tar::new()
                    .huge(b"././@LongLink", b'K', GIB, b'l')
                    .file("manifest.json", b"{}")
                    .end()
                    .zst(),
            );
            assert!(
                e.ends_with("a GNU long link name of 1073741824 bytes (at most 4096)"),
                "{e}"
            );
            // a pax global header is not read at all: refused by its type
            let e = read_err(
                &Tar::new()
                    .huge(b"pax_global_header", b'g', GIB, b'9')
                    .end()
                    .zst(),
            );
            assert_eq!(
                e,
                "bundle entry `pax_global_header` is a pax global header; bundles hold regular files only"
            );
            // extensions in a row for one entry are refused, not piled up
            let e = read_err(
                &Tar::new()
                    .entry(b"x", b'x', &pax(&[("comment", "a")]))
                    .entry(b"x", b'x', &pax(&[("comment", "b")]))
                    .file("manifest.json", b"{}")
                    .end()
                    .zst(),
            );
            assert!(
                e.ends_with("a second pax extended header for the same entry"),
                "{e}"
            );
        },
    );
}

#[test]
fn a_blob_is_held_to_its_manifest_size_before_it_is_read() {
    bounded(
        "a_blob_is_held_to_its_manifest_size_before_it_is_read",
        || {
            let blob = b"gain 3\n";
            let sha = sha256_hex(blob);
            let name = format!("blobs/{sha}");
            // a pax size over the signed one
            let b = signed_tar(&[("params.txt", blob)])
                .entry(b"pax", b'x', &pax(&[("size", &GIB.to_string())]))
                .header(name.as_bytes(), b'0', blob.len() as u64)
                .run(b'z', GIB)
                .end()
                .zst();
            let (r, got) = read(&b);
            let e = r.unwrap_err().to_string();
            assert_eq!(
                e,
                format!("blob {sha} is not what the manifest says: the entry holds 1073741824 bytes, the manifest says 7")
            );
            assert_eq!(got, 0, "nothing of it reached the sink");
            // a plain header over the signed size
            let b = signed_tar(&[("params.txt", blob)])
                .huge(name.as_bytes(), b'0', GIB, b'z')
                .end()
                .zst();
            let (r, got) = read(&b);
            assert!(r
                .unwrap_err()
                .to_string()
                .contains("the entry holds 1073741824 bytes"),);
            assert_eq!(got, 0);
        },
    );
}

#[test]
fn a_sink_cannot_read_past_the_entry() {
    // The sink gets a reader that ends at the blob's size even when the
    // archive goes on; the next header is not blob data.
    let blob = b"gain 3\n";
    let sha = sha256_hex(blob);
    let b = signed_tar(&[("params.txt", blob)])
        .file(&format!("blobs/{sha}"), blob)
        .huge(b"blobs/extra", b'0', 4096, b'q')
        .end()
        .zst();
    let (keys, compat) = trust();
    let mut seen = Vec::new();
    let e = BundleReader::read(
        &b[..],
        &keys,
        &compat,
        |_| Ok(()),
        |_, data| {
            let mut v = Vec::new();
            data.read_to_end(&mut v)?;
            seen.push(v);
            Ok(())
        },
    )
    .unwrap_err();
    assert_eq!(seen, vec![blob.to_vec()]);
    assert_eq!(
        e.to_string(),
        "bundle entry `blobs/extra` is not a file the manifest lists"
    );
}

#[test]
fn a_zstd_window_over_the_limit_is_refused_before_it_is_allocated() {
    bounded(
        "a_zstd_window_over_the_limit_is_refused_before_it_is_allocated",
        || {
            let tar = Tar::new().file("manifest.json", b"{}").end();
            // 2^26: zstd's own default limit (2^27) would allocate it
            let b = zstd_frame_with_window(&tar.pieces, 16);
            let e = read_err(&b);
            assert!(
                e.starts_with("bundle is truncated or corrupt: ") && e.contains("memory"),
                "{e}"
            );
            // the window the writer uses is accepted
            let ok = zstd_frame_with_window(&tar.pieces, 12);
            let e = read_err(&ok);
            assert!(e.contains("unsigned"), "{e}");
        },
    );
}

#[test]
fn rejected_names_are_cut_and_escaped() {
    let long = format!("evil\x1b[2J\n{}", "x".repeat(4000));
    let shown = format!("`evil\\u{{1b}}[2J\\n{}`... (4009 bytes)", "x".repeat(91));
    // via a GNU long name
    let e = read_err(
        &Tar::new()
            .entry(b"././@LongLink", b'L', long.as_bytes())
            .file("short", b"")
            .end()
            .zst(),
    );
    assert_eq!(
        e,
        format!("bundle entry {shown} is not a file the manifest lists")
    );
    // a blob name where the manifest should be
    let e = read_err(
        &Tar::new()
            .entry(b"././@LongLink", b'L', format!("blobs/{long}").as_bytes())
            .file("short", b"")
            .end()
            .zst(),
    );
    assert!(
        e.starts_with("bundle does not start with `manifest.json` (found `blobs/evil\\u{1b}[2J\\n"),
        "{e}"
    );
    assert!(e.ends_with("`... (4015 bytes))"), "{e}");
    // via a pax path, refused as a name a bundle does not hold
    let e = read_err(
        &Tar::new()
            .entry(b"x", b'x', &pax(&[("path", &format!("/{long}"))]))
            .file("short", b"")
            .end()
            .zst(),
    );
    assert!(e.starts_with("bundle entry `/evil\\u{1b}[2J\\n"), "{e}");
    assert!(e.ends_with("... (4010 bytes) is an absolute path"), "{e}");
    // a link target is cut and escaped too
    let e = read_err(
        &Tar::new()
            .entry(b"././@LongLink", b'K', long.as_bytes())
            .entry(b"manifest.json", b'2', b"")
            .end()
            .zst(),
    );
    assert_eq!(
        e,
        format!("bundle entry `manifest.json` is a symbolic link to {shown}; bundles hold regular files only")
    );
    // after the signature: an unlisted blob name, not UTF-8
    let blob = b"gain 3\n";
    let mut name = b"blobs/\xff\xfe".to_vec();
    name.extend_from_slice(&[b'y'; 3000]);
    let e = read_err(
        &signed_tar(&[("params.txt", blob)])
            .entry(b"././@LongLink", b'L', &name)
            .file("short", b"")
            .end()
            .zst(),
    );
    assert!(
        e.starts_with("bundle entry `blobs/\u{fffd}\u{fffd}yyy"),
        "{e}"
    );
    assert!(e.contains("... ("), "{e}");
}

#[test]
fn a_damaged_header_is_named_with_its_offset() {
    let mut b = Tar::new().file("manifest.json", b"{}").end();
    if let Piece::Raw(h) = &mut b.pieces[0] {
        h[0] = b'M';
    }
    let e = read_err(&b.zst());
    assert!(
        e.starts_with("bundle is not a valid tar stream at byte 0: header checksum is"),
        "{e}"
    );
    // cut inside an entry
    let mut t = Tar::new().header(b"manifest.json", b'0', 100);
    t.pieces.push(Piece::Raw(vec![b'{'; 10]));
    let e = read_err(&t.zst());
    assert!(e.starts_with("bundle is truncated or corrupt: "), "{e}");
}
