//! A small owned temporary directory, removed on drop: the check's
//! workers write their files there and the benchmarks their channels, so
//! the library needs no extra dependency for it.

use std::io;
use std::path::{Path, PathBuf};

/// A directory this process created; removed with its contents on drop.
#[derive(Debug)]
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    /// Creates `<parent>/<name>` (and `parent` as needed).
    pub fn new(parent: &Path, name: &str) -> io::Result<TempDir> {
        let p = parent.join(name);
        std::fs::create_dir_all(&p)?;
        Ok(TempDir(p))
    }

    /// Creates `<parent>/<prefix>-<pid>-<monotonic ns>`, a name no other
    /// run on this machine picks.
    pub fn unique(parent: &Path, prefix: &str) -> io::Result<TempDir> {
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            controller::Monotonic::now().as_nanos()
        );
        TempDir::new(parent, &name)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_created_unique_and_removed_on_drop() {
        let base = tempfile::tempdir().unwrap();
        let a = TempDir::unique(&base.path().join("sub"), "t").unwrap();
        let b = TempDir::unique(&base.path().join("sub"), "t").unwrap();
        assert_ne!(a.path(), b.path());
        std::fs::write(a.path().join("f"), b"x").unwrap();
        let p = a.path().to_path_buf();
        drop(a);
        assert!(!p.exists());
        assert!(b.path().is_dir());
    }
}
