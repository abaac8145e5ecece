//! The file `apply` leaves for `verify`: what the kernel would not do, so
//! that a later verify reports it as unmovable instead of drift.
//!
//! One small JSON document (`{"unmovable_irqs":[0,9]}`), written whole
//! (to a temporary name, then renamed) so a reader never sees half of it.
//! Its place is the caller's: the on-robot layout names it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::apply::ApplyReport;

/// The most read of the file: one number per interrupt that would not
/// move, thousands of them in well under this.
pub const MAX_STATE_FILE: u64 = 1 << 20;

/// What `apply` found it could not change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyState {
    /// Interrupts whose affinity the kernel refused to set.
    pub unmovable_irqs: Vec<u32>,
}

/// Why the apply-state file could not be read or written; every variant
/// names the file.
#[derive(Debug, thiserror::Error)]
pub enum ApplyStateError {
    #[error("cannot read {}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{} is not an apply-state file", path.display())]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("cannot write {}", path.display())]
    Write { path: PathBuf, source: io::Error },
}

impl ApplyState {
    /// The state an apply run leaves.
    pub fn from_report(report: &ApplyReport) -> Self {
        ApplyState {
            unmovable_irqs: report.unmovable_irqs(),
        }
    }

    /// Reads the state at `path`; `None` when there is no file (apply has
    /// not run).
    pub fn read(path: &Path) -> Result<Option<Self>, ApplyStateError> {
        let text = match units::bounded::Bound::regular(MAX_STATE_FILE).read_text(path) {
            Ok(t) => t,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => {
                return Err(ApplyStateError::Read {
                    path: path.to_path_buf(),
                    source: e.into_io(),
                })
            }
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| ApplyStateError::Parse {
                path: path.to_path_buf(),
                source,
            })
    }

    /// Writes the state to `path`, creating its directory.
    pub fn write(&self, path: &Path) -> Result<(), ApplyStateError> {
        let failed = |source| ApplyStateError::Write {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(failed)?;
        }
        let text = serde_json::to_string(self).map_err(|e| failed(e.into()))?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        fs::write(&tmp, text)
            .and_then(|()| fs::rename(&tmp, path))
            .map_err(|e| {
                let _ = fs::remove_file(&tmp);
                failed(e)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_state_reads_back_and_absence_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("var/lib/rtdeploy/cpusets-apply.json");
        assert_eq!(ApplyState::read(&path).unwrap(), None);
        let state = ApplyState {
            unmovable_irqs: vec![0, 9],
        };
        state.write(&path).unwrap();
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            r#"{"unmovable_irqs":[0,9]}"#
        );
        assert_eq!(ApplyState::read(&path).unwrap(), Some(state));
        assert_eq!(fs::read_dir(path.parent().unwrap()).unwrap().count(), 1);
    }

    #[test]
    fn a_damaged_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cpusets-apply.json");
        fs::write(&path, "{\"unmovable").unwrap();
        let e = ApplyState::read(&path).unwrap_err();
        assert!(matches!(e, ApplyStateError::Parse { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!("{} is not an apply-state file", path.display())
        );
        assert!(std::error::Error::source(&e).is_some());
    }
}
