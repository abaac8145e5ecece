//! Output formats. Each writer takes the entries in path order, one at a
//! time, with a reader for a regular file's bytes; none of them holds more
//! than one buffer of file data.

pub mod cpio;
mod direct;
pub mod ext4;
pub mod tar;
pub mod zst;

use std::io::{self, BufRead, Write};

use crate::entry::{is_zero, Entry, Kind, SparseMap};

/// The formats `build` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    Tar,
    #[serde(rename = "tar.zst")]
    TarZst,
    Ext4,
    #[serde(rename = "cpio.gz")]
    CpioGz,
}

impl Format {
    pub const ALL: [Format; 4] = [Format::Tar, Format::TarZst, Format::Ext4, Format::CpioGz];

    pub fn name(self) -> &'static str {
        match self {
            Format::Tar => "tar",
            Format::TarZst => "tar.zst",
            Format::Ext4 => "ext4",
            Format::CpioGz => "cpio.gz",
        }
    }

    /// Whether an entry of this kind can be written in this format.
    pub fn can_hold(self, kind: &Kind) -> bool {
        match self {
            Format::Tar | Format::TarZst => !matches!(kind, Kind::Socket),
            Format::Ext4 | Format::CpioGz => true,
        }
    }
}

/// A `--format` value that names no format.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatParseError {
    #[error("unknown format `{0}` (expected tar, tar.zst, ext4 or cpio.gz)")]
    Unknown(String),
}

impl std::str::FromStr for Format {
    type Err = FormatParseError;
    fn from_str(s: &str) -> Result<Self, FormatParseError> {
        Format::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| FormatParseError::Unknown(s.to_string()))
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a writer is given for one entry.
pub struct Item<'a> {
    /// Path relative to the image root; empty for the root.
    pub path: &'a str,
    pub entry: &'a Entry,
    /// For a later member of a hard link group: the group's first path.
    pub link_to: Option<&'a str>,
    /// Inode number: the same for every member of a hard link group,
    /// counted from 1 in path order.
    pub ino: u64,
    /// Link count (members of the hard link group; 2 for directories).
    pub nlink: u32,
}

/// One output format.
pub trait Sink {
    /// Writes one entry; `data` is `Some` for regular files carrying data.
    fn put(&mut self, item: &Item, data: Option<&mut dyn BufRead>) -> io::Result<()>;
}

/// A writer that counts what passes through it.
pub struct CountingWriter<W> {
    pub inner: W,
    pub count: u64,
}

impl<W> CountingWriter<W> {
    pub fn new(inner: W) -> Self {
        CountingWriter { inner, count: 0 }
    }
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Copies exactly `want` bytes from `data` to `out`, straight from the
/// reader's buffer; a file that shrank since it was listed is an error,
/// not a corrupt archive.
pub(crate) fn exact_copy(data: &mut dyn BufRead, want: u64, out: &mut dyn Write) -> io::Result<()> {
    let mut left = want;
    while left > 0 {
        let buf = data.fill_buf()?;
        if buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("file shrank while read ({} of {want} bytes)", want - left),
            ));
        }
        let n = buf.len().min(left as usize);
        out.write_all(&buf[..n])?;
        data.consume(n);
        left -= n as u64;
    }
    Ok(())
}

/// Passes the data segments of a file with holes to `put` (file offset,
/// bytes), taking all `size` bytes of the file from `data` (holes
/// included, as reading it gives them) and checking that the bytes
/// between the segments are still zeros: a file written to after it was
/// mapped is an error, not an image that silently differs from it.
pub(crate) fn copy_segments(
    data: &mut dyn BufRead,
    size: u64,
    map: &SparseMap,
    put: &mut dyn FnMut(u64, &[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let mut segments = map.segments.iter().peekable();
    let mut pos = 0u64;
    while pos < size {
        let buf = data.fill_buf()?;
        if buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("file shrank while read ({pos} of {size} bytes)"),
            ));
        }
        let n = buf.len().min((size - pos) as usize);
        let mut i = 0;
        while i < n {
            let at = pos + i as u64;
            while segments.next_if(|&&(o, l)| o + l <= at).is_some() {}
            let end = match segments.peek() {
                Some(&&(o, l)) if o <= at => {
                    let end = i + (o + l - at).min((n - i) as u64) as usize;
                    put(at, &buf[i..end])?;
                    end
                }
                next => {
                    let hole_end = next.map_or(size, |&&(o, _)| o);
                    let end = i + (hole_end - at).min((n - i) as u64) as usize;
                    if !is_zero(&buf[i..end]) {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "the file changed while read (data in bytes {at}..{} where it had a hole when listed)",
                                pos + end as u64
                            ),
                        ));
                    }
                    end
                }
            };
            i = end;
        }
        data.consume(n);
        pos += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segments_of(content: &[u8], map: &SparseMap) -> io::Result<Vec<(u64, Vec<u8>)>> {
        let mut out: Vec<(u64, Vec<u8>)> = Vec::new();
        // Small reads, so runs and holes straddle buffer boundaries.
        let mut data = io::BufReader::with_capacity(7, content);
        copy_segments(&mut data, content.len() as u64, map, &mut |at, bytes| {
            match out.last_mut() {
                Some((o, b)) if *o + b.len() as u64 == at => b.extend_from_slice(bytes),
                _ => out.push((at, bytes.to_vec())),
            }
            Ok(())
        })?;
        Ok(out)
    }

    #[test]
    fn only_the_data_runs_are_copied() {
        let mut content = vec![0u8; 100];
        content[10..20].fill(1);
        content[90..].fill(2);
        let map = SparseMap {
            segments: vec![(10, 10), (90, 10)],
        };
        assert_eq!(
            segments_of(&content, &map).unwrap(),
            [(10, vec![1; 10]), (90, vec![2; 10])]
        );
    }

    #[test]
    fn data_where_a_hole_was_mapped_is_an_error() {
        let mut content = vec![0u8; 100];
        content[10..20].fill(1);
        content[50] = 3;
        let map = SparseMap {
            segments: vec![(10, 10)],
        };
        let e = segments_of(&content, &map).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("changed while read"), "{e}");
        // A file shorter than listed.
        let mut data: &[u8] = &content[..50];
        let e = copy_segments(&mut data, 100, &map, &mut |_, _| Ok(())).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
