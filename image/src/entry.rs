//! The image as a sorted tree of entries, whatever it was read from.
//!
//! Paths are relative to the image root, `/`-separated, without a leading
//! `./` or `/`; the root itself is the empty path. A `BTreeMap` keeps them in
//! byte order, which puts every directory before what it holds, so every
//! writer emits the same order for the same content.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

/// Where a regular file's bytes come from.
#[derive(Debug, Clone)]
pub enum Data {
    /// A file on the build host (a directory base, the release, the
    /// `deploy` binary), opened only when written.
    Disk(PathBuf),
    /// `len` bytes at `offset` of the tree's tar file (the base tar, or its
    /// decompressed copy).
    TarAt { offset: u64 },
    /// Small generated files (configuration, manifests).
    Bytes(Arc<Vec<u8>>),
}

/// What an entry is.
#[derive(Debug, Clone)]
pub enum Kind {
    Dir,
    /// A regular file. Entries sharing a `link_group` are hard links of one
    /// inode; the first in path order carries the data.
    File {
        size: u64,
        data: Data,
        link_group: Option<u64>,
    },
    /// A symbolic link, its target kept as written (never resolved).
    Symlink(String),
    Char {
        major: u32,
        minor: u32,
    },
    Block {
        major: u32,
        minor: u32,
    },
    Fifo,
    Socket,
}

impl Kind {
    /// The name used in manifests and error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Kind::Dir => "dir",
            Kind::File { .. } => "file",
            Kind::Symlink(_) => "symlink",
            Kind::Char { .. } => "char",
            Kind::Block { .. } => "block",
            Kind::Fifo => "fifo",
            Kind::Socket => "socket",
        }
    }

    /// The `S_IFMT` bits of this kind.
    pub fn type_bits(&self) -> u32 {
        match self {
            Kind::Dir => 0o040000,
            Kind::File { .. } => 0o100000,
            Kind::Symlink(_) => 0o120000,
            Kind::Char { .. } => 0o020000,
            Kind::Block { .. } => 0o060000,
            Kind::Fifo => 0o010000,
            Kind::Socket => 0o140000,
        }
    }
}

/// One file, directory, link or node of the image.
#[derive(Debug, Clone)]
pub struct Entry {
    pub kind: Kind,
    /// Permission bits, setuid/setgid/sticky included (`0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Seconds since the epoch, already clamped when the tree is written.
    pub mtime: u64,
}

impl Entry {
    /// A root-owned directory.
    pub fn dir(mode: u32, mtime: u64) -> Self {
        Entry {
            kind: Kind::Dir,
            mode,
            uid: 0,
            gid: 0,
            mtime,
        }
    }

    /// A root-owned file holding `bytes`.
    pub fn bytes(bytes: Vec<u8>, mode: u32, mtime: u64) -> Self {
        Entry {
            kind: Kind::File {
                size: bytes.len() as u64,
                data: Data::Bytes(Arc::new(bytes)),
                link_group: None,
            },
            mode,
            uid: 0,
            gid: 0,
            mtime,
        }
    }

    /// A root-owned symbolic link.
    pub fn symlink(target: &str, mtime: u64) -> Self {
        Entry {
            kind: Kind::Symlink(target.to_string()),
            mode: 0o777,
            uid: 0,
            gid: 0,
            mtime,
        }
    }

    pub fn size(&self) -> u64 {
        match &self.kind {
            Kind::File { size, .. } => *size,
            _ => 0,
        }
    }
}

/// The whole image: entries by path, and the tar file `Data::TarAt`
/// offsets point into.
#[derive(Debug, Default)]
pub struct Tree {
    pub entries: BTreeMap<String, Entry>,
    pub tar_file: Option<Arc<File>>,
    /// Where the tar file came from, for error messages.
    pub tar_path: PathBuf,
}

impl Tree {
    /// Opens the bytes of a regular file entry for reading.
    pub fn open<'a>(
        &'a self,
        path: &str,
        size: u64,
        data: &'a Data,
    ) -> io::Result<Box<dyn Read + 'a>> {
        Ok(match data {
            Data::Disk(p) => Box::new(File::open(p)?.take(size)),
            Data::Bytes(b) => Box::new(io::Cursor::new(b.as_slice())),
            Data::TarAt { offset } => {
                let file = self.tar_file.as_ref().ok_or_else(|| {
                    io::Error::other(format!("{path}: no tar file open for its data"))
                })?;
                Box::new(ReadAt {
                    file,
                    pos: *offset,
                    left: size,
                })
            }
        })
    }

    /// Where a regular file's bytes are read from, for error messages.
    pub fn source_of(&self, path: &str, data: &Data) -> PathBuf {
        match data {
            Data::Disk(p) => p.clone(),
            Data::TarAt { .. } => self.tar_path.join(path),
            Data::Bytes(_) => PathBuf::from(format!("(generated) /{path}")),
        }
    }

    /// Sum of the sizes of every regular file (hard links counted once).
    pub fn data_bytes(&self) -> u64 {
        let mut seen = std::collections::HashSet::new();
        self.entries
            .values()
            .filter(|e| match &e.kind {
                Kind::File {
                    link_group: Some(g),
                    ..
                } => seen.insert(*g),
                _ => true,
            })
            .map(Entry::size)
            .sum()
    }
}

/// Positional reads from a shared file: no seek position to share, so many
/// entries can point into one file.
struct ReadAt<'a> {
    file: &'a File,
    pos: u64,
    left: u64,
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "tar file ends inside an entry",
            ));
        }
        self.pos += n as u64;
        self.left -= n as u64;
        Ok(n)
    }
}
