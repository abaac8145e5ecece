//! What can go wrong while building an image.

use std::path::PathBuf;

/// Why `build` refused or failed. Every variant names the offending path or
/// value; nothing of the output is left behind when one is returned.
#[derive(Debug, thiserror::Error)]
pub enum ImageBuildError {
    #[error("cannot {what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("output {} exists (pass --force to replace it)", path.display())]
    OutputExists { path: PathBuf },
    #[error("base {} is not a root filesystem: no {} (expected at least /etc and /usr directories)", base.display(), missing.join(", no "))]
    NotRootFs { base: PathBuf, missing: Vec<String> },
    #[error("{path} (from {source_path}) is built for {found}, but {want}: build it for {target} (for a Jetson: `cargo build --release --target aarch64-unknown-linux-gnu`, as scripts/build-aarch64.sh does)")]
    ProgramMachine {
        path: String,
        source_path: String,
        found: String,
        want: String,
        target: String,
    },
    #[error("{path} (from {source_path}) cannot run on this base: {}: link it statically, or use a base that has them", problems.join("; "))]
    ProgramNeeds {
        path: String,
        source_path: String,
        problems: Vec<String>,
    },
    #[error("{path} (from {source_path}) is not a program: {why}")]
    NotAProgram {
        path: String,
        source_path: String,
        why: String,
    },
    /// The release lacks programs its robot.yaml runs (the check
    /// `deploy bundle` and `deploy install` make too).
    #[error(transparent)]
    Programs(#[from] releases::ReleaseProgramsError),
    #[error("base {}: {reason}", path.display())]
    BadBase { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Conflict { path: String, reason: String },
    #[error("the {format} format cannot hold {}", what.join(", "))]
    Unrepresentable {
        format: &'static str,
        what: Vec<String>,
    },
    #[error("{path}: {}", problems.join("; "))]
    Extlinux { path: String, problems: Vec<String> },
    #[error("{tool} not found on PATH (install the Debian package `{package}`)")]
    ToolMissing {
        tool: &'static str,
        package: &'static str,
    },
    #[error("{tool} failed ({status}): {stderr}")]
    ToolFailed {
        tool: &'static str,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error(
        "image size {size} bytes is too small for {needed} bytes of content (pass a larger --size)"
    )]
    TooSmall { size: u64, needed: u64 },
}

impl ImageBuildError {
    pub(crate) fn io(
        what: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| ImageBuildError::Io { what, path, source }
    }
}
