//! Paths from robot.yaml (or the command line) put under a root: the
//! install prefix (`--prefix`) or the sysroot (`--sysroot`).
//!
//! robot.yaml writes on-robot paths as absolute paths (`log.dir:
//! /var/log/rtdeploy/mcap`, `metrics.textfile: /var/lib/node_exporter/
//! textfile/rtdeploy.prom`) that mean "under the prefix". [`join_under`]
//! is the one function that makes such a path: it refuses a `..`
//! component (which would climb out of the prefix however deep it sits)
//! and a NUL byte, so what it returns always starts with the root.
//! Validation ([`check`]) refuses the same paths with the same words, so
//! `config check` says so at the value's line and column before anything
//! runs. [`resolved_within`] is for a writer about to create something
//! there: it also refuses a symbolic link on the way that leads outside.

use std::path::{Component, Path, PathBuf};

/// Where channels live on a robot, as an absolute path; under `--prefix`
/// it is `<prefix>/dev/shm/rtdeploy`. The one spelling of this directory:
/// the on-robot layout, the runtime's default and the check take it from
/// here.
pub const SHM_DIR: &str = "/dev/shm/rtdeploy";

/// Why a path cannot be put under a root.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathJoinError {
    #[error("`{path}` is empty")]
    Empty { path: String },
    #[error("`{path}` has a `..` component, which would lead out of the prefix")]
    Parent { path: String },
    #[error("`{path}` holds a NUL byte")]
    Nul { path: String },
    #[error("`{path}` leads out of {} through a symbolic link (it resolves to {})", root.display(), resolved.display())]
    Outside {
        path: String,
        root: PathBuf,
        resolved: PathBuf,
    },
}

/// Checks that `path` can be put under a root: not empty, no `..`
/// component, no NUL byte. `.` components and repeated slashes are fine.
pub fn check(path: &str) -> Result<(), PathJoinError> {
    let p = || path.to_string();
    if path.is_empty() {
        return Err(PathJoinError::Empty { path: p() });
    }
    if path.contains('\0') {
        return Err(PathJoinError::Nul { path: p() });
    }
    if Path::new(path)
        .components()
        .any(|c| c == Component::ParentDir)
    {
        return Err(PathJoinError::Parent { path: p() });
    }
    Ok(())
}

/// `root` joined with `path` (absolute or relative: both mean under
/// `root`), as if `root` were `/`. The result starts with `root`: a path
/// that would leave it is refused ([`check`]).
pub fn join_under(root: &Path, path: &str) -> Result<PathBuf, PathJoinError> {
    check(path)?;
    let mut out = root.to_path_buf();
    for c in Path::new(path).components() {
        if let Component::Normal(part) = c {
            out.push(part);
        }
    }
    Ok(out)
}

/// Checks that `path` (made by [`join_under`] from `root`) stays inside
/// `root` once symbolic links are resolved: the nearest part of it that
/// exists is resolved and must lie under the resolved `root`. For a writer
/// that is about to create a directory or a file there.
pub fn resolved_within(root: &Path, path: &Path) -> Result<(), PathJoinError> {
    let Ok(root_real) = root.canonicalize() else {
        // No root yet: nothing under it can be a link.
        return Ok(());
    };
    let mut probe = Some(path);
    while let Some(p) = probe {
        if let Ok(real) = p.canonicalize() {
            if real.starts_with(&root_real) {
                return Ok(());
            }
            return Err(PathJoinError::Outside {
                path: path.display().to_string(),
                root: root.to_path_buf(),
                resolved: real,
            });
        }
        probe = p.parent();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_go_under_the_root() {
        let r = Path::new("/pre");
        assert_eq!(
            join_under(r, "/var/log/x").unwrap(),
            Path::new("/pre/var/log/x")
        );
        assert_eq!(
            join_under(r, "var//./log/x").unwrap(),
            Path::new("/pre/var/log/x")
        );
        assert_eq!(join_under(r, "/").unwrap(), Path::new("/pre"));
    }

    #[test]
    fn what_would_leave_the_root_is_refused() {
        let r = Path::new("/pre");
        for p in ["/../../tmp/x.prom", "a/../../b", "..", "/var/.."] {
            let e = join_under(r, p).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("`{p}` has a `..` component, which would lead out of the prefix")
            );
        }
        assert!(matches!(
            join_under(r, "").unwrap_err(),
            PathJoinError::Empty { .. }
        ));
        assert!(matches!(
            join_under(r, "/a\0b").unwrap_err(),
            PathJoinError::Nul { .. }
        ));
        // `..` inside a name is a name.
        assert_eq!(join_under(r, "/a..b").unwrap(), Path::new("/pre/a..b"));
    }

    #[test]
    fn a_link_out_of_the_root_is_found() {
        let d = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        let root = d.path().join("pre");
        std::fs::create_dir_all(root.join("var")).unwrap();
        std::os::unix::fs::symlink(out.path(), root.join("var/log")).unwrap();
        let inside = join_under(&root, "/var/lib/x.prom").unwrap();
        resolved_within(&root, &inside).unwrap();
        let through = join_under(&root, "/var/log/rtdeploy/mcap").unwrap();
        let e = resolved_within(&root, &through).unwrap_err();
        assert!(matches!(e, PathJoinError::Outside { .. }), "{e}");
    }
}
