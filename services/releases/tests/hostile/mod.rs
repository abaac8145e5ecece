//! Hostile bundles built by hand: tar headers of any kind and size, inside
//! zstd frames made of raw and RLE blocks, so an entry that announces (and
//! holds) a gigabyte costs a few kilobytes to build and no compression
//! time. Also the child-process harness that measures what reading one
//! costs ([`child::bounded`]).
#![allow(dead_code)]

pub mod child;

use releases::bundle::{sha256_hex, FileEntry, Manifest, SecretKey};

/// The key hostile bundles are signed with when they need to be (a
/// replayed or leaked manifest: the blob phase comes after the signature).
pub const SEED: [u8; 32] = [0x5e; 32];
pub const ROBOT: &str = "arm";
pub const BOARD: &str = "generic";
pub const GIB: u64 = 1 << 30;

/// A part of the decompressed stream.
#[derive(Debug, Clone)]
pub enum Piece {
    Raw(Vec<u8>),
    /// `n` copies of a byte.
    Run(u8, u64),
}

/// A zstd frame holding `pieces` (no checksum, a 128 KiB window).
pub fn zstd_frame(pieces: &[Piece]) -> Vec<u8> {
    zstd_frame_with_window(pieces, 7)
}

/// A zstd frame whose window descriptor asks for 2^(10 + `exp`) bytes.
pub fn zstd_frame_with_window(pieces: &[Piece], exp: u8) -> Vec<u8> {
    const MAX_BLOCK: u64 = 128 << 10;
    let mut out = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, exp << 3];
    let mut blocks: Vec<(u8, u32, Vec<u8>)> = Vec::new();
    for p in pieces {
        match p {
            Piece::Raw(b) => {
                for c in b.chunks(MAX_BLOCK as usize) {
                    blocks.push((0, c.len() as u32, c.to_vec()));
                }
            }
            Piece::Run(byte, n) => {
                let mut left = *n;
                while left > 0 {
                    let k = left.min(MAX_BLOCK);
                    blocks.push((1, k as u32, vec![*byte]));
                    left -= k;
                }
            }
        }
    }
    if blocks.is_empty() {
        blocks.push((0, 0, Vec::new()));
    }
    let last = blocks.len() - 1;
    for (i, (kind, size, body)) in blocks.into_iter().enumerate() {
        let h = (size << 3) | (u32::from(kind) << 1) | u32::from(i == last);
        out.extend_from_slice(&h.to_le_bytes()[..3]);
        out.extend_from_slice(&body);
    }
    out
}

/// A ustar header: `name` (cut to the 100-byte field), type `kind`,
/// `size` in octal, a good checksum.
pub fn tar_header(name: &[u8], kind: u8, size: u64) -> Vec<u8> {
    let mut h = vec![0u8; 512];
    let n = name.len().min(100);
    h[..n].copy_from_slice(&name[..n]);
    h[100..107].copy_from_slice(b"0000644");
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
    h[136..147].copy_from_slice(b"00000000000");
    h[156] = kind;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    h
}

/// The records of a pax extended header.
pub fn pax(records: &[(&str, &str)]) -> Vec<u8> {
    let mut v = Vec::new();
    for (k, val) in records {
        let body = format!(" {k}={val}\n");
        let mut len = body.len() + 1;
        while body.len() + len.to_string().len() != len {
            len = body.len() + len.to_string().len();
        }
        v.extend_from_slice(format!("{len}{body}").as_bytes());
    }
    v
}

fn pad(size: u64) -> Piece {
    Piece::Raw(vec![0u8; ((512 - size % 512) % 512) as usize])
}

/// A tar stream being built.
#[derive(Default)]
pub struct Tar {
    pub pieces: Vec<Piece>,
}

impl Tar {
    pub fn new() -> Tar {
        Tar::default()
    }

    /// An entry holding `data`.
    pub fn entry(mut self, name: &[u8], kind: u8, data: &[u8]) -> Tar {
        self.pieces
            .push(Piece::Raw(tar_header(name, kind, data.len() as u64)));
        self.pieces.push(Piece::Raw(data.to_vec()));
        self.pieces.push(pad(data.len() as u64));
        self
    }

    /// A regular file.
    pub fn file(self, name: &str, data: &[u8]) -> Tar {
        self.entry(name.as_bytes(), b'0', data)
    }

    /// An entry whose header says `size` and that holds `size` bytes of
    /// `fill`.
    pub fn huge(mut self, name: &[u8], kind: u8, size: u64, fill: u8) -> Tar {
        self.pieces.push(Piece::Raw(tar_header(name, kind, size)));
        self.pieces.push(Piece::Run(fill, size));
        self.pieces.push(pad(size));
        self
    }

    /// A header alone: `size` bytes of data follow it, or not.
    pub fn header(mut self, name: &[u8], kind: u8, size: u64) -> Tar {
        self.pieces.push(Piece::Raw(tar_header(name, kind, size)));
        self
    }

    /// `n` bytes of `fill` and the padding after them.
    pub fn run(mut self, fill: u8, n: u64) -> Tar {
        self.pieces.push(Piece::Run(fill, n));
        self.pieces.push(pad(n));
        self
    }

    pub fn end(mut self) -> Tar {
        self.pieces.push(Piece::Raw(vec![0u8; 1024]));
        self
    }

    /// The tar inside a zstd frame: a bundle's bytes.
    pub fn zst(&self) -> Vec<u8> {
        zstd_frame(&self.pieces)
    }
}

/// A signed manifest for `files` (path, contents): its bytes and
/// signature, as a publisher would have made them.
pub fn signed_manifest(files: &[(&str, &[u8])]) -> (Manifest, Vec<u8>, [u8; 64]) {
    let m = Manifest {
        format: 1,
        robot: ROBOT.into(),
        board: BOARD.into(),
        version: "1.0".into(),
        robot_yaml: format!("robot: {{name: {ROBOT}}}\n"),
        files: files
            .iter()
            .map(|(p, d)| FileEntry {
                path: (*p).into(),
                mode: 0o644,
                size: d.len() as u64,
                sha256: sha256_hex(d).to_string(),
            })
            .collect(),
    };
    let bytes = m.to_bytes();
    let sig = SecretKey::from_seed(SEED).sign(&bytes);
    (m, bytes, sig)
}

/// A tar that starts with a signed manifest for `files`.
pub fn signed_tar(files: &[(&str, &[u8])]) -> Tar {
    let (_, bytes, sig) = signed_manifest(files);
    Tar::new()
        .file("manifest.json", &bytes)
        .file("manifest.sig", &sig)
}

/// The keys and robot that accept what [`signed_manifest`] signs.
pub fn trust() -> (releases::bundle::TrustedKeys, releases::bundle::Compat) {
    let public = SecretKey::from_seed(SEED).public_base64();
    let keys = releases::bundle::load_trusted_keys(std::path::Path::new("/nonexistent"), &[public])
        .unwrap();
    let compat = releases::bundle::Compat {
        robot: ROBOT.into(),
        board: BOARD.into(),
    };
    (keys, compat)
}
