//! sha256 in lower-case hex, the name of every blob.

use std::fmt;
use std::io::{self, Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

/// A sha256 as 64 lower-case hex digits.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sha256Hex(String);

impl Sha256Hex {
    /// Parses 64 lower-case hex digits; anything else is `None`.
    pub fn parse(s: &str) -> Option<Sha256Hex> {
        let ok = s.len() == 64
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        ok.then(|| Sha256Hex(s.to_string()))
    }

    fn from_digest(d: &[u8]) -> Sha256Hex {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(64);
        for b in d {
            s.push(HEX[(b >> 4) as usize] as char);
            s.push(HEX[(b & 15) as usize] as char);
        }
        Sha256Hex(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first eight digits, used in release directory names.
    pub fn short(&self) -> &str {
        &self.0[..8]
    }
}

impl fmt::Display for Sha256Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// sha256 of a byte string.
pub fn sha256_hex(bytes: &[u8]) -> Sha256Hex {
    Sha256Hex::from_digest(&Sha256::digest(bytes))
}

/// sha256 and size of a file's contents.
pub fn sha256_file(path: &Path) -> io::Result<(Sha256Hex, u64)> {
    let mut f = units::bounded::Bound::regular(u64::MAX)
        .following_links()
        .open(path)
        .map_err(|e| e.into_io())?;
    let mut w = Sha256Writer::new(io::sink());
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        w.write_all(&buf[..n])?;
    }
    Ok(w.finish())
}

/// A writer that hashes and counts what passes through it.
pub struct Sha256Writer<W> {
    inner: W,
    hasher: Sha256,
    len: u64,
}

impl<W: Write> Sha256Writer<W> {
    pub fn new(inner: W) -> Self {
        Sha256Writer {
            inner,
            hasher: Sha256::new(),
            len: 0,
        }
    }

    /// Seeds the hash with bytes already written earlier (a resumed blob).
    pub fn absorb(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.len += bytes.len() as u64;
    }

    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// The hash and byte count so far.
    pub fn finish(self) -> (Sha256Hex, u64) {
        (Sha256Hex::from_digest(&self.hasher.finalize()), self.len)
    }

    /// The hash, byte count and the inner writer.
    pub fn into_parts(self) -> (Sha256Hex, u64, W) {
        (
            Sha256Hex::from_digest(&self.hasher.finalize()),
            self.len,
            self.inner,
        )
    }
}

impl<W: Write> Write for Sha256Writer<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        assert_eq!(
            sha256_hex(b"abc").as_str(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn parse_refuses_upper_case_and_short() {
        assert!(Sha256Hex::parse(&"A".repeat(64)).is_none());
        assert!(Sha256Hex::parse(&"a".repeat(63)).is_none());
        assert!(Sha256Hex::parse("../../etc/passwd").is_none());
        assert!(Sha256Hex::parse(&"a".repeat(64)).is_some());
    }
}
