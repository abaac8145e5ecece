//! Writes a signed bundle from a release directory, deterministically.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::hash::{sha256_file, Sha256Hex};
use super::keys::SecretKey;
use super::manifest::{
    FileEntry, Manifest, ManifestError, MANIFEST_FORMAT, MANIFEST_NAME, SIGNATURE_NAME,
};
use crate::name::release_name;

/// zstd level for bundles: good ratio at a speed that bundles 100 MB in
/// seconds.
const BUNDLE_ZSTD_LEVEL: i32 = 9;

/// What to bundle.
#[derive(Debug, Clone)]
pub struct BundleSpec {
    /// The release directory (`bin/...` and any other files).
    pub release_dir: PathBuf,
    pub version: String,
    /// `robot.name` and `board.model` from the release's robot.yaml.
    pub robot: String,
    pub board: String,
    /// The release's robot.yaml, verbatim.
    pub robot_yaml: String,
    /// The programs that robot.yaml runs (`processes[].exec`): each must
    /// be an executable file of the release ([`crate::programs`]).
    pub programs: Vec<String>,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct BundleWritten {
    pub manifest: Manifest,
    /// `<version>-<sha8>`, the directory name the release gets on the robot.
    pub release: String,
    pub bytes: u64,
}

/// Why a bundle could not be written.
#[derive(Debug, thiserror::Error)]
pub enum BundleWriteError {
    #[error("cannot read release file {}: {err}", path.display())]
    Read { path: PathBuf, err: std::io::Error },
    #[error("{} is a {kind}; a release holds regular files and directories only", path.display())]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{} has a name that is not UTF-8", path.display())]
    NotUtf8 { path: PathBuf },
    #[error("cannot write bundle {}: {err}", path.display())]
    Write { path: PathBuf, err: std::io::Error },
    #[error("release {}: {err}", dir.display())]
    Manifest { dir: PathBuf, err: ManifestError },
    #[error(transparent)]
    Programs(#[from] crate::programs::ReleaseProgramsError),
}

/// Builds the manifest for `spec` (hashing every file) without writing.
pub fn build_manifest(spec: &BundleSpec) -> Result<(Manifest, Vec<PathBuf>), BundleWriteError> {
    let mut files = Vec::new();
    walk(&spec.release_dir, "", &mut files)?;
    files.sort_by(|a, b| a.0.path.cmp(&b.0.path));
    let manifest = Manifest {
        format: MANIFEST_FORMAT,
        robot: spec.robot.clone(),
        board: spec.board.clone(),
        version: spec.version.clone(),
        robot_yaml: spec.robot_yaml.clone(),
        files: files.iter().map(|(e, _)| e.clone()).collect(),
    };
    manifest
        .validate()
        .map_err(|err| BundleWriteError::Manifest {
            dir: spec.release_dir.clone(),
            err,
        })?;
    manifest.check_programs(
        &spec.release_dir.display().to_string(),
        spec.programs.iter().map(String::as_str),
    )?;
    Ok((manifest, files.into_iter().map(|(_, p)| p).collect()))
}

fn walk(
    dir: &Path,
    rel: &str,
    out: &mut Vec<(FileEntry, PathBuf)>,
) -> Result<(), BundleWriteError> {
    let read_err = |path: &Path| {
        let path = path.to_path_buf();
        move |err| BundleWriteError::Read { path, err }
    };
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(read_err(dir))?
        .collect::<Result<_, _>>()
        .map_err(read_err(dir))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        let name = e
            .file_name()
            .into_string()
            .map_err(|_| BundleWriteError::NotUtf8 { path: path.clone() })?;
        let relpath = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        // The installer writes these itself at the top of a release.
        if rel.is_empty() && ["robot.yaml", MANIFEST_NAME, SIGNATURE_NAME].contains(&name.as_str())
        {
            continue;
        }
        let md = std::fs::symlink_metadata(&path).map_err(read_err(&path))?;
        let ft = md.file_type();
        if ft.is_dir() {
            walk(&path, &relpath, out)?;
        } else if ft.is_file() {
            let (sha, size) = sha256_file(&path).map_err(read_err(&path))?;
            let entry = FileEntry {
                path: relpath,
                mode: md.permissions().mode() & 0o777,
                size,
                sha256: sha.to_string(),
            };
            out.push((entry, path));
        } else {
            let kind = if ft.is_symlink() {
                "symbolic link"
            } else {
                "special file"
            };
            return Err(BundleWriteError::NotRegular { path, kind });
        }
    }
    Ok(())
}

/// Writes `out` (via a temporary file and rename): `manifest.json`,
/// `manifest.sig`, then each distinct blob once in hash order, every tar
/// header with fixed owner, mode and time, so the bytes depend only on the
/// release contents, the version and the key.
pub fn write_bundle(
    spec: &BundleSpec,
    key: &SecretKey,
    out: &Path,
) -> Result<BundleWritten, BundleWriteError> {
    let (manifest, sources) = build_manifest(spec)?;
    let bytes = manifest.to_bytes();
    let sig = key.sign(&bytes);
    let werr = |err| BundleWriteError::Write {
        path: out.to_path_buf(),
        err,
    };
    let tmp = {
        let mut s = out.as_os_str().to_owned();
        s.push(".tmp");
        PathBuf::from(s)
    };
    let result = (|| {
        let file = File::create(&tmp).map_err(werr)?;
        let mut enc = zstd::Encoder::new(BufWriter::new(file), BUNDLE_ZSTD_LEVEL).map_err(werr)?;
        enc.include_checksum(true).map_err(werr)?;
        let mut tar = tar::Builder::new(enc);
        append(&mut tar, MANIFEST_NAME, bytes.len() as u64, &bytes[..]).map_err(werr)?;
        append(&mut tar, SIGNATURE_NAME, 64, &sig[..]).map_err(werr)?;
        let mut seen = std::collections::BTreeMap::<Sha256Hex, &Path>::new();
        for (f, src) in manifest.files.iter().zip(&sources) {
            seen.entry(Sha256Hex::parse(&f.sha256).expect("validated"))
                .or_insert(src);
        }
        for (sha, src) in &seen {
            let file = units::bounded::Bound::regular(u64::MAX)
                .open(src)
                .map_err(|e| BundleWriteError::Read {
                    path: src.to_path_buf(),
                    err: e.into_io(),
                })?;
            let size = file.metadata().map_err(werr)?.len();
            append(&mut tar, &format!("blobs/{sha}"), size, file).map_err(werr)?;
        }
        let enc = tar.into_inner().map_err(werr)?;
        let mut w = enc.finish().map_err(werr)?;
        w.flush().map_err(werr)?;
        let f = w.into_inner().map_err(|e| werr(e.into_error()))?;
        f.sync_all().map_err(werr)?;
        std::fs::rename(&tmp, out).map_err(werr)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    let size = std::fs::metadata(out).map_err(werr)?.len();
    // A file changed while it was bundled would make a bundle that no robot
    // accepts; catch it here instead.
    for (f, src) in manifest.files.iter().zip(&sources) {
        let (sha, _) = sha256_file(src).map_err(|err| BundleWriteError::Read {
            path: src.clone(),
            err,
        })?;
        if sha.as_str() != f.sha256 {
            let _ = std::fs::remove_file(out);
            return Err(BundleWriteError::Read {
                path: src.clone(),
                err: std::io::Error::other("file changed while it was bundled"),
            });
        }
    }
    let release = release_name(&manifest.version, &bytes);
    Ok(BundleWritten {
        manifest,
        release,
        bytes: size,
    })
}

fn append<W: Write, R: std::io::Read>(
    tar: &mut tar::Builder<W>,
    name: &str,
    size: u64,
    data: R,
) -> std::io::Result<()> {
    let mut h = tar::Header::new_ustar();
    h.set_path(name)?;
    h.set_size(size);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    tar.append(&h, data)
}
