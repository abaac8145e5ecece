//! What every command gets: the global options, resolved.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// The JSON schema version every `--json` document carries.
pub const SCHEMA_VERSION: u32 = 1;

/// How a command ended, as the exit code says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: done, or every check passed.
    Ok,
    /// 1: a check, verify or budget found a problem.
    Failed,
    /// 2: could not run (bad input, missing permission, ...).
    Error,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Failed => 1,
            Exit::Error => 2,
        }
    }
}

/// The global options, resolved once in `main`.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// Every on-robot path is under this directory (`/` on a robot).
    pub prefix: PathBuf,
    /// `/proc` and `/sys` are read under this directory (`/` on a robot).
    pub sysroot: PathBuf,
    /// The robot description.
    pub config_path: PathBuf,
    /// Print one JSON document on stdout and nothing else there.
    pub json: bool,
    /// -q: no progress, no notes.
    pub quiet: bool,
    /// -v count: more detail on stderr.
    pub verbose: u8,
}

impl Ctx {
    /// An on-robot path (`/etc/rtdeploy`, `/run/rtdeploy/control.sock`, ...)
    /// under `--prefix`.
    pub fn root(&self, abs: &str) -> PathBuf {
        join_under(&self.prefix, abs)
    }

    /// A kernel path (`/proc/...`, `/sys/...`) under `--sysroot`.
    pub fn sys(&self, abs: &str) -> PathBuf {
        join_under(&self.sysroot, abs)
    }

    /// Prints `value` as the command's one JSON document, with
    /// `schema_version` first.
    pub fn print_json<T: Serialize>(&self, value: &T) -> anyhow::Result<()> {
        let mut doc = serde_json::to_value(value)?;
        if let serde_json::Value::Object(map) = &mut doc {
            let mut with_version = serde_json::Map::new();
            with_version.insert("schema_version".into(), SCHEMA_VERSION.into());
            with_version.extend(std::mem::take(map));
            doc = serde_json::Value::Object(with_version);
        }
        let mut text = serde_json::to_string_pretty(&doc)?;
        text.push('\n');
        write_stdout(&text)
    }

    /// A note on stderr unless -q.
    pub fn note(&self, msg: impl std::fmt::Display) {
        if !self.quiet {
            eprintln!("{msg}");
        }
    }

    /// Detail on stderr with -v.
    pub fn detail(&self, msg: impl std::fmt::Display) {
        if self.verbose > 0 {
            eprintln!("{msg}");
        }
    }
}

/// Writes to stdout; a reader that went away (`deploy plan | head`) ends
/// the process quietly instead of panicking.
pub fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        r => Ok(r?),
    }
}

/// `base` joined with an absolute path, as if `base` were `/`, through
/// [`units::path::join_under`]: for the program's own constant paths,
/// which have no `..` (robot.yaml's paths are refused at validation when
/// they do, and joined with `units::path::join_under` where used).
pub fn join_under(base: &Path, abs: &str) -> PathBuf {
    units::path::join_under(base, abs).expect("an on-robot path of the program's own")
}
