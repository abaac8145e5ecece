//! `deploy mender-module STATE FILES_DIR`: our Mender update module (module
//! type `rtdeploy-release`); the module itself is
//! [`releases::mender`], which this command gives the robot's robot.yaml
//! and supervisor.
//!
//! Protocol: stdout carries only the answers of `NeedsArtifactReboot` and
//! `SupportsRollback`; everything else goes to stderr, which Mender logs.
//! A state this module does not know exits 0 with nothing printed, as the
//! protocol asks. Exit: 0 done; 1 the trial was rolled back or no verdict
//! came in time; 2 error (refused bundle, no bundle, I/O).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use releases::mender::{ModuleEnv, Outcome};
use releases::{InstallOptions, InstallReport};
use services::control::{self, Request};

use crate::ctx::{Ctx, Exit};

#[derive(Debug, Args)]
pub struct MenderModuleArgs {
    /// The protocol state Mender calls (ArtifactInstall, ArtifactCommit, ...).
    pub state: String,
    /// Mender's work directory for this artifact (`files/` holds the
    /// bundle).
    pub files_dir: PathBuf,
}

pub fn run(ctx: &Ctx, args: MenderModuleArgs) -> anyhow::Result<Exit> {
    match releases::mender::run_state(&RobotEnv(ctx), &args.state, &args.files_dir)? {
        Outcome::Done => Ok(Exit::Ok),
        Outcome::Answer(word) => {
            crate::ctx::write_stdout(&format!("{word}\n"))?;
            Ok(Exit::Ok)
        }
        Outcome::Failed => Ok(Exit::Failed),
    }
}

/// This robot, as the module sees it: its robot.yaml and its supervisor.
struct RobotEnv<'a>(&'a Ctx);

impl ModuleEnv for RobotEnv<'_> {
    fn prefix(&self) -> &Path {
        &self.0.prefix
    }

    fn install_options(&self, holder: &str) -> Result<InstallOptions<'static>, String> {
        super::install::install_options(self.0, holder).map_err(|e| format!("{e:#}"))
    }

    fn verdict_timeout(&self) -> Option<Duration> {
        super::load_robot(self.0)
            .ok()
            .and_then(|l| l.robot.update.mender.map(|m| m.verdict_timeout.0))
    }

    fn lock_timeout(&self) -> Option<Duration> {
        super::load_robot(self.0)
            .ok()
            .map(|l| l.robot.update.lock_timeout.0)
    }

    fn installed(&self, report: &InstallReport) {
        super::install::notify_supervisor(self.0, report);
    }

    /// Tells a running supervisor that `current` moved (it also looks by
    /// itself once a second).
    fn rolled_back(&self) {
        let socket = control::socket_path(&self.0.prefix);
        if socket.exists() {
            if let Err(e) = control::request(&socket, &Request::ReleaseChanged) {
                self.say(&format!(
                    "warning: {e}; the supervisor sees the change within a second by itself"
                ));
            }
        }
    }

    fn rollback_reason(&self, release: &str) -> Option<Option<String>> {
        let socket = control::socket_path(&self.0.prefix);
        let r = control::request(&socket, &Request::Status)
            .ok()
            .and_then(|r| r.status)
            .and_then(|s| s.release)?;
        (r.state == "rolled-back" && r.other.as_deref() == Some(release)).then_some(r.detail)
    }

    /// A line on stderr, which Mender puts into its log and deployment
    /// report.
    fn say(&self, line: &str) {
        eprintln!("rtdeploy: {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
