//! Output formats. Each writer takes the entries in path order, one at a
//! time, with a reader for a regular file's bytes; none of them holds more
//! than one buffer of file data.

pub mod cpio;
pub mod ext4;
pub mod tar;

use std::io::{self, BufRead, Write};

use crate::entry::{Entry, Kind};

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

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Format::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| format!("unknown format `{s}` (expected tar, tar.zst, ext4 or cpio.gz)"))
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
