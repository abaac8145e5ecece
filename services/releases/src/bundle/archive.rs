//! A strict, streaming reader for the tar inside a bundle.
//!
//! A bundle is read before its signature is checked, so every length this
//! reader takes from the input is held to a limit before a byte of it is
//! allocated or read: a GNU long name or long link name at most
//! [`MAX_NAME`] bytes, a pax extended header at most [`MAX_PAX`] bytes, at
//! most one of each per entry. Entry data is never read here: the caller
//! gets the entry's size (a pax `size` record included) and decides with
//! it, then reads through [`Archive::data`], which stops at that size.
//!
//! Understood: v7, ustar and GNU headers (octal or base-256 sizes, the
//! ustar name prefix), `L`/`K` GNU long names and `x` pax headers (their
//! `path`, `linkpath` and `size` records). Any other type, a pax global
//! header or a sparse file included, comes back as an [`Entry`] of that
//! type for the caller to refuse by name, its data unread.

use std::io::{self, Read};

/// The longest GNU long name (or long link name) accepted: PATH_MAX.
pub const MAX_NAME: u64 = 4096;
/// The largest pax extended header accepted. Ours never write one; tar
/// tools write a few hundred bytes.
pub const MAX_PAX: u64 = 64 << 10;

const BLOCK: usize = 512;

/// One entry's header, its extensions applied.
#[derive(Debug)]
pub struct Entry {
    /// The name, as bytes (the pax `path`, else the GNU long name, else the
    /// ustar prefix and name).
    pub name: Vec<u8>,
    /// The link target of a link entry.
    pub link: Vec<u8>,
    /// The tar type flag (`b'0'` for a regular file).
    pub kind: u8,
    /// The size of the data (the pax `size` when there is one).
    pub size: u64,
}

impl Entry {
    /// A regular file (`0`, the old NUL, or the contiguous `7`).
    pub fn is_file(&self) -> bool {
        matches!(self.kind, b'0' | 0 | b'7')
    }
}

/// Why the tar stream is not one.
#[derive(Debug)]
pub enum ArchiveError {
    /// Reading (or decompressing) failed, or the stream ended inside a
    /// header or an entry.
    Io(io::Error),
    /// A header is malformed or over a limit; `offset` is where the header
    /// starts in the tar stream.
    Format { offset: u64, why: String },
}

/// Why a header's number field is not a number.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TarNumberError {
    #[error("a negative base-256 number")]
    NegativeBase256,
    #[error("a base-256 number over 2^64")]
    Base256Overflow,
    /// The field's text, shown cut and escaped.
    #[error("{0} is not an octal number")]
    NotOctal(String),
    #[error("an octal number over 2^64")]
    OctalOverflow,
}

/// Why a header block is not a tar header.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TarChecksumError {
    #[error("checksum field: {0}")]
    Field(TarNumberError),
    #[error(
        "header checksum is {want}, the header sums to {sum} (not a tar header, or a damaged one)"
    )]
    Mismatch { want: u64, sum: u64 },
}

/// Why a pax extended header's record is refused; `at` is the record's
/// byte offset in the header's data.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PaxRecordError {
    #[error("record at byte {at} has no length")]
    NoLength { at: usize },
    #[error("record at byte {at} has a length that does not end it at a newline")]
    BadLength { at: usize },
    #[error("record at byte {at} has no `=`")]
    NoEquals { at: usize },
    /// The value, shown cut and escaped.
    #[error("record at byte {at} has size {value}, not a number of bytes")]
    Size { at: usize, value: String },
}

impl From<io::Error> for ArchiveError {
    fn from(e: io::Error) -> Self {
        ArchiveError::Io(e)
    }
}

/// Reads entries one after another from a tar stream.
pub struct Archive<R> {
    inner: R,
    /// Bytes consumed from `inner`.
    offset: u64,
    /// Data bytes of the current entry not yet read.
    left: u64,
    /// Padding after the current entry's data.
    pad: u64,
    ended: bool,
}

/// The data of the current entry; reads end at its size.
pub struct EntryData<'a, R> {
    ar: &'a mut Archive<R>,
}

impl<R: Read> Read for EntryData<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let ar = &mut *self.ar;
        if ar.left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(ar.left).unwrap_or(usize::MAX));
        let n = ar.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the stream ends inside an entry, {} bytes short", ar.left),
            ));
        }
        ar.left -= n as u64;
        ar.offset += n as u64;
        Ok(n)
    }
}

impl<R: Read> Archive<R> {
    pub fn new(inner: R) -> Archive<R> {
        Archive {
            inner,
            offset: 0,
            left: 0,
            pad: 0,
            ended: false,
        }
    }

    /// The data of the entry [`next`](Archive::next) returned last.
    pub fn data(&mut self) -> EntryData<'_, R> {
        EntryData { ar: self }
    }

    /// The next entry, after skipping whatever is left of the current one;
    /// `None` at the end of the archive (a zero block, or the end of the
    /// stream between entries).
    pub fn next(&mut self) -> Result<Option<Entry>, ArchiveError> {
        if self.ended {
            return Ok(None);
        }
        // Apart: a size near 2^64 plus its padding would overflow.
        self.skip(self.left)?;
        self.skip(self.pad)?;
        self.left = 0;
        self.pad = 0;
        let mut long_name: Option<Vec<u8>> = None;
        let mut long_link: Option<Vec<u8>> = None;
        let mut pax: Option<Pax> = None;
        loop {
            let at = self.offset;
            let Some(h) = self.header()? else {
                if long_name.is_some() || long_link.is_some() || pax.is_some() {
                    return Err(ArchiveError::Format {
                        offset: at,
                        why: "the archive ends after an extension header, before its entry".into(),
                    });
                }
                self.ended = true;
                return Ok(None);
            };
            let kind = h[156];
            let size = parse_size(&h[124..136]).map_err(|why| ArchiveError::Format {
                offset: at,
                why: format!("size field: {why}"),
            })?;
            let ext = match kind {
                b'L' => Some((&mut long_name, "GNU long name", MAX_NAME)),
                b'K' => Some((&mut long_link, "GNU long link name", MAX_NAME)),
                _ => None,
            };
            if let Some((slot, what, max)) = ext {
                if slot.is_some() {
                    return Err(ArchiveError::Format {
                        offset: at,
                        why: format!("a second {what} for the same entry"),
                    });
                }
                let mut v = self.extension(at, size, what, max)?;
                if let Some(nul) = v.iter().position(|&b| b == 0) {
                    v.truncate(nul);
                }
                *slot = Some(v);
                continue;
            }
            if kind == b'x' {
                if pax.is_some() {
                    return Err(ArchiveError::Format {
                        offset: at,
                        why: "a second pax extended header for the same entry".into(),
                    });
                }
                let data = self.extension(at, size, "pax extended header", MAX_PAX)?;
                pax = Some(Pax::parse(&data).map_err(|why| ArchiveError::Format {
                    offset: at,
                    why: format!("pax extended header: {why}"),
                })?);
                continue;
            }
            let pax = pax.unwrap_or_default();
            let name = match (pax.path, long_name) {
                (Some(p), _) => p,
                (None, Some(l)) => l,
                (None, None) => header_name(&h),
            };
            let link = pax
                .linkpath
                .or(long_link)
                .unwrap_or_else(|| cstr(&h[157..257]).to_vec());
            let size = pax.size.unwrap_or(size);
            self.left = size;
            self.pad = padding(size);
            return Ok(Some(Entry {
                name,
                link,
                kind,
                size,
            }));
        }
    }

    /// Reads one header block: `None` at a zero block or a clean end.
    fn header(&mut self) -> Result<Option<[u8; BLOCK]>, ArchiveError> {
        let at = self.offset;
        let mut h = [0u8; BLOCK];
        let mut got = 0;
        while got < BLOCK {
            match self.inner.read(&mut h[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => {
                    return Err(ArchiveError::Io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("the stream ends inside the header at byte {at}"),
                    )))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.offset += BLOCK as u64;
        if h.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        check_sum(&h).map_err(|why| ArchiveError::Format {
            offset: at,
            why: why.to_string(),
        })?;
        Ok(Some(h))
    }

    /// Reads an extension's data (`size` bytes, at most `max`) and its
    /// padding.
    fn extension(
        &mut self,
        at: u64,
        size: u64,
        what: &str,
        max: u64,
    ) -> Result<Vec<u8>, ArchiveError> {
        if size > max {
            return Err(ArchiveError::Format {
                offset: at,
                why: format!("a {what} of {size} bytes (at most {max})"),
            });
        }
        let mut v = vec![0u8; size as usize];
        self.inner.read_exact(&mut v).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                io::Error::new(e.kind(), format!("the stream ends inside a {what}"))
            } else {
                e
            }
        })?;
        self.offset += size;
        self.skip(padding(size))?;
        Ok(v)
    }

    fn skip(&mut self, n: u64) -> Result<(), ArchiveError> {
        if n == 0 {
            return Ok(());
        }
        let got = io::copy(&mut (&mut self.inner).take(n), &mut io::sink())?;
        self.offset += got;
        if got < n {
            return Err(ArchiveError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the stream ends {} bytes short of the next header", n - got),
            )));
        }
        Ok(())
    }
}

fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

/// The bytes of a NUL-terminated field.
fn cstr(f: &[u8]) -> &[u8] {
    f.iter().position(|&b| b == 0).map_or(f, |n| &f[..n])
}

/// The name of a header: the ustar prefix (POSIX ustar only; GNU headers
/// keep other fields there) joined to the name field.
fn header_name(h: &[u8; BLOCK]) -> Vec<u8> {
    let name = cstr(&h[..100]);
    let prefix = cstr(&h[345..500]);
    if &h[257..263] == b"ustar\0" && !prefix.is_empty() {
        let mut v = prefix.to_vec();
        v.push(b'/');
        v.extend_from_slice(name);
        v
    } else {
        name.to_vec()
    }
}

/// Octal (spaces and NULs around it allowed) or GNU base-256.
fn parse_size(f: &[u8]) -> Result<u64, TarNumberError> {
    if f[0] & 0x80 != 0 {
        if f[0] != 0x80 {
            return Err(TarNumberError::NegativeBase256);
        }
        let mut v: u64 = 0;
        for &b in &f[1..] {
            v = v
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(b)))
                .ok_or(TarNumberError::Base256Overflow)?;
        }
        return Ok(v);
    }
    let s = f
        .iter()
        .position(|&b| b != b' ')
        .map_or(&f[f.len()..], |i| &f[i..]);
    let s = cstr(s);
    let s = &s[..s.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1)];
    let mut v: u64 = 0;
    for &b in s {
        if !(b'0'..=b'7').contains(&b) {
            return Err(TarNumberError::NotOctal(super::quote::quoted_bytes(s)));
        }
        v = v
            .checked_mul(8)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
            .ok_or(TarNumberError::OctalOverflow)?;
    }
    Ok(v)
}

/// The header checksum: the sum of its bytes with the checksum field read
/// as spaces (unsigned, or signed as some old tars wrote it).
fn check_sum(h: &[u8; BLOCK]) -> Result<(), TarChecksumError> {
    let want = parse_size(&h[148..156]).map_err(TarChecksumError::Field)?;
    let field = 148..156;
    let (mut unsigned, mut signed) = (0u64, 0i64);
    for (i, &b) in h.iter().enumerate() {
        let b = if field.contains(&i) { b' ' } else { b };
        unsigned += u64::from(b);
        signed += i64::from(b as i8);
    }
    if want == unsigned || i64::try_from(want) == Ok(signed) {
        Ok(())
    } else {
        Err(TarChecksumError::Mismatch {
            want,
            sum: unsigned,
        })
    }
}

/// The records of a pax extended header this reader honours.
#[derive(Default)]
struct Pax {
    path: Option<Vec<u8>>,
    linkpath: Option<Vec<u8>>,
    size: Option<u64>,
}

impl Pax {
    /// Records are `LEN KEY=VALUE\n`, LEN counting the whole record.
    fn parse(mut d: &[u8]) -> Result<Pax, PaxRecordError> {
        let mut pax = Pax::default();
        let mut at = 0;
        while !d.is_empty() {
            let sp = d
                .iter()
                .take(20)
                .position(|&b| b == b' ')
                .ok_or(PaxRecordError::NoLength { at })?;
            let len: usize = std::str::from_utf8(&d[..sp])
                .ok()
                .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse().ok())
                .ok_or(PaxRecordError::NoLength { at })?;
            if len <= sp + 1 || len > d.len() || d[len - 1] != b'\n' {
                return Err(PaxRecordError::BadLength { at });
            }
            let kv = &d[sp + 1..len - 1];
            let eq = kv
                .iter()
                .position(|&b| b == b'=')
                .ok_or(PaxRecordError::NoEquals { at })?;
            let (key, value) = (&kv[..eq], &kv[eq + 1..]);
            match key {
                b"path" => pax.path = Some(value.to_vec()),
                b"linkpath" => pax.linkpath = Some(value.to_vec()),
                b"size" => {
                    let v = std::str::from_utf8(value)
                        .ok()
                        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| PaxRecordError::Size {
                            at,
                            value: super::quote::quoted_bytes(value),
                        })?;
                    pax.size = Some(v);
                }
                _ => {}
            }
            d = &d[len..];
            at += len;
        }
        Ok(pax)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &str, kind: u8, size: u64) -> [u8; BLOCK] {
        let mut h = [0u8; BLOCK];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..107].copy_from_slice(b"0000644");
        h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
        h[156] = kind;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].fill(b' ');
        let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        h
    }

    fn entry(out: &mut Vec<u8>, name: &str, kind: u8, data: &[u8]) {
        out.extend_from_slice(&header(name, kind, data.len() as u64));
        out.extend_from_slice(data);
        out.resize(out.len() + padding(data.len() as u64) as usize, 0);
    }

    fn pax(records: &[(&str, &str)]) -> Vec<u8> {
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

    #[test]
    fn reads_entries_and_stops_each_at_its_size() {
        let mut t = Vec::new();
        entry(&mut t, "a", b'0', b"hello");
        entry(&mut t, "b", b'0', &[7u8; 600]);
        t.extend_from_slice(&[0u8; 1024]);
        let mut ar = Archive::new(&t[..]);
        let e = ar.next().unwrap().unwrap();
        assert_eq!(
            (e.name.as_slice(), e.size, e.is_file()),
            (&b"a"[..], 5, true)
        );
        let mut s = String::new();
        ar.data().read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
        // the second entry's data is skipped when not read
        assert_eq!(ar.next().unwrap().unwrap().name, b"b");
        assert!(ar.next().unwrap().is_none());
        assert!(ar.next().unwrap().is_none());
    }

    #[test]
    fn extensions_apply_to_the_next_entry() {
        let mut t = Vec::new();
        entry(&mut t, "././@LongLink", b'L', b"long/name\0");
        entry(&mut t, "short", b'0', b"x");
        entry(&mut t, "pax", b'x', &pax(&[("path", "p/q"), ("size", "3")]));
        entry(&mut t, "ignored", b'0', b"abc");
        let mut ar = Archive::new(&t[..]);
        assert_eq!(ar.next().unwrap().unwrap().name, b"long/name");
        let e = ar.next().unwrap().unwrap();
        assert_eq!((e.name.as_slice(), e.size), (&b"p/q"[..], 3));
    }

    #[test]
    fn limits_hold_before_anything_is_read() {
        for (kind, what) in [
            (b'L', "GNU long name of"),
            (b'K', "GNU long link name of"),
            (b'x', "pax extended header of"),
        ] {
            let h = header("x", kind, 2 << 30);
            // only the header is there: a reader that tried to read the
            // data would report the end of the stream instead
            let e = match Archive::new(&h[..]).next() {
                Err(ArchiveError::Format { why, .. }) => why,
                other => panic!("{other:?}"),
            };
            assert!(e.contains(&format!("a {what} 2147483648 bytes")), "{e}");
        }
        let mut t = Vec::new();
        entry(&mut t, "a", b'L', b"one");
        entry(&mut t, "b", b'L', b"two");
        assert!(
            matches!(Archive::new(&t[..]).next(), Err(ArchiveError::Format { why, .. }) if why.contains("second GNU long name"))
        );
    }

    #[test]
    fn a_size_near_two_to_the_64_is_an_error_not_an_overflow() {
        let mut t = Vec::new();
        entry(
            &mut t,
            "pax",
            b'x',
            &pax(&[("size", &u64::MAX.to_string())]),
        );
        entry(&mut t, "a", b'0', b"");
        let mut ar = Archive::new(&t[..]);
        assert_eq!(ar.next().unwrap().unwrap().size, u64::MAX);
        // skipping it finds the end of the stream
        assert!(matches!(ar.next(), Err(ArchiveError::Io(_))));
    }

    #[test]
    fn malformed_headers_are_refused() {
        let mut h = header("a", b'0', 1);
        h[0] = b'b';
        let e = Archive::new(&h[..]).next().unwrap_err();
        assert!(
            matches!(e, ArchiveError::Format { ref why, .. } if why.contains("checksum")),
            "{e:?}"
        );
        assert!(parse_size(b"0000000001x\0").is_err());
        assert_eq!(parse_size(b"  17 \0\0\0\0\0\0\0").unwrap(), 15);
        let mut b = [0u8; 12];
        b[0] = 0x80;
        b[11] = 5;
        assert_eq!(parse_size(&b).unwrap(), 5);
        b[1] = 1;
        assert!(parse_size(&b).is_err());
        b[0] = 0xff;
        assert!(parse_size(&b).is_err());
        for bad in ["5 a=b\n", "99 a=b\n", "x a=b\n", "7 ab\n\n", "11 size=1x\n"] {
            assert!(Pax::parse(bad.as_bytes()).is_err(), "{bad}");
        }
        // truncated inside the data
        let mut t = Vec::new();
        entry(&mut t, "a", b'0', b"hello");
        let mut ar = Archive::new(&t[..515]);
        ar.next().unwrap().unwrap();
        assert!(ar.data().read_to_end(&mut Vec::new()).is_err());
    }
}
