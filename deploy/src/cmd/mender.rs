//! `deploy mender-module STATE FILES_DIR`: our Mender update module (module
//! type `rtdeploy-release`), and the artifact that carries a bundle to it.
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
//! plan: [`releases::system`]) sets the record's `reboot`, so
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

use anyhow::{bail, Context};
use clap::Args;
use releases::{link_target, read_state, Layout, ReleaseState, UpdateLock};
use serde::{Deserialize, Serialize};
use services::control::{self, Request};

use crate::ctx::{Ctx, Exit};

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

#[derive(Debug, Args)]
pub struct MenderModuleArgs {
    /// The protocol state Mender calls (ArtifactInstall, ArtifactCommit, ...).
    pub state: String,
    /// Mender's work directory for this artifact (`files/` holds the
    /// bundle).
    pub files_dir: PathBuf,
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

fn read_record(files_dir: &Path) -> anyhow::Result<Option<Record>> {
    let path = record_path(files_dir);
    match units::bounded::Bound::regular(MAX_RECORD_FILE).read(&path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .with_context(|| format!("cannot parse {}", path.display())),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into_io()).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Writes the record durably (temporary file, fsync, rename, fsync of the
/// directory): a power cut leaves the old record or the new one.
fn write_record(files_dir: &Path, rec: &Record) -> anyhow::Result<()> {
    let path = record_path(files_dir);
    let dir = path.parent().expect("the record is in tmp/");
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = dir.join(format!(".{RECORD}.tmp"));
    let mut f =
        fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let mut bytes = serde_json::to_vec_pretty(rec)?;
    bytes.push(b'\n');
    f.write_all(&bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    fs::rename(&tmp, &path).with_context(|| format!("cannot rename to {}", path.display()))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync {}", dir.display()))
}

/// A line on stderr, which Mender puts into its log and deployment report.
fn say(msg: impl std::fmt::Display) {
    eprintln!("rtdeploy: {msg}");
}

pub fn run(ctx: &Ctx, args: MenderModuleArgs) -> anyhow::Result<Exit> {
    let dir = &args.files_dir;
    match args.state.as_str() {
        // Mender stores the payload in FILES_DIR/files when the module
        // does not read the stream itself; the bundle is read once, by
        // the install, which verifies it.
        "Download" => Ok(Exit::Ok),
        "SupportsRollback" => answer("Yes"),
        "NeedsArtifactReboot" => {
            let reboot = read_record(dir)?.is_some_and(|r| r.reboot);
            answer(if reboot { "Automatic" } else { "No" })
        }
        "ArtifactInstall" => artifact_install(ctx, dir),
        // Only called after answering `Yes` to NeedsArtifactReboot, which
        // this module never does (a system update answers `Automatic`:
        // Mender reboots).
        "ArtifactReboot" | "ArtifactRollbackReboot" => Ok(Exit::Ok),
        "ArtifactVerifyReboot" => verify_running(ctx, dir, true),
        "ArtifactVerifyRollbackReboot" => verify_running(ctx, dir, false),
        "ArtifactCommit" => artifact_commit(ctx, dir),
        "ArtifactRollback" => artifact_rollback(ctx, dir),
        "ArtifactFailure" => artifact_failure(ctx, dir),
        "Cleanup" => {
            let path = record_path(dir);
            match fs::remove_file(&path) {
                Ok(()) => Ok(Exit::Ok),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Exit::Ok),
                Err(e) => Err(e).with_context(|| format!("cannot remove {}", path.display())),
            }
        }
        // The protocol: a state the module does not know is not an error,
        // and nothing is printed.
        _ => Ok(Exit::Ok),
    }
}

fn answer(word: &str) -> anyhow::Result<Exit> {
    crate::ctx::write_stdout(&format!("{word}\n"))?;
    Ok(Exit::Ok)
}

/// The one bundle in FILES_DIR/files.
fn the_bundle(files_dir: &Path) -> anyhow::Result<PathBuf> {
    let files = files_dir.join("files");
    let mut found = Vec::new();
    for e in fs::read_dir(&files).with_context(|| format!("cannot list {}", files.display()))? {
        let e = e.with_context(|| format!("cannot list {}", files.display()))?;
        if e.file_type().map(|t| t.is_file()).unwrap_or(false) {
            found.push(e.path());
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        n => bail!(
            "expected one bundle in {}, found {n} files (write the artifact with `deploy bundle --mender-artifact`)",
            files.display()
        ),
    }
}

fn artifact_install(ctx: &Ctx, dir: &Path) -> anyhow::Result<Exit> {
    let layout = Layout::new(&ctx.prefix);
    let bundle = the_bundle(dir)?;
    let (sha, _) = releases::bundle::sha256_file(&bundle)
        .with_context(|| format!("cannot read {}", bundle.display()))?;
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
            say(format!("{r} is already installed by this artifact"));
            return Ok(Exit::Ok);
        }
    }
    if let Some(Record {
        release: Some(r), ..
    }) = &old
    {
        if current.as_deref() == Some(r.as_str()) {
            say(format!(
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
    let opts = super::install::install_options(ctx, "deploy mender-module")?;
    let rep = releases::install_bundle(&ctx.prefix, &bundle, &opts)
        .with_context(|| format!("refused {}", bundle.display()))?;
    for w in &rep.warnings {
        say(format!("warning: {w}"));
    }
    rec.release = Some(rep.release.clone());
    rec.reboot = rep.reboot;
    write_record(dir, &rec)?;
    say(match rep.state.as_str() {
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
    super::install::notify_supervisor(ctx, &rep);
    Ok(Exit::Ok)
}

/// After a reboot: `current` is this artifact's release (`ours`), or is not
/// (after the rollback's reboot).
fn verify_running(ctx: &Ctx, dir: &Path, ours: bool) -> anyhow::Result<Exit> {
    let Some(rec) = read_record(dir)? else {
        bail!("no record of an install in {}", dir.display());
    };
    let current = link_target(&Layout::new(&ctx.prefix).current());
    let is_ours = rec.release.is_some() && current == rec.release;
    if is_ours == ours {
        return Ok(Exit::Ok);
    }
    say(format!(
        "after the reboot current is {} ({} expected)",
        current.as_deref().unwrap_or("nothing"),
        if ours {
            rec.release.as_deref().unwrap_or("this artifact's release")
        } else {
            rec.previous.as_deref().unwrap_or("the release before")
        }
    ));
    Ok(Exit::Failed)
}

fn artifact_commit(ctx: &Ctx, dir: &Path) -> anyhow::Result<Exit> {
    let Some(Record {
        release: Some(release),
        ..
    }) = read_record(dir)?
    else {
        bail!(
            "nothing to commit: no finished install in {}",
            dir.display()
        );
    };
    let timeout = super::load_robot(ctx)
        .ok()
        .and_then(|l| l.robot.update.mender.map(|m| m.verdict_timeout.0))
        .unwrap_or(Duration::from_secs(600));
    let start = Instant::now();
    let mut said = false;
    loop {
        match read_state(&ctx.prefix)? {
            Some(ReleaseState::Committed { release: r }) if r == release => {
                say(format!("{release}: committed by the supervisor"));
                return Ok(Exit::Ok);
            }
            Some(ReleaseState::Trial { release: r, .. }) if r == release => {
                if !said {
                    say(format!(
                        "{release}: in trial; waiting up to {timeout:?} for the supervisor's verdict"
                    ));
                    said = true;
                }
            }
            Some(ReleaseState::Committed { release: now }) => {
                say(match rollback_reason(ctx, &release) {
                    Some(why) => {
                        format!("{release}: the trial failed and was rolled back to {now}: {why}")
                    }
                    None => format!(
                        "{release}: rolled back to {now} (the supervisor gives no reason: a rollback by hand, or its recovery after a restart)"
                    ),
                });
                return Ok(Exit::Failed);
            }
            Some(ReleaseState::Trial { release: other, .. }) => {
                say(format!(
                    "{release}: no longer in trial: {other} is (installed by something else)"
                ));
                return Ok(Exit::Failed);
            }
            None => bail!(
                "{release}: no release state in {} (was the robot's state removed?)",
                Layout::new(&ctx.prefix).state().display()
            ),
        }
        if start.elapsed() >= timeout {
            say(format!(
                "{release}: no verdict within update.mender.verdict_timeout ({timeout:?}); is `deploy supervise` running? Mender rolls back"
            ));
            return Ok(Exit::Failed);
        }
        std::thread::sleep(POLL);
    }
}

/// Why the supervisor rolled `release` back, from its status (it says so
/// right after the rollback; a moment's wait covers the gap).
fn rollback_reason(ctx: &Ctx, release: &str) -> Option<String> {
    let socket = control::socket_path(&ctx.prefix);
    let until = Instant::now() + REASON_WAIT;
    loop {
        let status = control::request(&socket, &Request::Status)
            .ok()
            .and_then(|r| r.status)
            .and_then(|s| s.release);
        if let Some(r) = status {
            if r.state == "rolled-back" && r.other.as_deref() == Some(release) {
                return r.detail;
            }
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

fn artifact_rollback(ctx: &Ctx, dir: &Path) -> anyhow::Result<Exit> {
    let Some(rec) = read_record(dir)? else {
        say("nothing was installed by this artifact: nothing to roll back");
        return Ok(Exit::Ok);
    };
    let lock_timeout = super::load_robot(ctx)
        .map(|l| l.robot.update.lock_timeout.0)
        .unwrap_or(Duration::from_secs(60));
    let _lock = UpdateLock::acquire(&ctx.prefix, "deploy mender-module", lock_timeout)?;
    let layout = Layout::new(&ctx.prefix);
    let ours = |r: &str| rec.release.as_deref() == Some(r);
    let go_back = match read_state(&ctx.prefix)? {
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
        say(format!(
            "nothing to roll back: current is {}{}",
            link_target(&layout.current())
                .as_deref()
                .unwrap_or("nothing"),
            match &rec.release {
                Some(r) => format!(", not {r} (already rolled back)"),
                None => " (the install did not finish)".into(),
            }
        ));
        return Ok(Exit::Ok);
    }
    let rb = releases::rollback(&ctx.prefix).context("rollback")?;
    say(format!(
        "rolled back{}: {} -> {} (committed)",
        if rb.trial { " the trial" } else { "" },
        rb.from,
        rb.to
    ));
    tell_supervisor(ctx);
    Ok(Exit::Ok)
}

/// Tells a running supervisor that `current` moved (it also looks by itself
/// once a second).
fn tell_supervisor(ctx: &Ctx) {
    let socket = control::socket_path(&ctx.prefix);
    if socket.exists() {
        if let Err(e) = control::request(&socket, &Request::ReleaseChanged) {
            say(format!(
                "warning: {e}; the supervisor sees the change within a second by itself"
            ));
        }
    }
}

/// The update failed: say where the robot stands (the rollback before this
/// state already put the release back).
fn artifact_failure(ctx: &Ctx, dir: &Path) -> anyhow::Result<Exit> {
    let rec = read_record(dir)?.unwrap_or_default();
    let state = read_state(&ctx.prefix)?;
    let now = state.as_ref().map_or("nothing", |s| s.release());
    match (&rec.release, &state) {
        (Some(r), Some(ReleaseState::Trial { release, .. })) if r == release => say(format!(
            "update failed while {r} is still in trial; the supervisor rolls it back at its next start"
        )),
        (Some(r), _) => say(format!("update of {r} failed; running {now}")),
        (None, _) => say(format!("update failed before anything was installed; running {now}")),
    }
    Ok(Exit::Ok)
}

/// Wraps `bundle` into a Mender module-image artifact (format v3, payload
/// type [`MODULE_TYPE`]) named `name` for `device_type`, with Debian's
/// `mender-artifact` tool. Written beside `out` and renamed into place.
pub fn write_artifact(
    bundle: &Path,
    name: &str,
    device_type: &str,
    out: &Path,
) -> anyhow::Result<()> {
    let file_name = out
        .file_name()
        .with_context(|| format!("{} names no file", out.display()))?;
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
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            bail!("mender-artifact is not installed (Debian: apt install mender-artifact)")
        }
        Err(e) => return Err(e).context("cannot run mender-artifact"),
    };
    if !o.status.success() {
        let _ = fs::remove_file(&tmp);
        bail!(
            "mender-artifact write module-image failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    fs::rename(&tmp, out).with_context(|| format!("cannot rename to {}", out.display()))
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
    fn an_unknown_state_prints_nothing_and_succeeds() {
        let d = tempfile::tempdir().unwrap();
        let ctx = Ctx {
            prefix: d.path().to_path_buf(),
            sysroot: "/".into(),
            config_path: d.path().join("missing.yaml"),
            json: false,
            quiet: false,
            verbose: 0,
        };
        let args = MenderModuleArgs {
            state: "ProvidePayloadFileSizes".into(),
            files_dir: d.path().to_path_buf(),
        };
        assert_eq!(run(&ctx, args).unwrap(), Exit::Ok);
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
