//! The controller release: the files of the release directory, checked
//! against the programs robot.yaml names, normalised (root-owned, 0755 for
//! anything executable, 0644 otherwise) and described by a manifest whose
//! digest names the release.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::entry::{Data, Entry, Kind};
use crate::error::ImageBuildError;
use crate::manifest::{Manifest, ManifestEntry};

/// One file of the release, relative to the release directory.
#[derive(Debug, Clone)]
pub struct ReleaseFile {
    pub rel: String,
    pub entry: Entry,
    pub sha256: Option<String>,
}

/// The release as it goes into the image.
#[derive(Debug, Clone)]
pub struct Release {
    pub files: Vec<ReleaseFile>,
    /// The newest mtime in the release directory.
    pub newest_mtime: u64,
    /// ELF files that went in stripped ([`crate::elf::strip`]): their
    /// path in the release and the file with their debug information
    /// (the original, kept beside the image).
    pub debug: Vec<(String, PathBuf)>,
}

/// The most read of one program of an image (whole, to strip or inspect
/// it): a bound, not a size; a robot's program with its debug information
/// is tens to hundreds of MiB.
pub const MAX_PROGRAM: u64 = 4 << 30;

/// The debug file's name of a release file at `rel` (its path in the
/// release): its file name plus `.debug`.
fn debug_name(rel: &str) -> String {
    format!("{}.debug", rel.rsplit('/').next().unwrap_or(rel))
}

/// `path`'s bytes stripped of their debug information, when it is an ELF
/// file that has some, linked (`.gnu_debuglink`) to the debug file
/// `debug_name`: the name it is installed under plus `.debug`, which is
/// where the debug file is kept beside the output. `follow`: `path` may be
/// a symbolic link (a program named on the command line); a file of a
/// release tree is not followed (its links are entries of their own).
pub fn stripped(
    path: &Path,
    follow: bool,
    debug_name: &str,
) -> Result<Option<Vec<u8>>, ImageBuildError> {
    let mut magic = [0u8; 4];
    // Opened as the read below opens it (units::bounded): a FIFO is
    // refused, not waited on for its magic.
    let mut f =
        crate::entry::open_input(path, follow).map_err(ImageBuildError::io("open", path))?;
    if f.read_exact(&mut magic).is_err() || !crate::elf::is_elf(&magic) {
        return Ok(None);
    }
    // A program: read whole (it is stripped in memory), through
    // units::bounded like every input of an image.
    let bound = units::bounded::Bound::regular(MAX_PROGRAM);
    let bound = if follow {
        bound.following_links()
    } else {
        bound
    };
    let bytes = bound
        .read(path)
        .map_err(|e| ImageBuildError::io("read", path)(e.into_io()))?;
    crate::elf::strip(&bytes, debug_name, crate::elf::crc32(&bytes)).map_err(|e| {
        ImageBuildError::NotAProgram {
            path: path.display().to_string(),
            source_path: path.display().to_string(),
            why: format!("its ELF headers cannot be read: {e}"),
        }
    })
}

/// sha256 of a file, streamed.
pub fn sha256_file(path: &Path) -> Result<String, ImageBuildError> {
    let mut f = crate::entry::open_input(path, false).map_err(ImageBuildError::io("open", path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(ImageBuildError::io("read", path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// Reads the release directory (symlinks kept as links, never followed)
/// and checks that every program in `programs` is a regular executable
/// file in it ([`releases::check_programs`], the check bundles and
/// installs make too); all missing ones are listed at once. With
/// `strip`, ELF files go in without their debug information (listed in
/// [`Release::debug`]), and the manifest describes them so.
pub fn read(dir: &Path, programs: &[String], strip: bool) -> Result<Release, ImageBuildError> {
    let md = fs::metadata(dir).map_err(ImageBuildError::io("read release directory", dir))?;
    if !md.is_dir() {
        return Err(ImageBuildError::Io {
            what: "read release directory",
            path: dir.to_path_buf(),
            source: io::Error::new(io::ErrorKind::NotADirectory, "not a directory"),
        });
    }
    let mut files = Vec::new();
    let mut debug = Vec::new();
    let mut newest = 0u64;
    let mut stack: Vec<(PathBuf, String)> = vec![(dir.to_path_buf(), String::new())];
    while let Some((d, rel)) = stack.pop() {
        for de in fs::read_dir(&d).map_err(ImageBuildError::io("read directory", &d))? {
            let de = de.map_err(ImageBuildError::io("read directory", &d))?;
            let path = de.path();
            let name = de
                .file_name()
                .into_string()
                .map_err(|_| ImageBuildError::BadBase {
                    path: path.clone(),
                    reason: "file name is not UTF-8".into(),
                })?;
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let md = fs::symlink_metadata(&path).map_err(ImageBuildError::io("stat", &path))?;
            newest = newest.max(md.mtime().max(0) as u64);
            let ft = md.file_type();
            let (kind, mode, sha) = if ft.is_dir() {
                stack.push((path.clone(), r.clone()));
                (Kind::Dir, 0o755, None)
            } else if ft.is_file() {
                let exec = md.permissions().mode() & 0o111 != 0;
                let mode = if exec { 0o755 } else { 0o644 };
                match strip
                    .then(|| stripped(&path, false, &debug_name(&r)))
                    .transpose()?
                    .flatten()
                {
                    Some(bytes) => {
                        debug.push((r.clone(), path.clone()));
                        let sha = hex::encode(Sha256::digest(&bytes));
                        (
                            Kind::File {
                                size: bytes.len() as u64,
                                data: Data::Bytes(std::sync::Arc::new(bytes)),
                                link_group: None,
                            },
                            mode,
                            Some(sha),
                        )
                    }
                    None => {
                        let sha = sha256_file(&path)?;
                        (
                            Kind::File {
                                size: md.len(),
                                data: Data::Disk(path.clone()),
                                link_group: None,
                            },
                            mode,
                            Some(sha),
                        )
                    }
                }
            } else if ft.is_symlink() {
                let t = fs::read_link(&path).map_err(ImageBuildError::io("read symlink", &path))?;
                let t = t.to_str().ok_or_else(|| ImageBuildError::BadBase {
                    path: path.clone(),
                    reason: "symlink target is not UTF-8".into(),
                })?;
                (Kind::Symlink(t.to_string()), 0o777, None)
            } else {
                return Err(ImageBuildError::BadBase {
                    path,
                    reason: "the release holds only files, directories and symlinks".into(),
                });
            };
            files.push(ReleaseFile {
                rel: r,
                entry: Entry {
                    kind,
                    mode,
                    uid: 0,
                    gid: 0,
                    mtime: 0,
                    xattrs: Vec::new(),
                },
                sha256: sha,
            });
        }
    }
    files.sort_by(|a, b| a.rel.cmp(&b.rel));
    let seen: Vec<_> = files
        .iter()
        .map(|f| releases::programs::ReleaseFile {
            path: &f.rel,
            mode: f.entry.mode,
            regular: matches!(f.entry.kind, Kind::File { .. }),
        })
        .collect();
    releases::check_programs(
        &dir.display().to_string(),
        programs.iter().map(String::as_str),
        &seen,
    )?;
    debug.sort();
    Ok(Release {
        files,
        newest_mtime: newest,
        debug,
    })
}

impl Release {
    /// The release manifest (robot.yaml included, the manifest itself not).
    pub fn manifest(&self, robot: &str, version: &str, epoch: u64, robot_yaml: &[u8]) -> Manifest {
        let mut files: Vec<ManifestEntry> = self
            .files
            .iter()
            .map(|f| ManifestEntry::new(f.rel.clone(), &f.entry, f.sha256.clone(), None))
            .collect();
        let y = Entry::bytes(robot_yaml.to_vec(), 0o644, epoch);
        files.push(ManifestEntry::new(
            "robot.yaml".into(),
            &y,
            Some(hex::encode(Sha256::digest(robot_yaml))),
            None,
        ));
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Manifest {
            schema_version: 1,
            kind: "release",
            robot: robot.to_string(),
            version: version.to_string(),
            source_date_epoch: epoch,
            files,
        }
    }
}

/// A copy of the release directory `src` at `dest` for a bundle: every
/// ELF file with debug information stripped of it ([`stripped`]), the
/// others copied, permission bits kept. Returns the files copied (path,
/// mode), for the check of robot.yaml's programs, and the stripped ones
/// with the file that has their debug information (the original in
/// `src`). A release holds regular files and directories only: anything
/// else is refused here, by its path in `src`.
#[allow(clippy::type_complexity)]
pub fn stage_stripped(
    src: &Path,
    dest: &Path,
) -> Result<(Vec<(String, u32)>, Vec<(String, PathBuf)>), ImageBuildError> {
    let mut files = Vec::new();
    let mut debug = Vec::new();
    let mut stack = vec![(src.to_path_buf(), String::new())];
    fs::create_dir_all(dest).map_err(ImageBuildError::io("create", dest))?;
    while let Some((d, rel)) = stack.pop() {
        let mut entries: Vec<_> = fs::read_dir(&d)
            .map_err(ImageBuildError::io("read directory", &d))?
            .collect::<Result<_, _>>()
            .map_err(ImageBuildError::io("read directory", &d))?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let path = e.path();
            let name = e
                .file_name()
                .into_string()
                .map_err(|_| ImageBuildError::BadBase {
                    path: path.clone(),
                    reason: "file name is not UTF-8".into(),
                })?;
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let to = dest.join(&r);
            let md = fs::symlink_metadata(&path).map_err(ImageBuildError::io("stat", &path))?;
            let mode = md.permissions().mode() & 0o777;
            if md.is_dir() {
                fs::create_dir(&to).map_err(ImageBuildError::io("create", &to))?;
                stack.push((path, r));
            } else if md.is_file() {
                match stripped(&path, false, &debug_name(&r))? {
                    Some(bytes) => {
                        fs::write(&to, bytes).map_err(ImageBuildError::io("write", &to))?;
                        debug.push((r.clone(), path.clone()));
                    }
                    None => {
                        fs::copy(&path, &to).map_err(ImageBuildError::io("copy", &path))?;
                    }
                }
                fs::set_permissions(&to, fs::Permissions::from_mode(mode))
                    .map_err(ImageBuildError::io("set the mode of", &to))?;
                files.push((r, mode));
            } else {
                return Err(ImageBuildError::BadBase {
                    path,
                    reason: "a release holds regular files and directories only".into(),
                });
            }
        }
    }
    files.sort();
    debug.sort();
    Ok((files, debug))
}
