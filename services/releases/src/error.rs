//! Why a release operation failed.

use std::io;
use std::path::{Path, PathBuf};

use crate::bundle::{BundleReadError, KeyError, StoreError};
use crate::lock::UpdateLockError;

/// Why a release operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("{}: {err}", path.display())]
    Io { path: PathBuf, err: io::Error },
    #[error("state file {} is not valid: {why}", path.display())]
    State { path: PathBuf, why: String },
    #[error("release `{release}` is in trial; it must be committed or rolled back before another install")]
    TrialInProgress { release: String },
    #[error("release `{release}` changes the system and has not run yet: reboot first, its trial is judged after the reboot")]
    RebootPending { release: String },
    #[error("release {release} changes the system, and {why}")]
    System { release: String, why: String },
    #[error("boot attempts: {why}")]
    BootAttempts { why: String },
    #[error("no release is in trial (state: {state})")]
    NotInTrial { state: String },
    #[error("nothing to roll back to: {why}")]
    NoPrevious { why: String },
    #[error("release {} is missing or incomplete: {why}", path.display())]
    Incomplete { path: PathBuf, why: String },
    #[error(transparent)]
    Lock(#[from] UpdateLockError),
    #[error(transparent)]
    Keys(#[from] KeyError),
    #[error(transparent)]
    Bundle(#[from] BundleReadError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("update connection: {0}")]
    Connection(io::Error),
    #[error("update protocol: {0}")]
    Protocol(String),
    #[error("release {release}: its robot.yaml is not valid: {why}")]
    RobotYaml { release: String, why: String },
    #[error("release {release} needs blob {sha} (for `{path}`), which the store does not hold")]
    MissingBlob {
        release: String,
        sha: String,
        path: String,
    },
}

/// Opens a regular file of the release store (never through a link: the
/// store's own files are never links), without waiting on a FIFO and
/// refusing a device ([`units::bounded`]).
pub(crate) fn open_regular(path: &Path) -> io::Result<std::fs::File> {
    units::bounded::Bound::regular(u64::MAX)
        .open(path)
        .map_err(|e| e.into_io())
}

/// Reads a regular file of the store whole, at most `limit` bytes (more is
/// an error, `InvalidData`); a missing file is `NotFound`.
pub(crate) fn read_regular(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    units::bounded::Bound::regular(limit)
        .read(path)
        .map_err(|e| e.into_io())
}

pub(crate) fn ioe(path: &Path) -> impl FnOnce(io::Error) -> ReleaseError + '_ {
    move |err| ReleaseError::Io {
        path: path.to_path_buf(),
        err,
    }
}
