//! Reads a bundle: the signature first, then only the blobs the manifest
//! lists, each checked while it streams.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::PathBuf;

use super::archive::{Archive, ArchiveError, Entry};
use super::hash::{Sha256Hex, Sha256Writer};
use super::keys::{KeyError, TrustedKeys};
use super::manifest::{Compat, Manifest, ManifestError, MANIFEST_NAME, SIGNATURE_NAME};
use super::quote::{quoted, quoted_bytes};
use crate::name::release_name;

/// The largest manifest accepted: a release of many thousand files is a
/// few megabytes of JSON.
pub const MAX_MANIFEST: u64 = 16 << 20;
/// The largest signature entry accepted (an ed25519 signature is 64 bytes).
pub const MAX_SIGNATURE: u64 = 64;
/// The largest zstd window accepted, as a power of two (16 MiB). Bundles
/// and the wire are written at level 9 (a 4 MiB window at most); zstd's
/// own default limit is 128 MiB, which the decoder would allocate for any
/// frame that asks.
pub const WINDOW_LOG_MAX: u32 = 24;

/// A manifest whose signature verified against a trusted key and whose
/// robot and board match.
#[derive(Debug, Clone)]
pub struct VerifiedManifest {
    pub manifest: Manifest,
    /// The exact signed bytes.
    pub bytes: Vec<u8>,
    pub signature: [u8; 64],
    /// Where the key that verified it came from.
    pub signer: String,
    /// `<version>-<sha8>`.
    pub release: String,
}

impl VerifiedManifest {
    /// Verifies `sig` over `bytes` against `trusted` (before parsing
    /// anything), then parses, validates and checks compatibility.
    pub fn verify(
        bytes: Vec<u8>,
        sig: &[u8],
        trusted: &TrustedKeys,
        compat: &Compat,
    ) -> Result<VerifiedManifest, BundleReadError> {
        let signer = trusted
            .verify(&bytes, sig)
            .map_err(BundleReadError::Signature)?
            .to_string();
        let manifest = Manifest::parse(&bytes).map_err(BundleReadError::Manifest)?;
        manifest
            .check_compat(compat)
            .map_err(BundleReadError::Manifest)?;
        let signature: [u8; 64] = sig.try_into().expect("verified signatures are 64 bytes");
        let release = release_name(&manifest.version, &bytes);
        Ok(VerifiedManifest {
            manifest,
            bytes,
            signature,
            signer,
            release,
        })
    }
}

/// Why a bundle was refused. Names from the bundle are shown cut and
/// escaped ([`quoted`]).
#[derive(Debug, thiserror::Error)]
pub enum BundleReadError {
    #[error("cannot read bundle {}: {err}", path.display())]
    Open { path: PathBuf, err: io::Error },
    #[error("bundle is truncated or corrupt: {0}")]
    Corrupt(io::Error),
    #[error("bundle is not a valid tar stream at byte {offset}: {why}")]
    Archive { offset: u64, why: String },
    #[error("bundle is unsigned: expected `{SIGNATURE_NAME}` right after `{MANIFEST_NAME}`, found {found}")]
    Unsigned { found: String },
    #[error("bundle does not start with `{MANIFEST_NAME}` (found {found})")]
    NoManifest { found: String },
    #[error("bundle refused: {0}")]
    Signature(KeyError),
    #[error("bundle refused: {0}")]
    Manifest(ManifestError),
    #[error("bundle entry {} {why}", quoted(name))]
    BadEntry { name: String, why: String },
    #[error("blob {sha} is not what the manifest says: {why}")]
    BlobMismatch { sha: String, why: String },
    #[error("bundle is truncated: blob {sha} (for {}) is missing", quoted(path))]
    MissingBlob { sha: String, path: String },
    #[error("cannot stage blob {sha}: {err}")]
    Stage { sha: String, err: io::Error },
}

impl From<ArchiveError> for BundleReadError {
    fn from(e: ArchiveError) -> Self {
        match e {
            ArchiveError::Io(e) => BundleReadError::Corrupt(e),
            ArchiveError::Format { offset, why } => BundleReadError::Archive { offset, why },
        }
    }
}

/// The zstd decoder for bundles. A frame asking for a window over
/// 2^[`WINDOW_LOG_MAX`] bytes is refused instead of allocated.
pub(crate) fn decoder<'a, R: Read + 'a>(src: R) -> io::Result<impl Read + 'a> {
    let mut dec = zstd::Decoder::new(src)?;
    dec.window_log_max(WINDOW_LOG_MAX)?;
    Ok(dec)
}

/// The streaming reader. Use [`BundleReader::read`].
pub struct BundleReader;

impl BundleReader {
    /// Reads a whole bundle from `src`: the manifest and its signature
    /// (verified against `trusted` and checked against `compat` before any
    /// other entry is read), then each blob. `sink(sha, data)` gets every
    /// listed blob exactly once and may copy it (it does not need to read
    /// it all, and cannot read more than the manifest's size); the reader
    /// hashes the whole blob itself and fails the read on a mismatch, so a
    /// sink must treat what it wrote as unverified until `read` returns
    /// `Ok`.
    pub fn read<R: Read>(
        src: R,
        trusted: &TrustedKeys,
        compat: &Compat,
        mut on_manifest: impl FnMut(&VerifiedManifest) -> Result<(), BundleReadError>,
        mut sink: impl FnMut(&Sha256Hex, &mut dyn Read) -> io::Result<()>,
    ) -> Result<VerifiedManifest, BundleReadError> {
        let mut ar = Archive::new(decoder(src).map_err(BundleReadError::Corrupt)?);
        let (bytes, sig) = read_signed(&mut ar)?;
        let verified = VerifiedManifest::verify(bytes, &sig, trusted, compat)?;
        on_manifest(&verified)?;

        let mut want: BTreeMap<Sha256Hex, (u64, String)> = BTreeMap::new();
        for f in &verified.manifest.files {
            want.entry(Sha256Hex::parse(&f.sha256).expect("validated"))
                .or_insert((f.size, f.path.clone()));
        }
        while let Some(e) = ar.next()? {
            let name = check_entry(&e)?;
            let sha = name
                .strip_prefix("blobs/")
                .and_then(Sha256Hex::parse)
                .ok_or_else(|| BundleReadError::BadEntry {
                    name: name.clone(),
                    why: "is not a file the manifest lists".into(),
                })?;
            let Some((size, _)) = want.remove(&sha) else {
                return Err(BundleReadError::BadEntry {
                    name,
                    why: "is not a file the manifest lists (or appears twice)".into(),
                });
            };
            // The entry's size (a pax `size` included) must be the signed
            // one before a byte of it is read.
            if e.size != size {
                return Err(BundleReadError::BlobMismatch {
                    sha: sha.to_string(),
                    why: format!("the entry holds {} bytes, the manifest says {size}", e.size),
                });
            }
            let mut hashing = HashingReader {
                inner: ar.data(),
                hash: Sha256Writer::new(io::sink()),
            };
            sink(&sha, &mut hashing).map_err(|err| match err.kind() {
                io::ErrorKind::UnexpectedEof | io::ErrorKind::InvalidData => {
                    BundleReadError::Corrupt(err)
                }
                _ => BundleReadError::Stage {
                    sha: sha.to_string(),
                    err,
                },
            })?;
            io::copy(&mut hashing, &mut io::sink()).map_err(BundleReadError::Corrupt)?;
            let (got, len) = hashing.hash.finish();
            if got != sha || len != size {
                return Err(BundleReadError::BlobMismatch {
                    sha: sha.to_string(),
                    why: format!("content hashes to {got} ({len} bytes)"),
                });
            }
        }
        if let Some((sha, (_, path))) = want.into_iter().next() {
            return Err(BundleReadError::MissingBlob {
                sha: sha.to_string(),
                path,
            });
        }
        Ok(verified)
    }

    /// Reads only the manifest and signature, unverified (the sending side
    /// of an update: the robot verifies).
    pub fn read_manifest<R: Read>(src: R) -> Result<(Vec<u8>, Vec<u8>), BundleReadError> {
        let mut ar = Archive::new(decoder(src).map_err(BundleReadError::Corrupt)?);
        read_signed(&mut ar)
    }

    /// Streams the blobs of a bundle in order, without any check (the
    /// sending side; the robot checks every byte).
    pub fn for_each_blob<R: Read>(
        src: R,
        mut f: impl FnMut(&Sha256Hex, &mut dyn Read) -> io::Result<()>,
    ) -> Result<(), BundleReadError> {
        let mut ar = Archive::new(decoder(src).map_err(BundleReadError::Corrupt)?);
        while let Some(e) = ar.next()? {
            let name = check_entry(&e)?;
            if let Some(sha) = name.strip_prefix("blobs/").and_then(Sha256Hex::parse) {
                f(&sha, &mut ar.data()).map_err(|err| BundleReadError::Stage {
                    sha: sha.to_string(),
                    err,
                })?;
            }
        }
        Ok(())
    }
}

/// The first two entries, `manifest.json` (at most [`MAX_MANIFEST`] bytes)
/// and `manifest.sig` (at most [`MAX_SIGNATURE`]), each size checked
/// before its data is read.
fn read_signed<R: Read>(ar: &mut Archive<R>) -> Result<(Vec<u8>, Vec<u8>), BundleReadError> {
    let mut out = Vec::with_capacity(2);
    for (want, max) in [
        (MANIFEST_NAME, MAX_MANIFEST),
        (SIGNATURE_NAME, MAX_SIGNATURE),
    ] {
        let missing = |found: String| {
            if want == MANIFEST_NAME {
                BundleReadError::NoManifest { found }
            } else {
                BundleReadError::Unsigned { found }
            }
        };
        let Some(e) = ar.next()? else {
            return Err(missing(if want == MANIFEST_NAME {
                "an empty archive".into()
            } else {
                "the end of the archive".into()
            }));
        };
        let name = check_entry(&e)?;
        if name != want {
            return Err(missing(quoted(&name)));
        }
        if e.size > max {
            return Err(BundleReadError::BadEntry {
                name,
                why: format!("is {} bytes (at most {max})", e.size),
            });
        }
        let mut v = Vec::with_capacity(e.size as usize);
        ar.data()
            .read_to_end(&mut v)
            .map_err(BundleReadError::Corrupt)?;
        out.push(v);
    }
    let sig = out.pop().expect("two entries");
    Ok((out.pop().expect("two entries"), sig))
}

struct HashingReader<R: Read> {
    inner: R,
    hash: Sha256Writer<io::Sink>,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.absorb(&buf[..n]);
        Ok(n)
    }
}

/// The entry's name if it is a regular file with a plain relative name
/// that a bundle holds; otherwise an error saying what is wrong with it.
fn check_entry(e: &Entry) -> Result<String, BundleReadError> {
    let name = String::from_utf8_lossy(&e.name).into_owned();
    let bad = |why: String| BundleReadError::BadEntry {
        name: name.clone(),
        why,
    };
    if name.starts_with('/') {
        return Err(bad("is an absolute path".into()));
    }
    if name.split('/').any(|c| c == "..") {
        return Err(bad(
            "has a `..` component (it would leave the release)".into()
        ));
    }
    let only = "bundles hold regular files only";
    if !e.is_file() {
        let link = || quoted_bytes(&e.link);
        let what = match e.kind {
            b'2' => format!("is a symbolic link to {}", link()),
            b'1' => format!("is a hard link to {}", link()),
            b'3' | b'4' => "is a device node".into(),
            b'6' => "is a fifo".into(),
            b'5' => "is a directory".into(),
            b'g' => "is a pax global header".into(),
            b'S' => "is a GNU sparse file".into(),
            k if k.is_ascii_graphic() => format!("has tar type `{}`", k as char),
            k => format!("has tar type {k:#04x}"),
        };
        return Err(bad(format!("{what}; {only}")));
    }
    if name != MANIFEST_NAME && name != SIGNATURE_NAME && !name.starts_with("blobs/") {
        return Err(bad("is not a file the manifest lists".into()));
    }
    Ok(name)
}
