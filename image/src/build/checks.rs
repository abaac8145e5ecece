//! What the build refuses or warns about before it writes: an output among
//! its inputs, programs built for another board, holes cpio cannot hold.

use std::fs;
use std::path::Path;

use super::{paths, ImageSpec};
use crate::base::Base;
use crate::entry::{Entry, Kind, Tree};
use crate::error::ImageBuildError;
use crate::release;

/// Checks every program the image carries, the deploy binary and the
/// release's, against the board and the base ([`crate::programs`]).
pub(super) fn check_programs(
    spec: &ImageSpec,
    tree: &Tree,
    release_dir: &str,
) -> Result<Vec<String>, ImageBuildError> {
    let mut owned: Vec<(String, String, Vec<u8>)> = Vec::new();
    let mut listed = vec![paths::DEPLOY.to_string()];
    listed.extend(spec.tools.iter().map(|(p, _)| p.clone()));
    for exec in &spec.programs {
        if let Some(r) = releases::programs::in_release(exec) {
            listed.push(format!("{release_dir}/{r}"));
        }
    }
    listed.dedup();
    for path in listed {
        let Some(Entry {
            kind: Kind::File { size, data, .. },
            ..
        }) = tree.entries.get(&path)
        else {
            continue;
        };
        let tool = spec.tools.iter().find(|(p, _)| *p == path);
        let source = if path == paths::DEPLOY {
            spec.deploy_binary.clone()
        } else if let Some((_, src)) = tool {
            src.clone()
        } else {
            spec.release
                .join(path.trim_start_matches(release_dir).trim_start_matches('/'))
        };
        // Read whole to be inspected, at most as much as a program of the
        // release is read to be stripped (release::MAX_PROGRAM).
        let bytes = tree
            .open(&path, *size, data)
            .and_then(|mut r| {
                units::bounded::read_at_most(&mut r, &source, release::MAX_PROGRAM)
                    .map_err(units::bounded::FileReadError::into_io)
            })
            .map_err(ImageBuildError::io("read", &source))?;
        owned.push((path, source.display().to_string(), bytes));
    }
    let programs: Vec<crate::programs::Program> = owned
        .iter()
        .map(|(path, source, bytes)| crate::programs::Program {
            path: path.clone(),
            source: source.clone(),
            bytes,
        })
        .collect();
    crate::programs::check(
        &crate::programs::Target {
            board: &spec.board,
            arch: spec.arch.as_deref(),
        },
        tree,
        !matches!(spec.base, Base::None),
        &programs,
    )
}

/// Refuses an output the build would read back or overwrite: anywhere
/// inside a directory the image is made from (the base directory, the
/// release), or one of the input files themselves (a tar base, the deploy
/// binary).
///
/// Refusing, rather than leaving the output out of the walk, because the
/// output directory also receives the sidecars and the temporary files of
/// the build, so every build would change its own input: the image would
/// depend on what earlier builds left there, and a file of the base that
/// happens to have the output's name would be silently dropped (or, with
/// `--force`, overwritten). Both directory walks list entries with
/// `lstat` and never follow a symlink, so the test is on the real
/// directory: the output's directory, symlinks resolved, and each of its
/// parents are compared with the input directory by device and inode.
pub(super) fn check_output_outside_inputs(
    spec: &ImageSpec,
    out: &Path,
    out_dir: &Path,
) -> Result<(), ImageBuildError> {
    use std::os::unix::fs::MetadataExt;
    let id = |md: fs::Metadata| (md.dev(), md.ino());
    let refuse = |reason: String| ImageBuildError::Conflict {
        path: out.display().to_string(),
        reason,
    };
    // A directory that does not exist yet holds nothing the build reads;
    // creating the temporary file there fails later with its own error.
    let Ok(real_out_dir) = fs::canonicalize(out_dir) else {
        return Ok(());
    };
    let mut dirs = vec![("release directory", spec.release.as_path())];
    if let Base::Dir(dir) = &spec.base {
        dirs.push(("base directory", dir.as_path()));
    }
    for (what, dir) in dirs {
        let Ok(dir_id) = fs::metadata(dir).map(id) else {
            continue;
        };
        let inside = real_out_dir
            .ancestors()
            .any(|a| fs::metadata(a).map(id).ok() == Some(dir_id));
        if inside {
            return Err(refuse(format!(
                "the output is inside the {what} {}, which the image is made from \
                 (it would take in earlier images and their temporary files); \
                 write it outside {}",
                dir.display(),
                dir.display()
            )));
        }
    }
    if let Ok(out_id) = fs::metadata(out).map(id) {
        let mut files = vec![("deploy binary", spec.deploy_binary.as_path())];
        files.extend(spec.tools.iter().map(|(_, src)| ("program", src.as_path())));
        if let Base::Tar(tar) = &spec.base {
            files.push(("base", tar.as_path()));
        }
        for (what, file) in files {
            if fs::metadata(file).map(id).ok() == Some(out_id) {
                return Err(refuse(format!(
                    "the output is the {what} {} the image is made from; write it to another file",
                    file.display()
                )));
            }
        }
    }
    Ok(())
}

/// cpio (newc) has no way to say a run of a file is a hole: files with
/// holes are written whole, zeros included, and the warning says which
/// and how much that adds.
pub(super) fn cpio_holes_warning(tree: &Tree) -> Option<String> {
    let mut seen = std::collections::HashSet::new();
    let mut names = Vec::new();
    let mut zeros = 0;
    for (path, e) in &tree.entries {
        if let Kind::File {
            size,
            data,
            link_group,
        } = &e.kind
        {
            if let Some(map) = data.sparse_map() {
                if link_group.is_none_or(|g| seen.insert(g)) {
                    names.push(format!("/{path}"));
                    zeros += size - map.data_bytes();
                }
            }
        }
    }
    const SHOWN: usize = 5;
    let more = names.len().saturating_sub(SHOWN);
    let count = names.len();
    names.truncate(SHOWN);
    if more > 0 {
        names.push(format!("and {more} more"));
    }
    (count > 0).then(|| {
        format!(
            "cpio cannot hold holes: {count} sparse file(s) are written as data, {zeros} bytes of zeros in all: {}",
            names.join(", ")
        )
    })
}
