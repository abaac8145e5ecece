//! One module per subcommand: each parses its own arguments and returns
//! how it ended.

pub mod apply;
pub mod bench;
pub mod bundle;
pub mod check;
pub mod config;
pub mod control;
pub mod demo;
pub mod gen;
pub mod image;
pub mod install;
pub mod keygen;
pub mod log;
pub mod mender;
pub mod metrics;
pub mod plan;
pub mod release;
pub mod sim;
pub mod status;
pub mod supervise;
pub mod top;
pub mod trace;
pub mod update;
pub mod verify;

use crate::ctx::Ctx;
use services::robot::{self as robot_config, Loaded, RobotLoadError};

/// Loads robot.yaml for a command: warnings go to stderr (unless -q); an
/// invalid file prints every diagnostic and fails (exit 2).
pub fn load_robot(ctx: &Ctx) -> anyhow::Result<Loaded> {
    match robot_config::load(&ctx.config_path) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                ctx.note(w);
            }
            Ok(loaded)
        }
        Err(RobotLoadError::Invalid { path, diagnostics }) => {
            for d in &diagnostics {
                eprintln!("{d}");
            }
            Err(RobotLoadError::Invalid { path, diagnostics }.into())
        }
        Err(e) => Err(e.into()),
    }
}

/// `err` with the fix added when it is a refused write under the
/// prefix's shared-memory directory (`/dev/shm/rtdeploy`) that another
/// user made: a supervisor or check run as root leaves it behind, and a
/// user's run then cannot create its channels there.
pub fn with_shm_hint(ctx: &Ctx, err: anyhow::Error) -> anyhow::Error {
    use std::os::unix::fs::MetadataExt;
    let shm = releases::Layout::new(&ctx.prefix).shm_dir();
    let text = format!("{err:#}");
    let denied = text.contains("(os error 13)") || text.contains("(os error 1)");
    if !denied || !text.contains(&shm.display().to_string()) {
        return err;
    }
    let (Ok(dir), Ok(me)) = (std::fs::metadata(&shm), std::fs::metadata("/proc/self")) else {
        return err;
    };
    if dir.uid() == me.uid() {
        return err;
    }
    err.context(format!(
        "this user (uid {}) cannot write in {}, which belongs to uid {} (a supervisor or \
         `deploy check` run as root made it): run as root, or give this run a directory of its \
         own with --prefix (e.g. `deploy --prefix /tmp/rtdeploy-$USER ...`)",
        me.uid(),
        shm.display(),
        dir.uid()
    ))
}
