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
}

/// sha256 of a file, streamed.
pub fn sha256_file(path: &Path) -> Result<String, ImageBuildError> {
    let mut f = fs::File::open(path).map_err(ImageBuildError::io("open", path))?;
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
/// installs make too); all missing ones are listed at once.
pub fn read(dir: &Path, programs: &[String]) -> Result<Release, ImageBuildError> {
    let md = fs::metadata(dir).map_err(ImageBuildError::io("read release directory", dir))?;
    if !md.is_dir() {
        return Err(ImageBuildError::Io {
            what: "read release directory",
            path: dir.to_path_buf(),
            source: io::Error::new(io::ErrorKind::NotADirectory, "not a directory"),
        });
    }
    let mut files = Vec::new();
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
                let sha = sha256_file(&path)?;
                (
                    Kind::File {
                        size: md.len(),
                        data: Data::Disk(path.clone()),
                        link_group: None,
                    },
                    if exec { 0o755 } else { 0o644 },
                    Some(sha),
                )
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
    Ok(Release {
        files,
        newest_mtime: newest,
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
