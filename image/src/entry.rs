//! The image as a sorted tree of entries, whatever it was read from.
//!
//! Paths are relative to the image root, `/`-separated, without a leading
//! `./` or `/`; the root itself is the empty path. A `BTreeMap` keeps them in
//! byte order, which puts every directory before what it holds, so every
//! writer emits the same order for the same content.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a regular file's bytes come from.
#[derive(Debug, Clone)]
pub enum Data {
    /// A file on the build host (a directory base, the release, the
    /// `deploy` binary), opened only when written.
    Disk(PathBuf),
    /// A file on the build host with holes: every byte outside the map's
    /// segments was zero when it was listed. Read like `Disk` (the holes
    /// read as zeros); the writers that keep holes check that they still
    /// are zeros.
    SparseDisk { path: PathBuf, map: Arc<SparseMap> },
    /// A sparse member of the tar base (GNU or pax 1.0 sparse): the data
    /// runs `stored` lists lie one after another from `offset` in the
    /// tree's tar file, the rest of the file is zeros. `map` is the same
    /// file on the `HOLE_BLOCK` grid, as a directory base would give it, or
    /// `None` when no whole block of it is a hole.
    SparseTarAt {
        offset: u64,
        stored: Arc<SparseMap>,
        map: Option<Arc<SparseMap>>,
    },
    /// `len` bytes at `offset` of the tree's tar file (the base tar, or its
    /// decompressed copy).
    TarAt { offset: u64 },
    /// Small generated files (configuration, manifests).
    Bytes(Arc<Vec<u8>>),
}

impl Data {
    /// The map of a file with holes.
    pub fn sparse_map(&self) -> Option<&SparseMap> {
        match self {
            Data::SparseDisk { map, .. } => Some(map),
            Data::SparseTarAt { map, .. } => map.as_deref(),
            _ => None,
        }
    }
}

/// The grid holes are found on: a hole is a run of whole aligned blocks of
/// this size that are all zeros (the last block of a file may be short).
/// Fixed, rather than whatever block size the build host's filesystem
/// reports holes in, so that the map, and with it the image's bytes,
/// depends on the file's content and not on where it was stored; 4 KiB is
/// the block size of ext4, XFS and btrfs as usually made, and the page
/// size of tmpfs on x86 and most arm64 kernels.
pub const HOLE_BLOCK: u64 = 4096;

/// The data of a file with holes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SparseMap {
    /// `(offset, length)` of each run of data, in file order, none empty,
    /// none touching the next; every byte outside them is zero.
    pub segments: Vec<(u64, u64)>,
}

impl SparseMap {
    /// Bytes of data, holes left out.
    pub fn data_bytes(&self) -> u64 {
        self.segments.iter().map(|&(_, len)| len).sum()
    }
}

/// Opens an input file of the image (through units::bounded: a FIFO or a
/// device where a file was found is refused, not waited on or read
/// forever). `follow`: a path named on the command line, which may be a
/// link; a file of a walked tree is opened as found, never through a
/// link that replaced it.
pub fn open_input(path: &Path, follow: bool) -> io::Result<File> {
    let b = units::bounded::Bound::regular(u64::MAX);
    let b = if follow { b.following_links() } else { b };
    b.open(path).map_err(|e| e.into_io())
}

/// The map of a file's holes, or `None` when the filesystem reports none
/// (or no whole `HOLE_BLOCK` of zeros is left once the blocks around its
/// data are read).
///
/// The filesystem's holes are found with `lseek(2)` `SEEK_DATA` and
/// `SEEK_HOLE`, so a large hole costs no reading. Its data is then read on
/// the `HOLE_BLOCK` grid and blocks of zeros in it become holes too: a
/// file written with runs of zeros and the same file left with holes
/// there give the same map, and so the same image. Whether a file counts
/// as sparse at all is the filesystem's say (a fully allocated file is
/// data, whatever it holds): reading every file for zeros would double
/// the cost of a build.
pub fn map_holes(path: &Path, size: u64) -> io::Result<Option<SparseMap>> {
    use rustix::fs::SeekFrom;
    let file = open_input(path, false)?;
    // The filesystem's data regions, as [start, end).
    let mut regions = Vec::new();
    let mut pos = 0;
    while pos < size {
        let start = match rustix::fs::seek(&file, SeekFrom::Data(pos)) {
            Ok(start) => start,
            // Nothing but a hole from `pos` to the end of the file.
            Err(rustix::io::Errno::NXIO) => break,
            // No SEEK_DATA on this filesystem: all data, no holes.
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::OPNOTSUPP) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if start >= size {
            break;
        }
        let end = rustix::fs::seek(&file, SeekFrom::Hole(start))?.min(size);
        if end <= start {
            break;
        }
        regions.push((start, end));
        pos = end;
    }
    if regions == [(0, size)] || size == 0 {
        return Ok(None);
    }
    canonical_map(&regions, size, &mut |buf, at| file.read_exact_at(buf, at))
}

/// The map on the `HOLE_BLOCK` grid of a file of `size` bytes whose bytes
/// outside `regions` (`[start, end)`, in order) are known to be zeros:
/// the grid blocks the regions touch are read with `read_at` and those
/// that hold anything but zeros are the data. `None` when that is all of
/// the file.
pub(crate) fn canonical_map(
    regions: &[(u64, u64)],
    size: u64,
    read_at: &mut dyn FnMut(&mut [u8], u64) -> io::Result<()>,
) -> io::Result<Option<SparseMap>> {
    let mut segments: Vec<(u64, u64)> = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0; // grid-aligned end of what was read
    for &(start, end) in regions {
        let mut at = (start / HOLE_BLOCK * HOLE_BLOCK).max(done);
        let stop = end
            .div_ceil(HOLE_BLOCK)
            .saturating_mul(HOLE_BLOCK)
            .min(size);
        while at < stop {
            let want = (stop - at).min(buf.len() as u64) as usize;
            read_at(&mut buf[..want], at)?;
            for (i, block) in buf[..want].chunks(HOLE_BLOCK as usize).enumerate() {
                if is_zero(block) {
                    continue;
                }
                let off = at + i as u64 * HOLE_BLOCK;
                let len = block.len() as u64;
                match segments.last_mut() {
                    Some((o, l)) if *o + *l == off => *l += len,
                    _ => segments.push((off, len)),
                }
            }
            at += want as u64;
        }
        done = done.max(stop);
    }
    if segments == [(0, size)] {
        return Ok(None);
    }
    Ok(Some(SparseMap { segments }))
}

/// Reads `buf.len()` bytes at `at` of a sparse tar member whose `stored`
/// runs lie one after another from `offset` in `file`.
pub(crate) fn read_sparse_at(
    file: &File,
    offset: u64,
    stored: &SparseMap,
    buf: &mut [u8],
    at: u64,
) -> io::Result<()> {
    buf.fill(0);
    let end = at + buf.len() as u64;
    let mut packed = offset;
    for &(o, l) in &stored.segments {
        if o >= end {
            break;
        }
        let (from, to) = (o.max(at), (o + l).min(end));
        if from < to {
            let dst = &mut buf[(from - at) as usize..(to - at) as usize];
            file.read_exact_at(dst, packed + (from - o))?;
        }
        packed += l;
    }
    Ok(())
}

/// `Data` for a file on the build host: `SparseDisk` when it has holes.
/// Only files with fewer blocks allocated than their size are mapped (a
/// file with a hole has), so a tree of ordinary files costs no more than
/// its `lstat` calls.
pub fn disk_data(path: &Path, md: &fs::Metadata) -> io::Result<Data> {
    if md.blocks().saturating_mul(512) < md.len() {
        if let Some(map) = map_holes(path, md.len())? {
            return Ok(Data::SparseDisk {
                path: path.to_path_buf(),
                map: Arc::new(map),
            });
        }
    }
    Ok(Data::Disk(path.to_path_buf()))
}

/// Whether every byte of `bytes` is zero (compared a block at a time, as
/// `memcmp` does it, against a block of zeros).
pub(crate) fn is_zero(bytes: &[u8]) -> bool {
    static ZEROS: [u8; HOLE_BLOCK as usize] = [0; HOLE_BLOCK as usize];
    bytes.chunks(ZEROS.len()).all(|c| c == &ZEROS[..c.len()])
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
    /// Extended attributes (`security.capability`, POSIX ACLs as
    /// `system.posix_acl_*`, `user.*`, ...), sorted by name; see
    /// [`Xattrs`].
    pub xattrs: Xattrs,
}

/// Extended attributes by name, in name order, values as the kernel
/// returns them (a POSIX ACL in its `system.posix_acl_*` binary form).
pub type Xattrs = Vec<(String, Vec<u8>)>;

/// The most extended attributes one entry may carry, and the most bytes of
/// names and values together (Linux holds at most 64 KiB per value, and
/// ext4 one block of 4 KiB per inode outside the inode).
pub const MAX_XATTRS: usize = 128;
pub const MAX_XATTR_BYTES: usize = 64 << 10;

impl Entry {
    /// A root-owned directory.
    pub fn dir(mode: u32, mtime: u64) -> Self {
        Entry {
            kind: Kind::Dir,
            mode,
            uid: 0,
            gid: 0,
            mtime,
            xattrs: Xattrs::new(),
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
            xattrs: Xattrs::new(),
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
            xattrs: Xattrs::new(),
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
            Data::Disk(p) | Data::SparseDisk { path: p, .. } => {
                Box::new(open_input(p, false)?.take(size))
            }
            Data::Bytes(b) => Box::new(io::Cursor::new(b.as_slice())),
            Data::TarAt { offset } => Box::new(ReadAt {
                file: self.tar_file(path)?,
                pos: *offset,
                left: size,
            }),
            Data::SparseTarAt { offset, stored, .. } => Box::new(SparseReadAt {
                file: self.tar_file(path)?,
                offset: *offset,
                stored,
                pos: 0,
                size,
            }),
        })
    }

    fn tar_file(&self, path: &str) -> io::Result<&File> {
        self.tar_file
            .as_deref()
            .ok_or_else(|| io::Error::other(format!("{path}: no tar file open for its data")))
    }

    /// Where a regular file's bytes are read from, for error messages.
    pub fn source_of(&self, path: &str, data: &Data) -> PathBuf {
        match data {
            Data::Disk(p) | Data::SparseDisk { path: p, .. } => p.clone(),
            Data::TarAt { .. } | Data::SparseTarAt { .. } => self.tar_path.join(path),
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

    /// Like `data_bytes`, holes left out: what a format that keeps holes
    /// stores.
    pub fn stored_bytes(&self) -> u64 {
        let mut seen = std::collections::HashSet::new();
        self.entries
            .values()
            .filter_map(|e| match &e.kind {
                Kind::File {
                    link_group: Some(g),
                    ..
                } if !seen.insert(*g) => None,
                Kind::File { size, data, .. } => {
                    Some(data.sparse_map().map_or(*size, SparseMap::data_bytes))
                }
                _ => None,
            })
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

/// The whole content of a sparse tar member, holes as zeros.
struct SparseReadAt<'a> {
    file: &'a File,
    offset: u64,
    stored: &'a SparseMap,
    pos: u64,
    size: u64,
}

impl Read for SparseReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf
            .len()
            .min((self.size - self.pos).min(usize::MAX as u64) as usize);
        read_sparse_at(self.file, self.offset, self.stored, &mut buf[..n], self.pos).map_err(
            |e| match e.kind() {
                io::ErrorKind::UnexpectedEof => io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "tar file ends inside an entry",
                ),
                _ => e,
            },
        )?;
        self.pos += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// A file of `size` bytes with `writes` in it, the rest left as holes;
    /// `None` when the filesystem of the temporary directory keeps none.
    fn sparse_file(dir: &Path, size: u64, writes: &[(u64, &[u8])]) -> Option<PathBuf> {
        let p = dir.join("f");
        let f = File::create(&p).unwrap();
        f.set_len(size).unwrap();
        for (at, bytes) in writes {
            f.write_all_at(bytes, *at).unwrap();
        }
        let md = f.metadata().unwrap();
        (md.blocks() * 512 < size).then_some(p)
    }

    #[test]
    fn holes_are_found_and_zeros_on_the_grid_join_them() {
        let t = tempfile::tempdir().unwrap();
        let size = 1 << 20;
        let Some(p) = sparse_file(
            t.path(),
            size,
            &[
                (5000, b"0123456789"),
                // Written zeros: a hole as far as the map goes.
                (200 << 10, &[0u8; 8192]),
                (size - 100, &[0xff; 100]),
            ],
        ) else {
            eprintln!("skipping: the temporary directory's filesystem keeps no holes");
            return;
        };
        let map = map_holes(&p, size).unwrap().unwrap();
        assert_eq!(map.segments, [(4096, 4096), (size - 4096, 4096)]);
        assert_eq!(map.data_bytes(), 8192);
        let md = fs::metadata(&p).unwrap();
        assert!(matches!(
            disk_data(&p, &md).unwrap(),
            Data::SparseDisk { .. }
        ));
    }

    #[test]
    fn a_file_without_holes_is_plain_data() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        fs::write(&p, vec![0u8; 3 * HOLE_BLOCK as usize]).unwrap();
        assert_eq!(map_holes(&p, 3 * HOLE_BLOCK).unwrap(), None);
        let md = fs::metadata(&p).unwrap();
        assert!(matches!(disk_data(&p, &md).unwrap(), Data::Disk(_)));
        // All hole: no data runs at all.
        if let Some(p) = sparse_file(t.path(), 1 << 20, &[]) {
            let map = map_holes(&p, 1 << 20).unwrap().unwrap();
            assert!(map.segments.is_empty());
        }
    }
}
