//! The files beside the image and how every output gets into place: under a
//! temporary name first, then renamed.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::ImageBuildError;

/// The directory of the stripped programs' debug information, next to the
/// image.
pub fn debug_sidecar(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    out.with_file_name(format!("{name}.debug"))
}

/// The sidecar files written next to the image.
pub fn sidecars(out: &Path) -> (PathBuf, PathBuf) {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    (
        out.with_file_name(format!("{name}.manifest.json")),
        out.with_file_name(format!("{name}.cdx.json")),
    )
}

/// Writes `dest/<path>.debug` for every stripped program (the file as
/// given, with its debug information) under a temporary name beside
/// `dest`, and moves it into place; an older one there (`--force`) goes.
/// `None` when nothing was stripped (and an older directory is removed).
pub fn write_debug_dir(
    dest: &Path,
    files: &[(String, PathBuf)],
) -> Result<Option<PathBuf>, ImageBuildError> {
    let out_dir = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let out_name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let remove_old = || -> Result<(), ImageBuildError> {
        if fs::symlink_metadata(dest).is_ok_and(|m| m.is_dir()) {
            fs::remove_dir_all(dest).map_err(ImageBuildError::io("remove", dest))?;
        }
        Ok(())
    };
    if files.is_empty() {
        remove_old()?;
        return Ok(None);
    }
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{out_name}."))
        .tempdir_in(&out_dir)
        .map_err(ImageBuildError::io(
            "create a temporary directory in",
            &out_dir,
        ))?;
    for (path, src) in files {
        let to = tmp.path().join(format!("{path}.debug"));
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent).map_err(ImageBuildError::io("create", parent))?;
        }
        fs::copy(src, &to).map_err(ImageBuildError::io("copy the debug information of", src))?;
        std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .map_err(ImageBuildError::io("set the mode of", &to))?;
    }
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .map_err(ImageBuildError::io("set the mode of", tmp.path()))?;
    remove_old()?;
    let tmp = tmp.keep();
    fs::rename(&tmp, dest).map_err(ImageBuildError::io("rename into", dest))?;
    Ok(Some(dest.to_path_buf()))
}

/// Renames `tmp` to `dest`. A regular file already at `dest` (`--force`)
/// is swapped out with `renameat2(RENAME_EXCHANGE)` and then removed,
/// rather than renamed over: ext4 (`auto_da_alloc`) answers a rename over a
/// file by allocating and submitting every block of the new one in the
/// renaming process, which writes the image out on the build's time (a
/// twentieth of a 256 MB tar.zst build). The replacement is as atomic
/// either way: `dest` names the old file, then the new one, never nothing.
/// Durability is `--sync`'s (fsync before the rename), and the same either
/// way. Where the exchange fails (a filesystem without it), the plain
/// rename is tried and its error reported.
pub(super) fn persist(tmp: tempfile::NamedTempFile, dest: &Path) -> Result<(), ImageBuildError> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    if fs::symlink_metadata(dest).is_ok_and(|md| md.is_file())
        && renameat_with(CWD, tmp.path(), CWD, dest, RenameFlags::EXCHANGE).is_ok()
    {
        // `tmp` names the old file now; dropping it removes that.
        return Ok(());
    }
    tmp.persist(dest)
        .map(drop)
        .map_err(|e| ImageBuildError::io("rename into", dest)(e.error))
}

/// The process umask (read by setting it and putting it back).
pub(super) fn umask() -> u32 {
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
    rustix::process::umask(old);
    old.as_raw_mode() as u32
}

pub(super) fn write_temp(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    sync: bool,
) -> Result<tempfile::NamedTempFile, ImageBuildError> {
    let mut t = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(ImageBuildError::io("create a temporary file in", dir))?;
    t.write_all(bytes)
        .and_then(|_| if sync { t.as_file().sync_all() } else { Ok(()) })
        .map_err(ImageBuildError::io("write", t.path().to_path_buf()))?;
    std::fs::set_permissions(
        t.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o666 & !umask()),
    )
    .map_err(ImageBuildError::io(
        "set the mode of",
        t.path().to_path_buf(),
    ))?;
    Ok(t)
}
