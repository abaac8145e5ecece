//! Reads a bundle: the signature first, then only the blobs the manifest
//! lists, each checked while it streams.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::PathBuf;

use super::hash::{Sha256Hex, Sha256Writer};
use super::keys::{KeyError, TrustedKeys};
use super::manifest::{
    release_name, Compat, Manifest, ManifestError, MANIFEST_NAME, SIGNATURE_NAME,
};

/// The largest manifest accepted (a release of many thousand files).
const MAX_MANIFEST: u64 = 16 << 20;

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

/// Why a bundle was refused.
#[derive(Debug, thiserror::Error)]
pub enum BundleReadError {
    #[error("cannot read bundle {}: {source}", path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error("bundle is truncated or corrupt: {0}")]
    Corrupt(io::Error),
    #[error("bundle is unsigned: expected `{SIGNATURE_NAME}` right after `{MANIFEST_NAME}`, found {found}")]
    Unsigned { found: String },
    #[error("bundle does not start with `{MANIFEST_NAME}` (found {found})")]
    NoManifest { found: String },
    #[error("bundle refused: {0}")]
    Signature(KeyError),
    #[error("bundle refused: {0}")]
    Manifest(ManifestError),
    #[error("bundle entry `{name}` {why}")]
    BadEntry { name: String, why: String },
    #[error("blob {sha} is not what the manifest says: {why}")]
    BlobMismatch { sha: String, why: String },
    #[error("bundle is truncated: blob {sha} (for `{path}`) is missing")]
    MissingBlob { sha: String, path: String },
    #[error("cannot stage blob {sha}: {source}")]
    Stage { sha: String, source: io::Error },
}

/// The streaming reader. Use [`BundleReader::read`].
pub struct BundleReader;

impl BundleReader {
    /// Reads a whole bundle from `src`: the manifest and its signature
    /// (verified against `trusted` and checked against `compat` before any
    /// other entry is read), then each blob. `sink(sha, data)` gets every
    /// listed blob exactly once and may copy it (it does not need to read
    /// it all); the reader hashes the whole blob itself and fails the read
    /// on a mismatch, so a sink must treat what it wrote as unverified until
    /// `read` returns `Ok`.
    pub fn read<R: Read>(
        src: R,
        trusted: &TrustedKeys,
        compat: &Compat,
        mut on_manifest: impl FnMut(&VerifiedManifest) -> Result<(), BundleReadError>,
        mut sink: impl FnMut(&Sha256Hex, &mut dyn Read) -> io::Result<()>,
    ) -> Result<VerifiedManifest, BundleReadError> {
        let dec = zstd::Decoder::new(src).map_err(BundleReadError::Corrupt)?;
        let mut ar = tar::Archive::new(dec);
        let mut entries = ar.entries().map_err(BundleReadError::Corrupt)?;

        let mut next = |want: &str| -> Result<Option<(String, Vec<u8>)>, BundleReadError> {
            let Some(e) = entries.next() else {
                return Ok(None);
            };
            let mut e = e.map_err(BundleReadError::Corrupt)?;
            let name = check_entry(&e)?;
            if name != want {
                return Ok(Some((name, Vec::new())));
            }
            let size = e.header().size().map_err(BundleReadError::Corrupt)?;
            if size > MAX_MANIFEST {
                return Err(BundleReadError::BadEntry {
                    name,
                    why: format!("is {size} bytes (at most {MAX_MANIFEST})"),
                });
            }
            let mut v = Vec::with_capacity(size as usize);
            e.read_to_end(&mut v).map_err(BundleReadError::Corrupt)?;
            Ok(Some((name, v)))
        };
        let bytes = match next(MANIFEST_NAME)? {
            Some((n, v)) if n == MANIFEST_NAME => v,
            Some((n, _)) => {
                return Err(BundleReadError::NoManifest {
                    found: format!("`{n}`"),
                })
            }
            None => {
                return Err(BundleReadError::NoManifest {
                    found: "an empty archive".into(),
                })
            }
        };
        let sig = match next(SIGNATURE_NAME)? {
            Some((n, v)) if n == SIGNATURE_NAME => v,
            Some((n, _)) => {
                return Err(BundleReadError::Unsigned {
                    found: format!("`{n}`"),
                })
            }
            None => {
                return Err(BundleReadError::Unsigned {
                    found: "the end of the archive".into(),
                })
            }
        };
        let verified = VerifiedManifest::verify(bytes, &sig, trusted, compat)?;
        on_manifest(&verified)?;

        let mut want: BTreeMap<Sha256Hex, (u64, String)> = BTreeMap::new();
        for f in &verified.manifest.files {
            want.entry(Sha256Hex::parse(&f.sha256).expect("validated"))
                .or_insert((f.size, f.path.clone()));
        }
        for e in entries {
            let mut e = e.map_err(BundleReadError::Corrupt)?;
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
            let hsize = e.header().size().map_err(BundleReadError::Corrupt)?;
            if hsize != size {
                return Err(BundleReadError::BlobMismatch {
                    sha: sha.to_string(),
                    why: format!("{hsize} bytes, manifest says {size}"),
                });
            }
            let mut hashing = HashingReader {
                inner: &mut e,
                hash: Sha256Writer::new(io::sink()),
            };
            sink(&sha, &mut hashing).map_err(|source| match source.kind() {
                io::ErrorKind::UnexpectedEof | io::ErrorKind::InvalidData => {
                    BundleReadError::Corrupt(source)
                }
                _ => BundleReadError::Stage {
                    sha: sha.to_string(),
                    source,
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
        let dec = zstd::Decoder::new(src).map_err(BundleReadError::Corrupt)?;
        let mut ar = tar::Archive::new(dec);
        let mut entries = ar.entries().map_err(BundleReadError::Corrupt)?;
        let mut out = Vec::new();
        for want in [MANIFEST_NAME, SIGNATURE_NAME] {
            let mut e = match entries.next() {
                Some(e) => e.map_err(BundleReadError::Corrupt)?,
                None => {
                    return Err(BundleReadError::NoManifest {
                        found: "an empty archive".into(),
                    })
                }
            };
            let name = check_entry(&e)?;
            if name != want {
                return Err(if want == MANIFEST_NAME {
                    BundleReadError::NoManifest {
                        found: format!("`{name}`"),
                    }
                } else {
                    BundleReadError::Unsigned {
                        found: format!("`{name}`"),
                    }
                });
            }
            let mut v = Vec::new();
            (&mut e)
                .take(MAX_MANIFEST)
                .read_to_end(&mut v)
                .map_err(BundleReadError::Corrupt)?;
            out.push(v);
        }
        let sig = out.pop().expect("two entries");
        Ok((out.pop().expect("two entries"), sig))
    }

    /// Streams the blobs of a bundle in order, without any check (the
    /// sending side; the robot checks every byte).
    pub fn for_each_blob<R: Read>(
        src: R,
        mut f: impl FnMut(&Sha256Hex, &mut dyn Read) -> io::Result<()>,
    ) -> Result<(), BundleReadError> {
        let dec = zstd::Decoder::new(src).map_err(BundleReadError::Corrupt)?;
        let mut ar = tar::Archive::new(dec);
        for e in ar.entries().map_err(BundleReadError::Corrupt)? {
            let mut e = e.map_err(BundleReadError::Corrupt)?;
            let name = check_entry(&e)?;
            if let Some(sha) = name.strip_prefix("blobs/").and_then(Sha256Hex::parse) {
                f(&sha, &mut e).map_err(|source| BundleReadError::Stage {
                    sha: sha.to_string(),
                    source,
                })?;
            }
        }
        Ok(())
    }
}

struct HashingReader<'a, R: Read> {
    inner: &'a mut R,
    hash: Sha256Writer<io::Sink>,
}

impl<R: Read> Read for HashingReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.absorb(&buf[..n]);
        Ok(n)
    }
}

/// The entry's name if it is a regular file with a plain relative name;
/// otherwise an error saying what is wrong with it.
fn check_entry<R: Read>(e: &tar::Entry<R>) -> Result<String, BundleReadError> {
    let raw = e.path_bytes();
    let name = String::from_utf8_lossy(&raw).into_owned();
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
    let t = e.header().entry_type();
    let link = || {
        e.link_name_bytes()
            .map(|l| String::from_utf8_lossy(&l).into_owned())
            .unwrap_or_default()
    };
    match t {
        tar::EntryType::Regular | tar::EntryType::Continuous => {}
        tar::EntryType::Symlink => {
            return Err(bad(format!(
                "is a symbolic link to `{}`; bundles hold regular files only",
                link()
            )))
        }
        tar::EntryType::Link => {
            return Err(bad(format!(
                "is a hard link to `{}`; bundles hold regular files only",
                link()
            )))
        }
        tar::EntryType::Char | tar::EntryType::Block => {
            return Err(bad(
                "is a device node; bundles hold regular files only".into()
            ))
        }
        tar::EntryType::Fifo => {
            return Err(bad("is a fifo; bundles hold regular files only".into()))
        }
        tar::EntryType::Directory => {
            return Err(bad("is a directory; bundles hold regular files only".into()))
        }
        other => {
            return Err(bad(format!(
                "has tar type {:?}; bundles hold regular files only",
                other
            )))
        }
    }
    if name != MANIFEST_NAME && name != SIGNATURE_NAME && !name.starts_with("blobs/") {
        return Err(bad("is not a file the manifest lists".into()));
    }
    Ok(name)
}
