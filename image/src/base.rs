//! Reading the base root filesystem as data: a directory, a tar (plain,
//! gzip, zstd or bzip2, told apart by their magic bytes: Jetson Linux's
//! sample root filesystem ships as a `.tbz2`), or nothing.
//!
//! Nothing here follows a symlink or trusts a path: directory bases are
//! walked with `lstat`, tar member names with `..` are refused, and a tar is
//! never held in memory (a compressed one is decompressed to a temporary file
//! next to the output, then read by offset).
//!
//! Holes are kept: a file of a directory base with holes, and a sparse
//! member of a tar base (GNU `S` or pax 1.0, each map bounded), is mapped
//! on the same 4 KiB grid (`entry::HOLE_BLOCK`), so a base gives the same
//! image whether it is a directory or a tar made from it.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::entry::{
    canonical_map, disk_data, read_sparse_at, Data, Entry, Kind, SparseMap, Tree, Xattrs,
    MAX_XATTRS, MAX_XATTR_BYTES,
};
use crate::error::ImageBuildError;

/// What the image starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// A root filesystem tree on disk.
    Dir(PathBuf),
    /// A tar archive, plain or compressed with gzip, zstd or bzip2.
    Tar(PathBuf),
    /// Nothing: the image holds only what rtdeploy adds.
    None,
}

impl Base {
    /// `none`, a directory, or a file (taken as a tar).
    pub fn from_arg(arg: &Path) -> Base {
        if arg.as_os_str() == "none" {
            Base::None
        } else if arg.is_dir() {
            Base::Dir(arg.to_path_buf())
        } else {
            Base::Tar(arg.to_path_buf())
        }
    }
}

/// How a tar base is compressed, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
    /// `.tbz2` / `.tar.bz2`, as Jetson Linux's sample root filesystem
    /// ships (decompressed on one thread: no maintained crate decodes
    /// bzip2 blocks in parallel).
    Bzip2,
}

/// Tells the compression from the magic bytes; refuses the ones rtdeploy
/// cannot read with a message saying what to do.
pub fn detect(path: &Path, head: &[u8]) -> Result<Compression, ImageBuildError> {
    let bad = |reason: &str| ImageBuildError::BadBase {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    Ok(match head {
        [0x1f, 0x8b, ..] => Compression::Gzip,
        [0x28, 0xb5, 0x2f, 0xfd, ..] => Compression::Zstd,
        [b'B', b'Z', b'h', b'1'..=b'9', ..] => Compression::Bzip2,
        [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => {
            return Err(bad("xz-compressed tar is not supported (recompress it: `xz -dc B | zstd -o B.tar.zst`)"))
        }
        h if h.len() >= 262 && &h[257..262] == b"ustar" => Compression::None,
        h if h.len() < 512 => return Err(bad("too short to be a tar archive")),
        _ => return Err(bad("not a tar archive (no ustar magic; expected a directory, a .tar, .tar.gz, .tar.zst or .tbz2, or `none`)")),
    })
}

/// The base read into a tree, with the digest the SBOM names.
pub struct LoadedBase {
    pub tree: Tree,
    /// sha256 of the base file as given (tar), or `None` for a directory
    /// (its digest is that of its listing, computed while it is written).
    pub file_sha256: Option<String>,
}

/// Reads `base`; `spool_dir` receives the decompressed copy of a compressed
/// tar (a temporary file, unlinked at once).
pub fn load(
    base: &Base,
    spool_dir: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<LoadedBase, ImageBuildError> {
    match base {
        Base::None => Ok(LoadedBase {
            tree: Tree::default(),
            file_sha256: None,
        }),
        Base::Dir(dir) => Ok(LoadedBase {
            tree: read_dir(dir)?,
            file_sha256: None,
        }),
        Base::Tar(path) => read_tar(path, spool_dir, progress),
    }
}

/// Checks that a tree looks like a root filesystem.
pub fn check_rootfs(base: &Path, tree: &Tree) -> Result<(), ImageBuildError> {
    let missing: Vec<String> = ["etc", "usr"]
        .iter()
        .filter(|d| {
            !matches!(
                tree.entries.get(**d),
                Some(Entry {
                    kind: Kind::Dir,
                    ..
                })
            )
        })
        .map(|d| format!("/{d}"))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(ImageBuildError::NotRootFs {
            base: base.to_path_buf(),
            missing,
        })
    }
}

fn mtime_of(md: &fs::Metadata) -> u64 {
    md.mtime().max(0) as u64
}

/// Walks a directory base with `lstat`: symlinks are entries, not paths to
/// follow; hard links (same device and inode) become one link group.
pub fn read_dir(root: &Path) -> Result<Tree, ImageBuildError> {
    let md =
        fs::symlink_metadata(root).map_err(ImageBuildError::io("read base directory", root))?;
    let mut tree = Tree::default();
    tree.entries.insert(
        String::new(),
        Entry {
            kind: Kind::Dir,
            mode: md.mode() & 0o7777,
            uid: md.uid(),
            gid: md.gid(),
            mtime: mtime_of(&md),
            xattrs: read_xattrs(root)?,
        },
    );
    let mut groups: HashMap<(u64, u64), u64> = HashMap::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, rel)) = stack.pop() {
        let rd = fs::read_dir(&dir).map_err(ImageBuildError::io("read directory", &dir))?;
        for de in rd {
            let de = de.map_err(ImageBuildError::io("read directory", &dir))?;
            let path = de.path();
            let name = de.file_name();
            let name = name.to_str().ok_or_else(|| ImageBuildError::BadBase {
                path: path.clone(),
                reason: "file name is not UTF-8 (rtdeploy images hold UTF-8 names only)".into(),
            })?;
            let key = if rel.is_empty() {
                name.to_string()
            } else {
                format!("{rel}/{name}")
            };
            // lstat, relative to the directory being read (no walk of
            // the whole path per entry).
            let md = de.metadata().map_err(ImageBuildError::io("stat", &path))?;
            let ft = md.file_type();
            let kind = if ft.is_dir() {
                stack.push((path.clone(), key.clone()));
                Kind::Dir
            } else if ft.is_file() {
                let link_group = (md.nlink() > 1).then(|| {
                    let next = groups.len() as u64;
                    *groups.entry((md.dev(), md.ino())).or_insert(next)
                });
                Kind::File {
                    size: md.len(),
                    data: disk_data(&path, &md)
                        .map_err(ImageBuildError::io("find the holes of", &path))?,
                    link_group,
                }
            } else if ft.is_symlink() {
                let target =
                    fs::read_link(&path).map_err(ImageBuildError::io("read symlink", &path))?;
                let target = target.to_str().ok_or_else(|| ImageBuildError::BadBase {
                    path: path.clone(),
                    reason: "symlink target is not UTF-8".into(),
                })?;
                Kind::Symlink(target.to_string())
            } else if ft.is_char_device() || ft.is_block_device() {
                let rdev = md.rdev();
                let (major, minor) = (rustix::fs::major(rdev), rustix::fs::minor(rdev));
                if ft.is_char_device() {
                    Kind::Char { major, minor }
                } else {
                    Kind::Block { major, minor }
                }
            } else if ft.is_fifo() {
                Kind::Fifo
            } else if ft.is_socket() {
                Kind::Socket
            } else {
                return Err(ImageBuildError::BadBase {
                    path,
                    reason: "unknown file type".into(),
                });
            };
            tree.entries.insert(
                key,
                Entry {
                    kind,
                    mode: md.mode() & 0o7777,
                    uid: md.uid(),
                    gid: md.gid(),
                    mtime: mtime_of(&md),
                    xattrs: read_xattrs(&path)?,
                },
            );
        }
    }
    Ok(tree)
}

/// Whether an extended attribute of the build host goes into the image:
/// everything but the host's SELinux label (the robot labels its own
/// files, or has no SELinux at all).
pub fn keep_xattr(name: &str) -> bool {
    name != "security.selinux"
}

/// The extended attributes of `path` (not followed if a symlink), sorted
/// by name, bounded by [`MAX_XATTRS`] and [`MAX_XATTR_BYTES`]. A
/// filesystem without them gives none; one this process may not read
/// (`trusted.*` without CAP_SYS_ADMIN) is left out, as the kernel leaves
/// it out of the list.
pub fn read_xattrs(path: &Path) -> Result<Xattrs, ImageBuildError> {
    use rustix::io::Errno;
    let bad = |reason: String| ImageBuildError::BadBase {
        path: path.to_path_buf(),
        reason,
    };
    let mut names = vec![0u8; 4096];
    let n = loop {
        match rustix::fs::llistxattr(path, &mut names[..]) {
            Ok(n) => break n,
            Err(Errno::NOTSUP) => return Ok(Xattrs::new()),
            Err(Errno::RANGE) if names.len() < MAX_XATTR_BYTES => names.resize(MAX_XATTR_BYTES, 0),
            Err(e) => {
                return Err(ImageBuildError::io("list the extended attributes of", path)(e.into()))
            }
        }
    };
    let mut out = Xattrs::new();
    let mut total = 0;
    for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = std::str::from_utf8(name).map_err(|_| {
            bad(format!(
                "extended attribute name {} is not UTF-8",
                name.escape_ascii()
            ))
        })?;
        if !keep_xattr(name) {
            continue;
        }
        let mut value = vec![0u8; 256];
        let len = loop {
            match rustix::fs::lgetxattr(path, name, &mut value[..]) {
                Ok(len) => break len,
                Err(Errno::RANGE) if value.len() < MAX_XATTR_BYTES => {
                    value.resize(MAX_XATTR_BYTES, 0)
                }
                // Removed since it was listed.
                Err(Errno::NODATA) => break usize::MAX,
                Err(e) => {
                    return Err(
                        ImageBuildError::io("read the extended attributes of", path)(e.into()),
                    )
                }
            }
        };
        if len == usize::MAX {
            continue;
        }
        value.truncate(len);
        total += name.len() + value.len();
        if out.len() == MAX_XATTRS || total > MAX_XATTR_BYTES {
            return Err(bad(format!(
                "more than {MAX_XATTRS} extended attributes or {MAX_XATTR_BYTES} bytes of them"
            )));
        }
        out.push((name.to_string(), value));
    }
    out.sort();
    Ok(out)
}

/// Why a tar member's extended attributes cannot be read ([`pax_xattrs`]).
#[derive(Debug, thiserror::Error)]
enum PaxXattrsReadError {
    #[error("cannot read pax records")]
    Records(#[source] io::Error),
    #[error("bad pax record")]
    Record(#[source] io::Error),
    #[error("extended attribute name {} is not UTF-8", .0.escape_ascii())]
    NameNotUtf8(Vec<u8>),
    #[error("more than {MAX_XATTRS} extended attributes or {MAX_XATTR_BYTES} bytes of them")]
    TooMany,
}

/// The extended attributes of a tar member, from its pax records
/// `SCHILY.xattr.<name>` (as GNU tar `--xattrs` and bsdtar write them),
/// sorted by name and bounded like a directory's.
fn pax_xattrs<R: Read>(member: &mut tar::Entry<R>) -> Result<Xattrs, PaxXattrsReadError> {
    let Some(extensions) = member
        .pax_extensions()
        .map_err(PaxXattrsReadError::Records)?
    else {
        return Ok(Xattrs::new());
    };
    let mut out = Xattrs::new();
    let mut total = 0;
    for ext in extensions {
        let ext = ext.map_err(PaxXattrsReadError::Record)?;
        let Some(name) = ext.key_bytes().strip_prefix(b"SCHILY.xattr.") else {
            continue;
        };
        let name = std::str::from_utf8(name)
            .map_err(|_| PaxXattrsReadError::NameNotUtf8(name.to_vec()))?;
        if name.is_empty() || !keep_xattr(name) {
            continue;
        }
        total += name.len() + ext.value_bytes().len();
        if out.len() == MAX_XATTRS || total > MAX_XATTR_BYTES {
            return Err(PaxXattrsReadError::TooMany);
        }
        out.retain(|(n, _): &(String, Vec<u8>)| n != name);
        out.push((name.to_string(), ext.value_bytes().to_vec()));
    }
    out.sort();
    Ok(out)
}

/// A reader that hashes and counts what passes through it.
pub(crate) struct HashingReader<R> {
    pub inner: R,
    pub hasher: Sha256,
    pub count: u64,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// Counts bytes read and reports them every 8 MiB.
struct Progressing<'p, R> {
    inner: R,
    done: u64,
    reported: u64,
    progress: &'p mut dyn FnMut(u64),
}

impl<R: Read> Read for Progressing<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done += n as u64;
        if self.done - self.reported >= 8 << 20 {
            self.reported = self.done;
            (self.progress)(self.done);
        }
        Ok(n)
    }
}

/// Normalises a tar member name: no leading `/` or `./`, no `..`.
fn member_key(path: &Path, name: &Path) -> Result<String, ImageBuildError> {
    let mut parts = Vec::new();
    for c in name.components() {
        match c {
            Component::Normal(s) => {
                parts.push(s.to_str().ok_or_else(|| ImageBuildError::BadBase {
                    path: path.to_path_buf(),
                    reason: format!("member name {} is not UTF-8", name.display()),
                })?)
            }
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(ImageBuildError::BadBase {
                    path: path.to_path_buf(),
                    reason: format!(
                        "member `{}` leaves the root (contains `..`)",
                        name.display()
                    ),
                })
            }
        }
    }
    Ok(parts.join("/"))
}

fn read_tar(
    path: &Path,
    spool_dir: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<LoadedBase, ImageBuildError> {
    let io_err = |what| ImageBuildError::io(what, path);
    let mut file = crate::entry::open_input(path, true).map_err(io_err("open base"))?;
    // Its first block, enough to tell the compression by.
    let head = units::bounded::read_at_most(&mut (&mut file).take(512), path, 512)
        .map_err(|e| io_err("read base")(e.into_io()))?;
    let compression = detect(path, &head)?;
    let file = crate::entry::open_input(path, true).map_err(io_err("open base"))?;
    let mut hashing = HashingReader {
        inner: Progressing {
            inner: BufReader::with_capacity(1 << 20, file),
            done: 0,
            reported: 0,
            progress,
        },
        hasher: Sha256::new(),
        count: 0,
    };
    let (tree, data_file) = match compression {
        Compression::None => {
            // One sequential pass hashes the file and indexes its members;
            // their data is read later by offset from the same file.
            let data_file = crate::entry::open_input(path, true).map_err(io_err("open base"))?;
            let tree = index_tar(path, &mut hashing, &data_file)?;
            (tree, data_file)
        }
        Compression::Gzip | Compression::Zstd | Compression::Bzip2 => {
            let mut spool = tempfile::tempfile_in(spool_dir)
                .map_err(ImageBuildError::io("create a temporary file in", spool_dir))?;
            let copied = match compression {
                Compression::Gzip => io::copy(
                    &mut flate2::read::MultiGzDecoder::new(&mut hashing),
                    &mut spool,
                ),
                // Every stream of a file made by pbzip2 or lbzip2 too.
                Compression::Bzip2 => io::copy(
                    &mut bzip2::read::MultiBzDecoder::new(&mut hashing),
                    &mut spool,
                ),
                _ => zstd::stream::read::Decoder::new(&mut hashing)
                    .and_then(|mut d| io::copy(&mut d, &mut spool)),
            };
            copied.map_err(io_err("decompress base"))?;
            // Hash what is left (trailing padding after the compressed frame).
            io::copy(&mut hashing, &mut io::sink()).map_err(io_err("read base"))?;
            let reader = spool
                .try_clone()
                .map_err(io_err("reopen the decompressed base"))?;
            let mut reader = reader;
            io::Seek::rewind(&mut reader).map_err(io_err("rewind the decompressed base"))?;
            let tree = index_tar(path, BufReader::with_capacity(1 << 20, reader), &spool)?;
            (tree, spool)
        }
    };
    // Finish hashing a plain tar whose end-of-archive blocks were not read.
    io::copy(&mut hashing, &mut io::sink()).map_err(io_err("read base"))?;
    let digest = hex::encode(hashing.hasher.finalize());
    let mut tree = tree;
    tree.tar_file = Some(Arc::new(data_file));
    tree.tar_path = path.to_path_buf();
    Ok(LoadedBase {
        tree,
        file_sha256: Some(digest),
    })
}

/// Reads every member header of a tar stream; data stays where it is,
/// recorded by offset. `data` is the same tar (decompressed), read by
/// offset for the maps of sparse members.
fn index_tar(path: &Path, reader: impl Read, data: &File) -> Result<Tree, ImageBuildError> {
    let bad = |reason: String| ImageBuildError::BadBase {
        path: path.to_path_buf(),
        reason,
    };
    let mut archive = tar::Archive::new(reader);
    let mut tree = Tree::default();
    let entries = archive
        .entries()
        .map_err(|e| bad(format!("cannot read tar: {e}")))?;
    for member in entries {
        let mut member = member.map_err(|e| bad(format!("cannot read tar: {e}")))?;
        let pax_sparse = pax_sparse(&mut member).map_err(|reason| {
            bad(format!(
                "member `{}`: {reason}",
                member.path_bytes().escape_ascii()
            ))
        })?;
        let name = match &pax_sparse {
            Some(p) => PathBuf::from(&p.name),
            None => member
                .path()
                .map_err(|e| bad(format!("bad member name: {e}")))?
                .into_owned(),
        };
        let key = member_key(path, &name)?;
        let mut xattrs = pax_xattrs(&mut member).map_err(|reason| {
            bad(format!(
                "member `{}`: {}",
                name.display(),
                units::error::Chain(&reason)
            ))
        })?;
        let sparse_err = |e: SparseError| match e {
            SparseError::Io(e) => ImageBuildError::io("read base", path)(e),
            SparseError::Bad(reason) => bad(format!("member `{}`: {reason}", name.display())),
        };
        let h = member.header();
        let num = |r: io::Result<u64>, what: &str| {
            r.map_err(|e| bad(format!("member `{}`: bad {what}: {e}", name.display())))
        };
        let mode = num(h.mode().map(u64::from), "mode")? as u32 & 0o7777;
        let uid = num(h.uid(), "uid")?;
        let gid = num(h.gid(), "gid")?;
        let mtime = num(h.mtime(), "mtime")?;
        let (uid, gid) = match (u32::try_from(uid), u32::try_from(gid)) {
            (Ok(u), Ok(g)) => (u, g),
            _ => {
                return Err(bad(format!(
                    "member `{}`: uid/gid beyond 32 bits",
                    name.display()
                )))
            }
        };
        let link_target = || -> Result<String, ImageBuildError> {
            let t = member
                .link_name()
                .map_err(|e| bad(format!("member `{}`: bad link name: {e}", name.display())))?
                .ok_or_else(|| {
                    bad(format!(
                        "member `{}`: link without a target",
                        name.display()
                    ))
                })?;
            t.to_str().map(str::to_string).ok_or_else(|| {
                bad(format!(
                    "member `{}`: link target is not UTF-8",
                    name.display()
                ))
            })
        };
        let dev = |what: &str| -> Result<(u32, u32), ImageBuildError> {
            let maj = h.device_major().ok().flatten();
            let min = h.device_minor().ok().flatten();
            match (maj, min) {
                (Some(a), Some(b)) => Ok((a, b)),
                _ => Err(bad(format!(
                    "member `{}`: {what} without device numbers",
                    name.display()
                ))),
            }
        };
        let kind = match h.entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => match &pax_sparse {
                Some(p) => {
                    let (offset, stored) =
                        pax_sparse_map(data, member.raw_file_position(), member.size(), p.size)
                            .map_err(sparse_err)?;
                    Kind::File {
                        size: p.size,
                        data: sparse_tar_data(data, offset, stored, p.size).map_err(sparse_err)?,
                        link_group: None,
                    }
                }
                None => Kind::File {
                    size: member.size(),
                    data: Data::TarAt {
                        offset: member.raw_file_position(),
                    },
                    link_group: None,
                },
            },
            tar::EntryType::GNUSparse => {
                let (offset, stored) = gnu_sparse_map(data, &member).map_err(sparse_err)?;
                let size = member.size();
                Kind::File {
                    size,
                    data: sparse_tar_data(data, offset, stored, size).map_err(sparse_err)?,
                    link_group: None,
                }
            }
            tar::EntryType::Directory => Kind::Dir,
            tar::EntryType::Symlink => Kind::Symlink(link_target()?),
            tar::EntryType::Link => {
                let target = member_key(path, Path::new(&link_target()?))?;
                let next_group = tree.entries.len() as u64;
                match tree.entries.get_mut(&target) {
                    Some(Entry {
                        kind: Kind::File { size, data, link_group },
                        xattrs: first,
                        ..
                    }) => {
                        // One inode: its attributes, whichever member
                        // carried them.
                        if xattrs.is_empty() {
                            xattrs = first.clone();
                        }
                        let group = *link_group.get_or_insert(next_group);
                        Kind::File {
                            size: *size,
                            data: data.clone(),
                            link_group: Some(group),
                        }
                    }
                    _ => {
                        return Err(bad(format!(
                            "hard link `{}` points at `{target}`, which is not a regular file before it in the archive",
                            name.display()
                        )))
                    }
                }
            }
            tar::EntryType::Char => {
                let (major, minor) = dev("character device")?;
                Kind::Char { major, minor }
            }
            tar::EntryType::Block => {
                let (major, minor) = dev("block device")?;
                Kind::Block { major, minor }
            }
            tar::EntryType::Fifo => Kind::Fifo,
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => continue,
            other => {
                return Err(bad(format!(
                    "member `{}` has tar type {other:?}, which rtdeploy cannot carry into an image",
                    name.display()
                )))
            }
        };
        tree.entries.insert(
            key,
            Entry {
                kind,
                mode,
                uid,
                gid,
                mtime,
                xattrs,
            },
        );
    }
    // A tar without an entry for `./` still has a root.
    tree.entries
        .entry(String::new())
        .or_insert_with(|| Entry::dir(0o755, 0));
    Ok(tree)
}

/// Most data runs a sparse member of a tar base may list: 16 MiB of map
/// in memory. A real file with more runs than that is better given as a
/// directory base; a tar that claims more is refused before the map is
/// read whole.
const MAX_SPARSE_RUNS: usize = 1 << 20;

enum SparseError {
    Io(io::Error),
    Bad(String),
}

impl From<io::Error> for SparseError {
    fn from(e: io::Error) -> Self {
        SparseError::Io(e)
    }
}

/// A member in the pax sparse format 1.0 (GNU tar `--format=posix
/// --sparse`, bsdtar): its real name and size from the pax header; the map
/// is at the start of its data.
struct PaxSparse {
    name: String,
    size: u64,
}

/// Why a member's pax sparse keys are refused.
#[derive(Debug, thiserror::Error)]
enum PaxSparseError {
    #[error("cannot read its pax header: {0}")]
    Read(io::Error),
    #[error("bad pax header: {0}")]
    Bad(io::Error),
    #[error("pax sparse 1.0 header without a valid GNU.sparse.name and GNU.sparse.realsize")]
    Incomplete,
    #[error("is in pax sparse format {major}.{minor}, which rtdeploy does not read (only 1.0, the one GNU tar --format=posix --sparse writes)")]
    Unsupported { major: String, minor: String },
}

/// The pax sparse keys of a member, if any. Versions 0.0 and 0.1 (the map
/// in the pax header) are refused by name rather than read as a plain file
/// called `GNUSparseFile.N/...` holding a map and packed data.
fn pax_sparse<R: Read>(member: &mut tar::Entry<R>) -> Result<Option<PaxSparse>, PaxSparseError> {
    let Some(extensions) = member.pax_extensions().map_err(PaxSparseError::Read)? else {
        return Ok(None);
    };
    let (mut major, mut minor, mut name, mut size) = (None, None, None, None);
    let (mut any, mut map) = (false, false);
    for ext in extensions {
        let ext = ext.map_err(PaxSparseError::Bad)?;
        let Ok(key) = ext.key() else { continue };
        if !key.starts_with("GNU.sparse.") {
            continue;
        }
        any = true;
        let value = ext.value().ok().map(str::to_string);
        match key {
            "GNU.sparse.major" => major = value,
            "GNU.sparse.minor" => minor = value,
            "GNU.sparse.name" => name = value,
            "GNU.sparse.realsize" => size = value.and_then(|v| v.parse::<u64>().ok()),
            "GNU.sparse.map" => map = true,
            _ => {}
        }
    }
    if !any {
        return Ok(None);
    }
    match (major.as_deref(), minor.as_deref(), name, size) {
        (Some("1"), Some("0"), Some(name), Some(size)) => Ok(Some(PaxSparse { name, size })),
        (Some("1"), Some("0"), ..) => Err(PaxSparseError::Incomplete),
        _ => Err(PaxSparseError::Unsupported {
            major: major.unwrap_or_else(|| "0".into()),
            // 0.1 names its map in one key, 0.0 in a key per run.
            minor: minor.unwrap_or_else(|| if map { "1" } else { "0" }.into()),
        }),
    }
}

/// Checks a list of data runs: in order, not overlapping, inside `size`,
/// and adding up to `stored` bytes; zero-length runs (GNU tar marks the
/// end of a file ending in a hole with one) are dropped.
fn checked_runs(runs: Vec<(u64, u64)>, size: u64, stored: u64) -> Result<SparseMap, SparseError> {
    let mut segments: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
    let mut end = 0;
    let mut total = 0u64;
    for (offset, len) in runs {
        let bad = |why: &str| {
            SparseError::Bad(format!("sparse map: run at {offset} of {len} bytes {why}"))
        };
        if offset < end {
            return Err(bad("overlaps the one before"));
        }
        let run_end = offset
            .checked_add(len)
            .filter(|&e| e <= size)
            .ok_or_else(|| bad(&format!("goes past the file's {size} bytes")))?;
        end = run_end;
        total += len;
        if len > 0 {
            segments.push((offset, len));
        }
    }
    if total != stored {
        return Err(SparseError::Bad(format!(
            "sparse map lists {total} bytes of data, the member holds {stored}"
        )));
    }
    Ok(SparseMap { segments })
}

/// The runs of a GNU sparse member (type `S`): four in its header, then
/// 21 in each extension block after it, read from the tar by offset.
/// Returns where the runs' data starts, and the runs.
fn gnu_sparse_map<R: Read>(
    data: &File,
    member: &tar::Entry<R>,
) -> Result<(u64, SparseMap), SparseError> {
    let bad = |s: &str| SparseError::Bad(s.to_string());
    let h = member.header();
    let gnu = h
        .as_gnu()
        .ok_or_else(|| bad("GNU sparse member without a GNU header"))?;
    let stored = h.entry_size()?;
    let mut runs = Vec::new();
    let mut add = |block: &tar::GnuSparseHeader| -> Result<(), SparseError> {
        if !block.is_empty() {
            if runs.len() >= MAX_SPARSE_RUNS {
                return Err(bad(&format!("more than {MAX_SPARSE_RUNS} sparse runs")));
            }
            runs.push((block.offset()?, block.length()?));
        }
        Ok(())
    };
    for block in &gnu.sparse {
        add(block)?;
    }
    // The extension blocks follow the header, the data follows them (the
    // `tar` crate's file position is that of the first extension block).
    // Their number is bounded by the runs they hold and the tar's end.
    let mut at = member.raw_header_position() + 512;
    let mut extended = gnu.is_extended();
    while extended {
        let mut ext = tar::GnuExtSparseHeader::new();
        data.read_exact_at(ext.as_mut_bytes(), at)?;
        for block in &ext.sparse {
            add(block)?;
        }
        extended = ext.is_extended();
        at += 512;
    }
    Ok((at, checked_runs(runs, member.size(), stored)?))
}

/// The map at the start of a pax 1.0 sparse member's data: decimal lines,
/// the number of runs, then offset and length of each; padded to a 512
/// byte block, after which the runs' data follows. Returns where that data
/// starts and the runs.
fn pax_sparse_map(
    data: &File,
    start: u64,
    member_size: u64,
    size: u64,
) -> Result<(u64, SparseMap), SparseError> {
    let bad = |s: String| SparseError::Bad(s);
    let mut numbers = Vec::new();
    let mut want = None;
    let mut digits = String::new();
    let mut block = [0u8; 512];
    let mut at = 0u64;
    while want.is_none_or(|n| numbers.len() < n) {
        if at + 512 > member_size {
            return Err(bad("pax sparse map runs past the member's data".into()));
        }
        data.read_exact_at(&mut block, start + at)?;
        at += 512;
        for &b in &block {
            if want.is_some_and(|n| numbers.len() >= n) {
                break;
            }
            match b {
                b'0'..=b'9' if digits.len() < 20 => digits.push(b as char),
                b'\n' => {
                    let n: u64 = digits
                        .parse()
                        .map_err(|_| bad(format!("bad number `{digits}` in the pax sparse map")))?;
                    digits.clear();
                    match want {
                        None => {
                            if n > MAX_SPARSE_RUNS as u64 {
                                return Err(bad(format!(
                                    "pax sparse map of {n} runs (at most {MAX_SPARSE_RUNS})"
                                )));
                            }
                            want = Some(2 * n as usize);
                        }
                        Some(_) => numbers.push(n),
                    }
                }
                _ => return Err(bad("pax sparse map is not decimal lines".into())),
            }
        }
    }
    let runs = numbers.chunks(2).map(|p| (p[0], p[1])).collect();
    Ok((start + at, checked_runs(runs, size, member_size - at)?))
}

/// `Data` for a sparse tar member: its runs, and its map on the grid
/// (read for zeros as a directory base's file would be).
fn sparse_tar_data(
    data: &File,
    offset: u64,
    stored: SparseMap,
    size: u64,
) -> Result<Data, SparseError> {
    let regions: Vec<(u64, u64)> = stored.segments.iter().map(|&(o, l)| (o, o + l)).collect();
    let map = canonical_map(&regions, size, &mut |buf, at| {
        read_sparse_at(data, offset, &stored, buf, at)
    })?;
    Ok(Data::SparseTarAt {
        offset,
        stored: Arc::new(stored),
        map: map.map(Arc::new),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_compression_by_magic() {
        let p = Path::new("b");
        assert_eq!(detect(p, &[0x1f, 0x8b, 8, 0]).unwrap(), Compression::Gzip);
        assert_eq!(
            detect(p, &[0x28, 0xb5, 0x2f, 0xfd, 0]).unwrap(),
            Compression::Zstd
        );
        let mut ustar = vec![0u8; 512];
        ustar[257..262].copy_from_slice(b"ustar");
        assert_eq!(detect(p, &ustar).unwrap(), Compression::None);
        assert_eq!(detect(p, b"BZh91AY&SY").unwrap(), Compression::Bzip2);
        // A block size of 0 is no bzip2 stream.
        assert!(detect(p, b"BZh01AY&SY").is_err());
        let e = detect(p, &[0xfd, b'7', b'z', b'X', b'Z', 0])
            .unwrap_err()
            .to_string();
        assert!(e.contains("xz-compressed tar is not supported"), "{e}");
        let e = detect(p, &[0u8; 512]).unwrap_err().to_string();
        assert!(e.contains("not a tar"), "{e}");
    }

    #[test]
    fn sparse_maps_are_checked() {
        let runs = |r: &[(u64, u64)], size, stored| match checked_runs(r.to_vec(), size, stored) {
            Ok(m) => Ok(m.segments),
            Err(SparseError::Bad(why)) => Err(why),
            Err(SparseError::Io(e)) => panic!("{e}"),
        };
        assert_eq!(
            runs(&[(0, 512), (8192, 10), (9000, 0)], 9000, 522),
            Ok(vec![(0, 512), (8192, 10)])
        );
        let e = runs(&[(4096, 512), (4000, 10)], 9000, 522).unwrap_err();
        assert!(e.contains("overlaps"), "{e}");
        let e = runs(&[(8990, 20)], 9000, 20).unwrap_err();
        assert!(e.contains("goes past the file's 9000 bytes"), "{e}");
        let e = runs(&[(0, 512)], 9000, 1024).unwrap_err();
        assert!(
            e.contains("lists 512 bytes of data, the member holds 1024"),
            "{e}"
        );
        let e = runs(&[(u64::MAX, 2)], 9000, 2).unwrap_err();
        assert!(e.contains("goes past"), "{e}");
    }

    #[test]
    fn pax_sparse_maps_are_read_and_bounded() {
        use std::io::Write;
        let mut f = tempfile::tempfile().unwrap();
        let mut map = b"2\n0\n4\n8192\n3\n".to_vec();
        map.resize(512, 0);
        f.write_all(&map).unwrap();
        f.write_all(b"abcdxyz").unwrap();
        let (at, m) = pax_sparse_map(&f, 0, 512 + 7, 8195).ok().unwrap();
        assert_eq!(at, 512);
        assert_eq!(m.segments, [(0, 4), (8192, 3)]);
        let mut buf = vec![1u8; 8195];
        read_sparse_at(&f, at, &m, &mut buf, 0).unwrap();
        assert_eq!(&buf[..4], b"abcd");
        assert!(buf[4..8192].iter().all(|&b| b == 0));
        assert_eq!(&buf[8192..], b"xyz");

        let bad = |text: &[u8], member_size| {
            let mut f = tempfile::tempfile().unwrap();
            let mut t = text.to_vec();
            t.resize(1024, 0);
            f.write_all(&t).unwrap();
            match pax_sparse_map(&f, 0, member_size, 1 << 30) {
                Err(SparseError::Bad(why)) => why,
                Err(SparseError::Io(e)) => panic!("{e}"),
                Ok(_) => panic!("accepted"),
            }
        };
        assert!(bad(b"99999999\n", 1024).contains("at most 1048576"));
        // 300 runs announced, 254 numbers in the one block the member has.
        let long = [&b"300\n"[..], &b"1\n".repeat(254)].concat();
        assert!(bad(&long, 512).contains("runs past the member's data"));
        assert!(bad(b"1\nx\n", 1024).contains("not decimal lines"));
    }

    #[test]
    fn member_names_cannot_leave_the_root() {
        let p = Path::new("b.tar");
        assert_eq!(
            member_key(p, Path::new("./etc/passwd")).unwrap(),
            "etc/passwd"
        );
        assert_eq!(member_key(p, Path::new("/usr/bin/")).unwrap(), "usr/bin");
        assert_eq!(member_key(p, Path::new("./")).unwrap(), "");
        let e = member_key(p, Path::new("etc/../../x"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("leaves the root"), "{e}");
    }
}
