//! Our Mender update module (module type `rtdeploy-release`, run as
//! `deploy mender-module STATE FILES_DIR`), and the artifact that carries a
//! bundle to it. What it needs of the robot beyond the release store (its
//! robot.yaml, its supervisor) it asks through [`ModuleEnv`].
//!
//! Fleets that run Mender hand it our signed bundle wrapped in a
//! module-image artifact (`deploy bundle --mender-artifact`); Mender's
//! client downloads it and calls this module once per state of its update
//! module protocol (v3), with FILES_DIR its work directory for this
//! artifact (`files/` holds the bundle, `tmp/` is ours). Our guarantees stay
//! in force inside Mender:
//!
//! - `ArtifactInstall` verifies the bundle's ed25519 signature, robot and
//!   board and installs it in trial through the same code as `deploy
//!   install` (nothing is written before the signature holds);
//! - `ArtifactCommit` does not decide anything: it waits (at most
//!   `update.mender.verdict_timeout`) for the supervisor's verdict on the
//!   trial (health and timing budgets for `update.health_window`); it exits
//!   0 once the supervisor committed, non-zero when the trial was rolled
//!   back (or no verdict came), so Mender rolls back and reports failure;
//! - `ArtifactRollback` goes back to the release that ran before this
//!   artifact, unless that is already so (the supervisor rolled back first).
//!
//! Mender may run a state again (after a power cut, or a client restart),
//! so each state is idempotent: what this artifact installed and what ran
//! before is kept in `FILES_DIR/tmp/rtdeploy-release.json`, written before
//! the install starts and again when it ends, with the sha256 of the
//! bundle it was made for; each state compares it with `state.json` and
//! the `current` link and only acts on a difference (an install is found
//! done only when the record names the bundle in `files/`, byte for byte,
//! and its release is current: a record left by another payload does not
//! skip this one). A
//! trial interrupted by a power cut is rolled back by the supervisor at
//! its next start anyway.
//!
//! Controller-only releases need no reboot (`NeedsArtifactReboot` answers
//! `No`). A release that also changes the system (kernel command line, CPU
//! plan: [`crate::system`]) sets the record's `reboot`, so
//! `NeedsArtifactReboot` answers `Automatic`: Mender reboots into the new
//! boot label, `ArtifactVerifyReboot` checks that the release survived the
//! start-up recovery, and `ArtifactCommit` waits for the supervisor's
//! verdict as for any trial. A rollback writes the previous extlinux.conf
//! back; Mender's reboot after it boots the previous line.
//!
//! Protocol: stdout carries only the answers of `NeedsArtifactReboot` and
//! `SupportsRollback`; everything else goes to stderr, which Mender logs.
//! A state this module does not know exits 0 with nothing printed, as the
//! protocol asks. Exit: 0 done; 1 the trial was rolled back or no verdict
//! came in time; 2 error (refused bundle, no bundle, I/O).

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::{
    link_target, read_state, InstallOptions, InstallReport, Layout, ReleaseError, ReleaseState,
    UpdateLock, UpdateLockError,
};

/// The module type: the payload type of our artifacts and the module's
/// file name under Mender's modules directory.
pub const MODULE_TYPE: &str = "rtdeploy-release";

/// Where `deploy image` installs the module, relative to the image root
/// (Mender 3's fixed modules directory).
pub const MODULE_PATH: &str = "usr/share/mender/modules/v3/rtdeploy-release";

/// What this artifact did, in `FILES_DIR/tmp/`.
const RECORD: &str = "rtdeploy-release.json";

/// How often the commit looks at `state.json` while it waits.
const POLL: Duration = Duration::from_millis(200);

/// How long the commit waits for the supervisor to say why it rolled back.
const REASON_WAIT: Duration = Duration::from_secs(3);

/// Why a state of the module failed (exit 2 for Mender).
#[derive(Debug, thiserror::Error)]
pub enum MenderError {
    #[error("cannot read {}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("cannot parse {}", path.display())]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("cannot create {}", path.display())]
    Create { path: PathBuf, source: io::Error },
    #[error("cannot write {}", path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("cannot rename to {}", path.display())]
    Rename { path: PathBuf, source: io::Error },
    #[error("cannot sync {}", path.display())]
    Sync { path: PathBuf, source: io::Error },
    #[error("cannot remove {}", path.display())]
    Remove { path: PathBuf, source: io::Error },
    #[error("cannot list {}", path.display())]
    List { path: PathBuf, source: io::Error },
    #[error("expected one bundle in {}, found {found} files (write the artifact with `deploy bundle --mender-artifact`)", path.display())]
    NotOneBundle { path: PathBuf, found: usize },
    #[error("refused {}", path.display())]
    Refused { path: PathBuf, source: ReleaseError },
    #[error("no record of an install in {}", path.display())]
    NoRecord { path: PathBuf },
    #[error("nothing to commit: no finished install in {}", path.display())]
    NothingToCommit { path: PathBuf },
    #[error("{release}: no release state in {} (was the robot's state removed?)", path.display())]
    NoState { release: String, path: PathBuf },
    #[error("rollback")]
    Rollback(#[source] ReleaseError),
    #[error(transparent)]
    Release(#[from] ReleaseError),
    #[error(transparent)]
    Lock(#[from] UpdateLockError),
    /// The robot's install options could not be made
    /// ([`ModuleEnv::install_options`]), with every cause.
    #[error("{0}")]
    Options(String),
    #[error("{} names no file", path.display())]
    NoFileName { path: PathBuf },
    #[error("mender-artifact is not installed (Debian: apt install mender-artifact)")]
    NoTool,
    #[error("cannot run mender-artifact")]
    RunTool(#[source] io::Error),
    #[error("mender-artifact write module-image failed ({status}): {stderr}")]
    ToolFailed { status: String, stderr: String },
}

/// What the module needs of the robot beyond the release store: its
/// robot.yaml and its supervisor (`deploy` gives both).
pub trait ModuleEnv {
    /// The install prefix (`/` on a robot).
    fn prefix(&self) -> &Path;
    /// The install options from this robot's robot.yaml.
    /// `Err`: why not, with every cause.
    fn install_options(&self, holder: &str) -> Result<InstallOptions<'static>, String>;
    /// `update.mender.verdict_timeout` (`None`: not set, or robot.yaml
    /// does not load).
    fn verdict_timeout(&self) -> Option<Duration>;
    /// `update.lock_timeout` (`None`: robot.yaml does not load).
    fn lock_timeout(&self) -> Option<Duration>;
    /// Tells a running supervisor that an install moved `current`.
    fn installed(&self, report: &InstallReport);
    /// Tells a running supervisor that a rollback moved `current`.
    fn rolled_back(&self);
    /// What the supervisor's status says of `release`'s rollback, if it
    /// rolled it back (`state` `rolled-back`, naming it): its detail.
    fn rollback_reason(&self, release: &str) -> Option<Option<String>>;
    /// A line for Mender's log (stderr).
    fn say(&self, line: &str);
}

/// How a state ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done (exit 0), nothing to print.
    Done,
    /// Done, with this answer on stdout (`NeedsArtifactReboot`,
    /// `SupportsRollback`).
    Answer(&'static str),
    /// The trial was rolled back, or no verdict came in time (exit 1).
    Failed,
}

/// The module's text. A script rather than a symlink to `deploy`: Mender
/// runs the module as `MODULE STATE FILES_DIR`, so a symlink would make
/// `deploy` tell its command from its own name (a second entry point to
/// keep working); the script keeps one (`deploy mender-module`) and carries
/// `deploy`'s global options (`--prefix`, `-c`) where a robot needs them.
pub fn module_script(deploy: &str, global_args: &[&str]) -> String {
    let mut line = shell_quote(deploy);
    for a in global_args {
        line.push(' ');
        line.push_str(&shell_quote(a));
    }
    format!(
        "#!/bin/sh\n\
         # rtdeploy's Mender update module (type {MODULE_TYPE}): installs our\n\
         # signed release bundles in trial and answers Mender's commit with the\n\
         # supervisor's verdict. See `deploy mender-module --help`.\n\
         exec {line} mender-module \"$@\"\n"
    )
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-=+:,".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// What this artifact installed, and what ran before it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    /// The release `current` named before the install (`None`: none).
    previous: Option<String>,
    /// The release the bundle installed; `None` while the install runs.
    release: Option<String>,
    /// The release changes the system and needs a reboot (always false
    /// for controller-only releases).
    #[serde(default)]
    reboot: bool,
    /// The sha256 of the bundle this record is about (`None` in a record
    /// of an older module: it names no bundle, so it proves nothing).
    #[serde(default)]
    bundle_sha256: Option<String>,
}

/// The most of the record read: a few hundred bytes.
const MAX_RECORD_FILE: u64 = 64 << 10;

fn record_path(files_dir: &Path) -> PathBuf {
    files_dir.join("tmp").join(RECORD)
}

fn read_record(files_dir: &Path) -> Result<Option<Record>, MenderError> {
    let path = record_path(files_dir);
    match units::bounded::Bound::regular(MAX_RECORD_FILE).read(&path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|source| MenderError::Parse { path, source }),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(MenderError::Read {
            path,
            source: e.into_io(),
        }),
    }
}

/// Writes the record durably (temporary file, fsync, rename, fsync of the
/// directory): a power cut leaves the old record or the new one.
fn write_record(files_dir: &Path, rec: &Record) -> Result<(), MenderError> {
    let path = record_path(files_dir);
    let dir = path.parent().expect("the record is in tmp/");
    let at = |p: &Path| p.to_path_buf();
    fs::create_dir_all(dir).map_err(|source| MenderError::Create {
        path: at(dir),
        source,
    })?;
    let tmp = dir.join(format!(".{RECORD}.tmp"));
    let mut f = fs::File::create(&tmp).map_err(|source| MenderError::Create {
        path: at(&tmp),
        source,
    })?;
    let mut bytes = serde_json::to_vec_pretty(rec).expect("a record serialises");
    bytes.push(b'\n');
    f.write_all(&bytes)
        .and_then(|()| f.sync_all())
        .map_err(|source| MenderError::Write {
            path: at(&tmp),
            source,
        })?;
    fs::rename(&tmp, &path).map_err(|source| MenderError::Rename {
        path: at(&path),
        source,
    })?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| MenderError::Sync {
            path: at(dir),
            source,
        })
}

/// Runs one state of Mender's update module protocol (v3) for the
/// artifact whose work directory is `dir`.
pub fn run_state(env: &dyn ModuleEnv, state: &str, dir: &Path) -> Result<Outcome, MenderError> {
    match state {
        // Mender stores the payload in FILES_DIR/files when the module
        // does not read the stream itself; the bundle is read once, by
        // the install, which verifies it.
        "Download" => Ok(Outcome::Done),
        "SupportsRollback" => Ok(Outcome::Answer("Yes")),
        "NeedsArtifactReboot" => {
            let reboot = read_record(dir)?.is_some_and(|r| r.reboot);
            Ok(Outcome::Answer(if reboot { "Automatic" } else { "No" }))
        }
        "ArtifactInstall" => artifact_install(env, dir),
        // Only called after answering `Yes` to NeedsArtifactReboot, which
        // this module never does (a system update answers `Automatic`:
        // Mender reboots).
        "ArtifactReboot" | "ArtifactRollbackReboot" => Ok(Outcome::Done),
        "ArtifactVerifyReboot" => verify_running(env, dir, true),
        "ArtifactVerifyRollbackReboot" => verify_running(env, dir, false),
        "ArtifactCommit" => artifact_commit(env, dir),
        "ArtifactRollback" => artifact_rollback(env, dir),
        "ArtifactFailure" => artifact_failure(env, dir),
        "Cleanup" => {
            let path = record_path(dir);
            match fs::remove_file(&path) {
                Ok(()) => Ok(Outcome::Done),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Outcome::Done),
                Err(source) => Err(MenderError::Remove { path, source }),
            }
        }
        // The protocol: a state the module does not know is not an error,
        // and nothing is printed.
        _ => Ok(Outcome::Done),
    }
}

/// The one bundle in FILES_DIR/files.
fn the_bundle(files_dir: &Path) -> Result<PathBuf, MenderError> {
    let files = files_dir.join("files");
    let list = |source| MenderError::List {
        path: files.clone(),
        source,
    };
    let mut found = Vec::new();
    for e in fs::read_dir(&files).map_err(list)? {
        let e = e.map_err(list)?;
        if e.file_type().map(|t| t.is_file()).unwrap_or(false) {
            found.push(e.path());
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        n => Err(MenderError::NotOneBundle {
            path: files,
            found: n,
        }),
    }
}

fn artifact_install(env: &dyn ModuleEnv, dir: &Path) -> Result<Outcome, MenderError> {
    let layout = Layout::new(env.prefix());
    let bundle = the_bundle(dir)?;
    let (sha, _) = crate::bundle::sha256_file(&bundle).map_err(|source| MenderError::Read {
        path: bundle.clone(),
        source,
    })?;
    let sha = sha.to_string();
    let current = link_target(&layout.current());
    let old = read_record(dir)?;
    if let Some(Record {
        release: Some(r),
        bundle_sha256: Some(was),
        ..
    }) = &old
    {
        if *was == sha && current.as_deref() == Some(r.as_str()) {
            env.say(&format!("{r} is already installed by this artifact"));
            return Ok(Outcome::Done);
        }
    }
    if let Some(Record {
        release: Some(r), ..
    }) = &old
    {
        if current.as_deref() == Some(r.as_str()) {
            env.say(&format!(
                "a record of {r} is here, but not of this bundle (sha256 {sha}): installing it"
            ));
        }
    }
    // Written before the install, so that a rollback after a power cut in
    // the middle of it knows what ran before; an install cut short and run
    // again keeps the release that ran before the first attempt.
    let previous = match &old {
        Some(Record {
            release: None,
            bundle_sha256: Some(was),
            previous,
            ..
        }) if *was == sha => previous.clone(),
        _ => current,
    };
    let mut rec = Record {
        previous,
        release: None,
        reboot: false,
        bundle_sha256: Some(sha),
    };
    write_record(dir, &rec)?;
    let opts = env
        .install_options("deploy mender-module")
        .map_err(MenderError::Options)?;
    let rep = crate::install_bundle(env.prefix(), &bundle, &opts).map_err(|source| {
        MenderError::Refused {
            path: bundle.clone(),
            source,
        }
    })?;
    for w in &rep.warnings {
        env.say(&format!("warning: {w}"));
    }
    rec.release = Some(rep.release.clone());
    rec.reboot = rep.reboot;
    write_record(dir, &rec)?;
    env.say(&match rep.state.as_str() {
        "trial" if rep.reboot => format!(
            "{}: installed in trial (signed by {}); it changes the system ({}): Mender reboots, then the supervisor judges it with the new plan",
            rep.release,
            rep.signer,
            rep.system.as_ref().map(|s| s.changes.join("; ")).unwrap_or_default()
        ),
        "trial" => format!(
            "{}: installed in trial (signed by {}); the supervisor judges it for update.health_window",
            rep.release, rep.signer
        ),
        "committed" => format!(
            "{}: installed and committed (the first release: nothing to go back to)",
            rep.release
        ),
        _ => format!("{}: already current; nothing changed", rep.release),
    });
    env.installed(&rep);
    Ok(Outcome::Done)
}

/// After a reboot: `current` is this artifact's release (`ours`), or is not
/// (after the rollback's reboot).
fn verify_running(env: &dyn ModuleEnv, dir: &Path, ours: bool) -> Result<Outcome, MenderError> {
    let Some(rec) = read_record(dir)? else {
        return Err(MenderError::NoRecord {
            path: dir.to_path_buf(),
        });
    };
    let current = link_target(&Layout::new(env.prefix()).current());
    let is_ours = rec.release.is_some() && current == rec.release;
    if is_ours == ours {
        return Ok(Outcome::Done);
    }
    env.say(&format!(
        "after the reboot current is {} ({} expected)",
        current.as_deref().unwrap_or("nothing"),
        if ours {
            rec.release.as_deref().unwrap_or("this artifact's release")
        } else {
            rec.previous.as_deref().unwrap_or("the release before")
        }
    ));
    Ok(Outcome::Failed)
}

fn artifact_commit(env: &dyn ModuleEnv, dir: &Path) -> Result<Outcome, MenderError> {
    let Some(Record {
        release: Some(release),
        ..
    }) = read_record(dir)?
    else {
        return Err(MenderError::NothingToCommit {
            path: dir.to_path_buf(),
        });
    };
    let timeout = env.verdict_timeout().unwrap_or(Duration::from_secs(600));
    let start = Instant::now();
    let mut said = false;
    loop {
        match read_state(env.prefix())? {
            Some(ReleaseState::Committed { release: r }) if r == release => {
                env.say(&format!("{release}: committed by the supervisor"));
                return Ok(Outcome::Done);
            }
            Some(ReleaseState::Trial { release: r, .. }) if r == release => {
                if !said {
                    env.say(&format!(
                        "{release}: in trial; waiting up to {timeout:?} for the supervisor's verdict"
                    ));
                    said = true;
                }
            }
            Some(ReleaseState::Committed { release: now }) => {
                env.say(&match rollback_reason(env, &release) {
                    Some(why) => {
                        format!("{release}: the trial failed and was rolled back to {now}: {why}")
                    }
                    None => format!(
                        "{release}: rolled back to {now} (the supervisor gives no reason: a rollback by hand, or its recovery after a restart)"
                    ),
                });
                return Ok(Outcome::Failed);
            }
            Some(ReleaseState::Trial { release: other, .. }) => {
                env.say(&format!(
                    "{release}: no longer in trial: {other} is (installed by something else)"
                ));
                return Ok(Outcome::Failed);
            }
            None => {
                return Err(MenderError::NoState {
                    release,
                    path: Layout::new(env.prefix()).state(),
                })
            }
        }
        if start.elapsed() >= timeout {
            env.say(&format!(
                "{release}: no verdict within update.mender.verdict_timeout ({timeout:?}); is `deploy supervise` running? Mender rolls back"
            ));
            return Ok(Outcome::Failed);
        }
        std::thread::sleep(POLL);
    }
}

/// Why the supervisor rolled `release` back, from its status (it says so
/// right after the rollback; a moment's wait covers the gap).
fn rollback_reason(env: &dyn ModuleEnv, release: &str) -> Option<String> {
    let until = Instant::now() + REASON_WAIT;
    loop {
        if let Some(detail) = env.rollback_reason(release) {
            return detail;
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

fn artifact_rollback(env: &dyn ModuleEnv, dir: &Path) -> Result<Outcome, MenderError> {
    let Some(rec) = read_record(dir)? else {
        env.say("nothing was installed by this artifact: nothing to roll back");
        return Ok(Outcome::Done);
    };
    let lock_timeout = env.lock_timeout().unwrap_or(Duration::from_secs(60));
    let _lock = UpdateLock::acquire(env.prefix(), "deploy mender-module", lock_timeout)?;
    let layout = Layout::new(env.prefix());
    let ours = |r: &str| rec.release.as_deref() == Some(r);
    let go_back = match read_state(env.prefix())? {
        // Our trial, or (the record written before the install, a power
        // cut before the second) a trial begun from where we began.
        Some(ReleaseState::Trial {
            release, previous, ..
        }) => ours(&release) || (rec.release.is_none() && rec.previous == Some(previous)),
        // Committed, then Mender failed a later step: back to what ran
        // before, if `previous` still names it.
        Some(ReleaseState::Committed { release }) => {
            ours(&release)
                && rec.previous.as_deref().is_some_and(|p| p != release)
                && link_target(&layout.previous()) == rec.previous
        }
        None => false,
    };
    if !go_back {
        env.say(&format!(
            "nothing to roll back: current is {}{}",
            link_target(&layout.current())
                .as_deref()
                .unwrap_or("nothing"),
            match &rec.release {
                Some(r) => format!(", not {r} (already rolled back)"),
                None => " (the install did not finish)".into(),
            }
        ));
        return Ok(Outcome::Done);
    }
    let rb = crate::rollback(env.prefix()).map_err(MenderError::Rollback)?;
    env.say(&format!(
        "rolled back{}: {} -> {} (committed)",
        if rb.trial { " the trial" } else { "" },
        rb.from,
        rb.to
    ));
    env.rolled_back();
    Ok(Outcome::Done)
}

/// The update failed: say where the robot stands (the rollback before this
/// state already put the release back).
fn artifact_failure(env: &dyn ModuleEnv, dir: &Path) -> Result<Outcome, MenderError> {
    let rec = read_record(dir)?.unwrap_or_default();
    let state = read_state(env.prefix())?;
    let now = state.as_ref().map_or("nothing", |s| s.release());
    match (&rec.release, &state) {
        (Some(r), Some(ReleaseState::Trial { release, .. })) if r == release => env.say(&format!(
            "update failed while {r} is still in trial; the supervisor rolls it back at its next start"
        )),
        (Some(r), _) => env.say(&format!("update of {r} failed; running {now}")),
        (None, _) => env.say(&format!("update failed before anything was installed; running {now}")),
    }
    Ok(Outcome::Done)
}

/// Wraps `bundle` into a Mender module-image artifact (format v3, payload
/// type [`MODULE_TYPE`]) named `name` for `device_type`, with Debian's
/// `mender-artifact` tool. Written beside `out` and renamed into place.
pub fn write_artifact(
    bundle: &Path,
    name: &str,
    device_type: &str,
    out: &Path,
) -> Result<(), MenderError> {
    let file_name = out.file_name().ok_or_else(|| MenderError::NoFileName {
        path: out.to_path_buf(),
    })?;
    let tmp = out.with_file_name(format!(".{}.tmp", file_name.to_string_lossy()));
    let _ = fs::remove_file(&tmp);
    let result = Command::new("mender-artifact")
        .args(["write", "module-image", "-T", MODULE_TYPE, "-n", name, "-t"])
        .arg(device_type)
        .arg("-f")
        .arg(bundle)
        .arg("-o")
        .arg(&tmp)
        .output();
    let o = match result {
        Ok(o) => o,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(MenderError::NoTool),
        Err(e) => return Err(MenderError::RunTool(e)),
    };
    if !o.status.success() {
        let _ = fs::remove_file(&tmp);
        return Err(MenderError::ToolFailed {
            status: o.status.to_string(),
            stderr: String::from_utf8_lossy(&o.stderr).trim().to_string(),
        });
    }
    fs::rename(&tmp, out).map_err(|source| MenderError::Rename {
        path: out.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_quotes_what_the_shell_would_split() {
        let s = module_script("/usr/bin/deploy", &[]);
        assert!(s.starts_with("#!/bin/sh\n"));
        assert!(
            s.ends_with("exec /usr/bin/deploy mender-module \"$@\"\n"),
            "{s}"
        );
        let s = module_script("/opt/my deploy", &["--prefix", "/tmp/it's"]);
        assert!(
            s.ends_with("exec '/opt/my deploy' --prefix '/tmp/it'\\''s' mender-module \"$@\"\n"),
            "{s}"
        );
    }

    #[test]
    fn the_record_survives_a_rewrite() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read_record(d.path()).unwrap(), None);
        let mut r = Record {
            previous: Some("1.0-aaaaaaaa".into()),
            release: None,
            reboot: false,
            bundle_sha256: Some("ab".repeat(32)),
        };
        write_record(d.path(), &r).unwrap();
        r.release = Some("2.0-bbbbbbbb".into());
        write_record(d.path(), &r).unwrap();
        assert_eq!(read_record(d.path()).unwrap(), Some(r));
    }
}
