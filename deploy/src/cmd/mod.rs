//! One module per subcommand: each parses its own arguments and returns
//! how it ended.

pub mod apply;
pub mod bench;
pub mod bundle;
pub mod check;
pub mod config;
pub mod control;
pub mod image;
pub mod install;
pub mod keygen;
pub mod log;
pub mod mender;
pub mod metrics;
pub mod plan;
pub mod release;
pub mod status;
pub mod supervise;
pub mod system_update;
pub mod top;
pub mod trace;
pub mod update;
pub mod verify;

use crate::config::{self as robot_config, ConfigLoadError, Loaded};
use crate::ctx::Ctx;

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
        Err(ConfigLoadError::Invalid { path, diagnostics }) => {
            for d in &diagnostics {
                eprintln!("{d}");
            }
            Err(ConfigLoadError::Invalid { path, diagnostics }.into())
        }
        Err(e) => Err(e.into()),
    }
}
