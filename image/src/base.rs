//! Reading the base root filesystem as data: a directory, a tar (plain,
//! gzip or zstd, told apart by their magic bytes), or nothing.
//!
//! Nothing here follows a symlink or trusts a path: directory bases are
//! walked with `lstat`, tar member names with `..` are refused, and a tar is
//! never held in memory (a compressed one is decompressed to a temporary file
//! next to the output, then read by offset).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::entry::{disk_data, Data, Entry, Kind, Tree};
use crate::error::ImageBuildError;

/// What the image starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// A root filesystem tree on disk.
    Dir(PathBuf),
    /// A tar archive, plain or compressed with gzip or zstd.
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
        [b'B', b'Z', b'h', ..] => {
            return Err(bad("bzip2-compressed tar is not supported (recompress it: `bzip2 -dc B | zstd -o B.tar.zst`)"))
        }
        [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => {
            return Err(bad("xz-compressed tar is not supported (recompress it: `xz -dc B | zstd -o B.tar.zst`)"))
        }
        h if h.len() >= 262 && &h[257..262] == b"ustar" => Compression::None,
        h if h.len() < 512 => return Err(bad("too short to be a tar archive")),
        _ => return Err(bad("not a tar archive (no ustar magic; expected a directory, a .tar, .tar.gz or .tar.zst, or `none`)")),
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
            let md = fs::symlink_metadata(&path).map_err(ImageBuildError::io("stat", &path))?;
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
                },
            );
        }
    }
    Ok(tree)
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
    let mut file = File::open(path).map_err(io_err("open base"))?;
    let mut head = Vec::with_capacity(512);
    (&mut file)
        .take(512)
        .read_to_end(&mut head)
        .map_err(io_err("read base"))?;
    let compression = detect(path, &head)?;
    let file = File::open(path).map_err(io_err("open base"))?;
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
            let tree = index_tar(path, &mut hashing)?;
            let data_file = File::open(path).map_err(io_err("open base"))?;
            (tree, data_file)
        }
        Compression::Gzip | Compression::Zstd => {
            let mut spool = tempfile::tempfile_in(spool_dir)
                .map_err(ImageBuildError::io("create a temporary file in", spool_dir))?;
            let copied = match compression {
                Compression::Gzip => io::copy(
                    &mut flate2::read::MultiGzDecoder::new(&mut hashing),
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
            let tree = index_tar(path, BufReader::with_capacity(1 << 20, reader))?;
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
/// recorded by offset.
fn index_tar(path: &Path, reader: impl Read) -> Result<Tree, ImageBuildError> {
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
        let member = member.map_err(|e| bad(format!("cannot read tar: {e}")))?;
        let name = member
            .path()
            .map_err(|e| bad(format!("bad member name: {e}")))?
            .into_owned();
        let key = member_key(path, &name)?;
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
            tar::EntryType::Regular | tar::EntryType::Continuous => Kind::File {
                size: member.size(),
                data: Data::TarAt {
                    offset: member.raw_file_position(),
                },
                link_group: None,
            },
            tar::EntryType::Directory => Kind::Dir,
            tar::EntryType::Symlink => Kind::Symlink(link_target()?),
            tar::EntryType::Link => {
                let target = member_key(path, Path::new(&link_target()?))?;
                let next_group = tree.entries.len() as u64;
                match tree.entries.get_mut(&target) {
                    Some(Entry {
                        kind: Kind::File { size, data, link_group },
                        ..
                    }) => {
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
            },
        );
    }
    // A tar without an entry for `./` still has a root.
    tree.entries
        .entry(String::new())
        .or_insert_with(|| Entry::dir(0o755, 0));
    Ok(tree)
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
        let e = detect(p, b"BZh91AY&SY").unwrap_err().to_string();
        assert!(e.contains("bzip2"), "{e}");
        let e = detect(p, &[0u8; 512]).unwrap_err().to_string();
        assert!(e.contains("not a tar"), "{e}");
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
