//! ed25519 keys: generation, the key files, and the set of trusted keys.
//!
//! `KEY` holds the 32-byte secret seed in base64 on one line (mode 0600);
//! `KEY.pub` holds the 32-byte public key in base64 on one line, the same
//! text `update.public_keys` in robot.yaml accepts.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

/// Why a key could not be made, read or used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot write key {}: {err}", path.display())]
    Write { path: PathBuf, err: std::io::Error },
    #[error("cannot read key {}: {err}", path.display())]
    Read { path: PathBuf, err: std::io::Error },
    #[error("{what} is not an ed25519 {kind} key (expected 44 characters of base64 from `deploy keygen`)")]
    Malformed { what: String, kind: &'static str },
    #[error("secret key {} is readable by group or others (mode {mode:o}; expected 0600)", path.display())]
    TooOpen { path: PathBuf, mode: u32 },
    #[error("no random bytes from the kernel: {0}")]
    Random(String),
    #[error("no trusted public key: none in {} and none in update.public_keys, so no bundle can be accepted", dir.display())]
    NoTrustedKey { dir: PathBuf },
    #[error(
        "signature does not verify against any of the {count} trusted public key(s) ({sources})"
    )]
    BadSignature { count: usize, sources: String },
}

/// A secret signing key.
pub struct SecretKey(SigningKey);

impl SecretKey {
    /// Signs `msg` (the exact manifest bytes).
    pub fn sign(&self, msg: &[u8]) -> [u8; 64] {
        self.0.sign(msg).to_bytes()
    }

    /// The public half, in base64.
    pub fn public_base64(&self) -> String {
        STANDARD.encode(self.0.verifying_key().to_bytes())
    }

    /// A key from a fixed 32-byte seed (tests and benchmarks only need this
    /// to be reproducible; `keygen` uses the kernel's random bytes).
    pub fn from_seed(seed: [u8; 32]) -> SecretKey {
        SecretKey(SigningKey::from_bytes(&seed))
    }
}

/// Generates a key pair: `out` (secret, mode 0600, never overwritten) and
/// `out.pub`. Returns the public key in base64.
pub fn keygen(out: &Path) -> Result<String, KeyError> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| KeyError::Random(e.to_string()))?;
    let key = SecretKey::from_seed(seed);
    let pub_path = pub_path(out);
    write_new(out, 0o600, &format!("{}\n", STANDARD.encode(seed)))?;
    let public = key.public_base64();
    if let Err(e) = write_new(&pub_path, 0o644, &format!("{public}\n")) {
        let _ = std::fs::remove_file(out);
        return Err(e);
    }
    Ok(public)
}

/// `KEY.pub` beside `KEY`.
pub fn pub_path(key: &Path) -> PathBuf {
    let mut s = key.as_os_str().to_owned();
    s.push(".pub");
    PathBuf::from(s)
}

fn write_new(path: &Path, mode: u32, text: &str) -> Result<(), KeyError> {
    let err = |err| KeyError::Write {
        path: path.to_path_buf(),
        err,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)
}

/// Reads a secret key file; refuses one that group or others can read.
pub fn load_secret_key(path: &Path) -> Result<SecretKey, KeyError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |err| KeyError::Read {
        path: path.to_path_buf(),
        err,
    };
    let mode = std::fs::metadata(path).map_err(err)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyError::TooOpen {
            path: path.to_path_buf(),
            mode,
        });
    }
    let text = read_key_file(path).map_err(err)?;
    let seed = decode32(text.trim()).ok_or_else(|| KeyError::Malformed {
        what: path.display().to_string(),
        kind: "secret",
    })?;
    Ok(SecretKey::from_seed(seed))
}

/// The most of a key file read: one base64 key and a newline is 45 bytes.
pub const MAX_KEY_FILE: u64 = 4096;

/// A key file's text (through a link: keys are often placed by links), at
/// most [`MAX_KEY_FILE`]; a FIFO or a device is refused.
fn read_key_file(path: &Path) -> std::io::Result<String> {
    units::bounded::Bound::regular(MAX_KEY_FILE)
        .following_links()
        .read_text(path)
        .map_err(|e| e.into_io())
}

fn decode32(s: &str) -> Option<[u8; 32]> {
    let v = STANDARD.decode(s).ok()?;
    v.try_into().ok()
}

/// Parses a base64 public key (as in `KEY.pub` or `update.public_keys`).
pub fn parse_public_key(s: &str) -> Result<VerifyingKey, KeyError> {
    let malformed = || KeyError::Malformed {
        what: format!("`{s}`"),
        kind: "public",
    };
    let bytes = decode32(s.trim()).ok_or_else(malformed)?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| malformed())
}

/// A public key in base64.
pub fn public_key_base64(k: &VerifyingKey) -> String {
    STANDARD.encode(k.to_bytes())
}

/// The public keys a robot accepts bundles from, each with where it came
/// from (for error messages).
#[derive(Debug, Clone)]
pub struct TrustedKeys {
    pub keys: Vec<(String, VerifyingKey)>,
    dir: PathBuf,
}

impl TrustedKeys {
    /// Checks `sig` over `msg` against every trusted key; returns where the
    /// matching key came from.
    pub fn verify(&self, msg: &[u8], sig: &[u8]) -> Result<&str, KeyError> {
        if self.keys.is_empty() {
            return Err(KeyError::NoTrustedKey {
                dir: self.dir.clone(),
            });
        }
        let bad = || KeyError::BadSignature {
            count: self.keys.len(),
            sources: self
                .keys
                .iter()
                .map(|(s, _)| s.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        };
        let sig: [u8; 64] = sig.try_into().map_err(|_| bad())?;
        let sig = Signature::from_bytes(&sig);
        self.keys
            .iter()
            .find(|(_, k)| k.verify_strict(msg, &sig).is_ok())
            .map(|(s, _)| s.as_str())
            .ok_or_else(bad)
    }
}

/// Loads `<keys_dir>/*.pub` (a missing directory holds no keys) and the
/// base64 keys from `update.public_keys`. A malformed key file is an error,
/// never skipped.
pub fn load_trusted_keys(keys_dir: &Path, extra: &[String]) -> Result<TrustedKeys, KeyError> {
    let mut keys = Vec::new();
    match std::fs::read_dir(keys_dir) {
        Ok(rd) => {
            let mut paths: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "pub"))
                .collect();
            paths.sort();
            for p in paths {
                let text = read_key_file(&p).map_err(|err| KeyError::Read {
                    path: p.clone(),
                    err,
                })?;
                let k = parse_public_key(text.trim()).map_err(|_| KeyError::Malformed {
                    what: p.display().to_string(),
                    kind: "public",
                })?;
                keys.push((p.display().to_string(), k));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => {
            return Err(KeyError::Read {
                path: keys_dir.to_path_buf(),
                err,
            })
        }
    }
    for (i, s) in extra.iter().enumerate() {
        keys.push((format!("update.public_keys[{i}]"), parse_public_key(s)?));
    }
    Ok(TrustedKeys {
        keys,
        dir: keys_dir.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keygen_writes_private_secret_and_matching_public() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let k = d.path().join("k");
        let public = keygen(&k).unwrap();
        assert_eq!(
            std::fs::metadata(&k).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::read_to_string(pub_path(&k)).unwrap().trim(),
            public
        );
        assert_eq!(public.len(), 44);
        let sk = load_secret_key(&k).unwrap();
        assert_eq!(sk.public_base64(), public);
        // never overwrites
        assert!(matches!(keygen(&k), Err(KeyError::Write { .. })));
    }

    #[test]
    fn verify_accepts_trusted_and_refuses_others() {
        let d = tempfile::tempdir().unwrap();
        let a = SecretKey::from_seed([1; 32]);
        let b = SecretKey::from_seed([2; 32]);
        std::fs::write(d.path().join("a.pub"), a.public_base64()).unwrap();
        let trusted = load_trusted_keys(d.path(), &[]).unwrap();
        let sig = a.sign(b"m");
        assert!(trusted.verify(b"m", &sig).unwrap().ends_with("a.pub"));
        assert!(matches!(
            trusted.verify(b"n", &sig),
            Err(KeyError::BadSignature { .. })
        ));
        assert!(matches!(
            trusted.verify(b"m", &b.sign(b"m")),
            Err(KeyError::BadSignature { .. })
        ));
        assert!(matches!(
            trusted.verify(b"m", &sig[..63]),
            Err(KeyError::BadSignature { .. })
        ));
        let extra = load_trusted_keys(&d.path().join("none"), &[b.public_base64()]).unwrap();
        assert_eq!(
            extra.verify(b"m", &b.sign(b"m")).unwrap(),
            "update.public_keys[0]"
        );
        let none = load_trusted_keys(&d.path().join("none"), &[]).unwrap();
        assert!(matches!(
            none.verify(b"m", &sig),
            Err(KeyError::NoTrustedKey { .. })
        ));
    }

    #[test]
    fn malformed_key_file_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("x.pub"), "not a key").unwrap();
        let e = load_trusted_keys(d.path(), &[]).unwrap_err();
        assert!(e.to_string().contains("x.pub"), "{e}");
    }
}
