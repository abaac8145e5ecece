//! `robot.yaml`: the whole robot description, composed from the sections
//! each crate owns, with the checks that cross sections.

mod de;
mod validate;
mod yaml;

use std::path::{Path, PathBuf};

use controller::config::{BootCheckSection, ChannelConfig, CheckSection};
use cpusets::config::{
    BoardSection, CpusSection, IrqsSection, KernelSection, PowerSection, SysctlSection,
};
use cpusets::cpuset::CpuSet;
use serde::Serialize;
use services::config::{ProcessConfig, RobotSection, UpdateSection};

pub use validate::{Diagnostic, Severity};

/// The validated robot description.
#[derive(Debug, Clone, Serialize)]
pub struct Robot {
    pub robot: RobotSection,
    pub board: BoardSection,
    pub cpus: CpusSection,
    pub kernel: KernelSection,
    pub irqs: IrqsSection,
    pub sysctl: SysctlSection,
    pub power: PowerSection,
    pub channels: Vec<ChannelConfig>,
    pub processes: Vec<ProcessConfig>,
    pub check: CheckSection,
    pub boot_check: BootCheckSection,
    pub update: UpdateSection,
}

impl Robot {
    /// Every CPU of the board (validation guarantees the count is known).
    pub fn all_cpus(&self) -> CpuSet {
        self.board.all_cpus().unwrap_or_default()
    }

    /// The housekeeping CPUs, as written or derived.
    pub fn housekeeping(&self) -> CpuSet {
        self.cpus.housekeeping(&self.all_cpus())
    }

    /// The CPUs a process runs on: as written, else the isolated CPUs for
    /// fifo/rr and the housekeeping CPUs for `other`.
    pub fn process_cpus(&self, p: &ProcessConfig) -> CpuSet {
        match &p.cpus {
            Some(c) => c.clone(),
            None if p.policy.is_realtime() => self.cpus.isolated.clone(),
            None => self.housekeeping(),
        }
    }

    /// How many processes publish on a channel.
    pub fn publishers_of(&self, channel: &str) -> usize {
        self.processes
            .iter()
            .filter(|p| p.publishes.iter().any(|c| c == channel))
            .count()
    }
}

/// A loaded, valid robot description with its warnings.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub robot: Robot,
    pub path: PathBuf,
    pub text: String,
    pub warnings: Vec<Diagnostic>,
}

/// Why a robot description was refused: every problem found, each with its
/// place in the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigLoadError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not valid: {} error(s)", path.display(), diagnostics.iter().filter(|d| d.severity == Severity::Error).count())]
    Invalid {
        path: PathBuf,
        diagnostics: Vec<Diagnostic>,
    },
}

/// Reads, parses and validates `robot.yaml`.
pub fn load(path: &Path) -> Result<Loaded, ConfigLoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigLoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    load_str(path, text)
}

/// Parses and validates `text` as if read from `path`.
pub fn load_str(path: &Path, text: String) -> Result<Loaded, ConfigLoadError> {
    let (robot, diagnostics) = validate::parse_and_validate(path, &text);
    match robot {
        Some(robot) if !diagnostics.iter().any(|d| d.severity == Severity::Error) => Ok(Loaded {
            robot,
            path: path.to_path_buf(),
            text,
            warnings: diagnostics,
        }),
        _ => Err(ConfigLoadError::Invalid {
            path: path.to_path_buf(),
            diagnostics,
        }),
    }
}
